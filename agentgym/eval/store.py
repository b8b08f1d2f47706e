"""An evaluation's folder: its plan, one trajectory JSONL per (env, policy), timings, and reading them back.

Layout of ``DIR``::

    plan.json                        the exact evaluation (policies, envs, seeds, samples, sampling)
    trajectories/ENV/POLICY.jsonl    one finished episode per line, appended as episodes finish
    timing.json                      wall seconds spent per (env, policy), summed over resumed sessions
    results.json, report.md, report.html   written at the end (``agentgym.eval.report``)

An episode line holds the task (index, seed, sample), outcome, and every turn's prompt text,
response text, parsed action, observation, reward, ``state_key``, invalid flag, tool calls, tokens
and info, plus the episode's first observation and info, so any episode can be replayed and audited.

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

import contextlib
import errno
import json
import logging
import os
import re
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from agentgym.errors import AgentGymError, ConfigError
from agentgym.rollout.records import EpisodeGroup, Trajectory, Turn

PLAN = "plan.json"
TIMING = "timing.json"
CUT_SUFFIX = ".cut"
"""Suffix of the file beside a trajectory log that keeps the cut-short last lines set aside from it."""

_log = logging.getLogger(__name__)
NO_SPACE = (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC))
"""The ``errno`` values of a full disk (or a full quota)."""


class EvalFolderError(AgentGymError):
    """The evaluation folder cannot be written (a full disk, a quota, no permission); what finished stays
    saved."""


def slug(name: str) -> str:
    """A file-name-safe form of an env id or policy name.

    Example:
        >>> slug("acme/maze-v0"), slug("run@checkpoint")
        ('acme__maze-v0', 'run@checkpoint')
    """
    return re.sub(r"[^A-Za-z0-9@._+-]", "_", name.replace("/", "__"))


def episode_record(env: str, policy: str, task_index: int, sample: int, trajectory: Trajectory, *,
                   observation: str, info: dict[str, Any], turn_texts: list[tuple[str, str]],
                   infos: list[dict[str, Any]] | None, wall_s: float | None = None) -> dict[str, Any]:
    """The JSONL line of one finished episode (see the module docstring).

    ``infos`` may be None when the step infos are unknown; ``turn_texts`` holds (prompt text,
    response text) per turn.
    """
    turns = []
    for n, turn in enumerate(trajectory.turns):
        prompt, response = turn_texts[n] if n < len(turn_texts) else ("", "")
        turns.append({
            "prompt": prompt, "response": response, "action": turn.action, "observation": turn.observation,
            "reward": turn.reward, "state_key": turn.state_key, "invalid": turn.invalid,
            "tool_calls": turn.tool_calls,
            "tokens": int(turn.extras.get("completion_tokens", len(turn.response_ids))),
            "response_ids": list(turn.response_ids),
            "info": infos[n] if infos is not None and n < len(infos) else None,
        })
    return {
        "env": env, "policy": policy, "task_index": task_index, "sample": sample, "seed": trajectory.seed,
        "task_id": trajectory.task_id, "success": trajectory.success, "return": trajectory.episode_return,
        "truncated": trajectory.truncated, "num_turns": len(trajectory.turns), "wall_s": wall_s,
        "observation": observation, "info": info, "turns": turns,
    }


def episode_key(record: dict[str, Any]) -> tuple[int, int]:
    """(task index, sample) of an episode line."""
    return int(record["task_index"]), int(record["sample"])


def trajectory_of(record: dict[str, Any]) -> Trajectory:
    """An episode line as a ``Trajectory`` (no prompt ids; tokens counted as the policy reported)."""
    turns = [Turn([], list(t.get("response_ids") or []), [], float(t["reward"]), str(t["state_key"]),
                  bool(t["invalid"]), str(t["action"]), str(t["observation"]), int(t.get("tool_calls", 0)),
                  {"completion_tokens": int(t.get("tokens", 0))}) for t in record["turns"]]
    return Trajectory(turns, str(record["task_id"]), int(record["seed"]), success=bool(record["success"]),
                      truncated=bool(record["truncated"]),
                      trajectory_id=f"{record['task_index']}-s{record['sample']}")


def groups_of(records: list[dict[str, Any]]) -> list[EpisodeGroup]:
    """Episode lines grouped by task (ordered by task index, samples in order)."""
    by_task: dict[int, list[dict[str, Any]]] = {}
    for record in sorted(records, key=episode_key):
        by_task.setdefault(int(record["task_index"]), []).append(record)
    return [EpisodeGroup(f"task-{index}", str(rs[0]["task_id"]), int(rs[0]["seed"]),
                         [trajectory_of(r) for r in rs])
            for index, rs in sorted(by_task.items())]


class EvalStore:
    """Reads and writes one evaluation folder (thread-safe appends; see the module docstring).

    Args:
        out_dir: the evaluation folder.
        on_notice: told, in one line, about a repair the store made (a cut line set aside, an unreadable
            ``timing.json``); default: a warning on the ``agentgym.eval.store`` logger.
    """

    def __init__(self, out_dir: str | Path, *, on_notice: Callable[[str], None] | None = None) -> None:
        self.root = Path(out_dir)
        self.on_notice = on_notice or _log.warning
        self._lock = threading.Lock()
        self._timing_reported = False

    # --- plan and timing --------------------------------------------------------------------------

    def has_plan(self) -> bool:
        return (self.root / PLAN).is_file()

    def read_plan(self) -> dict[str, Any]:
        """The saved plan as plain data (``EvalPlan.from_json`` checks its fields).

        Raises:
            ConfigError: no plan.json, or one that is not a JSON object (naming the file and what to do).
        """
        path = self.root / PLAN
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
        self._replace(self.root / PLAN, json.dumps(plan, indent=2) + "\n")

    def timing(self) -> dict[str, float]:
        """Wall seconds per ``"ENV\\tPOLICY"``; an unreadable timing.json counts as none (and is reported)."""
        path = self.root / TIMING
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
            self._replace(self.root / TIMING, json.dumps(timing, indent=2) + "\n")

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
        return self.root / "trajectories" / slug(env) / f"{slug(policy)}.jsonl"

    def append(self, env: str, policy: str, records: list[dict[str, Any]]) -> None:
        """Append finished episodes, each a whole line, synced before returning.

        A cut last line is mended first (see ``mend``). A write that fails half-way is undone, so
        the file still ends on the last whole episode.

        Raises:
            EvalFolderError: the folder cannot be written (a full disk names it, and how to go on).
        """
        if not records:
            return
        path = self.path(env, policy)
        data = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode("utf-8")
        with self._lock:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise self.write_error(path.parent, exc) from None
            notice = self._mend(path)
            if notice:
                self.on_notice(notice)
            try:
                # Unbuffered: a failed write is seen here, not at close.
                with open(path, "ab", buffering=0) as fh:
                    start = fh.tell()
                    try:
                        _write_all(fh, data)
                        os.fsync(fh.fileno())
                    except OSError:
                        # A partial line would hide the next episode appended after it; if even the cut
                        # fails, the next append's mend sets the partial line aside.
                        with contextlib.suppress(OSError):
                            fh.truncate(start)
                        raise
            except OSError as exc:
                raise self.write_error(path, exc) from None

    def mend(self) -> list[str]:
        """Mend the cut last line of every trajectory log in the folder (what ``append`` does per file).

        Returns:
            One line per file mended, saying what was done (each also goes to ``on_notice``).
        """
        with self._lock:
            notices = [n for n in map(self._mend, sorted((self.root / "trajectories").glob("*/*.jsonl")))
                       if n]
        for notice in notices:
            self.on_notice(notice)
        return notices

    def records(self, env: str, policy: str) -> list[dict[str, Any]]:
        """The planned episodes saved for (env, policy), one per (task, sample), in order.

        A repeated key keeps its first line; an unreadable line (cut short by a crash) is skipped; with
        a plan saved, a line the plan does not ask for (task index or sample out of range, or a seed
        other than the plan's for that task) is not counted, so it cannot stand in for a planned episode.
        """
        planned = self._planned()
        found: dict[tuple[int, int], dict[str, Any]] = {}
        for record in self._lines(self.path(env, policy)):
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
        """Leave ``path`` ending on a whole line: complete a whole episode that lacks only its line end,
        otherwise move the cut tail to ``path + CUT_SUFFIX``. Returns what it did (None: nothing to do).
        Caller holds the lock."""
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            return None
        if size == 0:
            return None
        with open(path, "rb+") as fh:
            fh.seek(size - 1)
            if fh.read(1) == b"\n":
                return None
            start = _last_line_start(fh, size)
            fh.seek(start)
            tail = fh.read()
            try:
                whole = _is_episode(json.loads(tail))
            except (ValueError, UnicodeDecodeError):
                whole = False
            shown = path.relative_to(self.root) if path.is_relative_to(self.root) else path
            try:
                if whole:
                    fh.seek(size)
                    fh.write(b"\n")
                    fh.flush()
                    os.fsync(fh.fileno())
                    return (f"{shown}: its last episode lacked its line end (the write was cut short); "
                            "completed")
                aside = path.with_name(path.name + CUT_SUFFIX)
                with open(aside, "ab") as out:  # kept before the log is cut back, so no byte is lost
                    out.write(tail + b"\n")
                    out.flush()
                    os.fsync(out.fileno())
                fh.truncate(start)
            except OSError as exc:
                raise self.write_error(path, exc) from None
        return (f"{shown}: its last line was cut short ({len(tail)} bytes, the episode being written when "
                f"the evaluation stopped); set aside in {aside.name}, and that episode is played again")

    def _replace(self, path: Path, text: str) -> None:
        """Write ``path`` atomically: a temporary file beside it, synced, then renamed over it."""
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb", buffering=0) as fh:
                _write_all(fh, text.encode("utf-8"))
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
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

    @staticmethod
    def _lines(path: Path) -> Iterator[dict[str, Any]]:
        if not path.is_file():
            return
        with open(path, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                if _is_episode(record):
                    yield record


def _is_episode(record: Any) -> bool:
    return isinstance(record, dict) and "task_index" in record and "turns" in record


def _first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0]


def _write_all(fh: Any, data: bytes) -> None:
    """Write every byte of ``data`` to an unbuffered file (a raw write may take only part of it)."""
    view = memoryview(data)
    while view:
        written = fh.write(view)
        if not written:
            raise OSError(errno.EIO, "the file took no bytes")
        view = view[written:]


def _last_line_start(fh: Any, size: int, block: int = 1 << 16) -> int:
    """Offset just after the last newline of a file of ``size`` bytes (0 if it has none)."""
    end = size
    while end > 0:
        begin = max(0, end - block)
        fh.seek(begin)
        found = fh.read(end - begin).rfind(b"\n")
        if found >= 0:
            return begin + found + 1
        end = begin
    return 0
