"""``FunctionCallingEnv`` (``tools-v0``): BFCL-style multi-turn function calling.

Each task comes with its own seeded database (an inventory, bank accounts, sensor readings) that
the agent cannot see: it reads and changes it with the tools of ``agentgym.envs.tools.function_tools``
(calculator, unit converter, ``lookup``/``update``/``list_keys``/``delete``), over as many turns
as it needs, and ends the episode with ``answer``. The episode is checked BFCL-style on the final
database state and, when the task asks for a value, on the answer. The tasks themselves (generation,
checking) are ``agentgym.envs.tools.function_tasks``.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction
from typing import Any, ClassVar, Literal

from agentgym.core import Env, TaskSplit
from agentgym.envs.arguments import check_non_negative
from agentgym.envs.tools.function_tasks import (
    FAMILIES,
    NUM_TASKS,
    Call,
    Task,
    answer_matches,
    changed_keys,
    format_task_id,
    generate_task,
    numbers_match,
    parse_task_id,
    state_checks,
)
from agentgym.envs.tools.function_tools import (
    TOOLS,
    Database,
    ToolError,
    calculate,
    format_number,
    run_tool,
    to_json,
    units_text,
)
from agentgym.envs.tools.tool_calls import parse_tool_calls
from agentgym.errors import ConfigError
from agentgym.snapshot import pack_snapshot, unpack_snapshot

#: Most tool calls one turn may make (the expert needs at most 6).
MAX_CALLS_PER_TURN = 6
_INSTRUCTIONS = """\
Carry out the task with tools. The data lives in a key-value database that you cannot see: read \
and change it with the tools. Keys look like inventory/<item>/price, inventory/<item>/stock, \
inventory/<item>/weight_lb (weight of one item in pounds), accounts/<name>/balance and \
sensors/<place>/temp_f (degrees Fahrenheit).

Call a tool by writing
<tool_call>{{"name": "<tool>", "arguments": {{...}}}}</tool_call>
for example <tool_call>{{"name": "lookup", "arguments": {{"key": "accounts/alice/balance"}}}}</tool_call>.
A turn may make up to {max_calls} calls; they run in order and each result comes back in its own \
<tool_response>...</tool_response> block. Use the results in your next calls. When the work is done, \
call answer: this ends the episode.

Tools:
{tools}
Units: {units}.

You are checked on the final database and on your answer: change exactly what the task asks and \
nothing else. A number counts as right within 0.01 of the exact value, so rounding to 2 decimal \
places is fine."""


def _conversion(value: Fraction, source: str, target: str) -> str:
    """The fact a conversion teaches: what was converted, not the wording of the units."""
    return f"convert:{format_number(value)} {source}->{target}"


# --- the env --------------------------------------------------------------------------------------


class FunctionCallingEnv(Env):
    """BFCL-style multi-turn function calling over a seeded key-value database.

    Reset poses a task (family and task number chosen by the seed, or
    ``options={"task_id": "tools/<family>/<number>"}``). Each turn the agent makes up to
    ``MAX_CALLS_PER_TURN`` tool calls, ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
    (the tag form ``<calculate>2 + 2</calculate>`` works for one-argument tools); they run in
    order and the observation holds one ``<tool_response>{"name": ..., "result"|"error": ...}
    </tool_response>`` block per call. ``answer`` (the last call of its turn) ends the episode.

    Reward, on the answering step: 1.0 when the final database equals the expected one (every
    number within ``numbers_match`` tolerance, the same keys) and the answer matches when the task
    asks for a value, else 0.0; ``success`` says the same. With ``partial_credit`` the reward is
    the fraction of checks passed (one per key the task or the agent changed, one for the answer)
    and ``success`` still needs all of them. The final info reports ``state_correct`` and
    ``answer_correct`` (``None`` when no value was asked). An episode that never answers gets 0.

    A turn with a malformed call (bad JSON, unknown tool, missing or mistyped argument), more than
    ``MAX_CALLS_PER_TURN`` calls, or an ``answer`` that is not its last call runs nothing:
    ``info["invalid_action"]``, reward ``-format_penalty``. A well-formed call that fails (division
    by zero, unknown key or unit) answers with an ``error`` in its ``tool_response``, the other
    calls still run, and ``info["tool_errors"]`` counts such failures of the step. ``info["tool_calls"]``
    counts the calls the step ran, failed ones included and the ``answer`` not (0 on an invalid turn).

    ``info["tools"]`` (on reset, with ``instructions``) holds the tool specs; ``info["answer"]``
    the expected answer as text (``None`` when any answer will do; privileged). ``state_key`` is
    the task, the database's changes from its initial state and the facts the agent has learnt
    (keys looked up, conversions done, calculated values), so orderings of the same work meet.
    The expert follows the task's plan, skipping calls whose effect is already there.

    Args:
        families: task families to draw from (default: all of ``FAMILIES``).
        split: ``"train"`` (even task numbers), ``"test"`` (odd ones, disjoint from train) or ``"all"``.
        partial_credit: reward the fraction of checks passed instead of all-or-nothing.
        format_penalty: subtracted from the reward of an invalid action (``>= 0``).

    Raises:
        ConfigError: an unknown family or split, or a negative penalty.

    Example:
        >>> env = FunctionCallingEnv()
        >>> obs, info = env.reset(options={"task_id": "tools/transfer/7"})
        >>> obs
        "Transfer 598.59 from ivan's account to mallory's account. Then answer with ivan's new balance."
        >>> lookup = '{"name": "lookup", "arguments": {"key": "accounts/ivan/balance"}}'
        >>> print(env.step(f"<tool_call>{lookup}</tool_call> <calculate>3647.6 - 598.59</calculate>")[0])
        <tool_response>
        {"name": "lookup", "result": {"key": "accounts/ivan/balance", "value": 3647.6}}
        </tool_response>
        <tool_response>
        {"name": "calculate", "result": {"result": 3049.01}}
        </tool_response>
    """

    has_expert: ClassVar[bool] = True
    supports_snapshot: ClassVar[bool] = True

    def __init__(self, families: Sequence[str] | None = None, split: Literal["train", "test", "all"] = "all",
                 partial_credit: bool = False, format_penalty: float = 0.0) -> None:
        chosen = tuple(FAMILIES if families is None else families)
        unknown = [f for f in chosen if f not in FAMILIES]
        if not chosen or unknown:
            raise ConfigError(f"families must be a non-empty subset of {', '.join(FAMILIES)}; "
                              f"got {list(chosen)!r}")
        if split not in ("train", "test", "all"):
            raise ConfigError(f"split must be 'train', 'test' or 'all', got {split!r}")
        check_non_negative(format_penalty, "format_penalty")
        self.families, self.split = chosen, split
        self.partial_credit, self.format_penalty = bool(partial_credit), float(format_penalty)
        lines = []
        for spec in TOOLS:
            fn = spec["function"]
            lines.append(f"- {fn['name']}({', '.join(fn['parameters']['properties'])}): {fn['description']}")
        self.instructions = _INSTRUCTIONS.format(max_calls=MAX_CALLS_PER_TURN, tools="\n".join(lines),
                                                 units=units_text())
        self._task: Task | None = None
        self._db = Database({})
        self._facts: set[str] = set()
        self._over = False

    def task_splits(self) -> tuple[TaskSplit, ...]:
        """``train`` (even task numbers) and ``test`` (odd ones): the families take turns, so task ``i``
        is family ``i mod F`` (of this env's ``families``) with the ``i // F``-th even or odd number."""
        size = len(self.families) * (NUM_TASKS // 2)
        return (TaskSplit("train", size, "even task numbers, families in turn"),
                TaskSplit("test", size, "odd task numbers (held out from train), families in turn"))

    def describe_task(self, split: TaskSplit, index: int) -> dict[str, Any]:
        """The task's id and family; the prompt is built by ``reset``."""
        family = self.families[index % len(self.families)]
        number = 2 * (index // len(self.families)) + (split.name == "test")
        return {"task_id": format_task_id(family, number),
                "description": f"a {family} task (number {number})"}

    def parse_task_id(self, task_id: Any) -> tuple[str, int]:
        """The task's family and number."""
        return parse_task_id(task_id)

    def choose_task(self, seed: int | None) -> tuple[str, int]:
        """A family and a number of this env's split, drawn from the seeded ``np_random``."""
        family = self.families[int(self.np_random.integers(len(self.families)))]
        if self.split == "all":
            return family, int(self.np_random.integers(NUM_TASKS))
        return family, 2 * int(self.np_random.integers(NUM_TASKS // 2)) + (self.split == "test")

    def start_task(self, task: tuple[str, int], options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        self._task = generate_task(*task)
        self._db, self._facts, self._over = Database(self._task.initial), set(), False
        info = self._info(invalid=False, success=False)
        info["instructions"] = self.instructions
        info["tools"] = TOOLS
        return self._task.prompt, info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        task = self._task
        parsed = parse_tool_calls(action, TOOLS)
        calls = parsed.calls
        answers = [n for n, call in enumerate(calls) if call.name == "answer"]
        problem = parsed.errors[0].message if parsed.errors else None
        if problem is None and len(calls) > MAX_CALLS_PER_TURN:
            problem = f"at most {MAX_CALLS_PER_TURN} tool calls per turn, got {len(calls)}"
        elif problem is None and answers and answers != [len(calls) - 1]:
            problem = "answer once, as the last call of the turn"
        if problem is not None:
            obs = f"Invalid action: {problem}. No call was run.\nTask: {task.prompt}"
            return obs, -self.format_penalty, False, False, self._info(invalid=True, success=False)
        blocks, failures = [], 0
        for call in calls[: answers[0] if answers else len(calls)]:
            try:
                result = run_tool(call.name, call.arguments, self._db)
            except ToolError as exc:
                failures += 1
                blocks.append(to_json({"name": call.name, "error": str(exc)}))
                continue
            self._learn(call.name, result)
            blocks.append(to_json({"name": call.name, "result": result}))
        obs = "\n".join(f"<tool_response>\n{block}\n</tool_response>" for block in blocks)
        if not answers:
            info = self._info(invalid=False, success=False)
            info.update(tool_errors=failures, tool_calls=len(blocks))
            return obs, 0.0, False, False, info
        self._over = True
        checks = state_checks(self._db.values, task)
        given = calls[-1].arguments["answer"]
        answer_ok = answer_matches(given, task.answer) if task.answer is not None else None
        passed = [*checks, *([answer_ok] if answer_ok is not None else [])]
        success = all(passed)
        reward = (sum(passed) / len(passed) if passed else 1.0) if self.partial_credit else float(success)
        if success:
            verdict = "The task is solved."
        else:
            wrong = [what for what, ok in (("the database is not in the expected state", all(checks)),
                                           ("the answer is not correct", answer_ok is not False)) if not ok]
            verdict = f"The task is not solved: {' and '.join(wrong)}."
        obs = (obs + "\n" if obs else "") + f"Answer received. {verdict}"
        info = self._info(invalid=False, success=success)
        info.update(tool_errors=failures, tool_calls=len(blocks), state_correct=all(checks),
                    answer_correct=answer_ok)
        return obs, float(reward), True, False, info

    def expert_action(self) -> str | None:
        """The calls of the first plan turn with work left (calls whose effect is already there are skipped).

        A lookup, listing, conversion or calculation is done once its fact is known; an update once
        the key holds the value; a delete once the key is gone. ``None`` after the answer.
        """
        task = self._task
        if self._over:
            return None
        for turn in task.plan:
            todo = [call for call in turn if not self._done(call)]
            if todo:
                return "\n".join(f"<tool_call>{to_json({'name': name, 'arguments': args})}</tool_call>"
                                 for name, args in todo)
        return None

    def snapshot(self) -> bytes:
        """Task id, database, learnt facts and ``np_random`` as pickled bytes."""
        task = self._task
        return pack_snapshot(self, {"task_id": task.task_id, "db": dict(self._db.values),
                                    "facts": sorted(self._facts), "over": self._over})

    def restore(self, data: bytes) -> None:
        """Reinstate a ``snapshot`` (trusted bytes only: pickle); works on a never-reset instance."""
        state = unpack_snapshot(self, data)
        self._task = generate_task(*parse_task_id(state["task_id"]))
        self._db, self._facts, self._over = Database(state["db"]), set(state["facts"]), bool(state["over"])

    def render(self) -> str | None:
        """The task text, or ``None`` before the first reset."""
        return self._task.prompt if self._task is not None else None

    # --- helpers ---------------------------------------------------------------------------------

    def _learn(self, name: str, result: dict[str, Any]) -> None:
        """Record what a successful read taught the agent (updates and deletes show in the database)."""
        if name == "lookup":
            self._facts.add(f"lookup:{result['key']}")
        elif name == "list_keys":
            self._facts.add(f"list:{result['prefix']}")
        elif name == "calculate":
            self._facts.add(f"calc={format_number(result['result'])}")
        elif name == "convert":
            self._facts.add(_conversion(result["value"], result["from_unit"], result["to_unit"]))

    def _done(self, call: Call) -> bool:
        name, args = call
        if name == "lookup":
            return f"lookup:{args['key']}" in self._facts
        if name == "list_keys":
            return f"list:{args['prefix']}" in self._facts
        if name == "calculate":
            return f"calc={format_number(calculate(args['expression']))}" in self._facts
        if name == "convert":
            return _conversion(args["value"], args["from_unit"], args["to_unit"]) in self._facts
        if name == "update":
            have = self._db.values.get(args["key"])
            return have is not None and numbers_match(have, args["value"])
        if name == "delete":
            return args["key"] not in self._db.values
        return False  # the answer is never done: giving it ends the episode

    def _info(self, *, invalid: bool, success: bool) -> dict[str, Any]:
        task = self._task
        assert task is not None
        values = self._db.values
        changes = [f"{k}={format_number(values[k]) if k in values else 'deleted'}"
                   for k in sorted(changed_keys(task.initial, values))]
        answer = format_number(task.answer) if isinstance(task.answer, Fraction) else task.answer
        return {
            # The database and what the agent has learnt are its state; the wording and order of
            # the calls that got there are history and stay out.
            "state_key": f"{task.task_id}|db={';'.join(changes)}|knows={';'.join(sorted(self._facts))}"
                         + ("|answered" if self._over else ""),
            "task_id": task.task_id,
            "invalid_action": invalid,
            "success": success,
            "answer": answer,
            "tool_calls": 0,  # the step's count replaces it
        }
