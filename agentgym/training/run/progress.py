"""What a run shows while it works: a live progress display in a terminal, timestamped lines elsewhere.

The loop reports phases (``start``/``update``/``finish``) and notes; ``Progress`` ignores them (the
library default), ``TerminalProgress`` draws rich progress bars, ``LineProgress`` prints one line per
step of a phase at most every ``min_interval_s`` (plus each phase's first and last), for logs and CI.
``quiet_third_party_bars`` keeps the bars of transformers and huggingface_hub (shard writing, weight
loading) out of the output.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO

from rich.console import Console


class Progress:
    """Receives a run's progress and shows nothing; subclasses show it.

    A phase is a named piece of work, with a known number of steps (SFT steps, RL iterations) or
    without (an evaluation). The loop calls ``start`` once per phase, ``update`` as steps complete,
    ``finish`` at its end, and ``note`` for anything the user should read now.
    """

    def start(self, phase: str, total: int | None = None, completed: int = 0) -> None:
        """A phase begins (``total`` steps, ``completed`` of them already done, e.g. on resume)."""

    def update(self, completed: int, status: str = "", total: int | None = None) -> None:
        """``completed`` steps of the current phase are done; ``status`` says how it goes."""

    def finish(self, status: str = "") -> None:
        """The current phase ended; ``status`` is its outcome."""

    def note(self, text: str) -> None:
        """A message to show now."""

    def close(self) -> None:
        """The run is over (stop any live display)."""

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def iteration_status(metrics: dict[str, Any]) -> str:
    """The key metrics of an RL iteration in one short string.

    Example:
        >>> iteration_status({"rollout/success_rate": 0.5, "reward/mean_return": 0.5,
        ...                   "rollout/mean_turns": 3.25, "perf/iteration_s": 2.0, "eval/success_rate": 0.75})
        'success 50% · return 0.50 · turns 3.2 · 2.0 s/it · held-out 75%'
    """
    status = (f"success {metrics['rollout/success_rate']:.0%} · return {metrics['reward/mean_return']:.2f} · "
              f"turns {metrics['rollout/mean_turns']:.1f} · {metrics['perf/iteration_s']:.1f} s/it")
    if "eval/success_rate" in metrics:
        status += f" · held-out {metrics['eval/success_rate']:.0%}"
    return status


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{secs:02d}"


class LineProgress(Progress):
    """Plain, timestamped lines: for output that is not a terminal (a log file, CI).

    Args:
        file: where to write (default: the console's file).
        min_interval_s: within a phase, at most one line per this many seconds (its first and last
            steps are always printed).

    Example:
        >>> import io
        >>> out = io.StringIO()
        >>> progress = LineProgress(out, min_interval_s=3600)
        >>> progress.start("RL", total=3)
        >>> for i in (1, 2, 3):
        ...     progress.update(i, "fine")
        >>> [line.split("] ")[1] for line in out.getvalue().splitlines()]
        ['RL 1/3 · fine', 'RL 3/3 · fine']
    """

    def __init__(self, file: TextIO | None = None, *, min_interval_s: float = 5.0) -> None:
        self.console = Console(file=file, soft_wrap=True, highlight=False, emoji=False)
        self.min_interval_s = min_interval_s
        self.started = time.monotonic()
        self.phase, self.total, self.completed, self.status = "", None, 0, ""
        self.printed_at: float | None = None
        self.printed_completed = -1

    def _print(self, text: str) -> None:
        self.console.print(f"[{_clock(time.monotonic() - self.started)}] {text}", markup=False)

    def start(self, phase: str, total: int | None = None, completed: int = 0) -> None:
        self.phase, self.total, self.completed, self.status = phase, total, completed, ""
        self.printed_at, self.printed_completed = None, completed
        if total is None:
            self._print(f"{phase}…")

    def update(self, completed: int, status: str = "", total: int | None = None) -> None:
        self.completed, self.status = completed, status
        self.total = total if total is not None else self.total
        now = time.monotonic()
        due = self.printed_at is None or now - self.printed_at >= self.min_interval_s
        if due or completed == self.total:
            self._print_step()

    def _print_step(self) -> None:
        of = f"/{self.total}" if self.total is not None else ""
        self._print(f"{self.phase} {self.completed}{of}" + (f" · {self.status}" if self.status else ""))
        self.printed_at, self.printed_completed = time.monotonic(), self.completed

    def finish(self, status: str = "") -> None:
        if self.total is None:
            self._print(f"{self.phase}: {status}" if status else f"{self.phase}: done")
        elif self.printed_completed != self.completed:
            self._print_step()

    def note(self, text: str) -> None:
        self._print(text)


class TerminalProgress(Progress):
    """rich progress bars, one row per phase, with notes printed above them.

    Args:
        console: the terminal's console.
    """

    def __init__(self, console: Console) -> None:
        from rich.progress import BarColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
        from rich.progress import Progress as Bars

        self.bars = Bars(TextColumn("[bold]{task.description}"), BarColumn(),
                         TextColumn("{task.fields[steps]}"), TextColumn("{task.fields[status]}"),
                         TimeElapsedColumn(), TimeRemainingColumn(), console=console)
        self.bars.start()
        self.task: Any = None
        self.total: int | None = None

    def start(self, phase: str, total: int | None = None, completed: int = 0) -> None:
        self.finish()
        self.total = total
        self.task = self.bars.add_task(phase, total=total, completed=completed, status="",
                                       steps=self._steps(completed))

    def _steps(self, completed: int) -> str:
        return f"{completed}/{self.total}" if self.total is not None else ""

    def update(self, completed: int, status: str = "", total: int | None = None) -> None:
        if self.task is not None:
            self.total = total if total is not None else self.total
            self.bars.update(self.task, completed=completed, total=self.total, status=status,
                             steps=self._steps(completed))

    def finish(self, status: str = "") -> None:
        if self.task is None:
            return
        if self.total is None:  # an evaluation: the bar fills when it ends
            self.bars.update(self.task, total=1, completed=1)
        if status:
            self.bars.update(self.task, status=status)
        self.bars.stop_task(self.task)
        self.task = None

    def note(self, text: str) -> None:
        self.bars.console.print(text, markup=False, highlight=False)

    def close(self) -> None:
        if self.task is not None:
            self.bars.stop_task(self.task)  # an interrupted phase stays as far as it got
        self.bars.stop()


def make_progress(console: Console) -> Progress:
    """Bars when ``console`` is a terminal, lines otherwise."""
    return TerminalProgress(console) if console.is_terminal else LineProgress(console.file)


@contextmanager
def quiet_third_party_bars() -> Iterator[None]:
    """Switch off the tqdm bars of transformers and huggingface_hub (weight loading, shard writing)
    for the duration, and back on after if they were on."""
    switched: list[Any] = []
    try:
        from transformers.utils import logging as transformers_logging

        if transformers_logging.is_progress_bar_enabled():
            transformers_logging.disable_progress_bar()
            switched.append(transformers_logging.enable_progress_bar)
    except ImportError:  # the train extra is not installed: nothing draws bars
        pass
    try:
        from huggingface_hub import utils as hub_utils

        if not hub_utils.are_progress_bars_disabled():
            hub_utils.disable_progress_bars()
            switched.append(hub_utils.enable_progress_bars)
    except ImportError:
        pass
    try:
        yield
    finally:
        for enable in switched:
            enable()
