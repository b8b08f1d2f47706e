"""What an evaluation plays: ``EvalPlan`` (policies × envs × tasks × samples), its envs, and what
the harness learns about each env before the first episode. Pure data, saved as ``plan.json``."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from agentgym.errors import AgentGymError, ConfigError
from agentgym.eval.policies import PolicySpec, unique_names
from agentgym.eval.store import PLAN, slug


class EvalError(AgentGymError):
    """An evaluation stopped: an env crashed, an endpoint failed, or the folder holds another plan."""


@dataclass(frozen=True)
class EnvEntry:
    """One env of an evaluation."""

    id: str
    """Registered env id."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Constructor arguments (``--env-arg``)."""
    max_turns: int | None = None
    """Override of the spec's turn budget."""
    url: str | None = None
    """An env service holding this env (``--env-url``); None plays it in-process."""
    split: str | None = None
    """A task split of the env (``--split``): the plan's ``seeds`` are then task indices of it, task ``i``
    played as ``reset(options={"split": split, "index": seeds[i]})``; None: they are reset seeds."""
    judge: dict[str, Any] | None = None
    """Judge settings (``agentgym.sources.env_source.JUDGE_FIELDS``; ``--judge`` or the run's ``env.judge``):
    the episodes' rewards are the judge's scores; None: the env's own rewards."""

    def to_json(self) -> dict[str, Any]:
        """The entry as JSON-safe data, without ``split`` and ``judge`` when they are None (so a plan
        without them reads as plans did before they existed).

        Example:
            >>> EnvEntry("maze-v0", split="test").to_json()
            {'id': 'maze-v0', 'kwargs': {}, 'max_turns': None, 'url': None, 'split': 'test'}
        """
        return {key: value for key, value in asdict(self).items()
                if value is not None or key not in ("split", "judge")}


#: plan.json's fields and their JSON types (what ``EvalPlan.from_json`` needs).
_PLAN_FIELDS: dict[str, type | tuple[type, ...]] = {
    "policies": list, "envs": list, "seeds": list, "samples": int, "temperature": (int, float),
    "sampling_seed": int, "concurrency": int,
}


@dataclass(frozen=True)
class EvalPlan:
    """What to evaluate: saved as ``plan.json``, so a resumed evaluation is exactly the same one."""

    policies: tuple[PolicySpec, ...]
    """The policies, in report order (the first is the baseline of paired comparisons)."""
    envs: tuple[EnvEntry, ...]
    """The envs."""
    seeds: tuple[int, ...]
    """The tasks: task i is ``reset(seed=seeds[i])`` for every policy, or task ``seeds[i]`` of the split
    of an env that names one (``EnvEntry.split``)."""
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
            raise ConfigError("give at least one --policy "
                              "(random, expert, a model directory, a run folder or a URL)")
        if not self.envs:
            raise ConfigError("give at least one env with --envs ID[,ID...]")
        if not self.seeds:
            raise ConfigError("--episodes must be >= 1")
        if len(set(self.seeds)) != len(self.seeds):
            raise ConfigError("--seeds lists a seed twice; each task needs its own seed")
        if any(entry.split is not None for entry in self.envs) and min(self.seeds) < 0:
            raise ConfigError(f"task indices of a split start at 0, got {min(self.seeds)}; give --task-range "
                              "START:END with 0 <= START < END")
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
        return {"policies": [p.to_json() for p in self.policies], "envs": [e.to_json() for e in self.envs],
                "seeds": list(self.seeds), "samples": self.samples, "temperature": self.temperature,
                "sampling_seed": self.sampling_seed, "concurrency": self.concurrency}

    @classmethod
    def from_json(cls, data: dict[str, Any], *, source: str = PLAN) -> EvalPlan:
        """Inverse of ``to_json``.

        Args:
            data: what ``to_json`` wrote.
            source: the file it came from, named in errors.

        Raises:
            ConfigError: ``data`` is not a whole plan (a damaged or foreign plan.json), naming ``source``.

        Example:
            >>> EvalPlan.from_json({})  # doctest: +NORMALIZE_WHITESPACE
            Traceback (most recent call last):
            ...
            agentgym.errors.ConfigError: plan.json is not an evaluation plan (no 'policies'), so the
            evaluation cannot be resumed; start it again with another --out
        """
        def broken(why: str) -> ConfigError:
            return ConfigError(f"{source} is not an evaluation plan ({why}), so the evaluation cannot be "
                               "resumed; start it again with another --out")

        if not isinstance(data, dict):
            raise broken(f"it holds {type(data).__name__}")
        for key, kind in _PLAN_FIELDS.items():
            if key not in data:
                raise broken(f"no {key!r}")
            if not isinstance(data[key], kind) or isinstance(data[key], bool):
                raise broken(f"{key!r} is {type(data[key]).__name__}")
        try:
            policies = tuple(PolicySpec.from_json(p) for p in data["policies"])
            envs = tuple(EnvEntry(**e) for e in data["envs"])
            seeds = tuple(int(s) for s in data["seeds"])
        except (TypeError, ValueError, AttributeError) as exc:
            raise broken(str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from None
        return cls(policies, envs, seeds, data["samples"], float(data["temperature"]), data["sampling_seed"],
                   data["concurrency"])

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
