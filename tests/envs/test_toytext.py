"""Tests of the toy-text adapter (``agentgym.envs.games.toytext``), ``frozenlake-v0`` and ``blackjack-v0``."""

from __future__ import annotations

import gymnasium
import numpy as np
import pytest

import agentgym
from agentgym.envs.games.blackjack import BlackjackEnv, basic_strategy
from agentgym.envs.games.frozenlake import FrozenLakeEnv
from agentgym.envs.games.toytext import ToyTextEnv, strip_ansi, to_builtin
from agentgym.envs.registration import register_games
from agentgym.errors import ConfigError, ResetNeeded

register_games()  # idempotent (override=True), so importing several test modules is fine

CLIFF_ACTIONS = ["up", "right", "down", "left"]
TAXI_ACTIONS = ["south", "north", "east", "west", "pickup", "dropoff"]


def make_cliff() -> ToyTextEnv:
    """A user's own toy-text env, wrapped in a few lines (as the module docstring shows)."""
    return ToyTextEnv("CliffWalking-v1", CLIFF_ACTIONS, success=lambda reward, terminated: terminated)


# Specs, not registrations: ids registered here would leak into other test modules' registry.
CLIFF = agentgym.EnvSpec("user/cliff-v0", make_cliff, max_turns=40)
TAXI = agentgym.EnvSpec(
    "user/taxi-v0",
    lambda: ToyTextEnv("Taxi-v4", TAXI_ACTIONS, name="taxi", instructions="Drive the taxi."),
    max_turns=40,
)


def run_episode(env: agentgym.EpisodeGuard, seed: int, policy) -> tuple[float, bool, int]:
    """(return, success, steps) of one episode; ``policy(env, info, rng) -> action``."""
    _, info = env.reset(seed=seed)
    rng = np.random.default_rng([seed, 1])
    total, steps = 0.0, 0
    while True:
        _, reward, terminated, truncated, info = env.step(policy(env, info, rng))
        total, steps = total + reward, steps + 1
        if terminated or truncated:
            return total, info["success"], steps


def expert_policy(env, info, rng) -> str:
    return env.expert_action()


def random_policy(env, info, rng) -> str:
    actions = info["admissible_actions"]
    return actions[int(rng.integers(len(actions)))]


# --- the contract --------------------------------------------------------------------------------


@pytest.mark.parametrize("env", ["frozenlake-v0", "blackjack-v0", CLIFF, TAXI],
                         ids=lambda env: getattr(env, "id", env))  # ids equal in every xdist worker
def test_check_env(env: str | agentgym.EnvSpec) -> None:
    agentgym.check_env(env)
    agentgym.check_env(env, seed=50, num_episodes=4)


@pytest.mark.parametrize("kwargs", [{"is_slippery": True}, {"size": 8, "p": 0.7}, {"size": 2, "p": 1.0}])
def test_check_env_frozenlake_variants(kwargs: dict) -> None:
    agentgym.check_env(agentgym.make("frozenlake-v0", **kwargs))


def test_snapshot_supported_and_forks_continue_identically() -> None:
    # Slippery ice makes every step draw from the inner env's np_random: a fork that lost it diverges.
    env = agentgym.make("frozenlake-v0", size=8, is_slippery=True, max_turns=200)
    assert env.supports_snapshot
    env.reset(seed=11)
    for _ in range(3):
        env.step(env.expert_action())
    forks = [env.fork("snapshot"), env.fork("replay")]
    traces = [[], [], []]
    for _ in range(20):
        for trace, member in zip(traces, [env, *forks], strict=True):
            if not member.episode_over:
                action = member.expert_action() or "left"
                trace.append(member.step(action))
    assert traces[0] == traces[1] == traces[2]
    assert len(traces[0]) > 3


def test_determinism_and_maps_vary_with_seed() -> None:
    a, b = agentgym.make("frozenlake-v0", size=6), agentgym.make("frozenlake-v0", size=6)
    maps = set()
    for seed in range(10):
        obs_a, info_a = a.reset(seed=seed)
        obs_b, info_b = b.reset(seed=seed)
        assert (obs_a, info_a) == (obs_b, info_b)
        while not a.episode_over:
            action = a.expert_action()
            assert action == b.expert_action()
            assert a.step(action) == b.step(action)
        maps.add(obs_a)
    assert len(maps) >= 8


def test_task_id_replays_the_map_and_rejects_other_configs() -> None:
    env = agentgym.make("frozenlake-v0")
    obs, info = env.reset(seed=5)
    assert info["task_id"] == "frozenlake/size4/p0.8/5"
    again, info2 = env.reset(seed=999, options={"task_id": info["task_id"]})
    assert again == obs and info2["task_id"] == info["task_id"]
    for bad in ["frozenlake/size5/p0.8/5", "frozenlake/size4/p0.8/05", "frozenlake/size4/p0.8/x", "nope", 3]:
        with pytest.raises(ConfigError):
            env.reset(options={"task_id": bad})
    slippery = agentgym.make("frozenlake-v0", is_slippery=True)
    assert slippery.reset(seed=5)[1]["task_id"] == "frozenlake/size4/p0.8/slippery/5"


def test_actions_parse_by_name_any_case_or_index() -> None:
    env = FrozenLakeEnv(size=4, p=1.0)  # no holes: every move is safe
    env.reset(seed=0)
    _, _, _, _, info = env.step("RIGHT")
    assert not info["invalid_action"] and info["state_key"].endswith("@1")
    _, _, _, _, info = env.step(" 1 ")  # index 1 = down
    assert not info["invalid_action"] and info["state_key"].endswith("@5")


@pytest.mark.parametrize(
    "action", ["jump", "", "   ", "4", "-1", "01x", "left right", "x" * 5000, "\x00\u2603"]
)
def test_invalid_actions_change_nothing(action: str) -> None:
    env = agentgym.make("frozenlake-v0")
    obs, info = env.reset(seed=2)
    text, reward, terminated, truncated, after = env.step(action)
    assert after["invalid_action"] is True
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert after["state_key"] == info["state_key"]
    assert "Valid actions: left, down, right, up." in text
    assert obs in text  # the state is shown again
    assert len(text) < 400  # long garbage is echoed only in part


def test_reset_needed_before_step() -> None:
    with pytest.raises(ResetNeeded):
        agentgym.make("frozenlake-v0").step("left")  # the guard enforces the order for every env
    assert FrozenLakeEnv().render() is None


def test_frozenlake_observation_and_end_messages() -> None:
    env = agentgym.make("frozenlake-v0")
    obs, info = env.reset(seed=3)
    assert obs.splitlines()[:4] == ["PFHF", "FFFF", "FFFF", "FFFG"]
    assert "answer with exactly one of: left, down, right, up" in info["instructions"].lower()
    obs, reward, terminated, _, info = env.step("right")
    obs, reward, terminated, _, info = env.step("right")  # into the hole at row 1, column 3
    assert terminated and reward == 0.0 and not info["success"]
    assert "You fell into a hole." in obs
    assert env.render() is not None and "P" in env.render()


def test_frozenlake_expert_always_reaches_the_goal_on_firm_ice() -> None:
    for size in (4, 8):
        env = agentgym.make("frozenlake-v0", size=size)
        results = [run_episode(env, seed, expert_policy) for seed in range(60)]
        assert all(success for _, success, _ in results), size
        # A shortest path on an n x n grid from corner to corner has at least 2(n-1) moves.
        assert min(steps for _, _, steps in results) >= 2 * (size - 1)
    random_rate = np.mean([run_episode(env, seed, random_policy)[1] for seed in range(60)])
    assert random_rate < 0.5


def test_frozenlake_slippery_expert_beats_random() -> None:
    env = agentgym.make("frozenlake-v0", is_slippery=True)
    expert_rate = np.mean([run_episode(env, seed, expert_policy)[1] for seed in range(60)])
    random_rate = np.mean([run_episode(env, seed, random_policy)[1] for seed in range(60)])
    # Measured over 500 seeds: expert 0.61, random 0.07 (30-turn budget).
    assert expert_rate >= 0.4 and expert_rate > random_rate + 0.25


def test_bad_frozenlake_arguments_name_the_argument() -> None:
    cases = [
        ({"size": 1}, "size"),
        ({"size": 13}, "size"),
        ({"size": 4.0}, "size"),
        ({"p": 0.5}, "p"),
        ({"p": float("nan")}, "p"),
        ({"is_slippery": "yes"}, "is_slippery"),
    ]
    for kwargs, name in cases:
        with pytest.raises(ConfigError, match=name):
            FrozenLakeEnv(**kwargs)


# --- blackjack ------------------------------------------------------------------------------------


def test_basic_strategy_table() -> None:
    # Hard totals: hit to 11, stand 17+, 13-16 stand against 2-6, 12 stand against 4-6.
    assert basic_strategy(11, 10, False) == 1 and basic_strategy(17, 1, False) == 0
    assert basic_strategy(13, 2, False) == 0 and basic_strategy(16, 7, False) == 1
    assert basic_strategy(12, 3, False) == 1 and basic_strategy(12, 4, False) == 0
    assert basic_strategy(12, 6, False) == 0 and basic_strategy(12, 7, False) == 1
    assert basic_strategy(16, 1, False) == 1  # the dealer's ace counts as 11
    # Soft totals: hit soft 17, soft 18 stands against 2-8, 19+ stands.
    assert basic_strategy(17, 6, True) == 1 and basic_strategy(18, 8, True) == 0
    assert basic_strategy(18, 9, True) == 1 and basic_strategy(18, 1, True) == 1
    assert basic_strategy(19, 10, True) == 0


def test_blackjack_basic_strategy_beats_random_over_2000_hands() -> None:
    env = agentgym.make("blackjack-v0")
    expert = [run_episode(env, seed, expert_policy) for seed in range(2000)]
    rand = [run_episode(env, seed, random_policy) for seed in range(2000)]
    expert_return, random_return = np.mean([r for r, _, _ in expert]), np.mean([r for r, _, _ in rand])
    expert_wins = np.mean([s for _, s, _ in expert])
    # Measured over 5,000 hands: expert mean return -0.05 (win rate 0.43), random -0.38 (0.29).
    assert expert_return > random_return + 0.2
    assert 0.38 <= expert_wins <= 0.48
    assert all(s == (r > 0) for r, s, _ in expert)  # success means a won hand


def test_blackjack_text_and_determinism() -> None:
    env = agentgym.make("blackjack-v0")
    obs, info = env.reset(seed=5)
    assert obs == (
        "Your cards: A, 10 (total 21, counting an ace as 11).\n"
        "The dealer shows 9; their other card is face down."
    )
    assert info["state_key"] == "blackjack/5@(21, 9, 1)"
    obs, reward, terminated, _, info = env.step("stick")
    assert terminated and "The dealer's cards: 9, " in obs and f"(reward {reward:g})" in obs
    replay = agentgym.make("blackjack-v0")
    assert replay.reset(seed=7, options={"task_id": "blackjack/5"})[0] == env.reset(seed=5)[0]
    assert replay.step("stick")[:4] == env.step("stick")[:4]


# --- the adapter ---------------------------------------------------------------------------------


def test_user_env_in_a_few_lines() -> None:
    env = agentgym.make(CLIFF)
    obs, info = env.reset(seed=0)
    assert info["task_id"] == "cliffwalking-v1/0" and info["state_key"] == "cliffwalking-v1/0@36"
    assert "Observation: 36." in obs and "\x1b" not in obs
    for action in ["up"] + ["right"] * 11 + ["down"]:
        _, reward, terminated, _, info = env.step(action)
    assert terminated and info["success"] and reward == -1.0


def test_factory_env_with_expert_and_custom_text() -> None:
    def factory(seed: int) -> gymnasium.Env:
        return gymnasium.make("CliffWalking-v1")

    def observe(gym_env: gymnasium.Env, obs: int) -> str:
        return f"You stand on square {obs}."

    def expert(gym_env: gymnasium.Env, obs: int) -> int:
        # Up from the start, right along row 2, down into the goal.
        row, col = divmod(obs, 12)
        return 0 if row == 3 and col == 0 else (2 if col == 11 else 1)

    spec = agentgym.EnvSpec(
        "user/cliff-factory-v0",
        lambda: ToyTextEnv(factory, CLIFF_ACTIONS, observe=observe, expert=expert, name="cliff",
                           success=lambda reward, terminated: terminated),
        max_turns=30,
    )
    agentgym.check_env(spec)
    env = agentgym.make(spec)
    assert env.has_expert and env.supports_snapshot
    ret, success, steps = run_episode(env, 0, expert_policy)
    assert success and steps == 13 and ret == -13.0
    assert env.reset(seed=4)[0] == "You stand on square 36."


def test_adapter_rejects_bad_arguments() -> None:
    cases = [
        (lambda: ToyTextEnv("CliffWalking-v1", ["up", "right", "down"]), "action_names"),
        (lambda: ToyTextEnv("CliffWalking-v1", ["up", "UP", "down", "left"]), "action_names"),
        (lambda: ToyTextEnv("CliffWalking-v1", "up right down left"), "action_names"),
        (lambda: ToyTextEnv("CliffWalking-v1", ["up", "right", "down", "3"]), "action_names"),
        (lambda: ToyTextEnv("NoSuchEnv-v0", ["a"]), "NoSuchEnv-v0"),
        (lambda: ToyTextEnv("CartPole-v1", ["left", "right"]), "observation space"),
        (lambda: ToyTextEnv(42, ["a"]), "env must be"),
        (lambda: ToyTextEnv(lambda seed: gymnasium.make("CliffWalking-v1"), CLIFF_ACTIONS,
                            gym_kwargs={"is_slippery": True}), "gym_kwargs"),
        (lambda: ToyTextEnv("CliffWalking-v1", CLIFF_ACTIONS, observe="text"), "observe"),
        (lambda: ToyTextEnv("CliffWalking-v1", CLIFF_ACTIONS, name="my cliff"), "name"),
        (lambda: ToyTextEnv("CliffWalking-v1", CLIFF_ACTIONS, gym_kwargs={"speed": 3}), "gym_kwargs"),
    ]
    for build, fragment in cases:
        with pytest.raises(ConfigError, match=fragment):
            build()


def test_helpers() -> None:
    assert to_builtin((np.int64(3), np.bool_(True), [np.int32(1)])) == (3, True, (1,))
    assert strip_ansi("  (Down)\n\x1b[41mS\x1b[0mF\n\x1b[34;1mB\x1b[0m:\n\n") == "  (Down)\n[S]F\n[B]:"
    assert isinstance(BlackjackEnv().action_names, tuple)
