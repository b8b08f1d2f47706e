"""Harness tasks: the rows a harness runs its agent on, from a JSONL file or a list.

Each row is a JSON object handed to the harness as it is. Keys agentgym reads:

- ``id`` (optional): the task's id in records and reports (default ``task-<index>``);
- ``answer`` (optional): the privileged answer (``info["answer"]``), for algorithms that read one (IGPO)
  and for a reward function;
- ``split`` (optional): ``"test"`` or ``"eval"`` marks a held-out task (see ``TaskSet.pick``).

A ``TaskSet``'s training tasks and held-out tasks are the harness env's task splits ``train`` and
``test`` (``TaskSet.splits``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentgym.core import HELD_OUT_SEED_START
from agentgym.errors import ConfigError

_HELD_OUT_SPLITS = ("test", "eval", "held_out")


def load_tasks(source: str | Path | Sequence[Mapping[str, Any]], *,
               what: str = "tasks", id_prefix: str = "task") -> list[dict[str, Any]]:
    """The task rows of a JSONL file (one JSON object per line; blank lines skipped) or of a list of dicts.

    A row without an ``id`` gets ``{id_prefix}-{index}``.

    Raises:
        ConfigError: a missing file, a line that is not a JSON object (naming the line), or no tasks.

    Example:
        >>> [row["id"] for row in load_tasks([{"question": "2+2?"}, {"id": "b", "question": "3+3?"}])]
        ['task-0', 'b']
    """
    if isinstance(source, (str, Path)):
        path = Path(source).expanduser()
        if not path.is_file():
            raise ConfigError(f"{what} file '{path}' does not exist; give a JSONL file with one JSON object "
                              "(a task) per line")
        rows: list[Any] = []
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except ValueError as exc:
                raise ConfigError(f"{what} file '{path}' line {number} is not JSON ({exc.msg}); each line "
                                  "must be one JSON object") from None
            if not isinstance(rows[-1], dict):
                raise ConfigError(f"{what} file '{path}' line {number} is a {type(rows[-1]).__name__}, not a "
                                  "JSON object")
    else:
        rows = [dict(row) if isinstance(row, Mapping) else row for row in source]
        for index, row in enumerate(rows):
            if not isinstance(row, dict):
                raise ConfigError(f"{what}[{index}] is a {type(row).__name__}, not a mapping (a task is a "
                                  "dict)")
    if not rows:
        raise ConfigError(f"{what} is empty; give at least one task")
    out = []
    for index, row in enumerate(rows):
        row = dict(row)
        row["id"] = str(row.get("id", f"{id_prefix}-{index}"))
        out.append(row)
    return out


@dataclass(frozen=True)
class TaskSet:
    """Training and held-out tasks, picked by seed.

    Example:
        >>> tasks = TaskSet.of([{"q": 1}, {"q": 2}, {"q": 3, "split": "test"}])
        >>> [tasks.pick(seed)["q"] for seed in (0, 1, 2, HELD_OUT_SEED_START)]
        [1, 2, 1, 3]
    """

    train: tuple[dict[str, Any], ...]
    held_out: tuple[dict[str, Any], ...]

    @classmethod
    def of(cls, tasks: str | Path | Sequence[Mapping[str, Any]],
           eval_tasks: str | Path | Sequence[Mapping[str, Any]] | None = None) -> TaskSet:
        """Held-out tasks are ``eval_tasks`` when given (ids default to ``eval-<index>``, apart from the
        training tasks' ``task-<index>``), else the rows whose ``split`` is test/eval; when there are
        none, held-out seeds reuse the training tasks.

        Raises:
            ConfigError: a training and a held-out task share an id but differ (an id names one task).
        """
        rows = load_tasks(tasks)
        held = [r for r in rows if str(r.get("split", "")).lower() in _HELD_OUT_SPLITS]
        train = [r for r in rows if r not in held] or rows
        if eval_tasks is not None:
            held = load_tasks(eval_tasks, what="eval_tasks", id_prefix="eval")
        by_id = {row["id"]: row for row in train}
        clash = next((row["id"] for row in held if by_id.get(row["id"], row) != row), None)
        if clash is not None:
            raise ConfigError(f"task id {clash!r} names both a training task and a different held-out task; "
                              "give the held-out task another id")
        return cls(tuple(train), tuple(held or train))

    def splits(self) -> dict[str, tuple[dict[str, Any], ...]]:
        """The task splits: ``train``, and ``test`` (the held-out tasks) when there are held-out tasks
        apart from the training ones.

        Example:
            >>> {name: [row["id"] for row in rows]
            ...  for name, rows in TaskSet.of([{"q": 1}, {"q": 2, "split": "eval"}]).splits().items()}
            {'train': ['task-0'], 'test': ['task-1']}
            >>> list(TaskSet.of([{"q": 1}]).splits())
            ['train']
        """
        if self.held_out == self.train:
            return {"train": self.train}
        return {"train": self.train, "test": self.held_out}

    def pick(self, seed: int | None) -> dict[str, Any]:
        """Task for a seed: seeds below ``HELD_OUT_SEED_START`` cycle through the training tasks, the
        others through the held-out ones."""
        seed = 0 if seed is None else int(seed)
        if seed >= HELD_OUT_SEED_START:
            return self.held_out[(seed - HELD_OUT_SEED_START) % len(self.held_out)]
        return self.train[seed % len(self.train)]

    def named(self, task_id: str) -> dict[str, Any]:
        """The task with this id (training or held-out).

        Raises:
            ConfigError: no task has it.
        """
        for row in (*self.train, *self.held_out):
            if row["id"] == task_id:
                return row
        raise ConfigError(f"no task has id {task_id!r}; ids look like {self.train[0]['id']!r}")
