"""``AlfWorldEnv`` (``alfworld-v0``): ALFWorld's text household tasks, real or generated games.

Games are played exactly as ALFWorld's ``AlfredTWEnv`` plays them: ``textworld`` loads the
``game.tw-pddl`` file (its PDDL backend, fast-downward underneath) behind alfworld's wrappers
``AlfredDemangler`` (ids to names such as "apple 1"), ``AlfredInfos`` (the game file) and
``AlfredExpert`` (the handcoded expert, or the planner). ``alfworld_engine.AlfredEngine`` is that
loading path; the env adds the agentgym contract on top (admissible-command checking, state keys, the expert).

Where the games come from:

- ``data_dir=`` or the ``ALFWORLD_DATA`` environment variable: the official data as
  ``alfworld-download`` lays it out (``json_2.1.1/{train,valid_seen,valid_unseen}/<task>/<trial>/``
  with ``game.tw-pddl`` + ``traj_data.json``). Games are collected as ``alfred_tw_env`` does:
  ``movable``/``Sliced`` trials and games not marked ``solvable`` are skipped.
- otherwise: games made by ``agentgym.envs.alfworld.generation`` from the package's PDDL domain and
  grammar, cached on disk (``$AGENTGYM_CACHE/alfworld``) and fed through the same loading path.

Needs the optional dependency: ``pip install alfworld`` (the ``alfworld`` extra).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any, ClassVar

from agentgym.core import Env, TaskSplit
from agentgym.envs.alfworld import generation as gen
from agentgym.envs.alfworld.engine import (
    EXPERT_TYPES,
    AlfredEngine,
    admissible_commands,
    expert_command,
    require_alfworld,
)
from agentgym.envs.textworld.games import normalize_command
from agentgym.errors import ConfigError

#: Pool sizes of the generated splits: those of ALFWorld's official splits.
DEFAULT_NUM_GAMES: dict[str, int] = {"train": 3553, "valid_seen": 140, "valid_unseen": 134}
_ECHO_CHARS = 60
_GEN_TASK_RE = re.compile(r"gen-r(\d+)-d(\d+)/(train|valid_seen|valid_unseen)/([a-z_]+)/seed(0|[1-9][0-9]*)")
_TASK_SENTENCE = re.compile(r"Your task is to: (.*)", re.DOTALL)
# Bookkeeping predicates that no action's precondition and no goal reads: "look", "examine",
# "inventory" and "help" only add them, so they would split one state into many GiGPO anchors.
_UNOBSERVED_PREDICATES = ("checked", "examined")
_INSTRUCTIONS = (
    "You are an agent in a household (ALFWorld, text version). The first observation describes the "
    "room and ends with your task ('Your task is to: ...'). Act by answering with exactly one command "
    "from the list of admissible actions, written as it appears there, e.g. 'go to countertop 1', "
    "'open fridge 1', 'take apple 1 from countertop 1', 'move apple 1 to diningtable 1', "
    "'heat apple 1 with microwave 1', 'cool apple 1 with fridge 1', 'clean apple 1 with sinkbasin 1', "
    "'use desklamp 1', 'examine apple 1', 'inventory' or 'look'. Commands not in the list are not sent "
    "to the game and change nothing. Objects are numbered per kind; closed receptacles must be opened "
    "to see inside. The episode ends when the task is done."
)

def _data_source(data_dir: str | os.PathLike[str] | None) -> tuple[Path, str, str] | None:
    """The official-data folder, how it was named and what to do when it is wrong (for messages);
    ``None`` for generated games."""
    if data_dir is not None:
        hint = ("run alfworld-download (or alfworld_gen.write_dataset) there, or leave data_dir unset "
                "to use generated games")
        return Path(data_dir).expanduser(), f"data_dir={data_dir}", hint
    value = os.environ.get("ALFWORLD_DATA")
    if not value:
        return None
    root = Path(value).expanduser()
    # ``import alfworld`` (before agentgym could restore it, e.g. in the caller's own code) exports
    # ALFWORLD_DATA=~/.cache/alfworld and creates that folder empty; such an empty default is not
    # a request for the official data.
    if root == Path("~/.cache/alfworld").expanduser() and not (root / "json_2.1.1").exists():
        return None
    return root, f"ALFWORLD_DATA={value}", "run alfworld-download or unset it to use generated games"


_SCAN_CACHE: dict[tuple[str, str, tuple[str, ...], int], list[tuple[str, Path]]] = {}
_SCAN_LOCK = threading.Lock()


def _read_json(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{path} is missing: {what}") from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path} is corrupt ({type(exc).__name__}: {str(exc)[:120]}): {what}") from None


def collect_games(root: Path, split: str, task_types: Iterable[str], label: str,
                  hint: str = "run alfworld-download") -> list[tuple[str, Path]]:
    """The solvable games of ``split`` in an ``$ALFWORLD_DATA`` folder, as ``(task_id, game file)``.

    Collected as ``alfred_tw_env.AlfredTWEnv.collect_game_files`` does (trials with ``movable`` or
    ``Sliced`` in their path and games whose ``solvable`` is missing or false are skipped), sorted by
    path. The task id is the trial's path below ``json_2.1.1``. Cached per process.

    Raises:
        ConfigError: the folder, the split or its games are missing, a ``traj_data.json`` or
            ``game.tw-pddl`` is corrupt, or no game has one of ``task_types``.
    """
    types = tuple(task_types)
    if not root.is_dir():
        raise ConfigError(f"{label} is not a folder; expected ALFWorld's data there "
                          f"(json_2.1.1/{split}/<task>/<trial>/game.tw-pddl + traj_data.json); {hint}")
    split_dir = root / "json_2.1.1" / split
    try:
        stamp = split_dir.stat().st_mtime_ns
    except OSError:
        stamp = -1
    key = (str(root.resolve()), split, types, stamp)
    with _SCAN_LOCK:
        if key in _SCAN_CACHE:
            return _SCAN_CACHE[key]
    games = sorted(split_dir.glob("*/*/game.tw-pddl"))
    if not games:
        raise ConfigError(f"{label} has no json_2.1.1/{split}/*/*/game.tw-pddl; {hint}")
    found: list[tuple[str, Path]] = []
    for game in games:
        trial = game.parent
        task_id = trial.relative_to(root / "json_2.1.1").as_posix()
        if "movable" in task_id or "Sliced" in task_id:
            continue  # not supported by ALFWorld's text engine either
        traj = _read_json(trial / "traj_data.json",
                          "ALFWorld's expert reads traj_data.json next to game.tw-pddl; "
                          "re-run alfworld-download")
        if not isinstance(traj, dict) or traj.get("task_type") not in types:
            continue
        data = _read_json(game, "re-run alfworld-download")
        if not isinstance(data, dict) or not {"pddl_domain", "grammar", "pddl_problem"} <= set(data):
            raise ConfigError(f"{game} is not an ALFWorld game file "
                              "(needs pddl_domain, grammar, pddl_problem); re-run alfworld-download")
        if not data.get("solvable"):
            continue
        found.append((task_id, game))
    if not found:
        raise ConfigError(f"{label} has no solvable game of task types {list(types)} in json_2.1.1/{split}")
    with _SCAN_LOCK:
        _SCAN_CACHE[key] = found
    return found


class AlfWorldEnv(Env):
    """ALFWorld (text): reach a household goal with commands such as "take apple 1 from countertop 1".

    **Games.** With ``data_dir`` or ``ALFWORLD_DATA`` set, the official games of ``split``
    (``"train"``, ``"valid_seen"``, ``"valid_unseen"``) of the chosen ``task_types``; otherwise
    games generated by ``alfworld_gen`` (held-out splits by seed range, see there), generated on
    first use and cached. ``reset(seed=s)`` plays game ``s mod N`` of the split's pool (``N``:
    ``num_games``, default the official split sizes 3553/140/134 for generated games, all games for
    real data); in a generated pool the task types take turns. ``info["task_id"]`` names the game
    (``"gen-r8-d6/train/pick_and_place_simple/seed0"``, or the trial path below ``json_2.1.1`` for
    real data) and ``reset(options={"task_id": ...})`` plays it again.

    **Turns.** Observations are ALFWorld's text: the first one is the intro ("-= Welcome to TextWorld,
    ALFRED! =-", the receptacles in view, "Your task is to: ..."). ``info["admissible_actions"]``
    lists the commands ALFWorld accepts now, without "help" (as verl-agent; "look" and "inventory"
    stay). An action that is not admissible after ``normalize_command`` is not sent to the game: the
    env answers "Nothing happens." plus why, with ``invalid_action=True``, and the game state (and the
    expert's memory) stays exactly as it was, which keeps replay and fork exact.
    **Reward** 1.0 on the step that wins (the goal holds), else 0.0 (verl-agent scales this to 10);
    the episode then terminates with ``success=True``. ALFWorld games cannot be lost: an episode
    without success ends by the turn budget (``max_turns``, 50).

    **State key.** The task id and a hash of the game's facts (where the agent and every object are,
    what is open, hot, clean, cool, held, toggled), without the bookkeeping facts that "look",
    "examine" and "inventory" add: trajectories reaching the same world state share a key.

    **Expert.** ``expert_action()``: ALFWorld's handcoded expert (``expert_type="handcoded"``), whose
    first command is always "look" (``AlfredExpert`` computes no plan at reset), with its
    bookkeeping of "move" commands fixed (``_move_aware_expert_class``); or the first command of
    fast-downward's plan from the current state (``"planner"``; it sees the whole PDDL state, so it
    walks straight to hidden objects). The handcoded expert explores and remembers what it saw, so
    it follows the episode's actual commands, not only its own; its random choices are seeded per
    (game, move), so it is deterministic.

    Fork is by deterministic replay (the PDDL backend's state lives in a C library).

    Args:
        split: ``"train"``, ``"valid_seen"`` or ``"valid_unseen"``.
        task_types: Names (or ALFWorld's numbers 1-6) of the task types to play; ``None``: all six.
        data_dir: An ALFWorld data folder; overrides ``ALFWORLD_DATA``.
        expert_type: ``"handcoded"`` or ``"planner"``.
        num_games: Pool size (generated) or the first ``num_games`` games (real data).
        num_receptacles: Generated games: receptacles per room, 5-20.
        num_distractors: Generated games: objects besides the task's, 0-30.
        game_cache_dir: Where generated games are cached (default ``alfworld_gen.default_cache_dir()``).

    Raises:
        ConfigError: a bad argument, an unknown task type (lists the six), a missing or corrupt
            data folder (says what was expected where), or ``alfworld`` not installed.
    """

    has_expert: ClassVar[bool] = True
    supports_snapshot: ClassVar[bool] = False

    def __init__(
        self,
        split: str = "train",
        task_types: Iterable[str | int] | None = None,
        data_dir: str | os.PathLike[str] | None = None,
        expert_type: str = "handcoded",
        num_games: int | None = None,
        num_receptacles: int = gen.DEFAULT_RECEPTACLES,
        num_distractors: int = gen.DEFAULT_DISTRACTORS,
        game_cache_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        self.split = gen.validate_split(split)
        self.task_types = gen.validate_task_types(task_types)
        if expert_type not in EXPERT_TYPES:
            raise ConfigError(f"unknown expert_type {expert_type!r}; choose one of {list(EXPERT_TYPES)}")
        self.expert_type = expert_type
        self.num_receptacles, self.num_distractors = gen.validate_difficulty(num_receptacles, num_distractors)
        if num_games is not None and (isinstance(num_games, bool) or not isinstance(num_games, int)
                                      or not 1 <= num_games <= gen.SPLIT_SEED_SPAN):
            raise ConfigError(f"num_games must be None or an integer in [1, {gen.SPLIT_SEED_SPAN}], "
                              f"got {num_games!r}")
        self.cache_dir = Path(game_cache_dir) if game_cache_dir is not None else gen.default_cache_dir()
        require_alfworld()  # fail at construction, not at the first reset, when it is missing
        source = _data_source(data_dir)
        self.data_dir: Path | None = None
        self._games: list[tuple[str, Path]] = []
        self._num_games_limit = num_games  # applies to every split's pool (task_splits)
        self._data_label = ("", "")
        if source is not None:
            self.data_dir, label, hint = source
            self._data_label = (label, hint)
            self._games = collect_games(self.data_dir, self.split, self.task_types, label, hint)[:num_games]
            self.num_games = len(self._games)
        else:
            self.num_games = num_games or DEFAULT_NUM_GAMES[self.split]
        self.instructions = _INSTRUCTIONS
        self._engine: AlfredEngine | None = None
        self._state: Any = None  # textworld GameState of the current turn
        self._task_id: str | None = None
        self._traj: dict[str, Any] = {}
        self._task = ""  # the sentence after "Your task is to: " in the intro
        self._observation = ""
        self._over = False

    # --- episode --------------------------------------------------------------------------------

    def parse_task_id(self, task_id: Any) -> tuple[str, Path]:
        """The task id and its game file."""
        return task_id, self._resolve_task(task_id)

    def choose_task(self, seed: int | None) -> tuple[str, Path]:
        """The seed's game of the pool (seed modulo its size): its task id and game file."""
        return self._pool_entry(self.seed_or_draw(seed, self.num_games) % self.num_games)

    def start_task(self, task: tuple[str, Path], options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        task_id, path = task
        if self._engine is None:
            self._engine = AlfredEngine.acquire(self.expert_type)
        self._state = None
        self._engine.load(path)
        self._traj = _read_json(path.parent / "traj_data.json",
                                "ALFWorld's expert reads it next to game.tw-pddl")
        self._state = self._engine.reset()
        self._task_id = str(task_id)
        self._over = False
        self._observation = str(self._state.feedback)
        found = _TASK_SENTENCE.search(self._observation)
        self._task = found.group(1).strip() if found else ""
        info = self._info(invalid=False)
        info["instructions"] = self.instructions
        return self._observation, info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        command = normalize_command(action) if isinstance(action, str) else ""
        admissible = self._admissible()
        if command not in admissible:
            shown = command if len(command) <= _ECHO_CHARS else command[:_ECHO_CHARS] + "..."
            why = "The answer is empty." if not command else f"{shown!r} is not an admissible command here."
            text = (f"Nothing happens. {why} Answer with exactly one command from the admissible actions, "
                    f"e.g. {admissible[0]!r}.")
            return text, 0.0, False, False, self._info(invalid=True)
        assert self._engine is not None
        self._state = self._engine.step(command)
        self._over = bool(self._state["won"])
        self._observation = str(self._state.feedback)
        return self._observation, float(self._over), self._over, False, self._info(invalid=False)

    def expert_action(self) -> str | None:
        """The expert's next command (always an admissible one), or ``None`` when it has none."""
        return None if self._over else expert_command(self._state)

    def render(self) -> str | None:
        """The last observation, or ``None`` before the first reset."""
        return self._observation if self._state is not None else None

    def close(self) -> None:
        if self._engine is not None:
            self._engine.release()
            self._engine = None
        self._state = None

    # --- tasks ----------------------------------------------------------------------------------

    def task_splits(self) -> tuple[TaskSplit, ...]:
        """ALFWorld's official splits, ``train``, ``valid_seen`` and ``valid_unseen``, whichever ``split``
        the env was made with (``reset(seed=...)`` draws from that one).

        Generated games: every split, each of the official size (or ``num_games``), task ``i`` being
        game ``i`` of the split's pool. Real data: the splits the folder has, their games in path
        order (the first ``num_games`` of each, when given).
        """
        if self.data_dir is None:
            return tuple(TaskSplit(name, self._num_games_limit or DEFAULT_NUM_GAMES[name],
                                   f"generated games of ALFWorld's {name} seed range, task types in turn")
                         for name in gen.SPLITS)
        return tuple(TaskSplit(name, len(self._split_games(name)), f"games of {name} in {self.data_dir}, "
                               "in path order")
                     for name in gen.SPLITS if (self.data_dir / "json_2.1.1" / name).is_dir())

    def describe_task(self, split: TaskSplit, index: int) -> dict[str, Any]:
        """The game's task id and its task type (generated) or trial folder (real data)."""
        if self.data_dir is None:
            task_type, game_seed = gen.pool_game(split.name, index, self.task_types)
            number = game_seed - gen.SPLIT_FIRST_SEED[split.name]
            return {"task_id": self._generated_id(split.name, task_type, number),
                    "description": f"{task_type}, generated game {number} of {split.name}"}
        task_id = self._split_games(split.name)[index][0]
        return {"task_id": task_id, "description": Path(task_id).parts[1]}

    def _split_games(self, split: str) -> list[tuple[str, Path]]:
        """The real-data games of ``split`` (``collect_games`` caches the folder scan)."""
        if split == self.split:
            return self._games
        assert self.data_dir is not None
        return collect_games(self.data_dir, split, self.task_types, *self._data_label)[:self._num_games_limit]

    # --- helpers --------------------------------------------------------------------------------

    def _pool_entry(self, index: int) -> tuple[str, Path]:
        if self.data_dir is not None:
            return self._games[index]
        task_type, game_seed = gen.pool_game(self.split, index, self.task_types)
        return self._generated(task_type, game_seed)

    def _generated(self, task_type: str, game_seed: int) -> tuple[str, Path]:
        path = gen.ensure_game(task_type, game_seed, num_receptacles=self.num_receptacles,
                               num_distractors=self.num_distractors, cache_dir=self.cache_dir)
        split = gen.split_of_seed(game_seed)
        return self._generated_id(split, task_type, game_seed - gen.SPLIT_FIRST_SEED[split]), path

    def _resolve_task(self, task_id: Any) -> Path:
        if not isinstance(task_id, str):
            raise ConfigError(f"task_id must be a str, got {task_id!r}")
        if self.data_dir is None:
            match = _GEN_TASK_RE.fullmatch(task_id)
            if (match is None or match.group(4) not in gen.TASK_TYPES
                    or int(match.group(5)) >= gen.SPLIT_SEED_SPAN):
                raise ConfigError(
                    f"malformed alfworld task_id {task_id!r} for generated games: expected "
                    f"'gen-r<receptacles>-d<distractors>/<split>/<task type>/seed<N>', e.g. "
                    f"{self._generated_id(self.split, self.task_types[0], 0)!r}"
                )
            settings = (int(match.group(1)), int(match.group(2)))
            if settings != (self.num_receptacles, self.num_distractors):
                raise ConfigError(
                    f"task_id {task_id!r} is a game with num_receptacles={settings[0]}, num_distractors="
                    f"{settings[1]}; this env generates {self.num_receptacles}/{self.num_distractors}: make "
                    "the env with those settings"
                )
            game_seed = gen.SPLIT_FIRST_SEED[match.group(3)] + int(match.group(5))
            return self._generated(match.group(4), game_seed)[1]
        parts = Path(task_id).parts
        path = self.data_dir / "json_2.1.1" / task_id / "game.tw-pddl"
        if len(parts) != 3 or parts[0] not in gen.SPLITS or ".." in parts or not path.is_file():
            raise ConfigError(
                f"unknown alfworld task_id {task_id!r}: expected '<split>/<task folder>/<trial folder>' "
                f"with a game.tw-pddl below {self.data_dir / 'json_2.1.1'}"
            )
        return path

    def _generated_id(self, split: str, task_type: str, index: int) -> str:
        """The task id of generated game ``index`` of ``task_type`` in ``split`` (what ``_GEN_TASK_RE``
        reads)."""
        return f"gen-r{self.num_receptacles}-d{self.num_distractors}/{split}/{task_type}/seed{index}"

    def _admissible(self) -> list[str]:
        return admissible_commands(self._state)

    def _state_key(self) -> str:
        # textworld's PDDL state also keeps the negation of every fact an action deleted
        # ("not_opened(fridge 1)" after a close), so it records history; under PDDL's closed world
        # the positive facts alone are the state. Derived axioms ("new-axiom@...") follow from them.
        facts = sorted(str(fact) for fact in self._state["_facts"]
                       if fact.name not in _UNOBSERVED_PREDICATES
                       and not fact.name.startswith(("not_", "new-axiom@")))
        return f"{self._task_id}|{hashlib.sha256(json.dumps(facts).encode()).hexdigest()[:24]}"

    def _info(self, *, invalid: bool) -> dict[str, Any]:
        return {
            "state_key": self._state_key(),
            "task_id": self._task_id,
            "task_type": str(self._traj.get("task_type", "")),
            "task": self._task,
            "admissible_actions": self._admissible(),
            "invalid_action": invalid,
            "success": bool(self._state["won"]),
        }
