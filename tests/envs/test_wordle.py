"""Tests of ``agentgym.envs.games.wordle``: feedback rules, the word list, the env and its solver."""

from __future__ import annotations

import re

import numpy as np
import pytest

import agentgym
from agentgym.envs.games.wordle import OPENER, WordleEnv, load_words, score_guess, solve_step
from agentgym.envs.registration import register_games
from agentgym.errors import ConfigError

register_games()  # idempotent (override=True)


# --- feedback rules (worked by hand) -------------------------------------------------------------


@pytest.mark.parametrize(
    ("secret", "guess", "feedback"),
    [
        # b at 3 and e at 4 are green; the secret's other b takes the b at 1 (yellow), a is yellow.
        ("abbey", "babes", "YYGG_"),
        # The secret has one e, so only the first e of the guess is yellow.
        ("abbey", "keeps", "_Y___"),
        # Two e's in the secret, two yellows for the guess's two e's; s is yellow too.
        ("speed", "erase", "Y__YY"),
        # Both l's of the secret are matched green, so the guess's first l is grey.
        ("hello", "lolly", "_YGG_"),
        # One r left over after the green r: the first r is yellow, the last one grey.
        ("array", "rarer", "YYG__"),
        # The secret's only e is taken by the green e, so the guess's earlier e's are grey.
        ("those", "geese", "___GG"),
        ("crane", "crane", "GGGGG"),
        ("crane", "lofty", "_____"),
    ],
)
def test_feedback_rules(secret: str, guess: str, feedback: str) -> None:
    assert score_guess(secret, guess) == feedback


def test_feedback_counts_never_exceed_the_secret() -> None:
    words = load_words()
    rng = np.random.default_rng(0)
    for _ in range(300):
        secret, guess = words[int(rng.integers(len(words)))], words[int(rng.integers(len(words)))]
        marks = score_guess(secret, guess)
        for letter in set(guess):
            marked = sum(1 for g, m in zip(guess, marks, strict=True) if g == letter and m != "_")
            assert marked == min(guess.count(letter), secret.count(letter))


def test_word_list() -> None:
    words = load_words()
    assert 1500 <= len(words) <= 2100
    assert all(re.fullmatch(r"[a-z]{5}", w) for w in words)
    assert list(words) == sorted(set(words))
    assert OPENER in words


# --- the env -------------------------------------------------------------------------------------


def test_check_env() -> None:
    agentgym.check_env("wordle-v0")
    agentgym.check_env("wordle-v0", seed=40, num_episodes=5)
    agentgym.check_env(agentgym.make("wordle-v0", max_guesses=3))


def test_a_game_by_task_id() -> None:
    env = agentgym.make("wordle-v0")
    obs, info = env.reset(seed=1, options={"task_id": "wordle/idx3"})
    assert info["task_id"] == "wordle/idx3" and info["answer"] == "abbey"
    assert "abbey" not in obs and "5-letter" in info["instructions"]
    obs, reward, terminated, _, info = env.step("bible")
    assert obs == "1. bible  Y _ G _ Y\nYou have 5 guesses left."
    assert (reward, terminated, info["success"], info["invalid_action"]) == (0.0, False, False, False)
    assert info["state_key"] == "wordle/idx3|bible"
    obs, reward, terminated, _, info = env.step(" ABBEY ")
    assert (reward, terminated, info["success"]) == (1.0, True, True)
    assert obs.endswith("You found the word in 2 guesses!")


def test_task_id_replays_and_rejects_malformed() -> None:
    env = agentgym.make("wordle-v0")
    _, info = env.reset(seed=123)
    _, again = env.reset(seed=5, options={"task_id": info["task_id"]})
    assert again["answer"] == info["answer"]
    for bad in ["wordle/idx-1", f"wordle/idx{len(load_words())}", "wordle/idx007", "wordle/abbey", 7]:
        with pytest.raises(ConfigError, match="task_id"):
            env.reset(options={"task_id": bad})


def test_secret_is_deterministic_from_the_seed_and_varies() -> None:
    a, b = agentgym.make("wordle-v0"), agentgym.make("wordle-v0")
    secrets = set()
    for seed in range(30):
        assert a.reset(seed=seed) == b.reset(seed=seed)
        secrets.add(a.reset(seed=seed)[1]["answer"])
    assert len(secrets) >= 25


@pytest.mark.parametrize(
    ("guess", "reason"),
    [
        ("abbe", "has 4 letters"),
        ("abbeys", "has 6 letters"),
        ("ab1ey", "not a single word"),
        ("cr ne", "not a single word"),
        ("zzzzz", "not in the word list"),
        ("", "empty"),
        ("x" * 5000, "has 5000 letters"),
        ("\x00\u2603", "not a single word"),
    ],
)
def test_invalid_guesses_use_up_no_guess(guess: str, reason: str) -> None:
    env = agentgym.make("wordle-v0")
    _, start = env.reset(seed=0)
    env.step("crane")
    obs, reward, terminated, truncated, info = env.step(guess)
    assert info["invalid_action"] and reason in obs and "does not use up a guess" in obs
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert info["state_key"] == f"{start['task_id']}|crane"
    assert "1. crane" in obs and len(obs) < 300
    obs, *_ = env.step("slate")
    assert "You have 4 guesses left." in obs


def test_running_out_of_guesses() -> None:
    env = agentgym.make("wordle-v0", max_guesses=2)
    _, info = env.reset(options={"task_id": "wordle/idx0"})  # aback
    env.step("crane")
    obs, reward, terminated, _, info = env.step("crane")  # a repeated guess still uses up a guess
    assert terminated and reward == 0.0 and not info["success"]
    assert obs.endswith("You are out of guesses.") and "aback" not in obs
    assert info["state_key"] == "wordle/idx0|crane,crane"


def test_state_key_keeps_guess_order() -> None:
    keys = []
    for order in (["crane", "slate"], ["slate", "crane"]):
        env = agentgym.make("wordle-v0")
        env.reset(options={"task_id": "wordle/idx0"})
        for guess in order:
            _, _, _, _, info = env.step(guess)
        keys.append(info["state_key"])
    assert keys == ["wordle/idx0|crane,slate", "wordle/idx0|slate,crane"]


def test_bad_arguments() -> None:
    for value in (0, 21, 2.5, True, "6"):
        with pytest.raises(ConfigError, match="max_guesses"):
            WordleEnv(max_guesses=value)


# --- the expert ----------------------------------------------------------------------------------


def play(env: agentgym.EpisodeGuard, seed: int, policy) -> tuple[bool, int]:
    _, info = env.reset(seed=seed)
    guesses = 0
    while True:
        _, _, terminated, truncated, info = env.step(policy(env))
        guesses += not info["invalid_action"]
        if terminated or truncated:
            return info["success"], guesses


def test_expert_solves_at_least_95_percent_of_the_list() -> None:
    words = load_words()
    solved, total_guesses = 0, 0
    for secret in words:
        history: tuple[tuple[str, str], ...] = ()
        for turn in range(1, 7):
            guess = solve_step(history)
            assert guess is not None
            history += ((guess, score_guess(secret, guess)),)
            if guess == secret:
                solved += 1
                total_guesses += turn
                break
    # Measured: 2015 of 2023 words (99.6%), 3.55 guesses on average when solved.
    assert solved / len(words) >= 0.95
    assert total_guesses / solved < 4.0


def test_expert_in_the_env_over_seeds_and_random_baseline() -> None:
    env = agentgym.make("wordle-v0")
    words = load_words()
    expert = [play(env, seed, lambda e: e.expert_action()) for seed in range(100)]
    rng = np.random.default_rng(0)
    rand = [play(env, seed, lambda e: words[int(rng.integers(len(words)))]) for seed in range(100)]
    assert np.mean([s for s, _ in expert]) >= 0.95
    assert all(g <= 6 for _, g in expert)
    assert np.mean([s for s, _ in rand]) < 0.1  # measured over 500 seeds: 0.002


def test_expert_guesses_stay_consistent_with_feedback() -> None:
    env = WordleEnv()
    env.reset(seed=3)
    seen = []
    while True:
        guess = env.expert_action()
        for earlier, marks in seen:
            assert score_guess(guess, earlier) == marks  # the guess could still be the secret
        _, _, terminated, _, info = env.step(guess)
        seen.append((guess, score_guess(info["answer"], guess)))
        if terminated:
            break
    assert env.expert_action() is None
