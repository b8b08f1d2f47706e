"""``code-math-v0`` and ``code-tests-v0``: contract, grading, stateful cells, misbehaving code, the
expert and baselines, the problem sets, and both envs over HTTP and on a sandbox service."""

from __future__ import annotations

import contextlib
import io
import json
import re
import statistics
import time
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from conftest import LiveServer

import agentgym
from agentgym.checker import check_env
from agentgym.envs.registration import register_tool_envs
from agentgym.envs.tools import code_math, code_tests
from agentgym.envs.tools.code_math import CodeMathEnv
from agentgym.envs.tools.code_tests import CodeTestsEnv, extract_code, load_problems
from agentgym.envs.tools.math_problems import (
    DRILLS,
    TEMPLATES,
    generate_problem,
    parse_number,
    problem_from_id,
    same_number,
)
from agentgym.errors import ConfigError
from agentgym.http.client import EnvClient, RemoteEnv
from agentgym.rollout.constraints import is_word_span, make_constraint
from agentgym.sandbox import BwrapBackend
from agentgym.sandbox.service import create_sandbox_app

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(autouse=True)
def registered() -> None:
    if not BwrapBackend.available():  # part of the test set-up (`make test` installs it), as in test_sandbox
        pytest.fail(f"bwrap cannot run here: {BwrapBackend.unavailable_reason()}; apt-get install bubblewrap")
    register_tool_envs()


def play_expert(env: Any, **reset: Any) -> list[tuple[Any, ...]]:
    obs, info = env.reset(**reset)
    trace: list[tuple[Any, ...]] = [(obs, 0.0, False, False, info)]
    while not (trace[-1][2] or trace[-1][3]):
        trace.append(env.step(env.expert_action()))
    return trace


def cell(code: str) -> str:
    return f"<python>{code}</python>"


def fenced(code: str) -> str:
    return f"Here is my solution.\n```python\n{code}\n```"


# --- both envs -----------------------------------------------------------------------------------


def test_check_env_passes() -> None:
    check_env("code-math-v0", num_episodes=4)
    check_env("code-tests-v0", num_episodes=4)
    check_env(lambda: CodeMathEnv(difficulty=3, templates=["count", "digits"], format_penalty=0.5))
    check_env(lambda: CodeTestsEnv(reward_on="best", feedback="inputs", format_penalty=0.1,
                                   max_submissions=2))


def test_bad_arguments_raise_config_errors() -> None:
    for kwargs, message in [({"difficulty": 4}, "difficulty"), ({"templates": ["algebra"]}, "templates"),
                            ({"format_penalty": -1}, "format_penalty"),
                            ({"max_output_chars": 5}, "max_output_chars"),
                            ({"limits": {"wall": 1}}, "unknown sandbox limit"),
                            ({"sandbox_url": "ftp://x"}, "sandbox_url"),
                            ({"sandbox_backend": "vm"}, "unknown sandbox backend")]:
        with pytest.raises(ConfigError, match=message):
            CodeMathEnv(**kwargs)
    for kwargs, message in [({"max_submissions": 0}, "max_submissions"), ({"reward_on": "mean"}, "reward_on"),
                            ({"feedback": "all"}, "feedback"), ({"test_timeout_s": 0}, "test_timeout_s"),
                            ({"problems": "missing.json"}, "does not exist")]:
        with pytest.raises(ConfigError, match=message):
            CodeTestsEnv(**kwargs)
    with pytest.raises(ConfigError, match="malformed code-math task_id"):
        CodeMathEnv().reset(options={"task_id": "nope"})
    with pytest.raises(ConfigError, match="unknown code-math template"):
        CodeMathEnv().reset(options={"task_id": "algebra-d1-3"})
    with pytest.raises(ConfigError, match="unknown code-tests task_id"):
        CodeTestsEnv().reset(options={"task_id": "nope"})


@pytest.mark.parametrize("env_id", ["code-math-v0", "code-tests-v0"])
def test_env_over_the_env_service(env_id: str, make_service: Callable[..., Any]) -> None:
    client = EnvClient(client=make_service([env_id]))
    local = agentgym.make(env_id)
    with RemoteEnv(env_id, client=client) as remote:
        for seed in (5, 6):
            expected = json.loads(json.dumps(play_expert(local, seed=seed)))
            assert json.loads(json.dumps(play_expert(remote, seed=seed))) == expected
            assert expected[-1][4]["success"]
        remote.reset(seed=1)
        obs, _, _, _, info = remote.step("no code here")
        assert info["invalid_action"] and obs.startswith("Invalid action")
        fork = remote.fork()
        assert fork.step(fork.expert_action())[4]["invalid_action"] is False


def test_both_envs_on_a_sandbox_service() -> None:
    server = LiveServer(create_sandbox_app(BwrapBackend(), pool_size=1))
    try:
        for env_id in ("code-math-v0", "code-tests-v0"):
            remote = agentgym.make(env_id, sandbox_url=server.url)
            local = agentgym.make(env_id)
            assert play_expert(remote, seed=3) == play_expert(local, seed=3)
            assert play_expert(remote, seed=3)[-1][4]["success"]
        env = agentgym.make("code-math-v0", sandbox_url=server.url, limits={"wall_clock_s": 1})
        env.reset(seed=0)
        obs, *_ = env.step(cell("x = 1\nwhile True:\n    x += 1"))
        assert "[stopped: the run took longer than 1 s]" in obs
        latencies = []
        for _ in range(5):
            started = time.perf_counter()
            obs, *_ = env.step(cell("print(6 * 7)"))
            latencies.append(time.perf_counter() - started)
            assert obs == "<output>\n42\n</output>"
        print(f"\ncode-math step over the sandbox service: "
              f"median {statistics.median(latencies) * 1000:.0f} ms")
    finally:
        server.stop()


def test_sandbox_url_from_the_environment_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    server = LiveServer(create_sandbox_app(BwrapBackend(), pool_size=1))
    try:
        def runs() -> float:
            text = httpx.get(f"{server.url}/metrics").text
            return float(re.search(r"^agentgym_sandbox_runs_total (\S+)$", text, flags=re.MULTILINE).group(1))

        monkeypatch.setenv("AGENTGYM_SANDBOX_URL", server.url)
        env = agentgym.make("code-math-v0")  # no sandbox_url: the variable points at the service
        before = runs()
        env.reset(seed=0)
        obs, *_ = env.step(cell("print(6 * 7)"))
        assert obs == "<output>\n42\n</output>" and runs() == before + 1
    finally:
        server.stop()


# --- code-math: answers and problems ---------------------------------------------------------------


def test_answers_are_compared_exactly() -> None:
    gold = Fraction(42)
    for text in ["42", "42.0", " 84/2 ", "\\boxed{42}", "$42$", "x = 42", "42.", "+42", "4200%",
                 "\\frac{84}{2}"]:
        assert same_number(text, gold) == (text != "4200%"), text
    assert parse_number("1,234,567") == 1234567 and parse_number("-3/4") == Fraction(-3, 4)
    assert parse_number("$149.04") == Fraction(3726, 25) and parse_number("12.5%") == Fraction(25, 2)
    assert same_number("0.1428571428", Fraction(1, 7)) and not same_number("0.142857", Fraction(1, 6))
    assert not same_number("0.14", Fraction(1, 7)) and not same_number("43", gold)
    for text in ["", "forty-two", "42 apples", "4/0", "1/2/3", "inf", "nan", "2+2", "1e5", "1" * 500]:
        assert parse_number(text) is None, text


def test_generator_is_deterministic_and_each_solution_prints_the_answer() -> None:
    seen = set()
    for template in TEMPLATES:
        for difficulty in (1, 2, 3):
            for seed in range(12):
                problem = generate_problem.__wrapped__(template, difficulty, seed)  # bypass the cache
                assert problem == generate_problem(template, difficulty, seed) == problem_from_id(problem.id)
                seen.add(problem.question)
                printed = io.StringIO()
                with contextlib.redirect_stdout(printed):
                    exec(problem.solution, {})  # noqa: S102 - our own generated code
                assert Fraction(printed.getvalue().strip()) == problem.answer, problem
    assert len(seen) > 0.95 * len(TEMPLATES) * 3 * 12  # seeds give different problems

    def digits(difficulty: int) -> float:  # mean length of the longest number in a question
        return statistics.mean(
            max(len(n) for n in re.findall(r"\d+", generate_problem(t, difficulty, s).question))
            for t in TEMPLATES for s in range(20))

    assert digits(1) < digits(2) < digits(3)


def test_the_expression_drill_is_copied_into_a_cell_and_its_value_answered() -> None:
    """The drill (``templates=["expression"]``): d + 1 terms, a positive value, a solution that is the
    question's own words; the expert copies it inline and answers the value the cell shows, both replies
    allowed by ``tag_spans:python,answer``. The default env never draws it."""
    rule = make_constraint("tag_spans:python,answer")
    for difficulty in (1, 2, 3):
        for seed in range(30):
            problem = generate_problem("expression", difficulty, seed)
            assert problem.answer > 0 and problem.answer.denominator == 1
            assert problem.question == f"Compute {problem.solution}. Give the exact value."
            assert is_word_span(problem.question, problem.solution)
            assert len(re.split(r" [+-] ", problem.solution)) == difficulty + 1
            assert str(problem.answer) not in re.findall(r"\d+", problem.question)  # only the tool tells it
    env = agentgym.make("code-math-v0", templates=["expression"], difficulty=2)
    for seed in range(3):
        trace = play_expert(env, seed=seed)
        info = trace[0][4]
        problem = problem_from_id(info["task_id"])
        assert info["task_id"].startswith("expression-d2-") and len(trace) == 3 and trace[-1][1] == 1.0
        assert trace[1][0] == f"<output>\n{problem.answer}\n</output>"
        prompts = (trace[0][0], trace[1][0])
        actions = (f"<python>{problem.solution}</python>", f"<answer>{problem.answer}</answer>")
        for prompt, action in zip(prompts, actions, strict=True):
            assert rule.may_end(prompt, action), (prompt, action)
    assert "expression" in DRILLS and "expression" not in TEMPLATES
    default = agentgym.make("code-math-v0")
    assert not any(default.reset(seed=s)[1]["task_id"].startswith("expression") for s in range(60))
    with pytest.raises(ConfigError, match="templates must be a non-empty list from tank.*expression"):
        CodeMathEnv(templates=["expresion"])


def test_expert_success_random_baseline_and_episode_length() -> None:
    env = agentgym.make("code-math-v0")
    lengths, solved, step_s = [], 0, []
    for seed in range(40):
        obs, info = env.reset(seed=seed)
        assert info["answer"] == str(problem_from_id(info["task_id"]).answer)
        started = time.perf_counter()
        obs, reward, terminated, _, info = env.step(env.expert_action())
        step_s.append(time.perf_counter() - started)
        assert obs.startswith("<output>\n") and not terminated and reward == 0.0
        trace = [obs]
        while not terminated:
            obs, reward, terminated, _, info = env.step(env.expert_action())
            trace.append(obs)
        solved += info["success"] and reward == 1.0
        lengths.append(len(trace))
    rng = np.random.default_rng(0)
    guesses = 0
    for seed in range(200):  # no tools: answer a random whole number at once
        env.reset(seed=seed)
        guesses += env.step(f"<answer>{int(rng.integers(0, 101))}</answer>")[4]["success"]
    print(f"\ncode-math: expert {solved}/40, mean length {statistics.mean(lengths):.2f} turns, random guess "
          f"{guesses}/200, python step median {statistics.median(step_s) * 1000:.0f} ms")
    assert solved == 40 and set(lengths) == {2}
    assert guesses / 200 < 0.05


# --- code-math: the interpreter --------------------------------------------------------------------


def test_cells_keep_state_across_turns_and_failed_cells_leave_none() -> None:
    env = agentgym.make("code-math-v0", max_turns=20)
    _, info = env.reset(seed=1)
    start_key = info["state_key"]
    assert start_key.endswith("|cells=-")
    obs, _, _, _, info = env.step(cell("import random\nx = 6\nr = random.random()\nprint('defined')"))
    assert obs == "<output>\ndefined\n</output>"
    key = info["state_key"]
    assert key != start_key
    # Replayed cells are silent; the new cell sees their names; a bare last expression is shown.
    obs, _, _, _, info = env.step(cell("x * 7"))
    assert obs == "<output>\n42\n</output>"
    obs, _, _, _, info = env.step(cell("y = 1\nundefined_name"))
    assert "NameError: name 'undefined_name' is not defined" in obs and 'File "<cell 3>", line 2' in obs
    failed_key = info["state_key"]
    obs, *_ = env.step(cell("print(y)"))
    assert "NameError: name 'y' is not defined" in obs  # the failed cell's y is gone
    obs, _, _, _, info = env.step(cell("print(r)") + cell("print(r)") + cell("z = x"))
    first, second, third = obs.split("\n<output>")
    assert first.split("\n")[1] == second.split("\n")[1]  # random is seeded: the replay draws the same r
    assert third == "\n(no output; print() what you want to see)\n</output>"
    assert info["state_key"] != failed_key
    obs, *_ = env.step(cell("def f(:"))
    assert "SyntaxError" in obs and 'File "<cell' in obs


def test_misbehaving_code_comes_back_as_an_observation() -> None:
    env = agentgym.make("code-math-v0", max_turns=20, max_output_chars=300,
                        limits={"wall_clock_s": 1, "output_bytes": 4096, "memory_mb": 256})
    env.reset(seed=2)
    cases = {
        "while True:\n    pass": "[stopped: the run took longer than 1 s]",
        "import time\ntime.sleep(30)": "[stopped: the run took longer than 1 s]",
        "while True:\n    print('spam' * 100)": "[stopped: the output went past 4096 bytes]",
        "import os\nos.kill(os.getpid(), 9)": "[stopped: the program was killed by signal 9]",
        "import os\nos._exit(3)": "[exit status 3]",
        "b = bytearray(1024 * 2**20)": "MemoryError",
        "print(open('/etc/passwd').read())": "FileNotFoundError",
        "open('/usr/evil', 'w')": "Error",  # read-only (or permission denied), either way refused
        "import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=0.5)": "Error",
        "raise SystemExit(0)": "SystemExit",
    }
    for code, expected in cases.items():
        obs, reward, terminated, _, info = env.step(cell(code))
        assert expected in obs, (code, obs)
        assert obs.startswith("<output>\n") and obs.endswith("\n</output>") and len(obs) < 600
        assert not terminated and reward == 0.0 and not info["invalid_action"]
    assert env.unwrapped._cells == []  # none of them counts as a successful cell


def test_invalid_actions_and_the_json_form() -> None:
    env = agentgym.make("code-math-v0", format_penalty=0.25, max_turns=20)
    obs, info = env.reset(seed=4)
    question = obs
    for bad, message in [("The answer is 42.", "no tool call found"),
                         (cell("print(1)") + "<answer>1</answer>", "either runs code or answers"),
                         ("<answer>1</answer><answer>2</answer>", "answer once"),
                         (cell("1") * 4, "at most 3 python cells"),
                         ("<answer>forty two</answer>", "is not a number"),
                         ("<python>print(1)", "never closed"),
                         ("<search>x</search>", "unknown tool 'search'"),
                         ('<tool_call>{"name": "python"}</tool_call>',
                          "missing the required argument 'code'")]:
        obs, reward, terminated, _, info = env.step(bad)
        assert info["invalid_action"] and reward == -0.25 and not terminated, bad
        assert message in obs and obs.endswith(question), (bad, obs)
    call = json.dumps({"name": "python", "arguments": json.dumps({"code": "print(2 ** 10)"})})
    obs, reward, _, _, info = env.step(f"<think>use <answer> later</think><tool_call>{call}</tool_call>")
    assert obs == "<output>\n1024\n</output>" and not info["invalid_action"] and reward == 0.0
    answer = info["answer"]
    call = json.dumps({"name": "answer", "arguments": {"answer": f"\\boxed{{{answer}}}"}})
    obs, reward, terminated, _, info = env.step(f"<tool_call>{call}</tool_call>")
    assert terminated and reward == 1.0 and info["success"] and "It is correct." in obs


def test_wrong_answer_ends_the_episode_with_zero() -> None:
    env = agentgym.make("code-math-v0")
    _, info = env.reset(seed=8)
    wrong = str(Fraction(info["answer"]) + 1)
    obs, reward, terminated, _, info = env.step(f"<answer>{wrong}</answer>")
    assert terminated and reward == 0.0 and not info["success"] and "not correct" in obs


def test_snapshot_fork_keeps_the_interpreter_state() -> None:
    env = agentgym.make("code-math-v0", max_turns=20)
    env.reset(seed=9)
    env.step(cell("import random\nsecret = random.randint(0, 10**9)"))
    forks = [env.fork("snapshot"), env.fork("replay")]
    outputs = [member.step(cell("print(secret)"))[0] for member in (env, *forks)]
    assert len(set(outputs)) == 1 and outputs[0].split("\n")[1].isdigit()
    for member in forks:
        member.close()


# --- code-tests ----------------------------------------------------------------------------------


def test_problem_set_is_well_formed_and_every_reference_passes_all_tests() -> None:
    problems = load_problems()
    assert len(problems) >= 30 and len({p.id for p in problems}) == len(problems)
    env = agentgym.make("code-tests-v0")
    for problem in problems:
        assert problem.signature.startswith(f"def {problem.id}(") and problem.signature.endswith(":")
        assert len(problem.examples) >= 2 and len(problem.tests) >= 6
        assert not set(map(json.dumps, problem.examples)) & set(map(json.dumps, problem.tests))
        obs, info = env.reset(options={"task_id": problem.id})
        assert problem.signature in obs and problem.reference not in obs
        assert info["answer"] == problem.reference
        obs, reward, terminated, _, info = env.step(env.expert_action())
        assert (reward, terminated, info["success"]) == (1.0, True, True), (problem.id, obs)
        assert info["tests_passed"] == info["tests_total"] == len(problem.tests)
        assert obs.endswith("All hidden tests pass.")


def test_wrong_solutions_score_partially_and_rewards_telescope() -> None:
    wrong = "def is_palindrome(s):\n    return s == s[::-1]\n"  # forgets case and punctuation
    env = agentgym.make("code-tests-v0")
    _, info = env.reset(options={"task_id": "is_palindrome"})
    assert info["state_key"] == "is_palindrome|score=-|left=3"
    obs, reward, terminated, _, info = env.step(fenced(wrong))
    partial = info["tests_passed"]
    assert 0 < partial < 10 and reward == partial / 10 and not terminated and not info["success"]
    assert info["state_key"] == f"is_palindrome|score={partial}/10|left=2"
    assert obs.startswith(f"Submission 1: {partial}/10 hidden tests passed.")
    assert "expected True, got False" in obs
    obs, reward, terminated, _, info = env.step(fenced("def is_palindrome(s):\n    return None"))
    assert info["tests_passed"] == 0 and reward == -partial / 10  # final: the latest submission counts
    obs, reward, terminated, _, info = env.step(fenced(wrong))
    assert terminated and reward == partial / 10 and "No submissions left" in obs
    best = agentgym.make("code-tests-v0", reward_on="best")
    best.reset(options={"task_id": "is_palindrome"})
    rewards = [best.step(fenced(code))[1] for code in (wrong, "def is_palindrome(s):\n    return None")]
    assert rewards == [partial / 10, 0.0]
    expert = best.expert_action()
    obs, reward, terminated, _, info = best.step(expert)
    assert terminated and info["success"] and sum(rewards) + reward == 1.0


def test_bad_submissions_fail_tests_without_raising() -> None:
    env = agentgym.make("code-tests-v0", max_submissions=20, max_turns=40, test_timeout_s=0.3,
                        limits={"wall_clock_s": 4, "output_bytes": 8192})
    env.reset(options={"task_id": "two_sum"})
    # Result lines forged after the harness's own (atexit) still need each expected value's digest.
    forged = ("import atexit, os\n"
              "def forge():\n"
              "    for i in range(8):\n"
              "        os.write(1, ('@@agentgym-test@@ {\"test\": %d, \"hash\": \"0\", "
              "\"repr\": \"[0, 1]\"}\\n' % i).encode())\n"
              "atexit.register(forge)\n"
              "def two_sum(nums, target):\n"
              "    raise ValueError('no idea')\n")
    cases = {
        "def two_sum(nums, target:\n    pass": "could not be loaded: SyntaxError",
        "raise RuntimeError('at import')":
            "could not be loaded: RuntimeError: at import (solution.py, line 1)",
        "def other(nums, target):\n    return []":
            "could not be loaded: the code defines no function 'two_sum'",
        "def two_sum(nums, target):\n    return nums[99]":
            "raised IndexError: list index out of range (solution.py, line 2)",
        "def two_sum(nums, target):\n    while True:\n        pass": "timed out after 0.3 s",
        "def two_sum(nums, target):\n    import sys\n    sys.exit(0)": "raised SystemExit",
        "def two_sum(nums, target):\n    import os\n    os._exit(0)": "no result: the program ended early",
        "def two_sum(nums, target):\n    import os\n    while True:\n        os.write(1, b'x' * 1000)":
            "[stopped: the output went past 8192 bytes]",
        "def two_sum(nums, target):\n    print('thinking ' * 100)\n    return object()":
            "got <object object at",
        forged: "got [0, 1]",
    }
    for code, expected in cases.items():
        obs, reward, terminated, _, info = env.step(fenced(code))
        assert expected in obs, (code, obs)
        assert not info["invalid_action"] and not terminated
        assert info["tests_passed"] == 0 and reward == 0.0, code
    obs, *_ = env.step(fenced("def two_sum(nums, target):\n    print('thinking')\n    return [1, 0]"))
    assert "printed: 'thinking\\n'" in obs


def test_submission_protocol() -> None:
    reference = {p.id: p for p in load_problems()}["fizzbuzz"].reference
    assert extract_code(f"```python\nbroken(\n```\nThen:\n```python\n{reference}```") == (reference, None)
    assert extract_code(f"```\n{reference}```") == (reference, None)
    assert extract_code(f"```py\n{reference}```\n```\noutput\n```") == (reference, None)
    call = json.dumps({"name": "submit", "arguments": {"code": reference}})
    assert extract_code(f"<tool_call>{call}</tool_call>") == (reference, None)
    assert extract_code(f"<submit>{reference}</submit>")[0] == reference.strip()
    assert extract_code("```python\n   \n```")[1] == "the code block is empty"
    assert "submit once per turn" in extract_code(f"<tool_call>{call}</tool_call>" * 2)[1]
    env = agentgym.make("code-tests-v0", format_penalty=0.5)
    env.reset(options={"task_id": "fizzbuzz"})
    for _ in range(3):  # replies without code do not use up submissions
        obs, reward, terminated, _, info = env.step("I would loop from 1 to n.")
        assert info["invalid_action"] and reward == -0.5 and not terminated and "3 submissions left" in obs
    obs, reward, terminated, _, info = env.step(f"<tool_call>{call}</tool_call>")
    assert terminated and info["success"] and reward == 1.0


def test_feedback_modes_hide_what_they_should() -> None:
    wrong = "def fizzbuzz(n):\n    return [str(i) for i in range(1, n + 1)]"
    shown = {}
    for mode in ("full", "inputs", "count"):
        env = agentgym.make("code-tests-v0", feedback=mode)
        env.reset(options={"task_id": "fizzbuzz"})
        shown[mode] = env.step(fenced(wrong))[0]
    assert "fizzbuzz(3): expected ['1', '2', 'Fizz'], got ['1', '2', '3']" in shown["full"]
    assert "fizzbuzz(3): got ['1', '2', '3']" in shown["inputs"] and "expected" not in shown["inputs"]
    assert "fizzbuzz(" not in shown["count"]
    assert shown["count"].startswith("Submission 1: 2/8 hidden tests passed.")


def test_user_problem_file(tmp_path: Path) -> None:
    data = {"problems": [{"id": "double", "title": "Double", "prompt": "Return twice x.",
                          "signature": "def double(x: float) -> float:",
                          "reference": "def double(x: float) -> float:\n    return 2 * x\n",
                          "examples": [{"args": [1], "expected": 2}],
                          "tests": [{"args": [0.1], "expected": 0.2}, {"args": [3], "expected": 6.0},
                                    {"args": [[1]], "expected": [1, 1]}]}]}
    path = tmp_path / "problems.json"
    path.write_text(json.dumps(data))
    env = agentgym.make("code-tests-v0", problems=str(path))
    trace = play_expert(env, seed=0)
    assert trace[0][4]["task_id"] == "double" and trace[-1][4]["success"]  # floats compare to 9 digits
    data["problems"][0]["tests"] = []
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="problem 0 tests must be a non-empty list"):
        code_tests.load_problems(str(path))


def test_expert_success_and_baselines() -> None:
    env = agentgym.make("code-tests-v0")
    successes, returns, lengths, step_s = 0, [], [], []
    for seed in range(30):
        env.reset(seed=seed)
        started = time.perf_counter()
        _, reward, terminated, _, info = env.step(env.expert_action())
        step_s.append(time.perf_counter() - started)
        successes += info["success"] and terminated and reward == 1.0
        lengths.append(1)
    for problem in load_problems():  # a stub that returns None, three times
        env.reset(options={"task_id": problem.id})
        total = 0.0
        for _ in range(3):
            _, reward, terminated, _, info = env.step(fenced(f"{problem.signature}\n    return None"))
            total += reward
        returns.append(total)
    print(f"\ncode-tests: expert {successes}/30 in 1 turn, stub mean return {statistics.mean(returns):.3f}, "
          f"submission median {statistics.median(step_s) * 1000:.0f} ms")
    assert successes == 30 and statistics.mean(returns) < 0.1


def test_modules_expose_their_defaults() -> None:
    assert code_math.DEFAULT_LIMITS.wall_clock_s == 5.0 and code_tests.DEFAULT_LIMITS.wall_clock_s == 10.0
    assert agentgym.spec("code-math-v0").max_turns == 8 and agentgym.spec("code-tests-v0").max_turns == 5


def test_tool_calls_counts_cells_run_and_submissions_graded() -> None:
    math_env = agentgym.make("code-math-v0", max_turns=20)
    _, info = math_env.reset(seed=4)
    assert info["tool_calls"] == 0
    assert math_env.step("The answer is 42.")[4]["tool_calls"] == 0  # invalid: nothing ran
    assert math_env.step(cell("print(1)") * 4)[4]["tool_calls"] == 0  # too many cells: nothing ran
    assert math_env.step(cell("print(1)"))[4]["tool_calls"] == 1
    obs, _, _, _, info = math_env.step(cell("x = 1") + cell("undefined_name") + cell("print(x)"))
    assert info["tool_calls"] == 3 and "NameError" in obs  # a failing cell ran too
    _, _, terminated, _, info = math_env.step(f"<answer>{info['answer']}</answer>")
    assert terminated and info["success"] and info["tool_calls"] == 0  # the answer is not a tool call

    tests_env = agentgym.make("code-tests-v0")
    _, info = tests_env.reset(options={"task_id": "fizzbuzz"})
    assert info["tool_calls"] == 0
    assert tests_env.step("I would loop from 1 to n.")[4]["tool_calls"] == 0
    _, _, terminated, _, info = tests_env.step(fenced("def fizzbuzz(n):\n    return []"))
    assert not terminated and info["tool_calls"] == 1 and info["tests_passed"] < info["tests_total"]
    _, _, terminated, _, info = tests_env.step(fenced(info["answer"]))
    assert terminated and info["success"] and info["tool_calls"] == 1
