"""What an evaluation plays: ``EvalPlan`` (policies × envs × task seeds × samples), its envs, and what
the harness learns about each env before the first episode. Pure data, saved as ``plan.json``."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from agentgym.errors import AgentGymError, ConfigError
from agentgym.eval.policies import PolicySpec, unique_names
from agentgym.eval.store import slug


class EvalError(AgentGymError):
    """An evaluation stopped: an env crashed, an endpoint failed, or the folder holds another plan."""


@dataclass(frozen=True)
class EnvEntry:
    """One env of an evaluation."""

    id: str
    """Registered env id."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Constructor arguments (``--env-arg``, ``--split``)."""
    max_turns: int | None = None
    """Override of the spec's turn budget."""
    url: str | None = None
    """An env service holding this env (``--env-url``); None plays it in-process."""


@dataclass(frozen=True)
class EvalPlan:
    """What to evaluate: saved as ``plan.json``, so a resumed evaluation is exactly the same one."""

    policies: tuple[PolicySpec, ...]
    """The policies, in report order (the first is the baseline of paired comparisons)."""
    envs: tuple[EnvEntry, ...]
    """The envs."""
    seeds: tuple[int, ...]
    """Task seeds; task i is ``reset(seed=seeds[i])`` for every policy."""
    samples: int = 1
    """Episodes per task and policy (pass@k needs more than one)."""
    temperature: float = 0.0
    """Sampling temperature of model policies (0 = greedy)."""
    sampling_seed: int = 0
    """Seeds model sampling and the random policy."""
    concurrency: int = 32
    """Episodes in flight at once."""

    def __post_init__(self) -> None:
        if not self.policies:
            raise ConfigError("give at least one --policy (random, expert, a model directory, a run folder or a URL)")
        if not self.envs:
            raise ConfigError("give at least one env with --envs ID[,ID...]")
        if not self.seeds:
            raise ConfigError("--episodes must be >= 1")
        if len(set(self.seeds)) != len(self.seeds):
            raise ConfigError("--seeds lists a seed twice; each task needs its own seed")
        if self.samples < 1:
            raise ConfigError(f"--samples must be >= 1, got {self.samples}")
        if self.concurrency < 1:
            raise ConfigError(f"--concurrency must be >= 1, got {self.concurrency}")
        if self.temperature < 0:
            raise ConfigError(f"--temperature must be >= 0, got {self.temperature}")
        unique_names(list(self.policies))
        for kind, names in (("env", [e.id for e in self.envs]), ("policy", [p.name for p in self.policies])):
            slugs = [slug(n) for n in names]
            if len(set(slugs)) != len(slugs):
                raise ConfigError(f"two {kind} names map to the same file name ({names}); rename one")

    def to_json(self) -> dict[str, Any]:
        """A JSON-safe dict (``from_json`` reads it back)."""
        return {"policies": [p.to_json() for p in self.policies], "envs": [asdict(e) for e in self.envs],
                "seeds": list(self.seeds), "samples": self.samples, "temperature": self.temperature,
                "sampling_seed": self.sampling_seed, "concurrency": self.concurrency}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> EvalPlan:
        """Inverse of ``to_json``."""
        return cls(tuple(PolicySpec.from_json(p) for p in data["policies"]),
                   tuple(EnvEntry(**e) for e in data["envs"]), tuple(data["seeds"]), data["samples"],
                   data["temperature"], data["sampling_seed"], data["concurrency"])

    def same_episodes(self, other: EvalPlan) -> bool:
        """True when ``other`` plays the same episodes (concurrency may differ)."""
        mine, theirs = self.to_json(), other.to_json()
        mine.pop("concurrency"), theirs.pop("concurrency")
        return mine == theirs


@dataclass(frozen=True)
class EnvInfo:
    """What the harness learned about an env from one reset before any episode."""

    has_tools: bool
    has_expert: bool
    action_format: str
