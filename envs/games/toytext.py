"""``ToyTextEnv``: any discrete Gymnasium toy-text env as a text env (``frozenlake-v0`` and
``blackjack-v0`` use it).

Wrap your own toy-text env (``Discrete`` actions; ``Discrete`` or ``Tuple``-of-``Discrete``
observations) in a few lines: name its actions, and say when an episode counts as solved.

Example:
    >>> import agentgym
    >>> from agentgym.envs.games.toytext import ToyTextEnv
    >>> def make_cliff() -> ToyTextEnv:
    ...     return ToyTextEnv(
    ...         "CliffWalking-v1",
    ...         ["up", "right", "down", "left"],
    ...         success=lambda reward, terminated: terminated,  # every step costs -1; the goal ends it
    ...     )
    >>> spec = agentgym.register("doc/cliff-v0", make_cliff, max_turns=40, override=True)
    >>> env = agentgym.make("doc/cliff-v0")
    >>> obs, info = env.reset(seed=0)
    >>> info["task_id"], info["state_key"]
    ('cliffwalking-v1/0', 'cliffwalking-v1/0@36')
    >>> obs, reward, terminated, truncated, info = env.step("Up")
    >>> reward, info["state_key"]
    (-1.0, 'cliffwalking-v1/0@24')
    >>> env.step("jump")[4]["invalid_action"]
    True

Pass ``observe=`` to describe the state in your own words (the default shows the env's ``ansi``
rendering), ``expert=`` to give it a solver, and ``instructions=`` to explain the game.
"""

from __future__ import annotations

import pickle
import re
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Protocol

import gymnasium
import numpy as np
from gymnasium import spaces

from agentgym.core import Env, TaskSplit
from agentgym.errors import ConfigError
from agentgym.snapshot import pack_snapshot, unpack_snapshot

# A valid action is a short word or number; longer strings are echoed only in part.
_ECHO_CHARS = 20
_MAX_ACTION_CHARS = 64
_SEED_BOUND = 2**63
# ``colorize(..., highlight=True)`` wraps a square in an SGR code and a reset; we keep the square.
_HIGHLIGHT_RE = re.compile(r"\x1b\[[0-9;]*m(.*?)\x1b\[0m", re.DOTALL)
_ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_DIGITS_RE = re.compile(r"[0-9]{1,4}")


class GymFactory(Protocol):
    """Builds the Gymnasium env of one task.

    Called with the task seed at every ``reset`` (before the env's own ``reset(seed=...)``), so a
    factory can generate the task from it (a map, say) or ignore it. Must return an env with a
    ``Discrete`` action space.
    """

    def __call__(self, seed: int, /) -> gymnasium.Env: ...


class Observer(Protocol):
    """Turns ``(gym_env, observation)`` into the text the agent reads. Must be deterministic."""

    def __call__(self, env: gymnasium.Env, obs: Any, /) -> str: ...


class StateKey(Protocol):
    """Names the state ``(gym_env, observation)`` within its task; the adapter prefixes the task id.

    Must not contain step counters or history (see ``agentgym.core.Env``).
    """

    def __call__(self, env: gymnasium.Env, obs: Any, /) -> str: ...


class Expert(Protocol):
    """The expert's action index in ``(gym_env, observation)``, or ``None`` where it has none."""

    def __call__(self, env: gymnasium.Env, obs: Any, /) -> int | None: ...


class Success(Protocol):
    """Whether a step with this reward that ended the episode (``terminated``) solved the task."""

    def __call__(self, reward: float, terminated: bool, /) -> bool: ...


def to_builtin(obs: Any) -> Any:
    """A toy-text observation with NumPy scalars turned into Python ones (stable ``repr``).

    Example:
        >>> to_builtin((np.int64(14), np.int64(10), np.int64(0)))
        (14, 10, 0)
    """
    if isinstance(obs, (tuple, list)):
        return tuple(to_builtin(x) for x in obs)
    if isinstance(obs, np.generic):
        return obs.item()
    return obs


def strip_ansi(rendering: str) -> str:
    """An ``ansi`` rendering without escape codes; highlighted squares are kept inside ``[...]``.

    Example:
        >>> strip_ansi("\\n\\x1b[41mS\\x1b[0mFF\\nFHG\\n")
        '[S]FF\\nFHG'
    """
    text = _HIGHLIGHT_RE.sub(lambda m: f"[{m.group(1)}]", rendering)
    return _ANSI_RE.sub("", text).strip("\n").rstrip()


def default_observe(env: gymnasium.Env, obs: Any) -> str:
    """The env's ``ansi`` rendering (when it has one) and the raw observation in a sentence."""
    lines = []
    if getattr(env, "render_mode", None) == "ansi":
        rendering = env.render()
        if isinstance(rendering, str) and rendering.strip():
            lines.append(strip_ansi(rendering))
    lines.append(f"Observation: {to_builtin(obs)!r}.")
    return "\n".join(lines)


def default_state_key(env: gymnasium.Env, obs: Any) -> str:
    """``repr`` of the raw discrete observation (a complete state for toy-text envs)."""
    return repr(to_builtin(obs))


def default_success(reward: float, terminated: bool) -> bool:
    """Solved when the episode terminated on a positive reward."""
    return terminated and reward > 0


def _check_discrete(space: Any) -> bool:
    if isinstance(space, spaces.Discrete):
        return True
    return isinstance(space, spaces.Tuple) and all(isinstance(s, spaces.Discrete) for s in space.spaces)


def _render_modes(env_id: str) -> list[str]:
    from gymnasium.envs.registration import load_env_creator

    entry = gymnasium.spec(env_id).entry_point
    creator = load_env_creator(entry) if isinstance(entry, str) else entry
    return list(getattr(creator, "metadata", {}).get("render_modes", []))


class ToyTextEnv(Env):
    """A discrete Gymnasium toy-text env played in text: actions are words, states are described.

    Each episode plays one task: the inner env is (re)built by the factory and reset with the task
    seed, so the seed decides everything. ``info["task_id"]`` is ``"<name>/<seed>"``;
    ``reset(options={"task_id": ...})`` plays it again. An action is one of ``action_names``
    (any case) or its index (``"0"``, ``"1"``...); anything else sets ``info["invalid_action"]``
    and leaves the state unchanged. Rewards, ``terminated`` and ``truncated`` are the inner env's.
    Every action is always admissible (toy-text envs accept them all).

    Snapshots pickle the inner env together with its ``np_random``; they are on when the inner env
    pickles (checked at construction) and ``snapshot`` is true.

    Args:
        env: A Gymnasium env id (made once, with ``render_mode="ansi"`` when the env has it, and
            reused) or a ``GymFactory`` called with the task seed at every reset.
        action_names: One word per discrete action, in action order.
        observe: Describes a state in text (default: the ``ansi`` rendering and the raw observation).
        state_key: Names a state within its task (default: ``repr`` of the raw observation).
        expert: Chooses the expert's action (default: no expert).
        success: Decides whether an episode that ended was solved (default: positive reward).
        instructions: System text for the agent (default: lists the actions).
        name: Prefix of task ids (default: the lower-cased env id; ``"toytext"`` for factories).
        gym_kwargs: Extra arguments of ``gymnasium.make`` (only with an env id).
        snapshot: Offer ``snapshot``/``restore`` when the inner env pickles.

    Raises:
        ConfigError: an argument is invalid; the message names it.

    Example:
        >>> env = ToyTextEnv("FrozenLake-v1", ["left", "down", "right", "up"],
        ...                  gym_kwargs={"is_slippery": False})
        >>> obs, info = env.reset(seed=3)
        >>> print(obs)
        [S]FFF
        FHFH
        FFFH
        HFFG
        Observation: 0.
        >>> print(env.step("down")[0])
        You chose down.
          (Down)
        SFFF
        [F]HFH
        FFFH
        HFFG
        Observation: 4.
    """

    supports_snapshot: ClassVar[bool] = False
    has_expert: ClassVar[bool] = False

    def __init__(
        self,
        env: str | GymFactory,
        action_names: Sequence[str],
        *,
        observe: Observer | None = None,
        state_key: StateKey | None = None,
        expert: Expert | None = None,
        success: Success | None = None,
        instructions: str | None = None,
        name: str | None = None,
        gym_kwargs: Mapping[str, Any] | None = None,
        snapshot: bool = True,
    ) -> None:
        names = self._check_action_names(action_names)
        plugs = {"observe": observe, "state_key": state_key, "expert": expert, "success": success}
        for arg, value in plugs.items():
            if value is not None and not callable(value):
                raise ConfigError(f"{arg} must be a callable or None, got {value!r}")
        if gym_kwargs is not None and not isinstance(gym_kwargs, Mapping):
            raise ConfigError(f"gym_kwargs must be a mapping or None, got {gym_kwargs!r}")
        self._shared: gymnasium.Env | None = None
        if isinstance(env, str):
            self._shared = self._make_gym(env, dict(gym_kwargs or {}))
            self._factory: GymFactory | None = None
            default_name = env.lower()
            probe = self._shared
        elif callable(env):
            if gym_kwargs:
                raise ConfigError("gym_kwargs only applies when env is a Gymnasium id; pass the "
                                  "arguments to your factory instead")
            self._factory = env
            default_name = "toytext"
            probe = self._call_factory(0)
        else:
            raise ConfigError(
                f"env must be a Gymnasium env id or a factory(seed) -> gymnasium.Env, got {env!r}"
            )
        if name is None:
            name = default_name
        if not isinstance(name, str) or not name or any(ch.isspace() or ch == "@" for ch in name):
            raise ConfigError(f"name must be a non-empty string without spaces or '@', got {name!r}")
        if not isinstance(probe.action_space, spaces.Discrete):
            raise ConfigError(f"env must have a Discrete action space, got {probe.action_space}")
        if int(probe.action_space.n) != len(names):
            raise ConfigError(
                f"action_names has {len(names)} names but the env has {int(probe.action_space.n)} "
                "actions; name each action, in action order"
            )
        if not _check_discrete(probe.observation_space):
            raise ConfigError(
                "env must have a Discrete (or Tuple of Discrete) observation space, got "
                f"{probe.observation_space}"
            )
        self.name = name
        self.action_names: tuple[str, ...] = names
        self._action_index = {n.lower(): i for i, n in enumerate(names)}
        self._observe: Observer = observe or default_observe
        self._state_key: StateKey = state_key or default_state_key
        self._expert = expert
        self._success: Success = success or default_success
        listed = ", ".join(names)
        shows_ansi = observe is None and getattr(probe, "render_mode", None) == "ansi"
        self.instructions = instructions or (
            f"You are playing {name}. Each turn, answer with exactly one action: {listed} "
            f"(or its number, 0 to {len(names) - 1})."
            + (" Squares in [brackets] are highlighted (usually your position)." if shows_ansi else "")
        )
        self.has_expert = expert is not None  # type: ignore[misc]
        self.supports_snapshot = bool(snapshot) and self._pickles(probe)  # type: ignore[misc]
        if self._factory is not None:
            probe.close()
        self._gym: gymnasium.Env | None = None
        self._task_id = ""
        self._obs: Any = None
        self._over = False

    # --- task ids --------------------------------------------------------------------------------

    def format_task_id(self, seed: int) -> str:
        """The task id of the task played with ``seed``: ``"<name>/<seed>"``."""
        return f"{self.name}/{seed}"

    def parse_task_id(self, task_id: Any) -> int:
        """The seed named by a task id of this env.

        Raises:
            ConfigError: ``task_id`` is not ``"<name>/<seed>"`` for this env's ``name``.
        """
        prefix = f"{self.name}/"
        seed_text = task_id[len(prefix):] if isinstance(task_id, str) and task_id.startswith(prefix) else ""
        if not re.fullmatch(r"0|[1-9][0-9]*", seed_text):
            raise ConfigError(
                f"task_id {task_id!r} is not a task of this env: expected '{prefix}<seed>', e.g. "
                f"'{prefix}0' (envs made with other arguments have other task ids)"
            )
        return int(seed_text)

    # --- the episode -----------------------------------------------------------------------------

    def choose_task(self, seed: int | None) -> int:
        """The task seed: the seed itself (drawn from ``np_random`` when there is none)."""
        return self.seed_or_draw(seed, _SEED_BOUND)

    def start_task(self, task: int, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        task_seed = task
        # The other options are the Gymnasium env's own.
        options = {key: value for key, value in options.items() if key != "task_id"}
        if self._shared is not None:
            gym_env = self._shared
        else:
            if self._gym is not None:
                self._gym.close()
            gym_env = self._call_factory(task_seed)
        obs, _ = gym_env.reset(seed=task_seed, options=options or None)
        self._gym, self._obs, self._over = gym_env, to_builtin(obs), False
        self._task_id = self.format_task_id(task_seed)
        info = self._info(invalid=False, success=False)
        info["instructions"] = self.instructions
        return self.describe(self._obs, terminated=False), info

    def describe_task(self, split: TaskSplit, index: int) -> dict[str, Any]:
        """A seeded task: the underlying Gymnasium env reset with the seed."""
        seed = int(split.seed_of(index))  # type: ignore[arg-type]
        return {"task_id": self.format_task_id(seed), "description": f"{self.name} reset with seed {seed}"}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        gym_env = self._gym
        index = self.parse_action(action)
        if index is None:
            text = action.strip() if isinstance(action, str) else ""
            shown = text if len(text) <= _ECHO_CHARS else text[:_ECHO_CHARS] + "..."
            message = f"Unknown action {shown!r}. Valid actions: {', '.join(self.action_names)}."
            body = self.describe(self._obs, terminated=False)
            return f"{message}\n{body}", 0.0, False, False, self._info(invalid=True, success=False)
        obs, reward, terminated, truncated, _ = gym_env.step(index)
        reward, terminated, truncated = float(reward), bool(terminated), bool(truncated)
        self._obs, self._over = to_builtin(obs), terminated or truncated
        solved = terminated and bool(self._success(reward, terminated))
        lines = [f"You chose {self.action_names[index]}."]
        lines.append(self.describe(self._obs, terminated=terminated))
        if terminated:
            lines.append(f"The episode is over (reward {reward:g}).")
        return "\n".join(lines), reward, terminated, truncated, self._info(invalid=False, success=solved)

    def parse_action(self, action: Any) -> int | None:
        """The action index named by ``action`` (a name in any case, or an index), or ``None``."""
        if not isinstance(action, str) or len(action) > _MAX_ACTION_CHARS:
            return None
        text = action.strip().lower()
        index = self._action_index.get(text)
        if index is None and _DIGITS_RE.fullmatch(text) and int(text) < len(self.action_names):
            index = int(text)
        return index

    def describe(self, obs: Any, *, terminated: bool) -> str:
        """The text of state ``obs``; subclasses may override (``terminated``: the episode just ended)."""
        return self._observe(self._gym, obs)

    def expert_action(self) -> str | None:
        """The expert's action, or ``None`` without an expert or after the episode ended."""
        gym_env = self._gym
        if self._expert is None or self._over:
            return None
        index = self._expert(gym_env, self._obs)
        return None if index is None else self.action_names[int(index)]

    def snapshot(self) -> bytes:
        """The inner env (with its ``np_random``), the task and ``np_random`` as pickled bytes."""
        gym_env = self._gym
        fields = {"name": self.name, "gym": gym_env, "task_id": self._task_id}
        return pack_snapshot(self, {**fields, "obs": self._obs, "over": self._over})

    def restore(self, data: bytes) -> None:
        """Reinstate a ``snapshot`` (trusted bytes only: pickle); works on a never-reset instance."""
        state = unpack_snapshot(self, data, expect={"name": self.name})
        gym_env = state["gym"]
        if self._shared is not None:
            self._shared = gym_env
        self._gym, self._obs, self._over = gym_env, state["obs"], state["over"]
        self._task_id = state["task_id"]

    def render(self) -> str | None:
        """The text of the current state, or ``None`` before the first reset."""
        return None if self._gym is None else self.describe(self._obs, terminated=self._over)

    def close(self) -> None:
        for gym_env in {id(e): e for e in (self._gym, self._shared) if e is not None}.values():
            gym_env.close()

    @property
    def gym_env(self) -> gymnasium.Env | None:
        """The inner Gymnasium env of the current episode (``None`` before the first reset)."""
        return self._gym

    # --- helpers ---------------------------------------------------------------------------------

    @staticmethod
    def _check_action_names(action_names: Any) -> tuple[str, ...]:
        if isinstance(action_names, str) or not isinstance(action_names, Sequence) or not action_names:
            raise ConfigError(f"action_names must be a non-empty list of words, got {action_names!r}")
        names = tuple(action_names)
        for n in names:
            if not isinstance(n, str) or not n.strip() or n != n.strip() or _DIGITS_RE.fullmatch(n):
                raise ConfigError(f"action_names must be words without surrounding spaces, got {n!r}")
        if len({n.lower() for n in names}) != len(names):
            raise ConfigError(f"action_names must differ (ignoring case), got {list(names)}")
        return names

    @staticmethod
    def _make_gym(env_id: str, kwargs: dict[str, Any]) -> gymnasium.Env:
        try:
            if "render_mode" not in kwargs and "ansi" in _render_modes(env_id):
                kwargs["render_mode"] = "ansi"
            return gymnasium.make(env_id, disable_env_checker=True, **kwargs)
        except gymnasium.error.Error as exc:
            raise ConfigError(f"env {env_id!r} could not be made by gymnasium.make: {exc}") from None
        except TypeError as exc:
            raise ConfigError(f"gym_kwargs {sorted(kwargs)} rejected by {env_id!r}: {exc}") from None

    def _call_factory(self, seed: int) -> gymnasium.Env:
        assert self._factory is not None
        built = self._factory(seed)
        if not isinstance(built, gymnasium.Env):
            raise ConfigError(f"env factory returned {type(built).__name__}, not a gymnasium.Env")
        return built

    @staticmethod
    def _pickles(gym_env: gymnasium.Env) -> bool:
        try:
            pickle.dumps(gym_env, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:  # noqa: BLE001 - any failure means "fork by replay instead"
            return False
        return True

    def _info(self, *, invalid: bool, success: bool) -> dict[str, Any]:
        gym_env = self._gym
        return {
            "state_key": f"{self._task_id}@{self._state_key(gym_env, self._obs)}",
            "task_id": self._task_id,
            "admissible_actions": list(self.action_names),
            "invalid_action": invalid,
            "success": success,
        }
