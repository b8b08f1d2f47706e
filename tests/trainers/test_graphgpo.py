"""GraphGPO: hand-computed graphs, a loop reference against the vectorised estimator, config, a short run."""

from __future__ import annotations

import math
from collections import defaultdict, deque
from pathlib import Path

import numpy as np
import pytest
import yaml
from learning import ROOT, small

from agentgym.errors import ConfigError
from agentgym.rollout.records import EpisodeGroup, Trajectory, Turn
from agentgym.trainers.graphgpo import GraphGPOArgs, goal_distances, graphgpo_advantages, state_graph
from agentgym.training.api.algorithm import get_algorithm
from agentgym.training.api.turn_table import TurnTable
from agentgym.training.config.loading import load_config
from agentgym.training.run.loop import train

PRESET = ROOT / "configs" / "quickstart_maze_graphgpo.yaml"


def traj(*steps: tuple, success: bool = False, end: str | None = None) -> Trajectory:
    """Turns from (state_key, reward[, invalid]) tuples; ``end``: the state the last step reported."""
    turns = [Turn([0], [1], [-0.1], s[1], s[0], invalid=bool(s[2]) if len(s) > 2 else False)
             for s in steps]
    if end is not None:
        last = turns[-1]
        turns[-1] = Turn(last.prompt_ids, last.response_ids, last.response_logprobs, last.reward,
                         last.state_key, invalid=last.invalid, info={"state_key": end})
    return Trajectory(turns, "task", 0, success=success)


def group(*trajectories: Trajectory, gid: str = "g") -> EpisodeGroup:
    return EpisodeGroup(gid, "task", 0, list(trajectories))


def graphgpo(groups: list[EpisodeGroup], **args: object) -> np.ndarray:
    return graphgpo_advantages(groups, GraphGPOArgs(**{"invalid_action_penalty": 0.0, **args}))


# --- hand-computed -----------------------------------------------------------------------------------
#
# One task, three trajectories (R = 8, ω = 0.5):
#   t1 (success): A → B → C → ⋆                       edges A→B, B→C, C→⋆
#   t2 (failed):  A → D → A → B, last step reported D  edges A→D, D→A, A→B, B→D   (a cycle A→D→A)
#   t3 (failed):  A → A, last step reported E          edges A→A, A→E            (E: nobody acted there)
# Backwards from ⋆: d(C) = 1, d(B) = 2, d(A) = 3, d(D) = 4; E has no path: d_max + 1 = 5.
# Step rewards R·ω^d(s′):
#   t1: A→B 8·0.5² = 2,  B→C 8·0.5 = 4,  C→⋆ 8
#   t2: A→D 8·0.5⁴ = 0.5,  D→A 8·0.5³ = 1,  A→B 2,  B→D 0.5
#   t3: A→A 1,  A→E 8·0.5⁵ = 0.25
# Out of A: [2, 0.5, 2, 1, 0.25] (t1, t2, t2, t3, t3), mean 1.15; out of B: [4, 0.5], mean 2.25;
# C and D are left once (A^S = 0). Only t1 has reward (1 on its last turn): A^E = 2/3, −1/3, −1/3.


def three_trajectories(end_of_t2: str | None = "D") -> EpisodeGroup:
    return group(traj(("A", 0.0), ("B", 0.0), ("C", 1.0), success=True),
                 traj(("A", 0.0), ("D", 0.0), ("A", 0.0), ("B", 0.0), end=end_of_t2),
                 traj(("A", 0.0), ("A", 0.0), end="E"))


def test_distances_on_the_hand_graph() -> None:
    groups = [three_trajectories()]
    table = TurnTable.from_groups(groups)
    graph = state_graph(groups, table, "success")
    node_distance, next_distance = goal_distances(table, graph)
    # State ids follow the sorted keys: A, B, C, D; the goal node is 4.
    assert node_distance.tolist() == [3, 2, 1, 4, 0]
    assert next_distance.tolist() == [2, 1, 0, 4, 3, 2, 4, 3, 5]


def test_mean_norm_by_hand() -> None:
    adv = graphgpo([three_trajectories()], omega=0.5, goal_reward=8.0, mode="mean_norm")
    e1, e0 = 2 / 3, -1 / 3
    expected = [e1 + 0.85, e1 + 1.75, e1 + 0.0,                 # t1: A, B, C (C left once)
                e0 - 0.65, e0 + 0.0, e0 + 0.85, e0 - 1.75,      # t2: A, D (left once), A, B
                e0 - 0.15, e0 - 0.9]                            # t3: A, A
    np.testing.assert_allclose(adv, expected, atol=1e-12)
    # The good step A→B of the failed t2 gets positive credit; t1's first step keeps GRPO's sign.
    assert adv[5] > 0 > adv[3]


def test_mean_std_norm_and_weights_by_hand() -> None:
    eps = 1e-6
    adv = graphgpo([three_trajectories()], omega=0.5, goal_reward=8.0, mode="mean_std_norm",
                   step_advantage_weight=2.0, episode_advantage_weight=0.5)
    # Out of A: deviations [0.85, −0.65, 0.85, −0.15, −0.9], squares sum 2.7, unbiased std √(2.7/4).
    sa = math.sqrt(2.7 / 4) + eps
    # Out of B: [4, 0.5], std 3.5/√2.
    sb = 3.5 / math.sqrt(2) + eps
    # Episode returns [1, 0, 0]: mean 1/3, unbiased std √((4/9 + 1/9 + 1/9)/2) = 1/√3.
    se = 1 / math.sqrt(3) + eps
    e1, e0 = 0.5 * (2 / 3) / se, 0.5 * (-1 / 3) / se
    expected = [e1 + 2 * 0.85 / sa, e1 + 2 * 1.75 / sb, e1,
                e0 - 2 * 0.65 / sa, e0, e0 + 2 * 0.85 / sa, e0 - 2 * 1.75 / sb,
                e0 - 2 * 0.15 / sa, e0 - 2 * 0.9 / sa]
    np.testing.assert_allclose(adv, expected, atol=1e-12)


def test_progress_reward_by_hand() -> None:
    # R·ω^(d(s′) − d(s) + 1): t1 closes one step each time: 8, 8, 8. t2: A→D 4−3+1 = 2 → 2; D→A 0 → 8;
    # A→B 0 → 8; B→D 4−2+1 = 3 → 1. t3: A→A 1 → 4; A→E 5−3+1 = 3 → 1.
    # Out of A: [8, 2, 8, 4, 1], mean 4.6; out of B: [8, 1], mean 4.5. No episode term.
    adv = graphgpo([three_trajectories()], omega=0.5, goal_reward=8.0, mode="mean_norm", progress_reward=True,
                   episode_advantage_weight=0.0)
    np.testing.assert_allclose(adv, [3.4, 3.5, 0.0, -2.6, 0.0, 3.4, -3.5, -0.6, -3.6], atol=1e-12)


def test_the_last_steps_reported_state_is_used_and_a_missing_one_is_a_dead_end() -> None:
    # Without t2's "D", its last step B→? is a dead end: d = 5, reward 8·0.5⁵ = 0.25 instead of 0.5.
    # Out of B: [4, 0.25], mean 2.125 → ±1.875 (A's rewards are unchanged).
    adv = graphgpo([three_trajectories(end_of_t2=None)], omega=0.5, goal_reward=8.0, mode="mean_norm",
                   episode_advantage_weight=0.0)
    np.testing.assert_allclose(adv[[1, 6]], [1.875, -1.875], atol=1e-12)
    # A reported state that only another group acted in is a dead end here too.
    other = group(traj(("Z", 1.0), success=True), traj(("Z", 0.0)), gid="h")
    adv = graphgpo([group(traj(("A", 1.0), success=True), traj(("A", 0.0), end="Z")), other], omega=0.5,
                   goal_reward=8.0, mode="mean_norm", episode_advantage_weight=0.0)
    # Group g: A→⋆ 8, A→Z (dead end: d_max + 1 = 2) 2; mean 5 → ±3.
    np.testing.assert_allclose(adv[:2], [3.0, -3.0], atol=1e-12)


def test_a_group_where_nothing_reaches_the_goal() -> None:
    # No goal: every node has d = d_max + 1 = 1, every reward is R·ω, and A^S only sees the invalid penalty.
    failed = group(traj(("A", 0.0), ("B", 0.0, True), ("A", 0.0)),
                   traj(("A", 0.0, True), ("B", 0.0), end="A"))
    assert graphgpo([failed], omega=0.3).tolist() == [0.0] * 5
    table = TurnTable.from_groups([failed])
    _, next_distance = goal_distances(table, state_graph([failed], table, "success"))
    assert next_distance.tolist() == [1.0] * 5
    adv = graphgpo([failed], omega=0.3, mode="mean_norm", invalid_action_penalty=0.1,
                   episode_advantage_weight=0.0)
    # Out of A: [3, 3, 3 − 0.1] (10·0.3 = 3), mean 3 − 0.1/3; out of B: [3 − 0.1, 3], mean 3 − 0.05.
    np.testing.assert_allclose(adv, [0.1 / 3, -0.05, 0.1 / 3, -0.2 / 3, 0.05], atol=1e-12)


def test_goal_by_positive_return() -> None:
    # success=False everywhere but t1's return is positive: with goal=positive_return t1 reaches ⋆.
    g = group(traj(("A", 0.0), ("B", 1.0)), traj(("A", 0.0), ("A", 0.0), end="C"))
    assert graphgpo([g], episode_advantage_weight=0.0).tolist() == [0.0] * 4  # no goal, no penalty
    adv = graphgpo([g], goal="positive_return", omega=0.5, goal_reward=8.0, mode="mean_norm",
                   episode_advantage_weight=0.0)
    # d(B) = 1, d(A) = 2, C: 3. Out of A: [4, 2, 1] → 5/3, −1/3, −4/3.
    np.testing.assert_allclose(adv, [5 / 3, 0.0, -1 / 3, -4 / 3], atol=1e-12)


def test_groups_never_share_nodes_and_empty_inputs() -> None:
    same_keys = [group(traj(("A", 0.0), ("B", 1.0), success=True), traj(("A", 0.0), ("A", 0.0)), gid="g"),
                 group(traj(("A", 0.0), ("B", 0.0)), traj(("A", 0.0), ("A", 0.0)), gid="h")]
    together = graphgpo(same_keys, omega=0.5)
    apart = np.concatenate([graphgpo([g], omega=0.5) for g in same_keys])
    np.testing.assert_allclose(together, apart, atol=1e-12)
    assert together[4:].tolist() == [0.0] * 4  # group h has no goal of its own
    assert graphgpo([]).shape == (0,)
    with_empty = group(traj(("A", 1.0), success=True), Trajectory([], "task", 0), traj(("A", 0.0)))
    adv = graphgpo([with_empty], episode_advantage_weight=0.0, omega=0.5, mode="mean_norm")
    np.testing.assert_allclose(adv, [3.75, -3.75], atol=1e-12)  # A→⋆ 10, A→dead end 10·0.5² = 2.5


def test_long_chain_with_small_omega() -> None:
    # 300 distinct states to the goal, and a copy that loops back halfway: distances are exact, and
    # ω = 0.01 underflows far rewards to 0 in both implementations alike.
    keys = [(f"s{i}", 0.0) for i in range(300)]
    chain = traj(*keys[:-1], (keys[-1][0], 1.0), success=True)
    loop = traj(*keys[:150], *keys[:150])
    groups = [group(chain, loop)]
    table = TurnTable.from_groups(groups)
    node_distance, _ = goal_distances(table, state_graph(groups, table, "success"))
    order = np.argsort([f"s{i}" for i in range(300)])  # state ids are sorted keys
    assert node_distance[:300][np.argsort(order)].tolist() == list(range(300, 0, -1))
    for omega in (0.01, 0.5):
        args = GraphGPOArgs(omega=omega)
        np.testing.assert_allclose(graphgpo_advantages(groups, args), graphgpo_loop(groups, args), atol=1e-9)


# --- loop reference ----------------------------------------------------------------------------------


def graphgpo_loop(groups: list[EpisodeGroup], args: GraphGPOArgs) -> np.ndarray:
    """GraphGPO written out with dictionaries, one group, edge and turn at a time."""
    goal = ("goal",)
    out: list[float] = []

    def norm(value: float, values: list[float]) -> float:
        n = len(values)
        if n < 2 or min(values) == max(values):
            return 0.0
        mean = sum(values) / n
        if args.mode == "mean_norm":
            return value - mean
        std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
        return (value - mean) / (std + args.epsilon)

    for g in groups:
        # The graph: one edge per turn, (trajectory, step) → (source, target).
        edges: dict[tuple[int, int], tuple[object, object]] = {}
        reached_any = False
        for i, t in enumerate(g.trajectories):
            reached = t.success if args.goal == "success" else sum(u.reward for u in t.turns) > 0
            for k, turn in enumerate(t.turns):
                if k + 1 < len(t.turns):
                    target: object = t.turns[k + 1].state_key
                elif reached:
                    target, reached_any = goal, True
                else:
                    target = turn.info.get("state_key", ("dead end", i))
                edges[(i, k)] = (turn.state_key, target)
        # Distances: breadth-first search backwards from the goal.
        into: dict[object, list[object]] = defaultdict(list)
        for source, target in edges.values():
            into[target].append(source)
        distance: dict[object, int] = {}
        if reached_any:
            distance[goal] = 0
            queue = deque([goal])
            while queue:
                node = queue.popleft()
                for source in into[node]:
                    if source not in distance:
                        distance[source] = distance[node] + 1
                        queue.append(source)
        unreachable = max(distance.values(), default=0) + 1

        def d(node: object, distance: dict[object, int] = distance, unreachable: int = unreachable) -> int:
            return distance.get(node, unreachable)

        # Step rewards and A^S over the edges out of each state.
        reward: dict[tuple[int, int], float] = {}
        for (i, k), (source, target) in edges.items():
            exponent = d(target) - d(source) + 1 if args.progress_reward else d(target)
            invalid = g.trajectories[i].turns[k].invalid
            reward[(i, k)] = args.goal_reward * args.omega ** exponent - args.invalid_action_penalty * invalid
        leaving: dict[object, list[float]] = defaultdict(list)
        for (i, k), (source, _) in edges.items():
            leaving[source].append(reward[(i, k)])
        # A^E: the trajectories' returns (or every turn's score), minus λ on invalid turns.
        returns = [sum(u.reward for u in t.turns) for t in g.trajectories]
        scores = [r - args.invalid_action_penalty * u.invalid
                  for r, t in zip(returns, g.trajectories, strict=True) for u in t.turns]
        for i, t in enumerate(g.trajectories):
            for k, turn in enumerate(t.turns):
                if len(g.trajectories) < 2:
                    episode = 0.0
                elif args.episode_baseline == "trajectory":
                    episode = norm(returns[i], returns) - args.invalid_action_penalty * turn.invalid
                else:
                    episode = norm(returns[i] - args.invalid_action_penalty * turn.invalid, scores)
                step = norm(reward[(i, k)], leaving[turn.state_key])
                out.append(args.episode_advantage_weight * episode + args.step_advantage_weight * step)
    return np.array(out)


def random_groups(rng: np.random.Generator, num_groups: int, max_len: int, num_states: int,
                  all_equal: bool = False, no_success: bool = False) -> list[EpisodeGroup]:
    groups = []
    for g in range(num_groups):
        trajectories = []
        for _ in range(int(rng.integers(1, 7))):
            length = int(rng.integers(1, max_len + 1))
            states = rng.integers(0, num_states, size=length)
            rewards = rng.choice([0.0, 0.0, 0.0, 0.5, -0.5], size=length)
            invalid = rng.random(length) < 0.2
            success = bool(rng.random() < 0.4) and not no_success
            if success:
                rewards[-1] = 1.0
            end = rng.choice(["none", "known", "new"])
            reported = (None if end == "none" else f"s{int(rng.integers(num_states))}" if end == "known"
                        else f"x{int(rng.integers(3))}")
            if all_equal:
                states, rewards = np.zeros(length, dtype=int), np.zeros(length)
                invalid = np.zeros(length, dtype=bool)
                success, reported = True, None
                rewards[-1] = 1.0
            trajectories.append(traj(*[(f"s{s}", float(r), bool(i))
                                       for s, r, i in zip(states, rewards, invalid, strict=True)],
                                     success=success, end=reported))
        groups.append(group(*trajectories, gid=f"g{g}"))
    return groups


@pytest.mark.parametrize("seed", range(6))
def test_loop_equals_vectorised(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for case in range(10):
        args = GraphGPOArgs(omega=float(rng.choice([0.1, 0.5, 0.9, 0.01, 1.0])),
                            goal_reward=float(rng.choice([10.0, 1.0])),
                            progress_reward=bool(rng.random() < 0.4),
                            goal=str(rng.choice(["success", "positive_return"])),
                            mode=str(rng.choice(["mean_norm", "mean_std_norm"])),
                            step_advantage_weight=float(rng.choice([1.0, 0.5])),
                            episode_advantage_weight=float(rng.choice([1.0, 0.0, 2.0])),
                            episode_baseline=str(rng.choice(["trajectory", "turn"])),
                            invalid_action_penalty=float(rng.choice([0.0, 0.1])))
        max_len = 50 if case % 3 == 0 else 8  # long trajectories too
        groups = random_groups(rng, int(rng.integers(1, 5)), max_len, num_states=int(rng.integers(1, 9)),
                               all_equal=case % 5 == 1, no_success=case % 5 == 2)
        np.testing.assert_allclose(graphgpo_advantages(groups, args), graphgpo_loop(groups, args), atol=1e-9,
                                   err_msg=f"{args}")


def test_identical_trajectories_give_zero() -> None:
    # Four copies of A → B → ⋆: equal returns, and out of each state every edge is the same.
    same = [group(*[traj(("A", 0.0), ("B", 1.0), success=True) for _ in range(4)])]
    for mode in ("mean_norm", "mean_std_norm"):
        assert graphgpo(same, mode=mode, epsilon=0.0).tolist() == [0.0] * 8


# --- config and training -------------------------------------------------------------------------------


def test_registered_with_the_reference_defaults() -> None:
    algo = get_algorithm("graphgpo")
    assert algo.make_args({}) == GraphGPOArgs() and algo.policy_loss == "ppo_clip"
    args = GraphGPOArgs()
    assert (args.omega, args.goal_reward, args.mode) == (0.1, 10.0, "mean_std_norm")
    assert not args.progress_reward
    assert (args.step_advantage_weight, args.episode_advantage_weight) == (1.0, 1.0)


@pytest.mark.parametrize("override, message", [
    ("algorithm.args.omega=1.5", "algorithm.args.omega must be in [0, 1]"),
    ("algorithm.args.goal_reward=0", "algorithm.args.goal_reward must be > 0"),
    ("algorithm.args.goal=reward", "algorithm.args.goal must be one of"),
    ("algorithm.args.omgea=0.2", "Did you mean algorithm.args.omega"),
])
def test_bad_arguments_name_the_field(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_config(PRESET, [override])


def test_preset_is_the_gigpo_quickstart_with_graphgpo() -> None:
    preset = yaml.safe_load(PRESET.read_text())
    gigpo = yaml.safe_load((ROOT / "configs" / "quickstart_maze_gigpo.yaml").read_text())
    assert preset["algorithm"]["name"] == "graphgpo"
    assert {k: v for k, v in preset.items() if k != "algorithm"} == {k: v for k, v in gigpo.items()
                                                                     if k != "algorithm"}
    assert load_config(PRESET).algorithm.args == {**preset["algorithm"]["args"]}


def test_one_iteration_of_the_quickstart_trains(tmp_path: Path) -> None:
    cfg = load_config(None, small("iterations=1", "algorithm.name=graphgpo"))
    report = train(cfg, tmp_path)
    assert len(report["history"]) == 1
