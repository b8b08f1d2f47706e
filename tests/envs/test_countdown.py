"""Tests of ``agentgym.envs.games.countdown``: the safe evaluator, the solver, puzzles and the env."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

import agentgym
from agentgym.envs.games.countdown import (
    CountdownEnv,
    ExpressionError,
    evaluate,
    format_task_id,
    generate_puzzle,
    solve,
)
from agentgym.envs.registration import register_games
from agentgym.errors import ConfigError

register_games()  # idempotent (override=True)


# --- the evaluator -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "numbers", "value"),
    [
        ("2 + 3 * 4", [2, 3, 4], 14),  # * binds tighter than +
        ("(2 + 3) * 4", [2, 3, 4], 20),  # parentheses first
        ("10 - 3 - 2", [10, 3, 2], 5),  # left to right
        ("10 - (3 - 2)", [10, 3, 2], 9),
        ("100 / 4 / 5", [100, 4, 5], 5),
        ("100 / (4 / 5)", [100, 4, 5], 125),
        ("6 / (1 - 3 / 4)", [6, 1, 3, 4], 24),  # fractions along the way are fine
        ("3 - 7", [3, 7], -4),
        ("7 / 2", [7, 2], Fraction(7, 2)),
        ("((25))", [25], 25),
        ("(" * 99 + "1" + ")" * 99, [1], 1),  # the deepest nesting that fits in 200 characters
        ("3 * 3", [3, 3, 4], 9),  # a number listed twice may be used twice
        ("25 × 4 ÷ 5 − 1", [25, 4, 5, 1], 19),  # typographic operators
        ("  50+50 ", [50, 50], 100),
    ],
)
def test_evaluate(expression: str, numbers: list[int], value: Fraction) -> None:
    assert evaluate(expression, numbers) == value


@pytest.mark.parametrize(
    ("expression", "numbers", "reason"),
    [
        ("3 * 3", [3, 4], "3 is used 2 times but is listed only once"),
        ("5 + 4", [3, 4], "5 is not one of the numbers"),
        ("4 / (3 - 3)", [4, 3, 3], "divides by zero"),
        ("2 ** 3", [2, 3], "'**' is not allowed"),
        ("2 ** 99999999999", [2, 99999999999], "'**' is not allowed"),  # rejected before any arithmetic
        ("7 // 2", [7, 2], "'//' is not allowed"),
        ("7 % 2", [7, 2], "'%' is not allowed"),
        ("-3 + 4", [3, 4], "unary minus"),
        ("2.5 * 2", [2, 5], "not a plain whole number"),
        ("1_0 + 1", [10, 1], "not a plain whole number"),
        ("0x10", [16], "not a plain whole number"),
        ("True + 1", [1], "not a plain whole number"),
        ("'3' + '4'", [3, 4], "not a plain whole number"),
        ("0 + 3", [3], "not a plain whole number"),
        ("__import__('os').system('true')", [1], "call is not allowed"),
        ("x + 1", [1], "name is not allowed"),
        ("[1, 2]", [1, 2], "list is not allowed"),
        ("1 if 1 else 2", [1, 2], "ifexp is not allowed"),
        ("3 + 4 = 7", [3, 4], "without '='"),
        ("3 +", [3], "not a well-formed"),
        ("(" * 150 + "1" + ")" * 150, [1], "longer than 200"),  # deep nesting never reaches the parser
        ("1 + " * 60 + "1", [1], "longer than 200"),
        ("", [1], "empty"),
        ("\x00", [1], "not a well-formed"),
    ],
)
def test_evaluate_rejects(expression: str, numbers: list[int], reason: str) -> None:
    with pytest.raises(ExpressionError, match=reason.replace("*", r"\*").replace("(", r"\(")):
        evaluate(expression, numbers)


# --- the solver and the puzzles ------------------------------------------------------------------


def test_solver_examples() -> None:
    assert solve((3, 7, 25), 82) == "25 * 3 + 7"
    assert solve((3, 7), 5) is None
    assert solve((4, 9), 9) == "9"
    expression = solve((100, 75, 50, 25, 6, 3), 952)
    assert expression is not None and evaluate(expression, [100, 75, 50, 25, 6, 3]) == 952


def test_generated_puzzles_are_solvable_and_in_range() -> None:
    for seed in range(200):
        rng = np.random.default_rng(seed)
        count = int(rng.integers(3, 7))
        numbers, target = generate_puzzle(rng, count)
        assert len(numbers) == count
        assert all(n in (*range(1, 11), 25, 50, 75, 100) for n in numbers)
        assert target not in numbers
        assert 10 <= target <= 999 or target == sum(numbers)
        expression = solve(numbers, target)
        assert expression is not None and evaluate(expression, numbers) == target


# --- the env -------------------------------------------------------------------------------------


def test_check_env() -> None:
    agentgym.check_env("countdown-v0")
    agentgym.check_env("countdown-v0", seed=30, num_episodes=6)
    agentgym.check_env(agentgym.make("countdown-v0", max_attempts=3, max_turns=6))
    agentgym.check_env(agentgym.make("countdown-v0", min_numbers=6, max_numbers=6))


def test_expert_always_solves_and_random_rarely_does() -> None:
    env = agentgym.make("countdown-v0")
    expert, rand = [], []
    for seed in range(100):
        _, info = env.reset(seed=seed)
        assert env.expert_action() == info["answer"]
        expert.append(env.step(info["answer"])[1])
        _, info = env.reset(seed=seed)
        numbers = [int(n) for n in info["task_id"].split("=")[1].split("/")[0].split(",")]
        rng = np.random.default_rng(seed)
        i, j = rng.permutation(len(numbers))[:2]
        rand.append(env.step(f"{numbers[i]} {'+-*/'[int(rng.integers(4))]} {numbers[j]}")[1])
    assert np.mean(expert) == 1.0
    assert np.mean(rand) < 0.1  # measured over 500 seeds: 0.006


def test_single_turn_by_default() -> None:
    env = agentgym.make("countdown-v0")
    assert env.max_turns == 1
    obs, info = env.reset(options={"task_id": "countdown/nums=3,7,25/target=82"})
    assert obs == "Numbers: 3 7 25\nTarget: 82"
    assert "You have one attempt." in info["instructions"]
    obs, reward, terminated, truncated, info = env.step("25 * 3")
    assert (reward, terminated, truncated, info["success"]) == (0.0, True, False, False)
    assert obs.startswith("Your expression = 75, target 82. No attempts left.")
    env.reset(options={"task_id": "countdown/nums=3,7,25/target=82"})
    obs, reward, terminated, truncated, info = env.step("3 * 3")
    assert info["invalid_action"] and truncated and not terminated and reward == 0.0
    assert "3 is used 2 times" in obs
    env.reset(options={"task_id": "countdown/nums=3,7,25/target=82"})
    obs, reward, terminated, truncated, info = env.step("(25 * 3) + 7")
    assert (reward, terminated, info["success"]) == (1.0, True, True)
    assert obs == "Correct: (25 * 3) + 7 = 82."


def test_several_attempts_give_feedback() -> None:
    env = agentgym.make("countdown-v0", max_attempts=3, max_turns=6)
    _, info = env.reset(options={"task_id": "countdown/nums=2,2,7,25/target=23"})
    assert info["state_key"] == "countdown/nums=2,2,7,25/target=23#attempts=0"
    obs, reward, terminated, _, info = env.step("25 - 7")
    assert obs.startswith("Your expression = 18, target 23. 2 attempts left.")
    assert not terminated and info["state_key"].endswith("#attempts=1")
    obs, *_, info = env.step("7 / (2 - 2)")  # invalid: uses up no attempt
    assert info["invalid_action"] and "divides by zero" in obs and info["state_key"].endswith("#attempts=1")
    obs, reward, terminated, _, info = env.step("7 / 2")
    assert obs.startswith("Your expression = 7/2, target 23. 1 attempt left.")
    _, reward, terminated, _, info = env.step("25 - 2")
    assert (reward, terminated, info["success"]) == (1.0, True, True)


def test_answer_is_privileged() -> None:
    env = agentgym.make("countdown-v0", max_attempts=2, max_turns=4)
    for seed in range(60):
        obs, info = env.reset(seed=seed)
        answer = info["answer"]
        assert answer is not None and answer not in obs and answer not in info["instructions"]
        obs, *_ = env.step("1 + ")  # invalid: the puzzle is shown again
        assert answer not in obs


def test_task_ids() -> None:
    env = agentgym.make("countdown-v0")
    obs, info = env.reset(seed=8)
    again, info2 = env.reset(seed=99, options={"task_id": info["task_id"]})
    assert again == obs and info2["answer"] == info["answer"]
    _, info = env.reset(options={"task_id": format_task_id([1, 1], 999)})  # no solution
    assert info["answer"] is None and env.expert_action() is None
    for bad in [
        "countdown/nums=03,7/target=5",  # not canonical
        "countdown/nums=3/target=5",  # too few numbers
        "countdown/nums=3,7,1,1,1,1,1/target=5",  # too many
        "countdown/nums=3,7/target=0",
        "countdown/nums=3,0/target=5",
        "countdown/3,7/5",
        12,
    ]:
        with pytest.raises(ConfigError, match="task_id"):
            env.reset(options={"task_id": bad})


def test_determinism_and_variety() -> None:
    a, b = agentgym.make("countdown-v0"), agentgym.make("countdown-v0")
    puzzles = set()
    for seed in range(40):
        first = a.reset(seed=seed)
        assert first == b.reset(seed=seed)
        puzzles.add(first[1]["task_id"])
        assert 3 <= len(first[0].splitlines()[0].split()) - 1 <= 6  # "Numbers: a b c ..."
    assert len(puzzles) == 40


def test_bad_arguments_name_the_argument() -> None:
    cases = [
        ({"min_numbers": 1}, "min_numbers"),
        ({"min_numbers": 4, "max_numbers": 3}, "max_numbers"),
        ({"max_numbers": 7}, "max_numbers"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"max_attempts": 1.5}, "max_attempts"),
    ]
    for kwargs, name in cases:
        with pytest.raises(ConfigError, match=name):
            CountdownEnv(**kwargs)
