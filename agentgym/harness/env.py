"""``HarnessEnv``: a user's agent as an env. Each episode is one run of the agent on one task; each of
its calls to the rollout proxy is one turn.

The collector plays it like any env (``agentgym.rollout.collector``), so every algorithm and the
evaluation drive a harness through the one engine:

- ``reset(seed)`` picks the task (``TaskSet.pick``; ``options["task_id"]`` names one, and
  ``options={"split": ..., "index": ...}`` a task of the splits ``train`` and ``test``, the task set's
  training and held-out tasks: ``TaskSet.splits``), opens a rollout
  on the proxy, starts the agent with the rollout's ``base_url``/``api_key``/``model`` and waits for its
  first call. The observation is the last message of the chat it sent; ``info["messages"]`` and
  ``info["tools"]`` are the chat itself, which the collector's renderer turns into the prompt ids exactly
  as the request asked.
- ``step(reply)`` answers the waiting call with the generated reply (its ``<tool_call>`` blocks as
  OpenAI ``tool_calls``) and waits for the agent's next call (reward 0), or for its end: the reward it
  returned (or the reward function's score of the transcript) ends the episode.

A run that raises, exits non-zero or outlives ``timeout_s`` is a *failed rollout*: the episode ends with
reward 0 and ``info["harness_error"]``; with ``on_failure="exclude"`` it is also marked ``discard`` and
the collector leaves it out of its group. The iteration goes on. What breaks the harness's contract
itself (it cannot be imported, returns a non-number, ends without calling the endpoint, fails before
its first call) raises ``HarnessError``: every other rollout would do the same.

``info["state_key"]`` hashes the chat so far, so GiGPO/HGPO find the states that group members share;
a harness rollout cannot be forked (ARPO's branching is refused before training starts), and
``info["answer"]`` is the task's ``answer`` when it has one (IGPO).
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal

from agentgym.core import Env, TaskSplit
from agentgym.errors import ConfigError
from agentgym.harness.agent import AgentOutcome, Harness, HarnessError
from agentgym.harness.proxy import DEFAULT_MODEL_NAME, Call, Finished, Reply, Rollout, RolloutProxy
from agentgym.harness.tasks import TaskSet
from agentgym.rollout.chat_messages import chat_state_key, reply_message

ExpertFn = Callable[[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]], "str | None"]
"""``(task, messages, tools) -> reply``: what a good model would answer to the agent's current call (its text,
tool calls written as ``<tool_call>`` blocks), or None where it has no answer: the demonstrations of SFT."""

RewardFn = Callable[[dict[str, Any], list[dict[str, Any]]], Any]
"""``(task, transcript) -> reward``: scores a run whose harness returned None; ``transcript`` is the last
chat the agent sent plus the model's final reply."""


def _function(target: Any) -> Any:
    if target is None or callable(target):
        return target
    from agentgym.harness.agent import _import

    return _import(target)


class HarnessEnv(Env):
    """A harness run as an env (see the module doc).

    Args:
        harness: ``"module:function"``, a command line, or a callable (``agentgym.harness.agent``).
        tasks: a JSONL file or a list of task dicts (``agentgym.harness.tasks``).
        eval_tasks: held-out tasks (default: rows of ``tasks`` whose ``split`` is test/eval).
        reward: ``"module:function"`` or a callable ``(task, transcript) -> number`` for harnesses that
            return None.
        timeout_s: wall-clock limit of one run of the agent (its tool time included).
        on_failure: ``zero`` (a failed rollout is trained on with reward 0) or ``exclude`` (left out).
        expert: ``"module:function"`` or a callable ``(task, messages, tools) -> reply`` (``ExpertFn``): the
            replies SFT demonstrations are made of (``sft.enabled``); None: no expert.
        model_name: the model name the agent must request.
        proxy: the proxy to use (default: this process's, started on first use).
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": []}
    forkable: ClassVar[bool] = False
    steps_wait: ClassVar[bool] = True

    def __init__(self, harness: str | Sequence[str] | Callable[..., Any],
                 tasks: str | Path | Sequence[Mapping[str, Any]], *,
                 eval_tasks: str | Path | Sequence[Mapping[str, Any]] | None = None,
                 reward: str | RewardFn | None = None, timeout_s: float = 300.0,
                 on_failure: Literal["zero", "exclude"] = "zero", expert: str | ExpertFn | None = None,
                 model_name: str = DEFAULT_MODEL_NAME,
                 proxy: RolloutProxy | None = None) -> None:
        super().__init__()
        if on_failure not in ("zero", "exclude"):
            raise ConfigError(f"on_failure must be 'zero' or 'exclude', got {on_failure!r}")
        if not (isinstance(timeout_s, (int, float)) and timeout_s > 0):
            raise ConfigError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
        self.harness = harness if isinstance(harness, Harness) else Harness(harness)
        self.tasks = TaskSet.of(tasks, eval_tasks)
        self.reward_fn: RewardFn | None = _function(reward)
        self.expert: ExpertFn | None = _function(expert)
        self.has_expert = self.expert is not None  # type: ignore[misc]
        self.timeout_s = float(timeout_s)
        self.on_failure = on_failure
        self.model_name = model_name
        self._proxy = proxy
        self._rollout: Rollout | None = None
        self._stop: Callable[[], None] = lambda: None
        self._call: Call | None = None
        self._deadline = 0.0
        self._task: dict[str, Any] = {}
        self._over = True
        self._tool_calls = 0
        """Tool calls in the model's latest reply (``info["tool_calls"]``)."""

    # --- the episode ----------------------------------------------------------------------------

    # Env.reset seeds np_random, then takes the task from parse_task_id or choose_task and starts it with
    # start_task.

    def parse_task_id(self, task_id: Any) -> dict[str, Any]:
        # A reset ends the run in progress even when it names no task: its agent is stopped now, not left
        # waiting on its call until the next reset.
        self._end("a new episode started")
        return self.tasks.named(str(task_id))

    def choose_task(self, seed: int | None) -> dict[str, Any]:
        return self.tasks.pick(seed)

    def start_task(self, task: dict[str, Any], options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """Open a rollout on the proxy, start the agent on ``task`` and observe its first call."""
        self._end("a new episode started")
        self._task = dict(task)
        self._tool_calls = 0
        proxy = self._proxy or RolloutProxy.shared(self.model_name)
        self._rollout = rollout = proxy.open(self._task["id"])
        self._deadline = time.monotonic() + self.timeout_s
        self._over = False
        self._stop = self.harness.start(self._task, rollout.base_url, rollout.api_key, proxy.model_name,
                                        rollout.finish)
        event = self._next_event()
        if isinstance(event, Call):
            return self._observe(event)
        self._end("the agent ended")
        raise self._no_first_call(event)

    def _no_first_call(self, event: Finished | None) -> HarnessError:
        """What broke the harness's contract when its run ended (or timed out) before its first call."""
        outcome = event.outcome if isinstance(event, Finished) else None
        if isinstance(outcome, AgentOutcome) and outcome.fault:
            return HarnessError(outcome.fault)
        if event is None:
            return HarnessError(f"harness {self.harness.name} made no call to its endpoint within timeout_s="
                                f"{self.timeout_s:g} s on task {self._task['id']!r}")
        if isinstance(outcome, AgentOutcome) and outcome.error:
            return HarnessError(f"harness {self.harness.name} failed on task {self._task['id']!r} before its "
                                f"first call: {outcome.error}")
        return HarnessError(f"harness {self.harness.name} finished task {self._task['id']!r} without "
                            "calling its endpoint; point the agent's client at the base_url (and api_key, "
                            "model) it is given")

    def task_splits(self) -> tuple[TaskSplit, ...]:
        """``train`` (the training tasks) and, when there are held-out tasks, ``test``."""
        described = {"train": "the training tasks, in order",
                     "test": "the held-out tasks (eval_tasks, or the rows whose split is test/eval)"}
        return tuple(TaskSplit(name, len(rows), described[name])
                     for name, rows in self.tasks.splits().items())

    def describe_task(self, split: TaskSplit, index: int) -> dict[str, Any]:
        return {"task_id": self.tasks.splits()[split.name][index]["id"]}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self._over or self._call is None or self._rollout is None:
            raise ConfigError("step() on a harness episode that is over; call reset() first")
        call, self._call = self._call, None
        message, has_calls = reply_message(action)
        self._tool_calls = len(message.get("tool_calls") or [])
        transcript = [*(call.messages or []), message]
        self._rollout.answer(call, Reply(action, message, "tool_calls" if has_calls else "stop"))
        event = self._next_event()
        if isinstance(event, Call):
            obs, info = self._observe(event)
            return obs, 0.0, False, False, info
        if event is None:
            return self._failed(f"the agent did not finish within timeout_s={self.timeout_s:g} s",
                                truncated=True)
        outcome: AgentOutcome = event.outcome
        if outcome.fault:
            self._end("the harness broke its contract")
            raise HarnessError(outcome.fault)
        if outcome.error:
            return self._failed(outcome.error)
        reward = outcome.reward
        if reward is None:
            reward = self._score(transcript)
        success = outcome.success if outcome.success is not None else reward > 0
        self._end("the agent ended")
        info = self._info({"success": bool(success), "harness_calls": self._rollout.calls,
                           "transcript_messages": len(transcript)})
        return "", float(reward), True, False, info

    def _score(self, transcript: list[dict[str, Any]]) -> float:
        if self.reward_fn is None:
            raise HarnessError(f"harness {self.harness.name} returned None on task {self._task['id']!r} "
                               "and no reward function is set; return the reward, or set reward: "
                               "module:function")
        from agentgym.harness.agent import outcome_of

        where = f"reward function of {self.harness.name}"
        value = outcome_of(self.reward_fn(dict(self._task), transcript), where)
        if value.reward is None:
            raise HarnessError(f"the {where} returned None; it must return a number")
        return value.reward

    def _failed(self, error: str, *,
                truncated: bool = False) -> tuple[str, float, bool, bool, dict[str, Any]]:
        self._end(error)
        info = self._info({"success": False, "harness_error": error,
                           "discard": self.on_failure == "exclude"})
        return "", 0.0, not truncated, truncated, info

    # --- events ---------------------------------------------------------------------------------

    def _next_event(self) -> Call | Finished | None:
        """The agent's next call or its end; None when the run's deadline passed first."""
        assert self._rollout is not None
        remaining = self._deadline - time.monotonic()
        try:
            return self._rollout.events.get(timeout=max(remaining, 0.001))
        except queue.Empty:
            return None

    def _observe(self, call: Call) -> tuple[str, dict[str, Any]]:
        self._call = call
        if call.kind == "completion":
            return call.prompt or "", self._info({"prompt_text": call.prompt or "", "request": call.params})
        messages = call.messages or []
        last = str(messages[-1].get("content") or "") if messages else ""
        return last, self._info({"messages": messages, "tools": call.tools or [], "request": call.params},
                                state=chat_state_key(messages, call.tools))

    def _info(self, extra: dict[str, Any], state: str | None = None) -> dict[str, Any]:
        info = {"task_id": self._task.get("id"), "forkable": False, "tool_calls": self._tool_calls,
                "state_key": state or f"harness:{self._task.get('id')}:end", **extra}
        if "answer" in self._task:
            info["answer"] = self._task["answer"]
        return info

    def _end(self, reason: str) -> None:
        self._over = True
        if self._rollout is not None:
            self._rollout.close(reason)
            self._stop()
        self._call = None

    def expert_action(self) -> str | None:
        if self.expert is None or self._call is None or self._call.kind != "chat":
            return None
        reply = self.expert(dict(self._task), list(self._call.messages or []), list(self._call.tools or []))
        return None if reply is None else str(reply)

    def render(self) -> str | None:
        return None

    def close(self) -> None:
        self._end("the env was closed")
