"""The text-environment contract: ``Env`` (the base class), the ``info`` keys it speaks and ``TaskSplit``.

Changed in v0.1: first version of the contract.
"""

from __future__ import annotations

import functools
import string
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import gymnasium
import numpy as np
from gymnasium import spaces

from agentgym.errors import ConfigError, EnvContractError

#: Keys an env may put in ``info``; ``state_key`` is required on every reset and step.
INFO_KEYS: dict[str, str] = {
    "state_key": "str, required: canonical id of the environment state (no counters, no history)",
    "task_id": "str: which task this episode plays (set on reset; echoed on every step)",
    "admissible_actions": "list[str]: the actions the env would accept now, where it knows them",
    "invalid_action": "bool: the last action could not be parsed or applied",
    "success": "bool: the episode ended with the task solved (distinct from reward)",
    "answer": "privileged ground truth: trainers may read it, prompts must never show it",
    "tools": "list[dict]: JSON-schema tool specs in OpenAI function format",
    "instructions": "str: system text placed before the first observation",
    "task_ref": "dict: {'split': str, 'index': int} when reset was given options split and index",
}

#: Task seeds from here on are held out: training draws its task seeds below it and evaluations start
#: here. Seeded envs' ``train`` split is the seeds below it and their ``test`` split the seeds from it.
HELD_OUT_SEED_START = 1_000_000

#: The ``reset`` options that name a task by split and index (``Env.task``).
TASK_OPTIONS = ("split", "index")


@dataclass(frozen=True)
class TaskSplit:
    """A named, ordered set of tasks of one env: task ``index`` of it is ``Env.task(name, index)``.

    Example:
        >>> split = TaskSplit("test", None, "held-out seeds", first_seed=HELD_OUT_SEED_START)
        >>> split.procedural, split.seed_of(3)
        (True, 1000003)
    """

    name: str
    """What ``reset(options={"split": name, ...})`` and ``task(name, index)`` call it."""
    size: int | None
    """How many tasks it has (indices ``0..size-1``); ``None``: procedural and unbounded, every index
    ``>= 0`` is a task."""
    description: str
    """One line for people: where its tasks come from."""
    first_seed: int | None = None
    """Seeded splits: task ``index`` is the episode of seed ``first_seed + index``. ``None``: the split's
    tasks are named (``Env.task`` gives each one's ``task_id``)."""

    @property
    def procedural(self) -> bool:
        """True when the split is unbounded (``size is None``)."""
        return self.size is None

    def seed_of(self, index: int) -> int | None:
        """The seed of task ``index`` of a seeded split, ``None`` for a split of named tasks."""
        return None if self.first_seed is None else self.first_seed + index

    def describe_range(self) -> str:
        """The valid indices in words: ``"0..139"`` or ``"any integer >= 0"``."""
        return "any integer >= 0" if self.size is None else f"0..{self.size - 1}"


#: The splits of an env whose tasks are its seeds (the default of ``Env.task_splits``): disjoint seed
#: ranges, so what training sees (``train``) never overlaps what evaluations measure (``test``).
SEEDED_SPLITS: tuple[TaskSplit, ...] = (
    TaskSplit("train", HELD_OUT_SEED_START, f"seeds 0..{HELD_OUT_SEED_START - 1}: the seeds training draws",
              first_seed=0),
    TaskSplit("test", None, f"held-out seeds from {HELD_OUT_SEED_START} on (task i is seed "
              f"{HELD_OUT_SEED_START} + i): the seeds evaluations use", first_seed=HELD_OUT_SEED_START),
)

#: The largest observation/action string the spaces admit (characters).
MAX_TEXT_CHARS = 1_000_000

#: Characters ``TextSpace.sample`` draws from: printable ASCII, newline included.
SAMPLE_CHARS = string.ascii_letters + string.digits + string.punctuation + " \n"


class TextSpace(spaces.Text):
    """A ``gymnasium.spaces.Text`` that contains *every* ``str`` of ``min_length..max_length`` characters.

    ``spaces.Text`` admits only its charset (alphanumeric by default), so a maze map with ``#``
    and newlines would not be "in" the space and Gymnasium's checker would reject every env. Here
    membership is any Unicode text within the length bounds; sampling, which has to draw from a
    finite charset, draws ``SAMPLE_CHARS`` strings of at most ``sample_max_length`` characters
    (an action of a million random characters is no more useful than one of 32, and much slower).

    Args:
        max_length: Longest string in the space.
        min_length: Shortest string in the space.
        sample_max_length: Longest string ``sample`` returns (capped at ``max_length``).
        seed: Seed of the space's own sampling generator.

    Example:
        >>> space = TextSpace(seed=0)
        >>> "#..#\\n#@ #  ünïcode ✓" in space, 42 in space
        (True, False)
        >>> sample = space.sample()
        >>> isinstance(sample, str) and len(sample) <= 32 and sample in space
        True
    """

    def __init__(
        self,
        max_length: int = MAX_TEXT_CHARS,
        *,
        min_length: int = 0,
        sample_max_length: int = 32,
        seed: int | np.random.Generator | None = None,
    ) -> None:
        super().__init__(max_length, min_length=min_length, charset=SAMPLE_CHARS, seed=seed)
        self.sample_max_length = max(self.min_length, min(int(sample_max_length), self.max_length))

    def contains(self, x: Any) -> bool:
        """Any ``str`` whose length is within the bounds, whatever its characters."""
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        """A random printable string; the length defaults to ``min_length..sample_max_length``.

        ``mask``/``probability`` work as for ``spaces.Text`` (over ``SAMPLE_CHARS``).
        """
        given = mask if mask is not None else probability
        length, chars = given if given is not None else (None, None)
        if length is None:
            length = int(self.np_random.integers(self.min_length, self.sample_max_length + 1))
        if probability is not None:
            return super().sample(probability=(length, chars))
        return super().sample(mask=(length, chars))

    @property
    def is_np_flattenable(self) -> bool:
        """False: flattening indexes characters in the charset, and the space holds any character."""
        return False

    def __repr__(self) -> str:
        return f"TextSpace({self.min_length}, {self.max_length}, sample_max_length={self.sample_max_length})"


def text_space() -> TextSpace:
    """The space of every observation and action: any ``str`` up to ``MAX_TEXT_CHARS`` characters."""
    return TextSpace(MAX_TEXT_CHARS)


def _resolving_task_options(reset: Callable[..., tuple[str, dict[str, Any]]]) -> Callable[..., Any]:
    """``reset`` that first turns options ``split``/``index`` into a seed or ``task_id`` (see ``Env``)."""

    @functools.wraps(reset)
    def reset_task(
        self: Env, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        if not self.resolves_tasks or not isinstance(options, dict):
            return reset(self, seed=seed, options=options)
        seed, options, task = self.resolve_task_options(seed, options)
        obs, info = reset(self, seed=seed, options=options)
        if task is not None and isinstance(info, dict):
            info["task_ref"] = task
        return obs, info

    return reset_task


class Env(gymnasium.Env[str, str]):
    """A text environment: observations and actions are strings.

    Subclasses MUST implement:

    - the start of an episode, in one of two ways. Either the three hooks that ``Env.reset`` calls:
      ``choose_task(seed)`` (with only a seed, the env picks the task from it, drawing from the already
      seeded ``self.np_random``), ``parse_task_id(task_id)`` (``options["task_id"]`` picks a named task
      explicitly) and ``start_task(task, options) -> (observation, info)``; or
      ``reset(*, seed=None, options=None) -> (observation, info)`` itself, calling
      ``super().reset(seed=seed)`` first so ``self.np_random`` is seeded.
    - ``step(action) -> (observation, reward, terminated, truncated, info)``.
      ``terminated`` means the episode reached a terminal state of the task (solved, failed, lost);
      ``truncated`` means it was cut short from outside the task — by the turn budget
      (``EnvSpec.max_turns``, applied by the wrapper ``make`` adds) or by the env's own limit.
      An action the env cannot parse or apply is *not* an exception: return an observation that
      explains why and ``info["invalid_action"] = True``.

    Subclasses MUST honour:

    - **Determinism.** The same ``seed`` + ``options`` + action sequence gives identical
      observations, rewards and infos. Use ``self.np_random`` for every random choice.
    - **``info["state_key"]``** on every reset and step: a string naming the environment state the
      agent is in — not the rendered prompt, no step counter, no history. Two trajectories that
      reach the same state must produce the same key (GiGPO's anchor groups rely on it).
    - **JSON-safe infos.** Every ``info`` value must survive ``json.dumps`` (the HTTP service sends it).

    Subclasses MAY provide (see ``INFO_KEYS`` for the optional ``info`` keys):

    - ``expert_action() -> str | None``: the action an expert (solver, planner, walkthrough) takes in
      the current state, or ``None`` where it has none. Used for SFT demos and as a baseline. Defining it
      is what declares the expert: ``has_expert`` becomes True for that class and its subclasses, and
      ``agentgym check`` runs the expert gates on it.
    - ``snapshot() -> bytes`` and ``restore(data)``: capture and reinstate the *whole* episode state,
      including ``self.np_random``. Set ``supports_snapshot = True`` when both exist. Without them,
      ``EpisodeGuard.fork`` (``agentgym.guard``) forks by deterministic replay (reset with the same seed
      and options, replay the actions); both paths must give identical continuations.
    - ``render() -> str | None``: the current state as text (``None`` before the first reset).
      ``metadata`` declares the ``"ansi"`` mode, which Gymnasium's checker holds to a str after a
      reset; an env without a rendering should set ``metadata = {"render_modes": []}``.
    - ``close()``: release resources. Must be idempotent.

    **Tasks.** Every env says which task splits it has and can start task ``i`` of a split:

    - ``task_splits() -> tuple[TaskSplit, ...]``: the env's splits. The default suits an env whose tasks
      are its seeds (``SEEDED_SPLITS``): ``train`` is seeds ``0..HELD_OUT_SEED_START - 1`` (the seeds
      training draws) and ``test`` the procedural, unbounded held-out seeds from ``HELD_OUT_SEED_START``
      on (where evaluations start), task ``i`` being seed ``first_seed + i``. An env of named tasks
      (a question file, a problem set, a folder of games) overrides it with splits whose
      ``first_seed`` is ``None``, and overrides ``describe_task`` to name each task.
    - ``task(split, index) -> dict``: task ``index`` of ``split`` described without starting it, as
      JSON-safe data: ``split``, ``index``, ``task_id`` (what ``info["task_id"]`` will say; ``None``
      only where the env cannot name a task without playing it), ``seed`` for seeded splits and a
      short ``description`` where cheap. Subclasses override ``describe_task``, not ``task``.
    - ``reset(options={"split": s, "index": i})`` starts that task: the same split and index always
      start the same task, whatever ``seed`` says (a seeded split's task *is* its seed; a named
      task is reset with ``options["task_id"]`` and seed ``i``). ``info["task_ref"]`` records
      ``{"split": s, "index": i}`` (named so because envs use ``info["task"]`` for their own ends:
      ALFWorld's goal sentence). An unknown split, an index out of range, only one of the two
      options, or both of them with ``task_id`` raise ``ConfigError`` naming the valid choices.
      Subclasses write nothing for this: ``Env`` wraps its own ``reset`` and every subclass's (in
      ``__init_subclass__``) so the options reach it, and the task hooks, already turned into a seed
      or a ``task_id``.
      An env that passes options on to another process (a remote env) sets
      ``resolves_tasks = False`` and the other side resolves them.

    Subclasses need not check call order: ``agentgym.make`` wraps every env in an ``EpisodeGuard``,
    which raises ``ResetNeeded`` (step before reset) and ``EpisodeFinished`` (step after the end)
    before env code runs.

    Attributes set by the framework: ``spec`` (the ``EnvSpec`` the env was made from; its
    ``make()`` builds another) and ``render_mode`` (``make(..., render_mode="ansi")``).

    Changed in v0.1: the spaces are ``TextSpace`` (any string), because ``spaces.Text`` admits only
    alphanumerics and Gymnasium's ``check_env`` rejected every env's observations.

    Changed in v0.1: overriding ``expert_action`` sets ``has_expert`` (it had to be set as well, and an env
    that set only the method had its expert ignored by ``check``, ``eval --policy expert`` and SFT).

    Changed in v0.1: ``reset`` calls the hooks ``choose_task``/``parse_task_id``/``start_task``, because
    every env of tasks repeated the same seeding and ``task_id`` dispatch in its own ``reset``.

    Changed in v0.1: the task API (``task_splits``, ``task``, ``reset`` options ``split``/``index``,
    ``info["task_ref"]``), because users of an env want to discover its tasks and start a given one,
    not only to pass seeds.
    """

    # ``render()`` returns text; Gymnasium's checker wants a positive frame rate wherever render
    # modes are declared, and a text env shows one frame per step, so the rate is nominal.
    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["ansi"], "render_fps": 1}
    #: True when the subclass implements ``snapshot``/``restore`` (fast fork without replay).
    supports_snapshot: ClassVar[bool] = False
    #: True when the class has an expert: set for every subclass that overrides ``expert_action`` (in
    #: ``__init_subclass__``). A class sets it itself only to say otherwise, and wrappers and remote envs
    #: (whose ``expert_action`` forwards) set it per instance from the env they stand for.
    has_expert: ClassVar[bool] = False
    #: False when the expert plays well but cannot win every task (chance, a strong opponent, slippery
    #: ice): the quality gates (``agentgym.gates``) then ask only that it makes valid moves.
    expert_solves_every_task: ClassVar[bool] = True
    #: False when no copy of a running episode can be made, not even by replay (a harness's agent):
    #: ``fork`` refuses, and algorithms that branch episodes are refused before training.
    forkable: ClassVar[bool] = True
    #: True when ``step`` waits on something outside this process (a harness's agent): env pools step
    #: such envs from threads of their own, so their waits overlap.
    steps_wait: ClassVar[bool] = False

    #: False when ``reset`` hands ``options`` on to code that resolves ``split``/``index`` itself
    #: (a remote env's service): the options then pass through untouched.
    resolves_tasks: ClassVar[bool] = True

    observation_space: TextSpace = text_space()
    action_space: TextSpace = text_space()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # Every subclass's reset learns the task options here, once, so no env repeats the code.
        if "reset" in cls.__dict__:
            cls.reset = _resolving_task_options(cls.__dict__["reset"])  # type: ignore[method-assign]
        # One rule for the expert: defining expert_action declares it. A has_expert written in the same
        # class body wins (an env whose expert depends on its arguments says False and sets it per instance).
        if "expert_action" in cls.__dict__ and "has_expert" not in cls.__dict__:
            cls.has_expert = True

    @_resolving_task_options
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """Start a new episode: seed ``np_random``, choose the task, start it.

        The task comes from ``parse_task_id(options["task_id"])`` when the options name one, else from
        ``choose_task(seed)``; ``start_task(task, options)`` then sets the episode up and returns the
        first observation and info. An env of tasks writes those three hooks and no ``reset``. An env
        that writes its own ``reset`` calls ``super().reset(seed=seed)`` first so ``np_random`` is
        seeded; with the default hooks that call returns ``("", {"state_key": ""})``.

        Example:
            >>> class Pick(Env):
            ...     def parse_task_id(self, task_id):
            ...         return int(task_id.removeprefix("n"))
            ...     def choose_task(self, seed):
            ...         return self.seed_or_draw(seed, 10) % 10
            ...     def start_task(self, task, options):
            ...         return f"number {task}", {"state_key": str(task), "task_id": f"n{task}"}
            >>> Pick().reset(seed=13)
            ('number 3', {'state_key': '3', 'task_id': 'n3'})
            >>> Pick().reset(options={"task_id": "n7"})[0]
            'number 7'
        """
        super().reset(seed=seed)
        options = options or {}
        task_id = options.get("task_id")
        task = self.choose_task(seed) if task_id is None else self.parse_task_id(task_id)
        return self.start_task(task, options)

    def parse_task_id(self, task_id: Any) -> Any:
        """The task ``reset(options={"task_id": task_id})`` starts, in whatever form ``start_task`` takes.

        Override it in an env of named tasks; raise ``ConfigError`` for an id that names none of them,
        saying what ids look like. The default ignores the id (an env without task ids).
        """
        return None

    def choose_task(self, seed: int | None) -> Any:
        """The task a reset with only ``seed`` starts (``seed`` is ``None``: draw it from ``np_random``).

        ``np_random`` is already seeded with ``seed``; every draw comes from it, so the same seed gives
        the same task. The default chooses nothing.
        """
        return None

    def start_task(self, task: Any, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """Set up the episode of ``task`` (what ``parse_task_id``/``choose_task`` gave) and observe it.

        Args:
            task: The chosen task.
            options: The ``reset`` options (``{}`` when none), ``task_id`` included when it was given.

        Returns:
            ``(observation, info)`` of the first step of the episode; ``info`` names the task in
            ``task_id`` where the env has task ids.
        """
        return "", {"state_key": ""}

    def seed_or_draw(self, seed: int | None, bound: int) -> int:
        """``seed`` itself, or when it is ``None`` an integer in ``0..bound-1`` drawn from ``np_random``.

        The choice of most seeded envs: the seed is the task (a level, a game), and a reset without one
        still plays a reproducible task of ``np_random``'s stream.

        Example:
            >>> env = Env()
            >>> _ = env.reset(seed=3)
            >>> env.seed_or_draw(42, 10), 0 <= env.seed_or_draw(None, 10) < 10
            (42, True)
        """
        return seed if seed is not None else int(self.np_random.integers(bound))

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Apply one action; see the class docstring for the meaning of the five values."""
        raise NotImplementedError(f"{type(self).__name__} must implement step(action)")

    def expert_action(self) -> str | None:
        """The expert's action in the current state, or ``None`` where the env has no expert."""
        return None

    def snapshot(self) -> bytes:
        """Capture the whole episode state (including ``np_random``) as bytes."""
        raise NotImplementedError(
            f"{type(self).__name__} does not implement snapshot(); fork by replay instead"
        )

    def restore(self, data: bytes) -> None:
        """Reinstate a state captured by ``snapshot``."""
        raise NotImplementedError(
            f"{type(self).__name__} does not implement restore(); fork by replay instead"
        )

    def render(self) -> str | None:
        """The current state as text (``"ansi"``), or ``None``; the default renders nothing."""
        return None

    # --- tasks ---------------------------------------------------------------------------------

    def task_splits(self) -> tuple[TaskSplit, ...]:
        """The env's task splits; by default ``SEEDED_SPLITS`` (its tasks are its seeds).

        Example:
            >>> [(split.name, split.size) for split in Env().task_splits()]
            [('train', 1000000), ('test', None)]
        """
        inner = self.unwrapped
        if inner is not self:  # a wrapper answers for the env it wraps
            return inner.task_splits()
        return SEEDED_SPLITS

    def task(self, split: str, index: int) -> dict[str, Any]:
        """Task ``index`` of ``split``, described without starting it (JSON-safe).

        Returns:
            ``{"split", "index", "task_id", ...}``: ``seed`` for seeded splits, then what
            ``describe_task`` adds (a ``description`` where cheap).

        Raises:
            ConfigError: ``split`` is not one of ``task_splits()`` or ``index`` is out of its range.

        Example:
            >>> Env().task("test", 2)
            {'split': 'test', 'index': 2, 'seed': 1000002, 'task_id': None}
        """
        inner = self.unwrapped
        if inner is not self:
            return inner.task(split, index)
        chosen = self.find_task_split(split, index)
        described: dict[str, Any] = {"split": chosen.name, "index": int(index)}
        if chosen.first_seed is not None:
            described["seed"] = chosen.seed_of(int(index))
        described.update({"task_id": None, **self.describe_task(chosen, int(index))})
        return described

    def describe_task(self, split: TaskSplit, index: int) -> dict[str, Any]:
        """What ``task`` says of task ``index`` of ``split`` (already checked) beyond split, index and seed.

        Override it: return at least ``task_id`` (required for splits of named tasks, since
        ``reset`` starts them by it) and, where cheap, a one-line ``description``. The default
        names nothing.
        """
        return {}

    def find_task_split(self, split: Any, index: Any) -> TaskSplit:
        """The ``TaskSplit`` called ``split``, after checking ``index`` is one of its tasks.

        Raises:
            ConfigError: unknown split or bad index; the message lists the valid splits and range.

        Example:
            >>> Env().find_task_split("train", 7).first_seed
            0
        """
        splits = self.task_splits()
        name = getattr(self.spec, "id", None) or type(self.unwrapped).__name__
        choices = ", ".join(f"{s.name} ({s.describe_range()})" for s in splits)
        chosen = next((s for s in splits if s.name == split), None) if isinstance(split, str) else None
        if chosen is None:
            raise ConfigError(f"{name} has no task split {split!r}; valid splits: {choices or 'none'}")
        if (isinstance(index, bool) or not isinstance(index, (int, np.integer)) or index < 0
                or (chosen.size is not None and index >= chosen.size)):
            raise ConfigError(f"task index {index!r} is out of range for split {chosen.name!r} of {name}; "
                              f"valid indices: {chosen.describe_range()}")
        return chosen

    def resolve_task_options(
        self, seed: int | None, options: dict[str, Any]
    ) -> tuple[int | None, dict[str, Any], dict[str, Any] | None]:
        """Turn ``reset`` options ``split``/``index`` into the seed and options that start that task.

        Returns:
            ``(seed, options, task)``: unchanged with ``task=None`` when the options name no task;
            otherwise the task's seed, the options without ``split``/``index`` (plus ``task_id``
            for a named task) and ``{"split", "index"}`` for ``info["task_ref"]``.

        Raises:
            ConfigError: one of ``split``/``index`` without the other, both with ``task_id``, or
                a split/index ``task`` refuses.
            EnvContractError: a split of named tasks whose ``describe_task`` gives no ``task_id``.

        Example:
            >>> Env().resolve_task_options(None, {"split": "test", "index": 5, "mode": "x"})
            (1000005, {'mode': 'x'}, {'split': 'test', 'index': 5})
        """
        given = [key for key in TASK_OPTIONS if key in options]
        if not given:
            return seed, options, None
        if len(given) < len(TASK_OPTIONS):
            missing = next(key for key in TASK_OPTIONS if key not in options)
            raise ConfigError(f"reset options name a task by 'split' and 'index' together; {missing!r} "
                              f"is missing (got only {given[0]!r})")
        if "task_id" in options:
            raise ConfigError("reset options give both 'task_id' and 'split'/'index'; give one of the two")
        split, index = options["split"], options["index"]
        chosen = self.find_task_split(split, index)
        index = int(index)
        rest = {key: value for key, value in options.items() if key not in TASK_OPTIONS}
        task = {"split": chosen.name, "index": index}
        if chosen.first_seed is not None:
            return chosen.seed_of(index), rest, task
        task_id = self.task(chosen.name, index).get("task_id")
        if not isinstance(task_id, str):
            raise EnvContractError(f"{type(self.unwrapped).__name__}.describe_task gave no task_id for task "
                                   f"{index} of named split {chosen.name!r}; reset starts those by task_id")
        return index, {**rest, "task_id": task_id}, task
