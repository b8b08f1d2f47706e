"""An evaluation's folder: its plan, one episode log per (env, policy), timings, and reading them back.

Layout of ``DIR`` (``RunFolder`` names every file)::

    plan.json                        the exact evaluation (policies, envs, seeds, samples, sampling)
    trajectories/ENV/POLICY.jsonl    one finished episode per line, appended as episodes finish
    timing.json                      wall seconds spent per (env, policy), summed over resumed sessions
    results.json, report.md, report.html   written at the end (``agentgym.eval.report``)

The episode lines are the one episode-log format (``agentgym.rollout.episode_log``) that training runs write
too; an evaluation's line adds every turn's prompt and response text, so any episode can be replayed and
audited. Lines that evaluations wrote before that format are read as it.

Nothing finished is lost, whatever stops an evaluation:

- lines are written whole, flushed and synced; a write that fails half-way (a full disk) is undone,
  so the file ends on a whole line and the error names the folder (``EvalFolderError``);
- a last line cut short by a crash is mended before the next append: completed when it is a whole
  episode lacking only its line end, otherwise moved to ``POLICY.jsonl.cut`` (and reported), so the
  replayed episode never lands on the cut line;
- ``plan.json`` and ``timing.json`` are replaced atomically (a temporary file, then a rename); an
  unreadable ``timing.json`` only resets the wall times;
- only the episodes the saved plan asks for count (task index in range, its seed, sample in range),
  so a stray line can never stand in for a planned episode.
"""

from __future__ import annotations

import errno
import json
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentgym.errors import AgentGymError, ConfigError
from agentgym.rollout.episode_log import CUT_SUFFIX, EpisodeLog, groups_of, replace_file, trajectory_of
from agentgym.run_folder import PLAN, TIMING, RunFolder, slug

__all__ = ["CUT_SUFFIX", "NO_SPACE", "PLAN", "TIMING", "EvalFolderError", "EvalStore", "episode_key",
           "groups_of", "slug", "trajectory_of"]

_log = logging.getLogger(__name__)
NO_SPACE = (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC))
"""The ``errno`` values of a full disk (or a full quota)."""


class EvalFolderError(AgentGymError):
    """The evaluation folder cannot be written (a full disk, a quota, no permission); what finished stays
    saved."""


def episode_key(record: dict[str, Any]) -> tuple[int, int]:
    """(task index, sample) of an episode line."""
    return int(record["task_index"]), int(record["sample"])


class EvalStore:
    """Reads and writes one evaluation folder (thread-safe appends; see the module docstring).

    Args:
        out_dir: the evaluation folder.
        on_notice: told, in one line, about a repair the store made (a cut line set aside, an unreadable
            ``timing.json``); default: a warning on the ``agentgym.eval.store`` logger.
    """

    def __init__(self, out_dir: str | Path, *, on_notice: Callable[[str], None] | None = None) -> None:
        self.root = Path(out_dir)
        self.folder = RunFolder(self.root)
        self.on_notice = on_notice or _log.warning
        self._lock = threading.Lock()
        self._timing_reported = False

    # --- plan and timing --------------------------------------------------------------------------

    def has_plan(self) -> bool:
        return self.folder.plan.is_file()

    def read_plan(self) -> dict[str, Any]:
        """The saved plan as plain data (``EvalPlan.from_json`` checks its fields).

        Raises:
            ConfigError: no plan.json, or one that is not a JSON object (naming the file and what to do).
        """
        path = self.folder.plan
        if not path.is_file():
            raise ConfigError(f"--resume {self.root}: no {PLAN} there; start the evaluation without --resume")
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{path} is not JSON ({_first_line(exc)}), so the evaluation cannot be "
                              f"resumed; start it again with another --out") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{path} holds {type(data).__name__}, not an evaluation plan, so the "
                              "evaluation cannot be resumed; start it again with another --out")
        return data

    def write_plan(self, plan: dict[str, Any]) -> None:
        """Save the plan (atomically: a cut write never leaves a half plan.json behind)."""
        self._replace(self.folder.plan, json.dumps(plan, indent=2) + "\n")

    def timing(self) -> dict[str, float]:
        """Wall seconds per ``"ENV\\tPOLICY"``; an unreadable timing.json counts as none (and is reported)."""
        path = self.folder.timing
        if not path.is_file():
            return {}
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError, OSError):
            data = None
        if not isinstance(data, dict):
            if not self._timing_reported:
                self._timing_reported = True
                self.on_notice(f"{path} is unreadable (a write cut short); wall times count from 0 again, "
                               "episodes are unaffected")
            return {}
        return {str(k): float(v) for k, v in data.items() if isinstance(v, (int, float))}

    def add_time(self, env: str, policy: str, seconds: float) -> None:
        """Add ``seconds`` to the wall time of (env, policy).

        Raises:
            EvalFolderError: timing.json cannot be written (the previous one stays as it was).
        """
        with self._lock:
            timing = self.timing()
            key = f"{env}\t{policy}"
            timing[key] = timing.get(key, 0.0) + seconds
            self._replace(self.folder.timing, json.dumps(timing, indent=2) + "\n")

    def wall_s(self, env: str, policy: str) -> float:
        return float(self.timing().get(f"{env}\t{policy}", 0.0))

    def write_file(self, name: str, text: str) -> None:
        """Write a file of the folder (a report) atomically.

        Raises:
            EvalFolderError: it cannot be written (the previous version, if any, stays whole).
        """
        self._replace(self.root / name, text)

    # --- episodes ---------------------------------------------------------------------------------

    def path(self, env: str, policy: str) -> Path:
        """The episode log of (env, policy) (``RunFolder.episode_file``)."""
        return self.folder.episode_file(env, policy)

    def append(self, env: str, policy: str, records: list[dict[str, Any]]) -> None:
        """Append finished episodes (``episode_log.episode_line``'s), each a whole line, synced before
        returning.

        A cut last line is mended first (see ``mend``). A write that fails half-way is undone, so
        the file still ends on the last whole episode.

        Raises:
            EvalFolderError: the folder cannot be written (a full disk names it, and how to go on).
        """
        if not records:
            return
        path = self.path(env, policy)
        with self._lock:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise self.write_error(path.parent, exc) from None
            notice = self._mend(path)
            try:
                EpisodeLog(path).append(records)
            except OSError as exc:
                raise self.write_error(path, exc) from None
        if notice:
            self.on_notice(notice)

    def mend(self) -> list[str]:
        """Mend the cut last line of every episode log in the folder (what ``append`` does per file).

        Returns:
            One line per file mended, saying what was done (each also goes to ``on_notice``).
        """
        with self._lock:
            notices = [n for n in map(self._mend, self.folder.episode_files()) if n]
        for notice in notices:
            self.on_notice(notice)
        return notices

    def records(self, env: str, policy: str) -> list[dict[str, Any]]:
        """The planned episodes saved for (env, policy), one per (task, sample), in order, in the episode-log
        format (``episode_log.read_line``; ``episode_log.groups_of`` groups them).

        A repeated key keeps its first line; an unreadable line (cut short by a crash, or damaged) is
        skipped; with a plan saved, a line the plan does not ask for (task index or sample out of range, or
        a seed other than the plan's for that task) is not counted, so it cannot stand in for a planned
        episode.
        """
        planned = self._planned()
        found: dict[tuple[int, int], dict[str, Any]] = {}
        for record in EpisodeLog(self.path(env, policy)).read():
            try:
                key, seed = episode_key(record), int(record["seed"])
            except (KeyError, TypeError, ValueError):
                continue
            if planned is not None:
                seeds, samples = planned
                if not (0 <= key[0] < len(seeds) and 0 <= key[1] < samples and seeds[key[0]] == seed):
                    continue
            found.setdefault(key, record)
        return [found[k] for k in sorted(found)]

    # --- files --------------------------------------------------------------------------------------

    def _planned(self) -> tuple[list[int], int] | None:
        """The saved plan's task seeds and samples; None without a readable plan (nothing to filter by)."""
        try:
            plan = self.read_plan()
            return [int(s) for s in plan["seeds"]], int(plan["samples"])
        except (ConfigError, KeyError, TypeError, ValueError):
            return None

    def _mend(self, path: Path) -> str | None:
        """``EpisodeLog.mend`` of ``path``, its notice naming the file. Caller holds the lock."""
        try:
            done = EpisodeLog(path).mend()
        except OSError as exc:
            raise self.write_error(path, exc) from None
        if done is None:
            return None
        shown = path.relative_to(self.root) if path.is_relative_to(self.root) else path
        return f"{shown}: {done}"

    def _replace(self, path: Path, text: str) -> None:
        try:
            replace_file(path, text)
        except OSError as exc:
            raise self.write_error(path, exc) from None

    def write_error(self, path: Path | None, exc: OSError) -> EvalFolderError:
        """The one-line error for ``exc``, raised while writing ``path`` (None: unknown) in this folder."""
        if exc.errno in NO_SPACE:
            writing = f" (writing {path.name})" if path is not None else ""
            return EvalFolderError(f"no space left on the device of {self.root}{writing}; every finished "
                                   f"episode is kept there: free some space, then "
                                   f"`agentgym eval --out {self.root} --resume` plays the rest")
        path = path or self.root
        if exc.errno == errno.ENOTDIR or (exc.errno == errno.EEXIST and not path.is_dir()):
            return EvalFolderError(f"cannot write {path}: a file stands where a folder is needed; "
                                   "give --out a folder")
        return EvalFolderError(f"cannot write {path}: {exc.strerror or exc}; make {self.root} writable, then "
                               f"`agentgym eval --out {self.root} --resume` plays the rest")


def _first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0]
