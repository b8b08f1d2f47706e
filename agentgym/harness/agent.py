"""The harness contract: what runs a user's agent once on one task, and what it gives back.

A harness is either

- an importable function, ``"module:function"`` (or the function itself)::

      def run(task: dict, base_url: str, api_key: str, model: str) -> float | dict | None: ...

  It is called with the task row positionally and, by keyword, whichever of ``base_url``, ``api_key``
  and ``model`` it accepts (all of them when it takes ``**kwargs``). An ``async def`` works the same way
  (it runs in an event loop of its own). It runs in a thread of its own, one per rollout;
- or a command line (any string that is not ``module:function``, or a list of arguments), run once per
  rollout in a subprocess with ``OPENAI_BASE_URL``, ``OPENAI_API_KEY``, ``AGENTGYM_MODEL`` and
  ``AGENTGYM_TASK`` (the task as JSON, also on its stdin) in its environment. Its reward is the last
  non-empty line of its stdout: a number, ``null`` or a JSON object (as below); exit code 0 is success.

What it returns: a number (the episode's reward), ``None`` (the run's reward function scores the
transcript), or a dict with ``reward`` (a number or None) and optionally ``success`` (a bool).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import math
import os
import re
import shlex
import subprocess
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agentgym.errors import ConfigError
from agentgym.plugins import import_object

_IMPORT_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
_ENDPOINT_KEYWORDS = ("base_url", "api_key", "model")


class HarnessError(ConfigError):
    """The harness broke its contract (cannot be imported, returned a non-number, never called the
    endpoint): a fault of the harness's code or configuration, not of one rollout."""


@dataclass(frozen=True)
class AgentOutcome:
    """How one run of the agent ended."""

    reward: float | None = None
    """The reward it returned (None: let the reward function score the transcript)."""
    success: bool | None = None
    """Success, when the harness said."""
    error: str | None = None
    """Why the run failed (an exception, a non-zero exit): a failed rollout."""
    fault: str | None = None
    """The harness broke its contract (returned a non-number...): the env raises it as a ``HarnessError``,
    since every other rollout would break it too."""


def outcome_of(value: Any, harness: str) -> AgentOutcome:
    """Read what a harness returned.

    Raises:
        HarnessError: anything but a number, None or a dict with a numeric (or null) ``reward``.

    Example:
        >>> outcome_of(1, "a:b"), outcome_of({"reward": 0.5, "success": True}, "a:b").success
        (AgentOutcome(reward=1.0, success=None, error=None, fault=None), True)
        >>> outcome_of("yes", "a:b")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        agentgym.harness.agent.HarnessError: harness a:b returned a str ('yes'); return a number (the ...
    """
    success = None
    if isinstance(value, Mapping):
        if "reward" not in value:
            raise HarnessError(f"harness {harness} returned a dict without 'reward' (keys: {sorted(value)}); "
                               'return {"reward": number, "success": bool}')
        success = value.get("success")
        if success is not None and not isinstance(success, bool):
            raise HarnessError(f"harness {harness} returned success={success!r}; success must be true or "
                               "false")
        value = value["reward"]
    if value is None:
        return AgentOutcome(None, success)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        shown = repr(value)[:60]
        raise HarnessError(f"harness {harness} returned a {type(value).__name__} ({shown}); return a number "
                           '(the reward), None (the reward function scores the transcript) or '
                           '{"reward": number, "success": bool}')
    return AgentOutcome(float(value), success)


def _describe(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:300]}" if text else type(exc).__name__


class Harness:
    """A resolved harness (see the module doc); ``start`` runs it once in the background.

    Args:
        target: ``"module:function"``, a callable, a command line string or a list of arguments.

    Raises:
        HarnessError: the module or function cannot be imported, or is not callable.
    """

    def __init__(self, target: str | Sequence[str] | Callable[..., Any]) -> None:
        self.function: Callable[..., Any] | None = None
        self.command: list[str] | None = None
        if callable(target):
            qualname = getattr(target, "__qualname__", repr(target))
            self.function, self.name = target, f"{target.__module__}:{qualname}"
        elif isinstance(target, str) and _IMPORT_PATH.match(target.strip()):
            self.name = target.strip()
            self.function = _import(self.name)
        elif isinstance(target, str) and target.strip():
            self.name, self.command = target.strip(), shlex.split(target)
        elif isinstance(target, Sequence) and not isinstance(target, str) and target:
            self.command = [str(part) for part in target]
            self.name = shlex.join(self.command)
        else:
            raise HarnessError(f"harness must be 'module:function', a command line or a callable, got "
                               f"{target!r}")
        self._keywords: tuple[str, ...] = _ENDPOINT_KEYWORDS
        if self.function is not None:
            self._keywords = _accepted_keywords(self.function)

    def start(self, task: dict[str, Any], base_url: str, api_key: str, model: str,
              done: Callable[[AgentOutcome], None]) -> Callable[[], None]:
        """Run the agent on ``task`` in the background; ``done`` gets its outcome (from another thread).
        Returns a function that stops it (kills a subprocess; a thread cannot be stopped, its later calls
        to the endpoint are refused)."""
        if self.command is not None:
            return self._start_command(task, base_url, api_key, model, done)
        endpoint = {"base_url": base_url, "api_key": api_key, "model": model}
        kwargs = {key: endpoint[key] for key in self._keywords}
        function = self.function
        assert function is not None

        def run() -> None:
            try:
                result = function(task, **kwargs)
                if inspect.isawaitable(result):
                    result = asyncio.run(_await(result))
            except BaseException as exc:  # the agent's own failure: a failed rollout
                done(AgentOutcome(error=_describe(exc)))
                return
            try:
                outcome = outcome_of(result, self.name)
            except HarnessError as exc:
                outcome = AgentOutcome(fault=str(exc))
            done(outcome)

        thread = threading.Thread(target=run, name=f"agentgym-harness-{task.get('id')}", daemon=True)
        thread.start()
        return lambda: None

    def _start_command(self, task: dict[str, Any], base_url: str, api_key: str, model: str,
                       done: Callable[[AgentOutcome], None]) -> Callable[[], None]:
        task_json = json.dumps(task)
        env = {**os.environ, "OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": api_key, "AGENTGYM_MODEL": model,
               "AGENTGYM_TASK": task_json}
        assert self.command is not None
        try:
            process = subprocess.Popen(self.command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True, env=env)
        except OSError as exc:
            raise HarnessError(f"harness command {self.name!r} cannot be started ({_describe(exc)}); give a "
                               "command line that runs, or 'module:function'") from None

        def wait() -> None:
            out, err = process.communicate(task_json)
            if process.returncode != 0:
                tail = " ".join((err or "").strip().splitlines()[-1:]) or "no stderr"
                done(AgentOutcome(error=f"the command exited with code {process.returncode}: {tail[:300]}"))
                return
            lines = [line.strip() for line in (out or "").splitlines() if line.strip()]
            try:
                value = json.loads(lines[-1]) if lines else None
            except ValueError:
                done(AgentOutcome(fault=f"harness {self.name} printed {lines[-1][:60]!r} last; its last "
                                        "stdout line must be the reward: a number, null or a JSON object"))
                return
            try:
                done(outcome_of(value, self.name))
            except HarnessError as exc:
                done(AgentOutcome(fault=str(exc)))

        threading.Thread(target=wait, name="agentgym-harness-wait", daemon=True).start()

        def stop() -> None:
            if process.poll() is None:
                process.kill()

        return stop


async def _await(awaitable: Any) -> Any:
    return await awaitable


def _import(path: str) -> Callable[..., Any]:
    # One resolver for every module:attr name: it finds the user's module in the working folder too.
    target = import_object(path, what=f"harness {path}", error=HarnessError)
    if not callable(target):
        raise HarnessError(f"harness {path} is a {type(target).__name__}, not a function")
    return target


def _accepted_keywords(function: Callable[..., Any]) -> tuple[str, ...]:
    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError):
        return _ENDPOINT_KEYWORDS
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return _ENDPOINT_KEYWORDS
    positional = [p for p in parameters.values()
                  if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    if not positional and not any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in parameters.values()):
        raise HarnessError(f"harness {function.__name__} takes no task argument; its first parameter gets "
                           "the task row")
    return tuple(k for k in _ENDPOINT_KEYWORDS if k in parameters
                 and parameters[k].kind is not inspect.Parameter.POSITIONAL_ONLY)
