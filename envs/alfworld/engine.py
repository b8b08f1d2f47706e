"""``AlfredEngine``: one ALFWorld game loaded exactly as ALFWorld's ``AlfredTWEnv`` loads it.

``textworld`` plays the ``game.tw-pddl`` file (its PDDL backend, fast-downward underneath) behind
alfworld's wrappers ``AlfredDemangler`` (ids to names such as "apple 1"), ``AlfredInfos`` (the game
file) and ``AlfredExpert`` (the handcoded expert, or the planner). This module also holds what it
takes to run that stack safely in a multi-threaded service and deterministically: one engine lock,
a per-thread seeded ``random`` for the expert, a pool of engines (their planner library is never
freed) and memoized parsing. ``alfworld_env`` builds the agentgym env on it; ``alfworld_gen`` plays
generated games through it to check them.
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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from agentgym.errors import ConfigError, ResetNeeded

EXPERT_TYPES: tuple[str, ...] = ("handcoded", "planner")
#: Commands removed from the admissible list (and refused): verl-agent drops "help" too; "look"
#: and "inventory" stay, as in ALFWorld.
HIDDEN_COMMANDS = frozenset({"help"})

# The engine lock serialises every call into textworld's PDDL backend across threads (the HTTP
# service steps sessions from a thread pool):
# - fast_downward.pddl2sas (run by load and by every reset) overwrites ``sys.argv``, flips the
#   translator's module-global options, and swaps ``sys.stdout`` to capture output;
# - the grammar that renders every observation parses with one module-level TatSu parser
#   (``textworld.envs.pddl.textgen._PARSER``), which keeps its parse state on the instance.
_ENGINE_LOCK = threading.RLock()



def require_alfworld() -> str:
    """Import ``alfworld`` (restoring ``ALFWORLD_DATA``) and return its version.

    Quirk of alfworld 0.4.2: ``import alfworld`` runs ``alfworld.info``, which creates
    ``~/.cache/alfworld`` and *exports* ``ALFWORLD_DATA`` pointing there when it was unset. Left in
    place, every later env in the process would take that empty folder for real data; the variable
    is put back as it was.

    Raises:
        ConfigError: ``alfworld`` is not installed (names the ``alfworld`` extra).
    """
    before = os.environ.get("ALFWORLD_DATA")
    try:
        import alfworld.info
    except ImportError as exc:
        raise ConfigError(
            "alfworld-v0 needs the 'alfworld' package (with textworld and fast-downward): "
            "pip install 'agentgym-rl[alfworld]' (or pip install alfworld)"
        ) from exc
    finally:
        if before is None:
            os.environ.pop("ALFWORLD_DATA", None)
        else:
            os.environ["ALFWORLD_DATA"] = before
    return str(alfworld.info.__version__)

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
        require_alfworld()
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
