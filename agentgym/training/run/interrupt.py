"""Stopping a run on Ctrl-C (SIGINT) or SIGTERM at a point it can resume from: ``StopSignals``.

The first Ctrl-C asks the run to stop after the current iteration (which then saves a checkpoint).
A second Ctrl-C, or a SIGTERM (a scheduler's or ``kill``'s notice, which may be followed by a kill),
asks it to stop now: ``StopNow`` is raised where the loop said the iteration may be abandoned
(collecting rollouts, the update, an evaluation between iterations), or as soon as the loop reaches
such a point. Where nothing can be saved anyway (the warm start) or everything already is (the final
evaluation), any signal stops at once.

Two ways reach a phase: the handler raises ``StopNow`` in the main thread when it lands inside a
region, and the long phases call ``poll`` between their steps (SFT and update minibatches, log-prob
chunks, collection turns), also from other threads (a background collection), where the handler
cannot raise. So every phase stops within one of its steps.

A signal can also land inside a finalizer (an object's ``__del__``, a weakref callback) that the garbage
collector happens to run at that moment. Python cannot propagate an exception from there and would print
it as "Exception ignored in ..." with a traceback; the stop is not lost (``now`` stays set, and the phase's
next ``poll`` or region raises it), so while the handlers are installed such a ``StopNow`` is dropped
quietly, and every other unraisable exception still goes to the previous ``sys.unraisablehook``.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any, Literal

SIGNALS = (signal.SIGINT, signal.SIGTERM)
Region = Literal["abandonable", "immediate"]


class StopNow(BaseException):
    """Raised inside a region the run may leave at once. A ``BaseException``, like ``KeyboardInterrupt``,
    so that no ``except Exception`` in env or hook code swallows it."""


class StopSignals:
    """SIGINT/SIGTERM handlers for the duration of a run (a context manager).

    Outside the main thread (where Python cannot install handlers) it does nothing.

    Args:
        on_note: told, as they arrive, what the signals will do (for the user).

    Example:
        >>> import os
        >>> with StopSignals() as stop:
        ...     os.kill(os.getpid(), signal.SIGINT)
        ...     stop.requested, stop.now
        (True, False)
    """

    def __init__(self, on_note: Callable[[str], None] | None = None) -> None:
        self.on_note = on_note or (lambda text: None)
        self.signal: str | None = None
        """Name of the last signal received (``"SIGINT"``, ``"SIGTERM"``), None before any."""
        self.now = False
        """Stop at once (at the next point that may be abandoned), not after the iteration."""
        self._region: Region | None = None
        self._previous: dict[int, Any] = {}
        self._previous_unraisablehook: Callable[[Any], Any] | None = None

    @property
    def requested(self) -> bool:
        """A stop was asked for (after the current iteration, or now)."""
        return self.signal is not None

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
            self._previous_unraisablehook, sys.unraisablehook = sys.unraisablehook, self._unraisable
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
        if self._previous_unraisablehook is not None:
            sys.unraisablehook, self._previous_unraisablehook = self._previous_unraisablehook, None

    def poll(self) -> None:
        """Raise ``StopNow`` when a pending stop applies where the run is (a stop at once anywhere, any stop
        inside an ``immediate`` region). Safe from any thread; long phases call it between their steps.

        Example:
            >>> import os
            >>> with StopSignals() as stop:
            ...     os.kill(os.getpid(), signal.SIGTERM)
            ...     try:
            ...         stop.poll()
            ...     except StopNow:
            ...         print("stopped at", stop.signal)
            stopped at SIGTERM
        """
        if self.now or (self._region == "immediate" and self.requested):
            raise StopNow

    @contextmanager
    def region(self, kind: Region | None) -> Iterator[None]:
        """Mark code a stop may cut short: ``abandonable`` on a second Ctrl-C or a SIGTERM, ``immediate`` on
        any signal. Entering it when such a stop is already pending raises ``StopNow`` at once. None: no
        region, the code runs to its end (a stop waits for the next region or ``poll``)."""
        if kind is None:
            yield
            return
        if self.now or (kind == "immediate" and self.requested):
            raise StopNow
        previous, self._region = self._region, kind
        try:
            yield
        finally:
            self._region = previous

    def _unraisable(self, unraisable: Any) -> None:
        """A ``StopNow`` the handler raised inside a finalizer: nothing to report, the stop stays pending."""
        if isinstance(unraisable.exc_value, StopNow):
            return
        assert self._previous_unraisablehook is not None
        self._previous_unraisablehook(unraisable)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        first = self.signal is None
        self.signal = signal.Signals(signum).name
        self.now = self.now or not first or signum == signal.SIGTERM or self._region == "immediate"
        if self.now and self._region is not None:
            raise StopNow
        if self.now:
            self.on_note(f"{self.signal}: stopping at once")
        else:
            self.on_note(f"{self.signal}: stopping after this iteration, which is then saved "
                         f"(Ctrl-C again to stop at once: a resumed run does this iteration again, and "
                         f"after a stop inside an update, every iteration since the last checkpoint)")
