"""The algorithm plug-in: ``Algorithm``, ``register_algorithm``, ``get_algorithm``, ``list_algorithms``.

An algorithm is a name plus an advantage estimator with one signature for all,
``estimator(groups, args) -> advantages`` (one float per turn, order group → trajectory → turn),
and a dataclass of arguments with defaults. Built-ins live in ``agentgym.trainers``; third-party
packages register through the entry-point group ``agentgym.trainers``.
"""

from __future__ import annotations

import dataclasses
import difflib
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, get_type_hints

import numpy as np

from agentgym.errors import ConfigError, RegistryError
from agentgym.plugins import load_plugins
from agentgym.rollout.records import EpisodeGroup

ENTRY_POINT_GROUP = "agentgym.trainers"


class AdvantageEstimator(Protocol):
    """Contract of every estimator.

    Args:
        groups: the batch; each group's trajectories share a task and seed.
        args: the algorithm's argument dataclass.

    Returns:
        float64 array of shape (num_turns,): one advantage per turn, in the order of
        ``[turn for g in groups for t in g.trajectories for turn in t.turns]``. The trainer
        broadcasts it to that turn's response tokens. Pure function of the records: no model, no env.
    """

    def __call__(self, groups: Sequence[EpisodeGroup], args: Any) -> np.ndarray: ...


@dataclass(frozen=True)
class Algorithm:
    """A registered algorithm."""

    name: str
    """Registry key, config value and metric prefix (lowercase paper acronym)."""
    estimator: AdvantageEstimator
    """Per-turn advantages from the records."""
    args_type: type
    """Dataclass of the algorithm's arguments; every field has a default and a docstring."""
    description: str = ""
    """One line for listings."""

    def make_args(self, values: Mapping[str, Any] | None = None) -> Any:
        """Build validated arguments; unknown fields raise ``ConfigError`` naming the valid ones."""
        values = dict(values or {})
        fields = {f.name: f for f in dataclasses.fields(self.args_type)}
        unknown = sorted(set(values) - set(fields))
        if unknown:
            hints = [difflib.get_close_matches(u, fields, n=1) for u in unknown]
            suggestion = "; ".join(f"{u!r} (did you mean {h[0]!r}?)" if h else repr(u) for u, h in zip(unknown, hints))
            raise ConfigError(
                f"algorithm {self.name!r} has no argument {suggestion}; valid: {', '.join(sorted(fields))}"
            )
        types = get_type_hints(self.args_type)
        for name, value in values.items():
            expected = types[name]
            if expected is float and isinstance(value, int) and not isinstance(value, bool):
                values[name] = float(value)
            elif expected in (float, int, bool, str) and not isinstance(values[name], expected):
                raise ConfigError(
                    f"algorithm.{name} must be {expected.__name__}, got {value!r} ({type(value).__name__})"
                )
        return self.args_type(**values)


class _AlgorithmRegistry:
    def __init__(self) -> None:
        self._algorithms: dict[str, Algorithm] = {}
        self._lock = threading.RLock()
        self._plugins_loaded = False

    def register(self, algorithm: Algorithm, *, override: bool = False) -> Algorithm:
        with self._lock:
            existing = self._algorithms.get(algorithm.name)
            if existing is not None and not override and not _same_code(existing, algorithm):
                raise RegistryError(f"algorithm {algorithm.name!r} is already registered; pass override=True")
            self._algorithms[algorithm.name] = algorithm
        return algorithm

    def get(self, name: str) -> Algorithm:
        self._load_plugins()
        found = self._algorithms.get(name)
        if found is None:
            close = difflib.get_close_matches(name, list(self._algorithms), n=3, cutoff=0.4)
            hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
            raise RegistryError(
                f"no algorithm named {name!r}.{hint} Registered: {', '.join(sorted(self._algorithms))}"
            )
        return found

    def all(self) -> list[Algorithm]:
        self._load_plugins()
        return sorted(self._algorithms.values(), key=lambda a: a.name)

    def _load_plugins(self) -> None:
        if self._plugins_loaded:
            return
        with self._lock:
            if self._plugins_loaded:
                return
            self._plugins_loaded = True
            load_plugins("agentgym.trainers", ENTRY_POINT_GROUP)


def _same_code(a: Algorithm, b: Algorithm) -> bool:
    """The same module imported under two names (``agentgym.trainers.x`` and ``trainers.x`` by
    doctest collection) registers twice; that is not a conflict."""
    return (a.estimator.__qualname__, a.args_type.__qualname__, a.estimator.__module__.rsplit(".", 1)[-1]) == (
        b.estimator.__qualname__, b.args_type.__qualname__, b.estimator.__module__.rsplit(".", 1)[-1])


_registry = _AlgorithmRegistry()


def register_algorithm(name: str, estimator: AdvantageEstimator, args_type: type, *, description: str = "",
                       override: bool = False) -> Algorithm:
    """Register an algorithm under ``name``."""
    return _registry.register(Algorithm(name, estimator, args_type, description), override=override)


def get_algorithm(name: str) -> Algorithm:
    """Look up an algorithm; unknown names raise with suggestions and the registered names."""
    return _registry.get(name)


def list_algorithms() -> list[Algorithm]:
    """Every registered algorithm, sorted by name."""
    return _registry.all()


def estimator_for(name: str) -> Callable[[Sequence[EpisodeGroup], Any], np.ndarray]:
    """The estimator of a registered algorithm (shortcut for ``get_algorithm(name).estimator``)."""
    return get_algorithm(name).estimator
