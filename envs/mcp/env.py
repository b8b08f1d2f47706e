"""``MCPEnv`` (``mcp-v0``): the tools of any MCP server, used by the policy to solve tasks from a task file.

The env connects to the server through the official ``mcp`` client (``agentgym.envs.mcp.connection``),
lists its tools and offers them to the policy in the tool-call format of the tool envs
(``agentgym.envs.tools.tool_calls``): ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, or
``<name>text</name>`` for a one-argument tool. Each call runs on the server and comes back in a
``<tool_response>`` block; ``answer`` ends the episode and is rewarded (``agentgym.envs.mcp.reward``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from agentgym.core import Env, TaskSplit
from agentgym.envs.mcp.connection import MCPConnection, MCPServer, mcp_field
from agentgym.envs.mcp.reward import DEFAULT_TOLERANCE, reward_function, score
from agentgym.envs.tools.tool_calls import parse_tool_calls, tool_spec
from agentgym.errors import ConfigError
from agentgym.harness.tasks import load_tasks

#: The tool that ends an episode with the final answer (the tool envs' convention).
ANSWER_TOOL = tool_spec("answer", "Give the final answer; this ends the episode.",
                        {"answer": {"type": ["string", "number"], "description": "The final answer."}})
#: The split of the tasks that name none (all of a task file without ``split`` fields).
UNSPLIT = "tasks"
_DESCRIPTION_CHARS = 120
_INSTRUCTIONS = """\
Solve the task with the tools below. Call a tool by writing
<tool_call>{{"name": "<tool>", "arguments": {{...}}}}</tool_call>
(a tool with one argument may also be called as <tool>value</tool>). A turn may make up to {max_calls} \
calls; they run in order and each result comes back in its own <tool_response>...</tool_response> block. \
When you know the answer, give it with <answer>...</answer>: this ends the episode.

Tools:
{tools}"""


def _mcp_spec(tool: Any) -> dict[str, Any]:
    """An MCP tool (name, description, JSON input schema) as an OpenAI-format function spec."""
    schema = dict(mcp_field(tool, "input_schema") or {"type": "object", "properties": {}})
    return {"type": "function",
            "function": {"name": tool.name, "description": tool.description or "", "parameters": schema}}


def _tool_line(spec: Mapping[str, Any]) -> str:
    fn = spec["function"]
    properties = fn["parameters"].get("properties") or {}
    return f"- {fn['name']}({', '.join(properties)}): {fn['description']}".rstrip(": ")


class MCPEnv(Env):
    """Tasks solved with the tools of an MCP server (a stdio command or a streamable-HTTP URL).

    Reset picks a task (by seed, or ``options={"task_id": ...}``; ids are the task file's ``id`` fields,
    else ``task-<line index>``; or ``options={"split": ..., "index": ...}``), connecting on first use.
    The task splits (``task_splits``) are the values of the tasks' ``split`` field, in the order they
    first appear, each holding its tasks in file order (tasks without one form the split ``tasks``);
    a file without ``split`` fields is one split, ``tasks``. The observation is the task's ``prompt``;
    ``info["tools"]`` and ``info["instructions"]`` list the server's tools and ``answer``. Each step
    runs the turn's tool calls (at most ``max_calls_per_turn``) in order on the server and shows one
    ``<tool_response>{"name": ..., "result"|"error": ...}</tool_response>`` per call; a tool that fails,
    a call the server refuses and a call that runs past ``call_timeout_s`` come back as ``error`` (the
    step still succeeds; ``info["tool_errors"]`` counts them). ``answer`` (the last call of its turn)
    ends the episode: reward from ``reward``, ``success`` when it is ``>= 1``. A turn with a malformed
    call, an unknown tool, too many calls or an answer that is not last runs nothing
    (``info["invalid_action"]``, reward 0). ``info["answer"]`` holds the task's ``answer`` (privileged).

    A server tool named ``answer`` is not offered (the env's own ``answer`` ends the episode). The
    server is part of the env: the contract's determinism holds when its tools answer the same
    call the same way. Each env keeps one session for its life (``close`` ends it, and the process of
    a stdio server); ``restart_per_episode`` opens a fresh one on every reset, for servers that keep
    state across calls. A server that dies raises ``RemoteEnvError`` naming it.

    Args:
        tasks: a JSONL task file (one ``{"prompt": ..., "answer": ...}`` object per line; optional
            ``id``, ``tolerance``, ``expert_actions`` and any fields a checker reads) or a list of dicts.
        server_command: a stdio MCP server's command line (string or argument list).
        server_url: a streamable-HTTP MCP server's URL (``http://host:port/mcp``).
        reward: ``None`` (answer match: ``agentgym.envs.mcp.reward.answer_matches``), a callable or
            ``"module:function"`` following ``agentgym.envs.mcp.reward.RewardFunction``.
        tolerance: numeric tolerance of the answer match (absolute and relative).
        max_calls_per_turn: most tool calls one turn may make.
        max_result_chars: longest tool result shown (longer ones are cut, saying so).
        connect_timeout_s: deadline for connecting and listing the tools.
        call_timeout_s: deadline of each tool call.
        restart_per_episode: open a new session (and a new stdio server process) on every reset.

    Raises:
        ConfigError: no server or both, an unusable task file (a task without ``prompt``, or without
            ``answer`` while the default reward is used), duplicate task ids, a bad reward, or a
            non-positive limit. Connecting raises ``RemoteEnvError`` (``RemoteTimeout``) on reset.
    """

    has_expert: ClassVar[bool] = True
    # Tool calls wait on another process; env pools may overlap those waits.
    steps_wait: ClassVar[bool] = True

    def __init__(self, tasks: str | Path | Sequence[Mapping[str, Any]] | None = None, *,
                 server_command: str | Sequence[str] | None = None, server_url: str | None = None,
                 reward: str | Callable[..., Any] | None = None, tolerance: float = DEFAULT_TOLERANCE,
                 max_calls_per_turn: int = 8, max_result_chars: int = 8000, connect_timeout_s: float = 30.0,
                 call_timeout_s: float = 30.0, restart_per_episode: bool = False) -> None:
        server = MCPServer.of(server_command, server_url)
        if tasks is None:
            raise ConfigError("mcp-v0 needs tasks=: a JSONL file with one {\"prompt\": ..., \"answer\": ...} "
                              "object per line")
        for name, value in (("max_calls_per_turn", max_calls_per_turn),
                            ("max_result_chars", max_result_chars)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")
        self.tasks = load_tasks(tasks)
        self._by_id: dict[str, dict[str, Any]] = {}
        for task in self.tasks:
            if not isinstance(task.get("prompt"), str) or not task["prompt"].strip():
                raise ConfigError(f"task {task['id']!r} has no \"prompt\" string; every task needs one")
            if reward is None and task.get("answer") is None:
                raise ConfigError(f"task {task['id']!r} has no \"answer\"; give one, or a reward= checker")
            if task["id"] in self._by_id:
                raise ConfigError(f"two tasks have the id {task['id']!r}; task ids must be unique")
            self._by_id[task["id"]] = task
        self._splits: dict[str, list[dict[str, Any]]] = {}
        for task in self.tasks:
            self._splits.setdefault(str(task.get("split", UNSPLIT)), []).append(task)
        self.reward_fn = reward_function(reward, tolerance)
        self.max_calls_per_turn, self.max_result_chars = max_calls_per_turn, max_result_chars
        self.restart_per_episode = bool(restart_per_episode)
        self.connection = MCPConnection(server, connect_timeout_s=connect_timeout_s,
                                        call_timeout_s=call_timeout_s)
        self.tools: list[dict[str, Any]] = []
        self.instructions = ""
        self._task: dict[str, Any] | None = None
        self._transcript: list[dict[str, Any]] = []
        self._valid_steps = 0
        self._over = False

    # --- the episode ------------------------------------------------------------------------------

    def parse_task_id(self, task_id: Any) -> dict[str, Any]:
        """The task whose id is ``task_id``."""
        if str(task_id) not in self._by_id:
            known = ", ".join(list(self._by_id)[:5])
            raise ConfigError(f"no task has id {task_id!r}; ids look like {known}")
        return self._by_id[str(task_id)]

    def choose_task(self, seed: int | None) -> dict[str, Any]:
        """A task drawn from the seeded ``np_random``."""
        return self.tasks[int(self.np_random.integers(len(self.tasks)))]

    def start_task(self, task: dict[str, Any], options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        if self.restart_per_episode:
            self.connection.close()
        self._connect()
        self._task, self._transcript, self._valid_steps, self._over = task, [], 0, False
        info = self._info(invalid=False, success=False)
        info.update(instructions=self.instructions, tools=self.tools)
        return task["prompt"], info

    def task_splits(self) -> tuple[TaskSplit, ...]:
        """One split per ``split`` value of the task file (see the class docstring)."""
        def described(name: str) -> str:
            if name != UNSPLIT:
                return f"tasks of the task file with split {name!r}, in file order"
            return "the task file's tasks, in order" if len(self._splits) == 1 else \
                "tasks of the task file without a split, in file order"

        return tuple(TaskSplit(name, len(rows), described(name)) for name, rows in self._splits.items())

    def describe_task(self, split: TaskSplit, index: int) -> dict[str, Any]:
        task = self._splits[split.name][index]
        return {"task_id": task["id"], "description": " ".join(task["prompt"].split())[:_DESCRIPTION_CHARS]}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        task = self._task
        assert task is not None  # the EpisodeGuard refuses step before reset
        parsed = parse_tool_calls(action, self.tools)
        calls = parsed.calls
        answers = [n for n, call in enumerate(calls) if call.name == "answer"]
        problem = parsed.errors[0].message if parsed.errors else None
        if problem is None and len(calls) > self.max_calls_per_turn:
            problem = f"at most {self.max_calls_per_turn} tool calls per turn, got {len(calls)}"
        elif problem is None and answers and answers != [len(calls) - 1]:
            problem = "answer once, as the last call of the turn"
        if problem is not None:
            obs = f"Invalid action: {problem}. No call was run.\nTask: {task['prompt']}"
            return obs, 0.0, False, False, self._info(invalid=True, success=False)
        self._valid_steps += 1
        blocks, failures = [], 0
        for call in calls[: answers[0] if answers else len(calls)]:
            outcome = self.connection.call_tool(call.name, call.arguments)
            text = self._shorten(outcome.text)
            outcome_key = "error" if outcome.is_error else "result"
            record = {"name": call.name, "arguments": call.arguments, outcome_key: text}
            failures += outcome.is_error
            self._transcript.append(record)
            blocks.append(json.dumps({key: value for key, value in record.items() if key != "arguments"}))
        obs = "\n".join(f"<tool_response>\n{block}\n</tool_response>" for block in blocks)
        if not answers:
            info = self._info(invalid=False, success=False)
            info.update(tool_calls=len(blocks), tool_errors=failures)
            return obs, 0.0, False, False, info
        given = calls[-1].arguments["answer"]
        reward = score(self.reward_fn, task, given if isinstance(given, str) else json.dumps(given),
                       self._transcript)
        self._over = True
        obs = (obs + "\n" if obs else "") + "Answer received."
        info = self._info(invalid=False, success=reward >= 1.0)
        info.update(tool_calls=len(blocks), tool_errors=failures)
        return obs, reward, True, False, info

    def expert_action(self) -> str | None:
        """The task's ``expert_actions`` entry for this point of the episode (invalid turns do not count);
        ``None`` when the task has none left, or after the answer."""
        actions = (self._task or {}).get("expert_actions")
        if self._over or not isinstance(actions, list) or self._valid_steps >= len(actions):
            return None
        action = actions[self._valid_steps]
        return action if isinstance(action, str) else None

    def render(self) -> str | None:
        """The task's prompt, or ``None`` before the first reset."""
        return self._task["prompt"] if self._task is not None else None

    def close(self) -> None:
        """End the session with the server (and a stdio server's process); safe to call twice."""
        self.connection.close()

    # --- helpers ---------------------------------------------------------------------------------

    def _connect(self) -> None:
        if self.connection.is_open:
            return
        listed = self.connection.open()
        # The final answer is the env's to reward: a server's own ``answer`` tool (an agentgym tool env
        # served with serve-mcp has one) is not offered, so ``answer`` always means the env's.
        specs = [_mcp_spec(tool) for tool in listed if tool.name != "answer"]
        self.tools = [*specs, ANSWER_TOOL]
        self.instructions = _INSTRUCTIONS.format(max_calls=self.max_calls_per_turn,
                                                 tools="\n".join(_tool_line(spec) for spec in self.tools))

    def _shorten(self, text: str) -> str:
        if len(text) <= self.max_result_chars:
            return text
        cut = len(text) - self.max_result_chars
        return text[: self.max_result_chars] + f"... [{cut} more characters cut]"

    def _info(self, *, invalid: bool, success: bool) -> dict[str, Any]:
        task = self._task
        assert task is not None
        # The server's state is hidden from the env: what the agent is in is the task plus what its
        # calls returned. A sorted set of (call, outcome) pairs, so orderings of the same work meet in
        # GiGPO's anchor groups, with the outcomes in it because a stateful server may answer the same
        # call differently; hashed, so that long tool results keep the key short.
        facts = sorted({json.dumps(record, sort_keys=True) for record in self._transcript})
        digest = hashlib.sha256("\n".join(facts).encode()).hexdigest()[:16] if facts else "none"
        return {
            "state_key": f"{task['id']}|calls={digest}" + ("|answered" if self._over else ""),
            "task_id": task["id"],
            "invalid_action": invalid,
            "success": success,
            "answer": task.get("answer"),
            "tool_calls": 0,  # the step's count replaces it
            "tool_errors": 0,
        }
