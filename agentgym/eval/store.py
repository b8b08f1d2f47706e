"""An evaluation's folder: its plan, one trajectory JSONL per (env, policy), timings, and reading them back.

Layout of ``DIR``::

    plan.json                        the exact evaluation (policies, envs, seeds, samples, sampling)
    trajectories/ENV/POLICY.jsonl    one finished episode per line, appended as episodes finish
    timing.json                      wall seconds spent per (env, policy), summed over resumed sessions
    results.json, report.md, report.html   written at the end (``agentgym.eval.report``)

An episode line holds the task (index, seed, sample), outcome, and every turn's prompt text,
response text, parsed action, observation, reward, ``state_key``, invalid flag, tool calls, tokens
and info, plus the episode's first observation and info, so any episode can be replayed and audited.
Lines are written whole and flushed; a line cut short by a crash is ignored when reading, so
``--resume`` simply plays that episode again.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from agentgym.rollout.records import EpisodeGroup, Trajectory, Turn

PLAN = "plan.json"
TIMING = "timing.json"


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
            "tool_calls": turn.tool_calls, "tokens": int(turn.extras.get("completion_tokens", len(turn.response_ids))),
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
    return [EpisodeGroup(f"task-{index}", str(rs[0]["task_id"]), int(rs[0]["seed"]), [trajectory_of(r) for r in rs])
            for index, rs in sorted(by_task.items())]


class EvalStore:
    """Reads and writes one evaluation folder (thread-safe appends)."""

    def __init__(self, out_dir: str | Path) -> None:
        self.root = Path(out_dir)
        self._lock = threading.Lock()

    # --- plan and timing --------------------------------------------------------------------------

    def has_plan(self) -> bool:
        return (self.root / PLAN).is_file()

    def read_plan(self) -> dict[str, Any]:
        return json.loads((self.root / PLAN).read_text())

    def write_plan(self, plan: dict[str, Any]) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / PLAN).write_text(json.dumps(plan, indent=2) + "\n")

    def timing(self) -> dict[str, float]:
        path = self.root / TIMING
        return json.loads(path.read_text()) if path.is_file() else {}

    def add_time(self, env: str, policy: str, seconds: float) -> None:
        with self._lock:
            timing = self.timing()
            key = f"{env}\t{policy}"
            timing[key] = timing.get(key, 0.0) + seconds
            (self.root / TIMING).write_text(json.dumps(timing, indent=2) + "\n")

    def wall_s(self, env: str, policy: str) -> float:
        return float(self.timing().get(f"{env}\t{policy}", 0.0))

    # --- episodes ---------------------------------------------------------------------------------

    def path(self, env: str, policy: str) -> Path:
        return self.root / "trajectories" / slug(env) / f"{slug(policy)}.jsonl"

    def append(self, env: str, policy: str, records: list[dict[str, Any]]) -> None:
        """Append finished episodes (each a whole line, flushed before returning)."""
        if not records:
            return
        path = self.path(env, policy)
        text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
        with self._lock:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "a", encoding="utf-8") as fh:
                fh.write(text)
                fh.flush()

    def records(self, env: str, policy: str) -> list[dict[str, Any]]:
        """The episodes saved for (env, policy), one per (task, sample): a repeated key keeps its first
        line, and an unreadable line (cut short by a crash) is skipped."""
        found: dict[tuple[int, int], dict[str, Any]] = {}
        for record in self._lines(self.path(env, policy)):
            found.setdefault(episode_key(record), record)
        return [found[k] for k in sorted(found)]

    @staticmethod
    def _lines(path: Path) -> Iterator[dict[str, Any]]:
        if not path.is_file():
            return
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                if isinstance(record, dict) and "task_index" in record and "turns" in record:
                    yield record
