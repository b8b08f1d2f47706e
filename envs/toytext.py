"""``ToyTextEnv``: any discrete Gymnasium toy-text env as a text env; ``FrozenLakeEnv`` and ``BlackjackEnv``.

Wrap your own toy-text env (``Discrete`` actions; ``Discrete`` or ``Tuple``-of-``Discrete``
observations) in a few lines: name its actions, and say when an episode counts as solved.

Example:
    >>> import agentgym
    >>> from agentgym.envs.toytext import ToyTextEnv
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

import functools
import pickle
import re
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Protocol

import gymnasium
import numpy as np
from gymnasium import spaces
from gymnasium.envs.toy_text.frozen_lake import FrozenLakeEnv as GymFrozenLakeEnv
from gymnasium.envs.toy_text.frozen_lake import generate_random_map

from agentgym.core import Env
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

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        options = dict(options or {})
        task_id = options.pop("task_id", None)
        if task_id is not None:
            task_seed = self.parse_task_id(task_id)
        else:
            task_seed = seed if seed is not None else int(self.np_random.integers(_SEED_BOUND))
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


# --- frozenlake-v0 -------------------------------------------------------------------------------

LAKE_ACTIONS: tuple[str, ...] = ("left", "down", "right", "up")
MIN_LAKE_SIZE, MAX_LAKE_SIZE = 2, 12
MIN_FROZEN_P = 0.6  # below this, valid maps get rare and generate_random_map retries for long
_LAKE_MOVES = ((0, -1), (1, 0), (0, 1), (-1, 0))  # in LAKE_ACTIONS order


@functools.lru_cache(maxsize=256)
def _lake_map(size: int, p: float, seed: int) -> tuple[str, ...]:
    # GRPO groups replay one map many times; generating it once per process is enough.
    return tuple(generate_random_map(size=size, p=p, seed=seed))


@functools.lru_cache(maxsize=256)
def _shortest_path_policy(desc: tuple[str, ...]) -> tuple[int, ...]:
    """Per square, the first action (``LAKE_ACTIONS`` order) of a shortest hole-free path to G (-1: none)."""
    rows, cols = len(desc), len(desc[0])
    goal = next((r, c) for r in range(rows) for c in range(cols) if desc[r][c] == "G")
    dist = {goal: 0}
    queue = deque([goal])
    while queue:
        r, c = queue.popleft()
        for dr, dc in _LAKE_MOVES:
            q = (r + dr, c + dc)
            if 0 <= q[0] < rows and 0 <= q[1] < cols and desc[q[0]][q[1]] != "H" and q not in dist:
                dist[q] = dist[(r, c)] + 1
                queue.append(q)
    policy = []
    for r in range(rows):
        for c in range(cols):
            here = dist.get((r, c))
            move = -1
            if here and desc[r][c] != "H":
                for a, (dr, dc) in enumerate(_LAKE_MOVES):
                    if dist.get((r + dr, c + dc)) == here - 1:
                        move = a
                        break
            policy.append(move)
    return tuple(policy)


@functools.lru_cache(maxsize=64)
def _value_iteration_policy(desc: tuple[str, ...], success_rate: float) -> tuple[int, ...]:
    """Greedy policy of value iteration on the slippery lake's known model (gamma 0.99).

    A discount below 1 breaks ties towards reaching the goal sooner: with gamma 1, an action that
    bumps into the edge forever would score as well as one that makes progress.
    """
    model = GymFrozenLakeEnv(desc=list(desc), is_slippery=True, success_rate=success_rate).P
    num_states, num_actions, gamma = len(model), len(LAKE_ACTIONS), 0.99
    width = max(len(model[s][a]) for s in range(num_states) for a in range(num_actions))
    prob = np.zeros((num_states, num_actions, width))
    succ = np.zeros((num_states, num_actions, width), dtype=np.int64)
    reward = np.zeros((num_states, num_actions, width))
    going_on = np.zeros((num_states, num_actions, width))
    for s in range(num_states):
        for a in range(num_actions):
            for k, (p, s2, r, done) in enumerate(model[s][a]):
                prob[s, a, k], succ[s, a, k], reward[s, a, k], going_on[s, a, k] = p, s2, r, not done
    value = np.zeros(num_states)
    for _ in range(100_000):
        q = (prob * (reward + gamma * going_on * value[succ])).sum(axis=2)
        new_value = q.max(axis=1)
        if np.max(np.abs(new_value - value)) < 1e-12:
            break
        value = new_value
    # The first action within 1e-9 of the best, so float noise cannot flip ties between machines.
    return tuple(int(np.flatnonzero(q[s] >= q[s].max() - 1e-9)[0]) for s in range(num_states))


def format_lake_name(size: int, p: float, is_slippery: bool) -> str:
    """The task-id prefix of a frozen-lake configuration.

    Example:
        >>> format_lake_name(4, 0.8, False)
        'frozenlake/size4/p0.8'
    """
    return f"frozenlake/size{size}/p{float(p)!r}" + ("/slippery" if is_slippery else "")


class FrozenLakeEnv(ToyTextEnv):
    """Cross a frozen lake without falling into a hole; each map is generated from the seed.

    The map (Gymnasium's ``generate_random_map(size, p, seed)``) is drawn as a grid: ``S`` start
    (top left), ``F`` frozen, ``H`` hole, ``G`` goal (bottom right) and ``P`` the agent. Reward 1.0
    on reaching the goal, 0.0 otherwise; falling into a hole ends the episode. Walking off the edge
    leaves the agent in place (a valid move). ``task_id``: ``"frozenlake/size4/p0.8/<seed>"``
    (``.../slippery/<seed>`` on slippery ice). Expert: a shortest hole-free path on firm ice, the
    value-iteration policy on the known transition model on slippery ice.

    Args:
        size: Squares per side, in ``[2, 12]``.
        p: Probability that a square is frozen (not a hole), in ``[0.6, 1.0]``.
        is_slippery: On slippery ice a move goes the chosen way with probability 1/3 and to either
            side otherwise (Gymnasium's rule).

    Raises:
        ConfigError: an argument is out of range.

    Example:
        >>> env = FrozenLakeEnv()
        >>> obs, info = env.reset(seed=3)
        >>> print(obs)
        PFHF
        FFFF
        FFFF
        FFFG
        You are at row 1, column 1.
        >>> info["state_key"], env.expert_action()
        ('frozenlake/size4/p0.8/3@0', 'down')
    """

    def __init__(self, size: int = 4, p: float = 0.8, is_slippery: bool = False) -> None:
        if (
            isinstance(size, bool)
            or not isinstance(size, (int, np.integer))
            or not MIN_LAKE_SIZE <= size <= MAX_LAKE_SIZE
        ):
            raise ConfigError(f"size must be an integer in [{MIN_LAKE_SIZE}, {MAX_LAKE_SIZE}], got {size!r}")
        if (
            isinstance(p, bool)
            or not isinstance(p, (int, float, np.integer, np.floating))
            or not MIN_FROZEN_P <= p <= 1.0  # also rejects NaN
        ):
            raise ConfigError(f"p must be a number in [{MIN_FROZEN_P}, 1.0], got {p!r}")
        if not isinstance(is_slippery, (bool, np.bool_)):
            raise ConfigError(f"is_slippery must be a bool, got {is_slippery!r}")
        self.size, self.p, self.is_slippery = int(size), float(p), bool(is_slippery)
        slip = (
            " The ice is slippery: you move the way you chose only 1 time in 3; otherwise you slide "
            "to one side of it (left or right of the chosen direction)." if self.is_slippery else ""
        )
        super().__init__(
            self._build,
            LAKE_ACTIONS,
            expert=self._expert_move,
            name=format_lake_name(self.size, self.p, self.is_slippery),
            instructions=(
                "You are crossing a frozen lake drawn as a grid of letters: S is the start, F frozen "
                "ice (safe), H a hole, G the goal and P you; row 1 is the top line. Each turn you "
                "move one square; moving off the edge leaves you where you are. Reach G without "
                f"falling into a hole.{slip} Answer with exactly one of: {', '.join(LAKE_ACTIONS)}."
            ),
        )

    def _build(self, seed: int) -> gymnasium.Env:
        desc = _lake_map(self.size, self.p, seed)
        return GymFrozenLakeEnv(desc=list(desc), is_slippery=self.is_slippery)

    def _desc(self) -> tuple[str, ...]:
        gym_env = self._gym
        return tuple(row.tobytes().decode() for row in gym_env.unwrapped.desc)  # type: ignore[attr-defined]

    def describe(self, obs: Any, *, terminated: bool) -> str:
        desc = self._desc()
        r, c = divmod(int(obs), len(desc[0]))
        rows = list(desc)
        rows[r] = rows[r][:c] + "P" + rows[r][c + 1 :]
        square = desc[r][c]
        if square == "H":
            where = "You fell into a hole."
        elif square == "G":
            where = "You reached the goal!"
        else:
            where = f"You are at row {r + 1}, column {c + 1}."
        return "\n".join(rows) + "\n" + where

    def _expert_move(self, gym_env: gymnasium.Env, obs: Any) -> int | None:
        desc = self._desc()
        if self.is_slippery:
            policy = _value_iteration_policy(desc, 1.0 / 3.0)
        else:
            policy = _shortest_path_policy(desc)
        move = policy[int(obs)]
        return None if move < 0 else move


# --- blackjack-v0 --------------------------------------------------------------------------------

BLACKJACK_ACTIONS: tuple[str, ...] = ("stick", "hit")


def basic_strategy(player_sum: int, dealer_card: int, usable_ace: bool) -> int:
    """Basic strategy for hit/stick only (dealer stands on all 17s, no doubling or splitting).

    Returns 1 (hit) or 0 (stick). ``dealer_card`` is the dealer's face-up card, 1 for an ace.

    Example:
        >>> basic_strategy(16, 10, False), basic_strategy(16, 6, False), basic_strategy(18, 9, True)
        (1, 0, 1)
    """
    dealer = 11 if dealer_card == 1 else dealer_card
    if usable_ace:
        if player_sum >= 19:
            return 0
        if player_sum == 18:
            return 0 if dealer <= 8 else 1
        return 1
    if player_sum >= 17:
        return 0
    if player_sum >= 13:
        return 0 if dealer <= 6 else 1
    if player_sum == 12:
        return 0 if 4 <= dealer <= 6 else 1
    return 1


def _cards(hand: Sequence[int]) -> str:
    return ", ".join("A" if card == 1 else str(card) for card in hand)


def _total(hand: Sequence[int]) -> tuple[int, bool]:
    total = sum(hand)
    if 1 in hand and total + 10 <= 21:
        return total + 10, True
    return total, False


class BlackjackEnv(ToyTextEnv):
    """Blackjack against a dealer who stands on 17 (Gymnasium's ``Blackjack-v1``, ``natural=False``).

    Cards are drawn with replacement from an infinite deck decided by the seed; face cards count
    10, an ace 1 or 11. Say ``hit`` to draw a card or ``stick`` to stop; the dealer then draws to
    17 or more. Reward +1 win, 0 draw, -1 loss (going over 21 loses at once); success = a win.
    ``task_id``: ``"blackjack/<seed>"``. Expert: the basic-strategy table (``basic_strategy``).

    Example:
        >>> env = BlackjackEnv()
        >>> obs, info = env.reset(seed=1)
        >>> print(obs)
        Your cards: 10, 10 (total 20).
        The dealer shows 7; their other card is face down.
        >>> env.expert_action()
        'stick'
    """

    def __init__(self) -> None:
        super().__init__(
            "Blackjack-v1",
            BLACKJACK_ACTIONS,
            gym_kwargs={"natural": False, "sab": False},
            expert=lambda gym_env, obs: basic_strategy(*obs),
            name="blackjack",
            instructions=(
                "You are playing blackjack against a dealer. Cards count their number, face cards "
                "(J, Q, K) count 10 and an ace counts 1 or 11, whichever is better. Get closer to 21 "
                "than the dealer without going over: say hit to take another card or stick to stop; "
                "then the dealer draws until reaching 17 or more. Going over 21 loses at once. "
                "Answer with exactly one of: stick, hit."
            ),
        )

    def describe(self, obs: Any, *, terminated: bool) -> str:
        game = self._gym.unwrapped
        player, dealer = list(game.player), list(game.dealer)  # type: ignore[attr-defined]
        total, soft = _total(player)
        note = " (bust)" if total > 21 else (", counting an ace as 11" if soft else "")
        lines = [f"Your cards: {_cards(player)} (total {total}{note})."]
        if terminated:
            dealer_total, _ = _total(dealer)
            lines.append(f"The dealer's cards: {_cards(dealer)} (total {dealer_total}).")
        else:
            lines.append(f"The dealer shows {_cards(dealer[:1])}; their other card is face down.")
        return "\n".join(lines)
