"""``CodeMathEnv`` (``code-math-v0``): ReTool-style math with a Python tool.

The agent interleaves ``<python>code</python>`` cells, whose output comes back as
``<output>…</output>``, with its own reasoning, then answers once with ``<answer>value</answer>``.
Problems come from ``agentgym.envs.tools.math_problems``: seeded word problems with exact answers
(integers or fractions) over seven templates, at three difficulties, and an arithmetic drill
(``templates=["expression"]``) that a tiny model can learn.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from gymnasium.utils import seeding

from agentgym.core import Env, TaskSplit
from agentgym.envs.arguments import check_non_negative
from agentgym.envs.tools.code_runner import CodeRunner, cut, describe_end, make_limits
from agentgym.envs.tools.math_problems import (
    DRILLS,
    TEMPLATES,
    MathProblem,
    generate_problem,
    parse_number,
    problem_from_id,
    same_number,
)
from agentgym.envs.tools.tool_calls import parse_tool_calls, tool_spec, work_or_answer
from agentgym.errors import ConfigError
from agentgym.sandbox import Limits
from agentgym.snapshot import pack_snapshot, unpack_snapshot

#: Most ``python`` cells one turn may run.
MAX_CELLS_PER_TURN = 3
#: Sandbox limits of one run (which replays the episode's earlier cells first).
DEFAULT_LIMITS = Limits(wall_clock_s=5.0, memory_mb=512, output_bytes=32 * 1024)
#: Problem seeds drawn on reset lie in ``[0, MAX_PROBLEM_SEED)``.
MAX_PROBLEM_SEED = 1_000_000
_ECHO_CHARS = 80

TOOLS: list[dict[str, Any]] = [
    tool_spec("python", "Run Python code; what it prints comes back. Names defined by earlier successful "
              "cells are still defined.",
              {"code": {"type": "string", "description": "Python source to run."}}),
    tool_spec("answer", "Give the final answer; this ends the episode.",
              {"answer": {"type": "string", "description": "The exact value only: an integer, a fraction "
                          "like 7/3, or a finite decimal."}}),
]
_INSTRUCTIONS = (
    "Solve the math problem. You have a Python interpreter: use it for every calculation you are not "
    "sure of.\n"
    "- To run code, write <python>code</python>. What the code prints, and any error, comes back "
    "between <output> and </output>. If the last line of a cell is an expression, its value is shown "
    "too. Variables, functions and imports persist from one successful cell to the next; a cell that "
    "fails leaves nothing behind. A run (which quietly replays your earlier cells first) may take "
    "{timeout:g} s; output past {chars} characters is cut. No network; rely on the standard library "
    "(fractions, math, itertools).\n"
    "- To answer, write <answer>value</answer> with the exact value only: an integer (42), a fraction "
    "(7/3) or a finite decimal (149.04); no units, no words. This ends the episode; you answer once.\n"
    "- A turn either runs code (up to {cells} cells, run in order) or answers. You may think before the "
    "tag.\n"
    "- The JSON form works too: <tool_call>{{\"name\": \"python\", \"arguments\": {{\"code\": \"...\"}}}}"
    "</tool_call> and <tool_call>{{\"name\": \"answer\", \"arguments\": {{\"answer\": \"...\"}}}}"
    "</tool_call>."
)


# --- answers -------------------------------------------------------------------------------------

# --- stateful cells ------------------------------------------------------------------------------

# The program one run executes: earlier successful cells replayed with their output discarded, then
# the new cell. Each cell runs in one shared namespace, as in a notebook kernel; `random` is seeded
# so a replay draws what the first run drew.
_DRIVER = '''\
import ast as _ast, linecache as _linecache, random as _random, sys as _sys, traceback as _traceback
_random.seed(0)
_CELLS = {cells}
_NS = {{"__name__": "__main__", "__builtins__": __builtins__}}


class _Discard:
    def write(self, text):
        return len(text)

    def flush(self):
        pass


def _run(index, show):
    name = "<cell %d>" % (index + 1)
    source = _CELLS[index]
    _linecache.cache[name] = (len(source), None, source.splitlines(True), name)
    tree = _ast.parse(source, name)
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], _ast.Expr) else None
    exec(compile(tree, name, "exec"), _NS)
    if last is not None:
        value = eval(compile(_ast.Expression(last.value), name, "eval"), _NS)
        if show and value is not None:
            print(repr(value))


for _index in range(len(_CELLS) - 1):
    _sys.stdout = _sys.stderr = _Discard()
    try:
        _run(_index, False)
    except BaseException:
        pass
    finally:
        _sys.stdout, _sys.stderr = _sys.__stdout__, _sys.__stderr__
try:
    _run(len(_CELLS) - 1, True)
except BaseException as _exc:
    _tb = _exc.__traceback__
    while _tb is not None and not _tb.tb_frame.f_code.co_filename.startswith("<cell "):
        _tb = _tb.tb_next
    _traceback.print_exception(type(_exc), _exc, _tb)
    _sys.stderr.flush()
    _sys.exit(1)
'''


def cell_program(cells: Sequence[str]) -> str:
    """The program that replays ``cells[:-1]`` silently, then runs ``cells[-1]`` and shows its output.

    Example:
        >>> compile(cell_program(["x = 6", "x * 7"]), "main.py", "exec") is not None
        True
    """
    return _DRIVER.format(cells=repr(list(cells)))


# --- the env -------------------------------------------------------------------------------------


class CodeMathEnv(Env):
    """Tool-integrated math reasoning (ReTool / ARPO style): a Python interpreter and one answer.

    Reset poses a generated word problem (the seed picks template and problem; or
    ``options={"task_id": "<template>-d<difficulty>-<seed>"}``). Each turn the agent either runs up to
    ``MAX_CELLS_PER_TURN`` ``<python>`` cells, each answered by an ``<output>…</output>`` block, or
    answers with ``<answer>value</answer>``, which terminates the episode: reward 1.0 when the
    value equals the exact answer (``same_number``), else 0.0. The ``<tool_call>`` JSON form
    (tools ``python`` and ``answer``) is accepted too. Anything else (no call, both kinds in one
    turn, two answers, too many cells, an answer that is not a number) is an invalid action
    (``info["invalid_action"]``, reward ``-format_penalty``) whose observation says what was wrong.

    **Interpreter state.** Every run is a fresh sandboxed process, so state is rebuilt: the run
    replays the episode's earlier *successful* cells (exit without an error or a limit hit) in one
    namespace with their output discarded, then runs the new cell. Because the sandbox runs the
    same code the same way and ``random`` is seeded, this is deterministic and needs no
    long-lived kernel, so snapshot/fork is just the list of cells. Costs: earlier cells' time counts
    against each run's wall clock, a failed cell's partial effects are dropped, and what code
    writes to files or prints outside ``sys.stdout`` is not carried over or silenced. Code whose
    output depends on time or memory addresses is not deterministic, and no env can make it so.

    ``info["tool_calls"]`` is the number of cells the step ran (0 on answering and invalid steps).
    ``info["answer"]`` holds the exact answer as text (privileged: never in an observation or the
    instructions); ``info["tools"]`` and ``info["instructions"]`` come with reset. The expert runs
    the problem's solution cell, reads its output and answers it.

    Args:
        difficulty: 1 (easy) to 3 (hard).
        templates: the templates to draw from (default: the word problems, all of ``TEMPLATES``); the
            drill ``"expression"`` (``DRILLS``) asks to evaluate an arithmetic expression whose copy into a
            cell is the whole solution: a first tool task for small models (with the
            ``tag_spans:python,answer`` decoding constraint, ``configs/code_math_*_tiny.yaml``).
        format_penalty: subtracted from the reward of an invalid action (``>= 0``).
        max_output_chars: each cell's output is cut to this many characters in the observation.
        limits: sandbox ``Limits`` of a run, or a dict of fields overriding ``DEFAULT_LIMITS``.
        sandbox_url: run code on a sandbox service (``agentgym sandbox serve``) instead of in-process.
        sandbox_token: bearer token of that service.
        sandbox_backend: in-process backend (``"auto"``: bwrap, else docker; ``"subprocess"`` is not
            a security boundary).

    Raises:
        ConfigError: an argument is out of range, or no sandbox backend can run here.

    Example:
        >>> problem = problem_from_id("count-d2-4")  # what reset(options={"task_id": "count-d2-4"}) poses
        >>> problem.question
        'A club has 19 men and 21 women. In how many ways can a committee of 3 men and 4 women be chosen?'
        >>> print(problem.solution)  # the expert's cell; it prints the answer
        from math import comb
        print(comb(19, 3) * comb(21, 4))
        >>> str(problem.answer)  # info["answer"]
        '5799465'
    """

    has_expert: ClassVar[bool] = True
    supports_snapshot: ClassVar[bool] = True

    def __init__(self, difficulty: int = 2, templates: Sequence[str] | None = None,
                 format_penalty: float = 0.0, max_output_chars: int = 2000,
                 limits: Limits | Mapping[str, Any] | None = None, sandbox_url: str | None = None,
                 sandbox_token: str | None = None,
                 sandbox_backend: str = "auto") -> None:
        if isinstance(difficulty, bool) or difficulty not in (1, 2, 3):
            raise ConfigError(f"difficulty must be 1, 2 or 3, got {difficulty!r}")
        chosen = list(TEMPLATES) if templates is None else list(templates)
        unknown = [t for t in chosen if t not in TEMPLATES and t not in DRILLS]
        if unknown or not chosen:
            raise ConfigError(f"templates must be a non-empty list from {', '.join([*TEMPLATES, *DRILLS])}, "
                              f"got {templates!r}")
        check_non_negative(format_penalty, "format_penalty")
        if isinstance(max_output_chars, bool) or not isinstance(max_output_chars, int) \
                or max_output_chars < 20:
            raise ConfigError(f"max_output_chars must be an integer >= 20, got {max_output_chars!r}")
        self.difficulty, self.templates = int(difficulty), chosen
        self.format_penalty, self.max_output_chars = float(format_penalty), max_output_chars
        self.limits = make_limits(limits, DEFAULT_LIMITS)
        self.runner = CodeRunner(self.limits, sandbox_url=sandbox_url, sandbox_token=sandbox_token,
                                 backend=sandbox_backend)
        self.instructions = _INSTRUCTIONS.format(timeout=self.limits.wall_clock_s, chars=max_output_chars,
                                                 cells=MAX_CELLS_PER_TURN)
        self._problem: MathProblem | None = None
        self._cells: list[str] = []
        self._last: tuple[str, str, bool] | None = None  # (code, stdout, succeeded) of the latest cell
        self._over = False

    def describe_task(self, split: TaskSplit, index: int) -> dict[str, Any]:
        """A seeded task: the problem ``reset`` generates from the seed (drawn here the same way)."""
        rng, _ = seeding.np_random(split.seed_of(index))
        template = self.templates[int(rng.integers(len(self.templates)))]
        problem = generate_problem(template, self.difficulty, int(rng.integers(MAX_PROBLEM_SEED)))
        return {"task_id": problem.id, "description": " ".join(problem.question.split())}

    def parse_task_id(self, task_id: Any) -> MathProblem:
        """The problem ``task_id`` names (its template, difficulty and seed)."""
        return problem_from_id(task_id)

    def choose_task(self, seed: int | None) -> MathProblem:
        """A problem of a template and problem seed drawn from the seeded ``np_random``."""
        template = self.templates[int(self.np_random.integers(len(self.templates)))]
        problem_seed = int(self.np_random.integers(MAX_PROBLEM_SEED))
        return generate_problem(template, self.difficulty, problem_seed)

    def start_task(self, task: MathProblem, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        self._problem = task
        self._cells, self._last, self._over = [], None, False
        info = self._info(invalid=False, success=False)
        info["instructions"] = self.instructions
        info["tools"] = TOOLS
        return self._question(), info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        problem = self._problem
        parsed = parse_tool_calls(action, TOOLS)
        cells, answer, problem_text = work_or_answer(parsed, "python", "code", MAX_CELLS_PER_TURN,
                                                     work_verb="runs code", work_noun="python cells")
        if problem_text is None and answer is not None and parse_number(answer) is None:
            shown = " ".join(answer.split())[:_ECHO_CHARS]
            problem_text = f"the answer {shown!r} is not a number; give the exact value only, e.g. 42 or 7/3"
        if problem_text is not None:
            hint = "" if parsed.no_call else (
                " Run code with <python>code</python> or answer with <answer>value</answer>.")
            obs = f"Invalid action: {problem_text}.{hint}\n{self._question()}"
            return obs, -self.format_penalty, False, False, self._info(invalid=True, success=False)
        if answer is not None:
            correct = same_number(answer, problem.answer)
            self._over = True
            shown = " ".join(answer.split())[:_ECHO_CHARS]
            info = self._info(invalid=False, success=correct)
            return (f"Your answer: {shown}. It is {'correct' if correct else 'not correct'}.",
                    1.0 if correct else 0.0, True, False, info)
        return "\n".join(self._run_cell(code) for code in cells), 0.0, False, False, self._info(
            invalid=False, success=False, tool_calls=len(cells))

    def expert_action(self) -> str | None:
        """Run the problem's solution cell; once its output is in, answer what it printed.

        A one-line cell is written inline (``<python>37 * 12 + 5</python>``), as a constrained model
        that copies it from the question would write it."""
        problem = self._problem
        if self._over:
            return None
        if self._last is not None and self._last[0] == problem.solution and self._last[2]:
            printed = [line for line in self._last[1].splitlines() if line.strip()]
            if printed:
                return f"<answer>{printed[-1].strip()}</answer>"
        if "\n" not in problem.solution:
            return f"<python>{problem.solution}</python>"
        return f"<python>\n{problem.solution}\n</python>"

    def snapshot(self) -> bytes:
        """Problem id, the successful cells, the latest cell's outcome and ``np_random`` as pickled bytes."""
        problem = self._problem
        return pack_snapshot(self, {"task_id": problem.id, "cells": list(self._cells), "last": self._last,
                                    "over": self._over})

    def restore(self, data: bytes) -> None:
        """Reinstate a ``snapshot`` (trusted bytes only: pickle)."""
        state = unpack_snapshot(self, data)
        self._problem = problem_from_id(state["task_id"])
        self._cells, self._last, self._over = list(state["cells"]), state["last"], bool(state["over"])

    def render(self) -> str | None:
        return self._question() if self._problem is not None else None

    # --- helpers ---------------------------------------------------------------------------------

    def _run_cell(self, code: str) -> str:
        result = self.runner.run(cell_program([*self._cells, code]))
        succeeded = result.exit_code == 0 and result.killed_reason is None
        if succeeded:
            self._cells.append(code)
        self._last = (code, result.stdout, succeeded)
        text = cut(result.stdout + result.stderr, self.max_output_chars)
        end = describe_end(result, self.limits)
        if result.exit_code not in (0, 1, None) and not end:
            end = f"[exit status {result.exit_code}]"
        body = "\n".join(part for part in (text.rstrip("\n"), end) if part)
        body = body or "(no output; print() what you want to see)"
        return f"<output>\n{body}\n</output>"

    def _question(self) -> str:
        assert self._problem is not None
        return f"Problem: {self._problem.question}"

    def _info(self, *, invalid: bool, success: bool, tool_calls: int = 0) -> dict[str, Any]:
        assert self._problem is not None
        # The interpreter's state is what the successful cells built (their code, replayed in order):
        # trajectories that ran the same cells face the same interpreter, whatever failed in between.
        digest = hashlib.sha256(json.dumps(self._cells).encode("utf-8", "surrogatepass")).hexdigest()[:16]
        return {
            "state_key": f"{self._problem.id}|cells={digest if self._cells else '-'}",
            "task_id": self._problem.id,
            "invalid_action": invalid,
            "success": success,
            "answer": str(self._problem.answer),
            "tool_calls": tool_calls,
        }
