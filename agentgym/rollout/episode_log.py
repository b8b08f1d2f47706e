"""The episode log: one JSON line per finished episode — its format, its one writer and its one reader —
for training runs (``trajectories/iter_NNNNN.jsonl``), evaluations (``trajectories/ENV/POLICY.jsonl``),
an evaluation's resume and the viewer. ``RunFolder`` names the files.

A line (format 1, ``"episode_format": 1``) holds one episode::

    episode_format  1
    env, policy     the env id and policy name (evaluations); None in a training run (its config names them)
    iteration       the training iteration that collected it; None in an evaluation
    group_id        the group (G episodes from one task and seed) it belongs to
    task_index      the task's place: in the evaluation's plan, or among the iteration's groups
    sample          the episode's place within its group
    trajectory_id, seed, task_id, success, truncated, parent_id, fork_turn, answer, note   (``Trajectory``)
    return          the sum of the turn rewards;   num_turns   how many turns
    wall_s          seconds the episode took, when measured
    observation, info   the reset's observation and info
    turns           each turn's ``Turn`` fields (prompt_ids, response_ids, response_logprobs, reward,
                    state_key, invalid, action, observation, tool_calls, extras, info), ``tokens`` (tokens
                    generated) and, where the writer had them, ``prompt`` and ``response`` as text
    (other keys)    kept as written (an evaluation's ``split`` and ``index``)

Lines written before the format existed are read as format 1 too: a training run's line holding a whole
group (``EpisodeGroup``'s fields) stands for its episodes; an evaluation's line lacks the training-only
fields. ``trajectory_of`` is the one place that rebuilds a ``Turn`` from stored data.

Writing never leaves a half line behind for the next line to land on: ``EpisodeLog.append`` writes whole
lines, synced, and undoes a write that fails half-way; a last line cut short by a crash is mended before
the next append (completed when it is whole but for its line end, otherwise set aside in ``PATH.cut``);
``EpisodeLog.write`` replaces the whole file atomically.

Changed in v0.2: one format for training and evaluation, because the viewer, an evaluation's resume and
the training run read the same episodes three ways before.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentgym.rollout.records import EpisodeGroup, Trajectory, Turn

FORMAT_FIELD = "episode_format"
FORMAT = 1
"""The format this module writes; ``read_line`` reads it and every earlier one."""
CUT_SUFFIX = ".cut"
"""Suffix of the file beside a log that keeps the cut-short last lines set aside from it."""


class DamagedLine(ValueError):
    """A parsed line lacks a field the log needs (the message names it)."""


# --- writing ------------------------------------------------------------------------------------------


def episode_line(trajectory: Trajectory, *, group_id: str, task_index: int, sample: int,
                 iteration: int | None = None, env: str | None = None, policy: str | None = None,
                 texts: list[tuple[str, str]] | None = None, prompt_ids: bool = True,
                 wall_s: float | None = None, **extra: Any) -> dict[str, Any]:
    """The log line of one finished episode (see the module docstring).

    Args:
        trajectory: the episode.
        group_id, task_index, sample, iteration, env, policy, wall_s: where it belongs (module docstring).
        texts: (prompt text, response text) per turn, stored beside the ids when given.
        prompt_ids: keep each turn's prompt ids; an evaluation that stores the prompt as text drops them.
        extra: more keys for the line (an evaluation's ``split`` and ``index``).

    Returns:
        A dict that survives ``json.dumps``; ``read_line`` gives it back.

    Example:
        >>> turn = Turn([1, 2], [3], [-0.5], 1.0, "s0", action="up")
        >>> episode = Trajectory([turn], "t", 7, success=True)
        >>> line = episode_line(episode, group_id="g", task_index=0, sample=0)
        >>> line["episode_format"], line["return"], line["turns"][0]["tokens"]
        (1, 1.0, 1)
        >>> trajectory_of(read_line(json.dumps(line))[0]).turns == [turn]
        True
    """
    turns = []
    for n, turn in enumerate(trajectory.turns):
        stored: dict[str, Any] = {
            "prompt_ids": list(turn.prompt_ids) if prompt_ids else [],
            "response_ids": list(turn.response_ids), "response_logprobs": list(turn.response_logprobs),
            "reward": turn.reward, "state_key": turn.state_key, "invalid": turn.invalid,
            "action": turn.action, "observation": turn.observation, "tool_calls": turn.tool_calls,
            "extras": dict(turn.extras), "info": dict(turn.info),
            "tokens": int(turn.extras.get("completion_tokens", len(turn.response_ids))),
        }
        if texts is not None:
            stored["prompt"], stored["response"] = texts[n] if n < len(texts) else ("", "")
        turns.append(stored)
    return {
        FORMAT_FIELD: FORMAT, "env": env, "policy": policy, "iteration": iteration, "group_id": group_id,
        "task_index": task_index, "sample": sample, "trajectory_id": trajectory.trajectory_id,
        "seed": trajectory.seed, "task_id": trajectory.task_id, "success": trajectory.success,
        "return": trajectory.episode_return, "truncated": trajectory.truncated, "num_turns": len(turns),
        "parent_id": trajectory.parent_id, "fork_turn": trajectory.fork_turn, "answer": trajectory.answer,
        "note": trajectory.note, "wall_s": wall_s, "observation": trajectory.first_observation,
        "info": dict(trajectory.first_info), **extra, "turns": turns,
    }


def iteration_lines(groups: list[EpisodeGroup], iteration: int) -> list[dict[str, Any]]:
    """The log lines of a training iteration's groups: group ``i``'s episodes as task ``i``, in order."""
    return [episode_line(t, group_id=g.group_id, task_index=i, sample=k, iteration=iteration)
            for i, g in enumerate(groups) for k, t in enumerate(g.trajectories)]


def write_iteration(path: str | Path, groups: list[EpisodeGroup], iteration: int) -> None:
    """Write a training iteration's episodes to ``path`` (``RunFolder.trajectory_file``), replacing it.

    Raises:
        OSError: it cannot be written.
    """
    EpisodeLog(path, iteration).write(iteration_lines(groups, iteration))


class EpisodeLog:
    """One file of episode lines: appending (an evaluation), replacing (a training iteration), reading.

    Args:
        path: the file.
        iteration: the training iteration whose episodes the file holds (None: an evaluation's file).

    Raises:
        OSError: from ``append``, ``write`` and ``mend`` when the file cannot be written; what was there
            before stays whole.
    """

    def __init__(self, path: str | Path, iteration: int | None = None) -> None:
        self.path = Path(path)
        self.iteration = iteration

    def append(self, lines: list[dict[str, Any]]) -> str | None:
        """Append whole lines, synced before returning, after mending a cut last line (``mend``).

        Returns:
            What the mend did, in one line (None: nothing to mend).
        """
        if not lines:
            return None
        data = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in lines).encode("utf-8")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        notice = self.mend()
        # Unbuffered: a failed write is seen here, not at close.
        with open(self.path, "ab", buffering=0) as fh:
            start = fh.tell()
            try:
                _write_all(fh, data)
                os.fsync(fh.fileno())
            except OSError:
                # A partial line would hide the next episode appended after it; if even the cut fails,
                # the next append's mend sets the partial line aside.
                with contextlib.suppress(OSError):
                    fh.truncate(start)
                raise
        return notice

    def write(self, lines: list[dict[str, Any]]) -> None:
        """Replace the file with ``lines`` atomically (a temporary file beside it, then a rename)."""
        replace_file(self.path, "".join(json.dumps(r) + "\n" for r in lines))

    def mend(self) -> str | None:
        """Leave the file ending on a whole line: complete a last line that lacks only its line end,
        otherwise move the cut tail to ``PATH.cut`` (no byte is lost). Returns what it did, in one line."""
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return None
        if size == 0:
            return None
        with open(self.path, "rb+") as fh:
            fh.seek(size - 1)
            if fh.read(1) == b"\n":
                return None
            start = _last_line_start(fh, size)
            fh.seek(start)
            tail = fh.read()
            try:
                whole = is_line(json.loads(tail))
            except (ValueError, UnicodeDecodeError):
                whole = False
            if whole:
                fh.seek(size)
                fh.write(b"\n")
                fh.flush()
                os.fsync(fh.fileno())
                return "its last episode lacked its line end (the write was cut short); completed"
            aside = self.path.with_name(self.path.name + CUT_SUFFIX)
            with open(aside, "ab") as out:  # kept before the log is cut back, so no byte is lost
                out.write(tail + b"\n")
                out.flush()
                os.fsync(out.fileno())
            fh.truncate(start)
        return (f"its last line was cut short ({len(tail)} bytes, the episode being written when the "
                f"writing stopped); set aside in {aside.name}, and that episode is played again")

    # --- reading --------------------------------------------------------------------------------------

    def scan(self) -> Iterator[LogLine]:
        """Every non-blank line of the file, in order, with where it lies; nothing if there is no file."""
        if not self.path.is_file():
            return
        offset = 0
        with open(self.path, "rb") as fh:
            for number, raw in enumerate(fh, start=1):
                start, offset = offset, offset + len(raw)
                if raw.strip():
                    yield LogLine(number, start, len(raw), raw)

    def read(self) -> list[dict[str, Any]]:
        """Every episode of the file (format 1), in order; a line cut short or damaged is skipped."""
        found: list[dict[str, Any]] = []
        position = 0
        for line in self.scan():
            try:
                found.extend(self.episodes(line, position))
            except DamagedLine:
                pass
            except ValueError:
                continue  # not JSON: a line cut short holds no task's place
            position += 1
        return found

    def episodes(self, line: LogLine, position: int) -> list[dict[str, Any]]:
        """The episodes of ``line``, the ``position``-th line of JSON ``scan`` gave (``read_line``)."""
        return read_line(line.raw, iteration=self.iteration, position=position)

    def read_at(self, offset: int, length: int, position: int) -> list[dict[str, Any]]:
        """The episodes of the ``position``-th line, at ``offset`` (``LogLine``'s), read again from disk.

        Raises:
            OSError: the file cannot be read.
            ValueError: the bytes there are no longer a readable line (the file was rewritten).
        """
        with open(self.path, "rb") as fh:
            fh.seek(offset)
            return read_line(fh.read(length), iteration=self.iteration, position=position)


@dataclass(frozen=True, slots=True)
class LogLine:
    """One line of a log file, as found: ``read_line(raw)`` gives its episodes."""

    number: int
    """1-based line number."""
    offset: int
    """Byte offset of the line in its file."""
    length: int
    """Byte length of the line, its line end included."""
    raw: bytes
    """The line's bytes."""


# --- reading ------------------------------------------------------------------------------------------


def is_line(data: Any) -> bool:
    """Whether parsed JSON is a log line of any format (an episode, or an earlier training run's group)."""
    return isinstance(data, dict) and (("task_index" in data and "turns" in data)
                                       or ("group_id" in data and "trajectories" in data))


def read_line(raw: str | bytes, *, iteration: int | None = None, position: int = 0) -> list[dict[str, Any]]:
    """The episodes of one log line, in format 1, whatever format wrote it.

    Args:
        raw: the line.
        iteration: the training iteration of the line's file, for lines that do not say it.
        position: the line's place among the file's lines: an earlier training run's group line is
            that task (its ``task_index``).

    Raises:
        ValueError: the line is not JSON (cut short by a crash, or still being written).
        DamagedLine: it is JSON but not a log line, or lacks a field (the message names it).

    Example:
        >>> old = '{"group_id": "g", "trajectories": [{"turns": [], "task_id": "t", "seed": 3}]}'
        >>> [(e["group_id"], e["sample"], e["seed"], e["return"]) for e in read_line(old)]
        [('g', 0, 3, 0.0)]
    """
    data = json.loads(raw)
    if not isinstance(data, dict):
        raise DamagedLine(f"a JSON {type(data).__name__}, not an episode object")
    if FORMAT_FIELD in data:
        if data[FORMAT_FIELD] != FORMAT:
            raise DamagedLine(f"episode_format {data[FORMAT_FIELD]!r} is newer than this agentgym reads "
                              f"({FORMAT}); upgrade agentgym")
        return [_episode(data, data["turns"] if isinstance(data.get("turns"), list) else None)]
    if "trajectories" in data or "task_index" not in data:
        return [{**e, "iteration": iteration, "task_index": position} for e in _group_episodes(data)]
    return [_evaluation_episode(data)]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _episode(data: dict[str, Any], turns: list[Any] | None) -> dict[str, Any]:
    """A format-1 line, checked."""
    for name, valid, what in (("task_index", _is_int, "an integer"), ("sample", _is_int, "an integer"),
                              ("return", lambda v: _number(v) is not None, "a number"),
                              ("turns", lambda v: isinstance(v, list), "a list")):
        if name not in data:
            raise DamagedLine(f"the episode has no '{name}'")
        if not valid(data[name]):
            raise DamagedLine(f"the episode's '{name}' is not {what}")
    for name in ("env", "policy"):
        if data.get(name) is not None and not isinstance(data[name], str):
            raise DamagedLine(f"the episode's '{name}' is not a string")
    for n, turn in enumerate(turns or []):
        if not isinstance(turn, dict):
            raise DamagedLine(f"turn {n} of the episode is not an object")
        if _number(turn.get("reward")) is None:
            raise DamagedLine(f"turn {n} of the episode has no numeric 'reward'")
    return data


def _evaluation_episode(data: dict[str, Any]) -> dict[str, Any]:
    """An evaluation's line written before format 1, as format 1: its turns carried no ids but the response's,
    and ``tokens`` for the rest."""
    for name in ("env", "policy"):
        if name not in data:
            raise DamagedLine(f"the episode has no '{name}'")
        if not isinstance(data[name], str):
            raise DamagedLine(f"the episode's '{name}' is not a string")
    _episode(data, None)
    if not all(isinstance(t, dict) for t in data["turns"]):
        raise DamagedLine("a turn of the episode is not an object")
    turns = []
    for t in data["turns"]:
        response_ids = list(t.get("response_ids") or [])
        turns.append({**t, "prompt_ids": [], "response_ids": response_ids, "response_logprobs": [],
                      "extras": {"completion_tokens": int(t.get("tokens", 0))},
                      "tokens": int(t.get("tokens", len(response_ids)))})
    task_index, sample = data["task_index"], data["sample"]
    return {FORMAT_FIELD: FORMAT, "iteration": None, "group_id": f"task-{task_index}",
            "trajectory_id": f"{task_index}-s{sample}", "parent_id": None, "fork_turn": None,
            "answer": None, "note": None, "wall_s": None, "observation": "", "info": {},
            **data, "turns": turns}


def _group_episodes(group: dict[str, Any]) -> list[dict[str, Any]]:
    """A training run's line written before format 1 (a whole ``EpisodeGroup``), as its episodes."""
    if "group_id" not in group:
        raise DamagedLine("the group has no 'group_id'")
    trajectories = group.get("trajectories")
    if not isinstance(trajectories, list):
        raise DamagedLine("the group has no 'trajectories' list")
    episodes = []
    for sample, t in enumerate(trajectories):
        if not isinstance(t, dict) or not isinstance(t.get("turns"), list):
            raise DamagedLine(f"trajectory {sample} has no 'turns' list")
        turns, episode_return = [], 0.0
        for n, turn in enumerate(t["turns"]):
            if not isinstance(turn, dict):
                raise DamagedLine(f"turn {n} of trajectory {sample} is not an object")
            for name in ("prompt_ids", "response_ids"):
                if not isinstance(turn.get(name), list):
                    raise DamagedLine(f"turn {n} of trajectory {sample} has no '{name}' list")
            reward = _number(turn.get("reward"))
            if reward is None:
                raise DamagedLine(f"turn {n} of trajectory {sample} has no numeric 'reward'")
            episode_return += reward
            extras = turn.get("extras") if isinstance(turn.get("extras"), dict) else {}
            turns.append({"response_logprobs": [], "state_key": "", "invalid": False, "action": "",
                          "observation": "", "tool_calls": 0, "extras": {}, "info": {}, **turn,
                          "tokens": int(extras.get("completion_tokens", len(turn["response_ids"])))})
        fields = {k: v for k, v in t.items() if k not in ("turns", "first_observation", "first_info")}
        episodes.append({FORMAT_FIELD: FORMAT, "env": None, "policy": None, "iteration": None,
                         "group_id": group["group_id"], "task_index": None, "sample": sample,
                         "trajectory_id": "", "seed": group.get("seed"), "task_id": group.get("task_id"),
                         "success": False, "truncated": False, "parent_id": None, "fork_turn": None,
                         "answer": None, "note": None, "wall_s": None, **fields,
                         "return": episode_return, "num_turns": len(turns),
                         "observation": t.get("first_observation", ""), "info": t.get("first_info") or {},
                         "turns": turns})
    return episodes


def trajectory_of(record: dict[str, Any]) -> Trajectory:
    """An episode (format 1, ``read_line``'s) as a ``Trajectory`` (its turns by ``Turn.from_json``).

    Example:
        >>> line = '{"env": "e", "policy": "p", "task_index": 2, "sample": 1, "seed": 9, "task_id": "t", ' \\
        ...        '"success": true, "truncated": false, "return": 1.0, "turns": [{"reward": 1.0, ' \\
        ...        '"state_key": "s", "invalid": false, "action": "up", "observation": "o", "tokens": 3}]}'
        >>> trajectory = trajectory_of(read_line(line)[0])
        >>> trajectory.trajectory_id, trajectory.episode_return, trajectory.turns[0].extras
        ('2-s1', 1.0, {'completion_tokens': 3})
    """
    turns = [Turn.from_json(t) for t in record["turns"]]
    seed = record.get("seed")
    return Trajectory(turns, str(record.get("task_id")), int(seed) if _is_int(seed) else 0,
                      success=bool(record.get("success")), truncated=bool(record.get("truncated")),
                      trajectory_id=str(record.get("trajectory_id") or ""), parent_id=record.get("parent_id"),
                      fork_turn=record.get("fork_turn"), answer=record.get("answer"),
                      first_observation=str(record.get("observation") or ""),
                      first_info=dict(record.get("info") or {}), note=record.get("note"))


def groups_of(records: list[dict[str, Any]]) -> list[EpisodeGroup]:
    """Episodes (format 1) grouped by task, ordered by task index, samples in order."""
    by_task: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for record in sorted(records, key=lambda r: (r.get("iteration") or 0, r["task_index"], r["sample"])):
        by_task.setdefault((record.get("iteration") or 0, record["task_index"]), []).append(record)
    return [EpisodeGroup(str(rs[0]["group_id"]), str(rs[0]["task_id"]), int(rs[0]["seed"]),
                         [trajectory_of(r) for r in rs])
            for _, rs in sorted(by_task.items())]


# --- files --------------------------------------------------------------------------------------------


def replace_file(path: Path, text: str) -> None:
    """Write ``path`` atomically: a temporary file beside it, synced, then renamed over it.

    Raises:
        OSError: it cannot be written; the previous version, if any, stays whole.
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb", buffering=0) as fh:
            _write_all(fh, text.encode("utf-8"))
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise


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
