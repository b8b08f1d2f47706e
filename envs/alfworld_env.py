"""``AlfWorldEnv`` (``alfworld-v0``): ALFWorld's text household tasks, real or generated games.

Games are played exactly as ALFWorld's ``AlfredTWEnv`` plays them: ``textworld`` loads the
``game.tw-pddl`` file (its PDDL backend, fast-downward underneath) behind alfworld's wrappers
``AlfredDemangler`` (ids to names such as "apple 1"), ``AlfredInfos`` (the game file) and
``AlfredExpert`` (the handcoded expert, or the planner). ``AlfredEngine`` is that loading path;
the env adds the agentgym contract on top (admissible-command checking, state keys, the expert).

Where the games come from:

- ``data_dir=`` or the ``ALFWORLD_DATA`` environment variable: the official data as
  ``alfworld-download`` lays it out (``json_2.1.1/{train,valid_seen,valid_unseen}/<task>/<trial>/``
  with ``game.tw-pddl`` + ``traj_data.json``). Games are collected as ``alfred_tw_env`` does:
  ``movable``/``Sliced`` trials and games not marked ``solvable`` are skipped.
- otherwise: games made by ``agentgym.envs.alfworld_gen`` from the package's PDDL domain and
  grammar, cached on disk (``$AGENTGYM_CACHE/alfworld``) and fed through the same loading path.

Needs the optional dependency: ``pip install alfworld`` (the ``alfworld`` extra).
"""

from __future__ import annotations

import collections
import contextlib
import copy
import hashlib
import json
import os
import random
import re
import sys
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, ClassVar

from agentgym.core import Env
from agentgym.envs import alfworld_gen as gen
from agentgym.envs.textworld_games import normalize_command
from agentgym.errors import ConfigError, EpisodeFinished, ResetNeeded

EXPERT_TYPES: tuple[str, ...] = ("handcoded", "planner")
#: Pool sizes of the generated splits: those of ALFWorld's official splits.
DEFAULT_NUM_GAMES: dict[str, int] = {"train": 3553, "valid_seen": 140, "valid_unseen": 134}
#: Commands removed from the admissible list (and refused): verl-agent drops "help" too; "look"
#: and "inventory" stay, as in ALFWorld.
HIDDEN_COMMANDS = frozenset({"help"})
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

# The engine lock serialises every call into textworld's PDDL backend across threads (the HTTP
# service steps sessions from a thread pool):
# - fast_downward.pddl2sas (run by load and by every reset) overwrites ``sys.argv``, flips the
#   translator's module-global options, and swaps ``sys.stdout`` to capture output;
# - the grammar that renders every observation parses with one module-level TatSu parser
#   (``textworld.envs.pddl.textgen._PARSER``), which keeps its parse state on the instance.
_ENGINE_LOCK = threading.RLock()


class _ExpertRandom(threading.local):
    """Stands in for the ``random`` module inside alfworld's handcoded expert.

    The expert draws from the global ``random`` (``HandCodedAgent.act`` picks a random admissible
    command when it would repeat itself; ``take``/``use`` pick among visible candidates). Routed
    here, the draws come from a per-thread generator that ``AlfredEngine`` seeds from (game, move)
    before every call, so the expert is deterministic and envs in other threads do not disturb it.
    """

    def __init__(self) -> None:
        self.rng = random.Random(0)

    def seed(self, value: str) -> None:
        """Reseed this thread's generator."""
        self.rng.seed(value)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.rng, name)


_EXPERT_RANDOM = _ExpertRandom()


_MOVE_COMMAND = re.compile(r"move (.+) to (.+)")
_MOVE_AWARE_EXPERT: Any = None


def _move_aware_expert_class() -> Any:
    """``AlfredExpert`` whose handcoded expert is told a "move X to R" command as "put X in/on R".

    Quirk of alfworld 0.4.2: its grammar (ALFWorld data 2.1.2) renamed the command "put X in/on R"
    to "move X to R", but the handcoded expert's bookkeeping (``BasePolicy.update_state_tracking``)
    still recognises a drop only by "put" in the last command. After any move it believes it still
    holds the object, proposes moving it again (not admissible, so AlfredExpert answers "look") and
    wanders: measured on 20 generated two-object games (8 receptacles), it wins 30% within 50
    commands, against 100% with this translation (the other task types end at their only move).
    Only the expert's view of the last command is translated; the game is untouched.
    """
    global _MOVE_AWARE_EXPERT
    if _MOVE_AWARE_EXPERT is None:
        from alfworld.agents.environment.alfred_tw_env import AlfredExpert

        class MoveAwareAlfredExpert(AlfredExpert):  # type: ignore[misc, valid-type]
            """alfworld's ``AlfredExpert``, telling its handcoded expert moves as puts."""

            def _gather_infos(self) -> None:
                actual = self.prev_command
                match = _MOVE_COMMAND.fullmatch(actual or "")
                if match is not None:
                    self.prev_command = f"put {match.group(1)} in/on {match.group(2)}"
                try:
                    super()._gather_infos()
                finally:
                    self.prev_command = actual

        _MOVE_AWARE_EXPERT = MoveAwareAlfredExpert
    return _MOVE_AWARE_EXPERT


_FAST_PARSING = False
_MEMO_LIMIT = 20_000
_SAS_LIMIT = 64


def _memoize_textworld_parsing() -> None:
    """Memoize three pure functions of textworld's PDDL backend that it recomputes on every turn.

    Measured: about 60% of a turn goes to re-parsing the same grammar strings with TatSu (every
    admissible command's template and every feedback rule, ``textgen._parse_and_convert``, and
    every grammar condition, ``Rule.parse_conjunctive_query``), and every reset translates the
    unchanged PDDL problem twice (``fast_downward.pddl2sas``). The memoized versions return what the
    originals return (fresh deep copies of the parse results, which textworld mutates; the
    translation's outputs are only read), so games play identically, about 2.5 times faster.
    Installed once per process, process-wide (TextWorld's own games use the same parsers).
    """
    global _FAST_PARSING
    if _FAST_PARSING:
        return
    import fast_downward
    from textworld.envs.pddl import textgen
    from textworld.logic import Rule

    parsed: dict[Any, Any] = {}

    def memoized(parse: Any) -> Any:
        def parse_once(*args: Any, **kwargs: Any) -> Any:
            key = (id(parse), args, tuple(sorted(kwargs.items())))
            try:
                hit = parsed[key]
            except KeyError:
                if len(parsed) >= _MEMO_LIMIT:
                    parsed.clear()
                hit = parsed[key] = parse(*args, **kwargs)
            except TypeError:  # unhashable arguments: nothing to share
                return parse(*args, **kwargs)
            return copy.deepcopy(hit)

        return parse_once

    query = memoized(Rule.parse_conjunctive_query.__func__.__get__(Rule))
    textgen._parse_and_convert = memoized(textgen._parse_and_convert)
    Rule.parse_conjunctive_query = classmethod(lambda cls, expr: query(expr))

    translate = fast_downward.pddl2sas
    translated: collections.OrderedDict[Any, Any] = collections.OrderedDict()

    def pddl2sas(domain: str, problem: str, verbose: bool = False, optimize: bool = False) -> Any:
        key = (domain, problem, bool(optimize))
        if verbose or key not in translated:
            translated[key] = translate(domain, problem, verbose=verbose, optimize=optimize)
            if len(translated) > _SAS_LIMIT:
                translated.popitem(last=False)
        translated.move_to_end(key)
        return translated[key]

    fast_downward.pddl2sas = pddl2sas
    _FAST_PARSING = True


@contextlib.contextmanager
def _engine_call() -> Iterator[None]:
    """Hold the engine lock, and put back the ``sys.argv`` that fast_downward.pddl2sas overwrites."""
    with _ENGINE_LOCK:
        argv = list(sys.argv)
        try:
            yield
        finally:
            sys.argv[:] = argv


class AlfredEngine:
    """One ALFWorld game at a time, loaded the way ALFWorld's ``AlfredTWEnv.init_env`` loads it.

    ``textworld``'s ``GenericEnvironment`` (the backend ``textworld.gym`` uses; ``.tw-pddl`` files
    get the PDDL backend) wrapped in ``AlfredDemangler(shuffle=False)``, ``AlfredInfos`` and
    ``AlfredExpert``, requesting the infos ``alfred_tw_env`` requests (``won``,
    ``admissible_commands``, extras ``gamefile`` and ``expert_plan``).

    Args:
        expert_type: ``"handcoded"`` (ALFWorld's default) or ``"planner"`` (fast-downward's plan,
            recomputed after every command).
        track_moves: Let the handcoded expert see "move X to R" as the put it was written for (see
            ``_move_aware_expert_class``); ``False`` keeps alfworld 0.4.2's expert exactly.

    Raises:
        ConfigError: an unknown expert type, or ``alfworld`` not installed.
    """

    def __init__(self, expert_type: str = "handcoded", *, track_moves: bool = True) -> None:
        if expert_type not in EXPERT_TYPES:
            raise ConfigError(f"unknown expert_type {expert_type!r}; choose one of {list(EXPERT_TYPES)}")
        gen.require_alfworld()
        import textworld
        from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredExpert, AlfredInfos
        from alfworld.agents.expert import handcoded_expert
        from textworld.envs.wrappers import GenericEnvironment

        handcoded_expert.random = _EXPERT_RANDOM  # see _ExpertRandom
        with _ENGINE_LOCK:
            _memoize_textworld_parsing()
        self.expert_type = expert_type
        infos = textworld.EnvInfos(won=True, admissible_commands=True, extras=["gamefile", "expert_plan"])
        env: Any = GenericEnvironment(infos)
        expert_class = _move_aware_expert_class() if track_moves else AlfredExpert
        # Quirk of alfworld 0.4.2: alfred_tw_env builds the expert wrapper as AlfredExpert(expert_type),
        # but the first parameter of AlfredExpert.__init__ is ``env``: the type lands there and the
        # expert silently stays handcoded. It is passed by keyword here.
        for wrapper in (AlfredDemangler(shuffle=False), AlfredInfos, expert_class(expert_type=expert_type)):
            env = wrapper(env)
        self._tw = env
        self.track_moves = track_moves
        self._released = False
        self._path: Path | None = None
        self._file_digest = ""
        self._digest = ""  # seeds the expert's random draws
        self._moves = 0
        self.expert_broken = False
        "True when the expert raised during this episode (it then has no plan until the next reset)."

    @property
    def path(self) -> Path | None:
        """The loaded game file."""
        return self._path

    @property
    def moves(self) -> int:
        """Commands sent since the last reset."""
        return self._moves

    def load(self, path: Path) -> None:
        """Load ``path`` (a ``game.tw-pddl``); a no-op when that file, unchanged, is already loaded.

        Raises:
            ConfigError: the file is missing or is not a valid ALFWorld game (names the file).
        """
        try:
            data = path.read_bytes()
            digest = hashlib.sha256(data).hexdigest()
            if self._path == path and self._file_digest == digest:
                return  # already loaded (the file may have been rewritten: compared by content)
            game = json.loads(data)
            # The expert's random draws are seeded from the game itself (problem and task sentence),
            # not its path or its recorded walkthrough, so a game plays the same from any folder and
            # the expert replays the walkthrough the generator recorded.
            seed = hashlib.sha256(f"{game['pddl_problem']}\n{game['grammar']}".encode()).hexdigest()[:16]
            with _engine_call():
                self._tw.load(str(path))
        except (Exception, SystemExit) as exc:  # json, PDDL parsing and translation fail in many ways
            # (fast-downward's translator calls sys.exit on some malformed tasks)
            self._path = None
            raise ConfigError(
                f"{path} is not a valid ALFWorld game file (JSON with pddl_domain, grammar and "
                f"pddl_problem): {type(exc).__name__}: {str(exc)[:200]}"
            ) from exc
        self._path = path
        self._file_digest = digest
        self._digest = seed

    def reset(self) -> Any:
        """Start the loaded game; returns textworld's ``GameState``.

        Raises:
            ConfigError: no ``traj_data.json`` next to the game file (the handcoded expert reads it).
        """
        if self._path is None:
            raise ResetNeeded("AlfredEngine.reset() before load()")
        self._moves = 0
        self.expert_broken = False
        try:
            with _engine_call():
                _EXPERT_RANDOM.seed(f"{self._digest}:0")
                return self._tw.reset()
        except (FileNotFoundError, KeyError, ValueError) as exc:
            # Quirk of alfworld 0.4.2: the handcoded expert opens traj_data.json next to the game
            # file (HandCodedAgent.reset) and needs its task_type and pddl_params.
            raise ConfigError(
                f"{self._path.parent} needs a valid traj_data.json (task_type, pddl_params) next to "
                f"game.tw-pddl: ALFWorld's expert reads it there ({type(exc).__name__}: {exc})"
            ) from exc

    def step(self, command: str) -> Any:
        """Send one command (the caller checks admissibility); returns the new ``GameState``."""
        self._moves += 1
        with _engine_call():
            _EXPERT_RANDOM.seed(f"{self._digest}:{self._moves}")
            before = self._tw.state
            try:
                state, _, _ = self._tw.step(command)
            except Exception:
                # Quirk of alfworld 0.4.2: AlfredExpert computes the expert's next command inside
                # step(), after the game has moved, and lets the expert's own errors escape
                # (HandCodedAgentFailed; "Timeout" after 200 commands). The game state is good:
                # keep it and drop the expert for the rest of the episode.
                state = self._tw.state
                if state is before:
                    raise
                state["extra.expert_plan"] = []
                self.expert_broken = True
        if self.expert_broken:
            state["extra.expert_plan"] = []
        return state

    @classmethod
    def acquire(cls, expert_type: str = "handcoded", *, track_moves: bool = True) -> AlfredEngine:
        """An engine from the process-wide pool of released ones, or a new one.

        Quirk of textworld 1.7: every ``PddlEnv`` dlopens its own copy of ``libdownward.so`` and
        never releases it; releasing it by hand (``fast_downward.close_lib``) crashes the
        interpreter at exit, because the library's static destructors still run. So engines are
        never destroyed but reused: the number alive is the peak number of games open at once.
        """
        with _POOL_LOCK:
            free = _POOL.get((expert_type, track_moves))
            if free:
                engine = free.pop()
                engine._released = False
                return engine
        return cls(expert_type, track_moves=track_moves)

    def release(self) -> None:
        """Hand the engine back to the pool (see ``acquire``); do not use it afterwards. Idempotent."""
        if self._released:
            return
        self._released = True
        with _POOL_LOCK:
            _POOL.setdefault((self.expert_type, self.track_moves), []).append(self)


_POOL: dict[tuple[str, bool], list[AlfredEngine]] = {}
_POOL_LOCK = threading.Lock()


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


def admissible_commands(state: Any) -> list[str]:
    """The commands the env accepts in textworld ``state``: ALFWorld's, without ``HIDDEN_COMMANDS``."""
    return [str(c) for c in state["admissible_commands"] if c not in HIDDEN_COMMANDS]


def expert_command(state: Any) -> str | None:
    """The expert's next command in textworld ``state`` (an admissible one), or ``None`` when it has none."""
    plan = state["extra.expert_plan"] or []
    if state["won"] or not plan:
        return None
    admissible = admissible_commands(state)
    if str(plan[0]) in admissible:
        return str(plan[0])
    # The handcoded expert, when it would repeat itself, picks a random admissible command of the
    # game, which can be the hidden "help"; AlfredExpert's own stand-in for an expert command it
    # cannot send is "look" (like "help", it changes nothing but the expert's turn).
    return "look" if "look" in admissible else None


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
        traj = _read_json(trial / "traj_data.json", "ALFWorld's expert reads traj_data.json next to game.tw-pddl; "
                          "re-run alfworld-download")
        if not isinstance(traj, dict) or traj.get("task_type") not in types:
            continue
        data = _read_json(game, "re-run alfworld-download")
        if not isinstance(data, dict) or not {"pddl_domain", "grammar", "pddl_problem"} <= set(data):
            raise ConfigError(f"{game} is not an ALFWorld game file (needs pddl_domain, grammar, pddl_problem); "
                              "re-run alfworld-download")
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
            raise ConfigError(f"num_games must be None or an integer in [1, {gen.SPLIT_SEED_SPAN}], got {num_games!r}")
        self.cache_dir = Path(game_cache_dir) if game_cache_dir is not None else gen.default_cache_dir()
        gen.require_alfworld()  # fail at construction, not at the first reset, when it is missing
        source = _data_source(data_dir)
        self.data_dir: Path | None = None
        self._games: list[tuple[str, Path]] = []
        if source is not None:
            self.data_dir, label, hint = source
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

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        task_id = (options or {}).get("task_id")
        if task_id is not None:
            path = self._resolve_task(task_id)
        else:
            index = seed % self.num_games if seed is not None else int(self.np_random.integers(self.num_games))
            task_id, path = self._pool_entry(index)
        if self._engine is None:
            self._engine = AlfredEngine.acquire(self.expert_type)
        self._state = None
        self._engine.load(path)
        self._traj = _read_json(path.parent / "traj_data.json", "ALFWorld's expert reads it next to game.tw-pddl")
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
        if self._state is None:
            raise ResetNeeded("AlfWorldEnv.step() called before reset(); call reset() first")
        if self._over:
            raise EpisodeFinished("the task is done; call reset() to start a new episode")
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
        if self._state is None:
            raise ResetNeeded("AlfWorldEnv.expert_action() called before reset(); call reset() first")
        return None if self._over else expert_command(self._state)

    def render(self) -> str | None:
        """The last observation, or ``None`` before the first reset."""
        return self._observation if self._state is not None else None

    def close(self) -> None:
        if self._engine is not None:
            self._engine.release()
            self._engine = None
        self._state = None

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
        task_id = (f"gen-r{self.num_receptacles}-d{self.num_distractors}/{split}/{task_type}/"
                   f"seed{game_seed - gen.SPLIT_FIRST_SEED[split]}")
        return task_id, path

    def _resolve_task(self, task_id: Any) -> Path:
        if not isinstance(task_id, str):
            raise ConfigError(f"task_id must be a str, got {task_id!r}")
        if self.data_dir is None:
            match = _GEN_TASK_RE.fullmatch(task_id)
            if match is None or match.group(4) not in gen.TASK_TYPES or int(match.group(5)) >= gen.SPLIT_SEED_SPAN:
                raise ConfigError(
                    f"malformed alfworld task_id {task_id!r} for generated games: expected "
                    f"'gen-r<receptacles>-d<distractors>/<split>/<task type>/seed<N>', e.g. "
                    f"{self._generated_id(self.task_types[0], 0)!r}"
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

    def _generated_id(self, task_type: str, seed: int) -> str:
        return f"gen-r{self.num_receptacles}-d{self.num_distractors}/{self.split}/{task_type}/seed{seed}"

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
