"""``CodeTestsEnv`` (``code-tests-v0``): write a Python function that passes hidden unit tests.

The problem set and the grading harness are ``agentgym.envs.tools.code_grading``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Literal

from agentgym.core import Env, TaskSplit
from agentgym.envs.arguments import check_int, check_non_negative
from agentgym.envs.tools.code_grading import SHOW_CHARS, CodeProblem, Grade, grade, load_problems
from agentgym.envs.tools.code_runner import CodeRunner, make_limits
from agentgym.envs.tools.tool_calls import parse_tool_calls, tool_spec
from agentgym.errors import ConfigError
from agentgym.sandbox import Limits
from agentgym.snapshot import pack_snapshot, unpack_snapshot

#: Sandbox limits of one submission's run (all its tests together).
DEFAULT_LIMITS = Limits(wall_clock_s=10.0, memory_mb=512, output_bytes=256 * 1024)
#: Longest submission accepted (characters).
MAX_CODE_CHARS = 50_000
_FENCE_RE = re.compile(r"```[ \t]*(python3?|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)

TOOLS: list[dict[str, Any]] = [
    tool_spec("submit", "Submit the complete solution code; it is run against the hidden tests.",
              {"code": {"type": "string", "description": "Python source defining the requested function."}}),
]
_INSTRUCTIONS = (
    "Write a Python function that solves the problem. It is checked against hidden unit tests.\n"
    "- Submit the complete code (the function with the exact name and parameters asked for, plus any "
    "imports and helpers it needs) in one ```python code block. If a reply holds several ```python "
    "blocks, the last one is submitted. The JSON form works too: <tool_call>{{\"name\": \"submit\", "
    "\"arguments\": {{\"code\": \"...\"}}}}</tool_call>.\n"
    "- Each test calls your function and compares what it returns with the expected value; printing "
    "is not returning. Use the standard library only; no input(), files or network. A test may run "
    "{test_s:g} s and the whole submission {wall_s:g} s.\n"
    "- After a submission you are told how many hidden tests passed{feedback}. You may submit up to "
    "{submissions} times; the episode ends when every test passes or the submissions are used up. The "
    "reward is the fraction of hidden tests passed by your {which} submission.\n"
    "- You may think before the code block."
)
_FEEDBACK_TEXT = {
    "full": ", and for up to {k} failing ones the input, the expected value and what your function "
            "returned or raised",
    "inputs": ", and for up to {k} failing ones the input and what your function returned or raised",
    "count": "",
}


def extract_code(action: str) -> tuple[str | None, str | None]:
    """The submitted code of a reply and ``None``, or ``None`` and what is wrong with the reply.

    The last ```` ```python ```` block wins; without one, the last bare ```` ``` ```` block; without
    either, a ``submit`` tool call (tag or JSON form).

    Example:
        >>> extract_code("Here:\\n```python\\ndef f():\\n    return 1\\n```")
        ('def f():\\n    return 1\\n', None)
        >>> extract_code("def f(): return 1")[1]
        'no code found; put the whole solution in one ```python block'
    """
    if not isinstance(action, str):
        return None, "the reply must be text"
    blocks = _FENCE_RE.findall(action[:MAX_CODE_CHARS * 2])
    tagged = [body for language, body in blocks if language]
    if blocks:
        code = tagged[-1] if tagged else blocks[-1][1]
    else:
        parsed = parse_tool_calls(action, TOOLS)
        if parsed.no_call:
            return None, "no code found; put the whole solution in one ```python block"
        if parsed.errors:
            return None, parsed.errors[0].message
        if len(parsed.calls) > 1:
            return None, "submit once per turn"
        code = parsed.calls[0].arguments["code"]
    if not code.strip():
        return None, "the code block is empty"
    if len(code) > MAX_CODE_CHARS:
        return None, f"the code is longer than {MAX_CODE_CHARS} characters"
    return code, None


# --- the env -------------------------------------------------------------------------------------


def _call(problem: CodeProblem, args: Sequence[Any]) -> str:
    text = f"{problem.id}({', '.join(repr(a) for a in args)})"
    return text if len(text) <= SHOW_CHARS else text[:SHOW_CHARS] + "...)"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= SHOW_CHARS else text[:SHOW_CHARS] + "..."


class CodeTestsEnv(Env):
    """Write a function that passes hidden unit tests, with feedback and retries.

    Reset shows a problem (the seed picks it; or ``options={"task_id": <problem id>}``): what the
    function must do, its ``def`` line and visible examples. Each turn the agent submits complete
    code in a ```` ```python ```` block (the last block of the reply), or with the ``submit`` tool
    (``<tool_call>`` JSON or ``<submit>…</submit>``). The code runs in the sandbox against the hidden
    tests; the observation says how many passed and, per ``feedback``, shows up to
    ``max_failures_shown`` failing tests (input, expected value, what came back or was raised, and
    what the test printed). The episode terminates when all tests pass or after ``max_submissions``
    submissions. A reply without code is an invalid action (``info["invalid_action"]``, reward
    ``-format_penalty``); it does not use up a submission.

    **Reward.** Each submission's reward is the change in the score that counts, so an episode's
    return equals that score whenever it stops (truncated by ``max_turns`` included):
    ``reward_on="final"`` scores the latest submission (a worse resubmission gives a negative
    reward), ``"best"`` the best one so far. The score is the fraction of hidden tests passed.
    Submission steps report ``info["tests_passed"]``/``info["tests_total"]``; ``success`` is all passed.
    ``info["tool_calls"]`` is 1 on a step whose submission ran against the tests, else 0.

    ``info["answer"]`` holds the reference solution (privileged: never shown); ``info["tools"]``
    and ``info["instructions"]`` come with reset. The expert submits the reference solution.
    Expected values are compared on the host, never inside the sandbox, so code cannot fake a pass
    by printing; but with ``feedback="full"`` failing tests reveal their expected values, which a
    policy could copy into a later submission — use ``"inputs"`` or ``"count"`` where that matters.

    Args:
        problems: a JSON problem file (see ``load_problems``), or ``None`` for the bundled set.
        max_submissions: submissions per episode.
        reward_on: ``"final"`` or ``"best"`` submission.
        feedback: ``"full"``, ``"inputs"`` (no expected values) or ``"count"`` (pass count only).
        max_failures_shown: failing tests detailed per submission.
        test_timeout_s: time limit of one test (the whole run has ``limits.wall_clock_s``).
        format_penalty: subtracted from the reward of an invalid action (``>= 0``).
        limits: sandbox ``Limits`` of a submission's run, or a dict of fields overriding ``DEFAULT_LIMITS``.
        sandbox_url: run code on a sandbox service (``agentgym sandbox serve``) instead of in-process.
        sandbox_token: bearer token of that service.
        sandbox_backend: in-process backend (``"auto"``: bwrap, else docker; ``"subprocess"`` is not
            a security boundary).

    Raises:
        ConfigError: an argument is out of range, the problem file is malformed, or no sandbox
            backend can run here.

    Example:
        >>> problem = {p.id: p for p in load_problems()}["two_sum"]
        >>> problem.signature, len(problem.tests)
        ('def two_sum(nums: list[int], target: int) -> list[int]:', 8)
        >>> reply = "```python\\n" + problem.reference + "```"  # the expert's reply
        >>> extract_code(reply)[0] == problem.reference
        True
    """

    has_expert: ClassVar[bool] = True
    supports_snapshot: ClassVar[bool] = True

    def __init__(self, problems: str | None = None, max_submissions: int = 3,
                 reward_on: Literal["final", "best"] = "final",
                 feedback: Literal["full", "inputs", "count"] = "full", max_failures_shown: int = 3,
                 test_timeout_s: float = 2.0, format_penalty: float = 0.0,
                 limits: Limits | Mapping[str, Any] | None = None, sandbox_url: str | None = None,
                 sandbox_token: str | None = None, sandbox_backend: str = "auto") -> None:
        check_int(max_submissions, "max_submissions", 1, 100)
        check_int(max_failures_shown, "max_failures_shown", 0, 100)
        if reward_on not in ("final", "best"):
            raise ConfigError(f"reward_on must be 'final' or 'best', got {reward_on!r}")
        if feedback not in _FEEDBACK_TEXT:
            raise ConfigError(f"feedback must be one of {', '.join(_FEEDBACK_TEXT)}, got {feedback!r}")
        check_non_negative(format_penalty, "format_penalty")
        if isinstance(test_timeout_s, bool) or not isinstance(test_timeout_s, (int, float)) \
                or not 0 < test_timeout_s <= 60:
            raise ConfigError(f"test_timeout_s must be a number in (0, 60], got {test_timeout_s!r}")
        self.problems_file = None if problems is None else str(problems)
        self.problems = load_problems(None if problems is None else str(problems))
        self.by_id = {p.id: p for p in self.problems}
        self.max_submissions, self.reward_on, self.feedback = int(max_submissions), reward_on, feedback
        self.max_failures_shown, self.test_timeout_s = int(max_failures_shown), float(test_timeout_s)
        self.format_penalty = float(format_penalty)
        self.limits = make_limits(limits, DEFAULT_LIMITS)
        self.runner = CodeRunner(self.limits, sandbox_url=sandbox_url, sandbox_token=sandbox_token,
                                 backend=sandbox_backend)
        self.instructions = _INSTRUCTIONS.format(
            test_s=self.test_timeout_s, wall_s=self.limits.wall_clock_s, submissions=self.max_submissions,
            which="latest" if reward_on == "final" else "best",
            feedback=_FEEDBACK_TEXT[feedback].format(k=self.max_failures_shown))
        self._problem: CodeProblem | None = None
        self._submissions = 0
        self._score = 0  # tests passed by the submission that counts (latest or best)
        self._over = False

    def task_splits(self) -> tuple[TaskSplit, ...]:
        """One split of named tasks, ``problems``: the problem set in file order."""
        source = "the bundled problem set" if self.problems_file is None else self.problems_file
        return (TaskSplit("problems", len(self.problems), f"problems of {source}, in order"),)

    def describe_task(self, split: TaskSplit, index: int) -> dict[str, Any]:
        """The problem's id (its function name) and title."""
        problem = self.problems[index]
        return {"task_id": problem.id, "description": problem.title}

    def parse_task_id(self, task_id: Any) -> CodeProblem:
        """The problem whose function name is ``task_id``."""
        if task_id not in self.by_id:
            raise ConfigError(f"unknown code-tests task_id {task_id!r}; ids are function names such as "
                              f"{self.problems[0].id!r}")
        return self.by_id[task_id]

    def choose_task(self, seed: int | None) -> CodeProblem:
        """A problem drawn from the seeded ``np_random``."""
        return self.problems[int(self.np_random.integers(len(self.problems)))]

    def start_task(self, task: CodeProblem, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        self._problem = task
        self._submissions, self._score, self._over = 0, 0, False
        info = self._info(invalid=False, success=False)
        info["instructions"] = self.instructions
        info["tools"] = TOOLS
        return self._statement(), info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        problem = self._problem
        code, problem_text = extract_code(action)
        if code is None:
            left = self.max_submissions - self._submissions
            hint = "" if problem_text.startswith("no code found") else (
                f" Submit the complete code of {problem.id}() in one ```python block.")
            obs = f"Invalid action: {problem_text}.{hint} ({left} submission{'s' if left != 1 else ''} left.)"
            return obs, -self.format_penalty, False, False, self._info(invalid=True, success=False)
        verdict = grade(problem, code, self.runner, self.test_timeout_s)
        self._submissions += 1
        total = len(problem.tests)
        before = self._score
        self._score = verdict.passed if self.reward_on == "final" else max(self._score, verdict.passed)
        solved = verdict.passed == total
        self._over = solved or self._submissions >= self.max_submissions
        info = self._info(invalid=False, success=solved, tool_calls=1)
        info.update(tests_passed=verdict.passed, tests_total=total)
        return self._feedback(verdict), (self._score - before) / total, self._over, False, info

    def expert_action(self) -> str | None:
        """Submit the reference solution."""
        problem = self._problem
        return None if self._over else f"```python\n{problem.reference}```"

    def snapshot(self) -> bytes:
        """Problem id, submissions made, the counted score and ``np_random`` as pickled bytes."""
        problem = self._problem
        return pack_snapshot(self, {"task_id": problem.id, "submissions": self._submissions,
                                    "score": self._score, "over": self._over})

    def restore(self, data: bytes) -> None:
        """Reinstate a ``snapshot`` (trusted bytes only: pickle)."""
        state = unpack_snapshot(self, data)
        if state["task_id"] not in self.by_id:
            raise ConfigError(f"snapshot of problem {state['task_id']!r}, which this env's problem set lacks")
        self._problem = self.by_id[state["task_id"]]
        self._submissions, self._score = int(state["submissions"]), int(state["score"])
        self._over = bool(state["over"])

    def render(self) -> str | None:
        return self._statement() if self._problem is not None else None

    # --- helpers ---------------------------------------------------------------------------------

    def _feedback(self, verdict: Grade) -> str:
        problem = self._problem
        assert problem is not None
        total = len(problem.tests)
        lines = [f"Submission {self._submissions}: {verdict.passed}/{total} hidden tests passed."]
        if verdict.setup_error:
            lines.append(f"Your code could not be loaded: {verdict.setup_error}")
            if verdict.setup_printed:
                lines.append(f"It printed: {verdict.setup_printed!r}")
        elif self.feedback != "count" and self.max_failures_shown:
            failing = [(args, expected, o)
                       for (args, expected), o in zip(problem.tests, verdict.outcomes, strict=True)
                       if not o.passed]
            if failing:
                shown = failing[: self.max_failures_shown]
                lines.append(f"Failing tests ({len(shown)} of {len(failing)} shown):")
                for args, expected, outcome in shown:
                    call = _call(problem, args)
                    if outcome.detail == "wrong value":
                        want = f"expected {_short(expected)}, " if self.feedback == "full" else ""
                        lines.append(f"- {call}: {want}got {outcome.got}")
                    elif self.feedback == "full" and outcome.detail.startswith(("raised", "timed out")):
                        lines.append(f"- {call}: expected {_short(expected)}, but it {outcome.detail}")
                    else:
                        lines.append(f"- {call}: {outcome.detail}")
                    if outcome.printed:
                        lines.append(f"  printed: {outcome.printed!r}")
        if verdict.passed == total:
            lines.append("All hidden tests pass.")
        elif self._over:
            lines.append(f"No submissions left; the score is {self._score}/{total}.")
        else:
            left = self.max_submissions - self._submissions
            lines.append(f"{left} submission{'s' if left != 1 else ''} left. "
                         "Fix the code and submit all of it again.")
        return "\n".join(lines)

    def _statement(self) -> str:
        problem = self._problem
        assert problem is not None
        examples = "\n".join(f"    {_call(problem, args)} == {_short(expected)}"
                             for args, expected in problem.examples)
        return (f"Problem: {problem.title}\n{problem.prompt}\n\n"
                f"Write this function:\n    {problem.signature}\n\n"
                f"Examples:\n{examples}")

    def _info(self, *, invalid: bool, success: bool, tool_calls: int = 0) -> dict[str, Any]:
        problem = self._problem
        assert problem is not None
        # The state is the problem, the score that counts so far and the submissions left: the rest
        # of the episode's return depends on nothing else. Submission texts are history.
        score = f"{self._score}/{len(problem.tests)}" if self._submissions else "-"
        left = self.max_submissions - self._submissions
        return {
            "state_key": f"{problem.id}|score={score}|left={left}",
            "task_id": problem.id,
            "invalid_action": invalid,
            "success": success,
            "answer": problem.reference,
            "tool_calls": tool_calls,
        }

