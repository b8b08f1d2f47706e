"""SeeUPO: the turn-index advantages, the reverse-turn update plan and its ratios keyed by trajectory id."""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import one_torch_thread
from learning import LEARN_FULL, ROOT, SMALL, assert_learns
from turn_tables import plan_table

from agentgym.errors import ConfigError
from agentgym.rollout.records import EpisodeGroup, Trajectory, Turn
from agentgym.trainers.seeupo import SeeUPOArgs, SequentialTurnPlan, seeupo_advantages
from agentgym.training.api.algorithm import get_algorithm
from agentgym.training.api.turn_table import TurnTable
from agentgym.training.config.loading import load_config
from agentgym.training.run.loop import Trainer, flatten, train

PRESET = ROOT / "configs" / "quickstart_maze_seeupo.yaml"


def traj(*rewards: float, tid: str = "", invalid: tuple[int, ...] = ()) -> Trajectory:
    turns = [Turn([0], [1], [-0.1], r, f"s{i}", invalid=i in invalid) for i, r in enumerate(rewards)]
    return Trajectory(turns, "task", 0, trajectory_id=tid)


# --- the estimator -------------------------------------------------------------------------------------


def test_hand_computed_turn_datasets() -> None:
    # Group a: returns 1 (3 turns), 0 (2 turns); group b: returns 2 (1 turn), 0 (2 turns).
    a = EpisodeGroup("a", "t", 0, [traj(0.0, 0.0, 1.0), traj(0.0, 0.0)])
    b = EpisodeGroup("b", "t", 0, [traj(2.0), traj(0.0, 0.0)])
    adv = seeupo_advantages([a, b], SeeUPOArgs())
    # Index 0, GRAE: a → ±0.5, b → ±1. Batch: [0.5, -0.5, 1, -1], mean 0, unbiased std √(2.5/3).
    s0 = math.sqrt(2.5 / 3)
    # Index 1: a has both (±0.5), b only its second (alone: 0). [0.5, -0.5, 0], std 0.5 → [1, -1, 0].
    # Index 2: only a's first: alone, 0 (a dataset of one row: std 0, so no division).
    expected = [0.5 / s0, 1.0, 0.0,  # a, trajectory 1
                -0.5 / s0, -1.0,     # a, trajectory 2
                1.0 / s0,            # b, trajectory 1
                -1.0 / s0, 0.0]      # b, trajectory 2
    np.testing.assert_allclose(adv, expected, atol=1e-12)


def test_clamp_and_invalid_penalty() -> None:
    # Sixteen single-turn groups of two; only group 0 varies: GRAE ±5 among 30 zeros, unbiased std
    # √(50/31), so z = ±3.94 before the clamp.
    groups = [EpisodeGroup(f"g{i}", "t", 0, [traj(10.0 if i == 0 else 0.0), traj(0.0, invalid=(0,))])
              for i in range(16)]
    adv = seeupo_advantages(groups, SeeUPOArgs(invalid_action_penalty=0.25))
    assert adv[0] == 3.0 and adv[1] == -3.0 - 0.25
    assert np.all(np.abs(adv[2:] + 0.25 * np.tile([0, 1], 15)) < 1.0)
    assert np.isclose(seeupo_advantages(groups, SeeUPOArgs(advantage_clip=10.0))[0], 5 / math.sqrt(50 / 31))


def test_all_equal_groups_and_empty_batch() -> None:
    groups = [EpisodeGroup("g", "t", 0, [traj(0.0, 1.0), traj(0.0, 1.0), traj(1.0)])]
    assert seeupo_advantages(groups, SeeUPOArgs()).tolist() == [0.0] * 5
    assert seeupo_advantages([], SeeUPOArgs()).shape == (0,)


def seeupo_loop(groups: list[EpisodeGroup], args: SeeUPOArgs) -> np.ndarray:
    """The estimator written per turn dataset, with dictionaries."""
    rows: dict[int, list[tuple[int, float]]] = defaultdict(list)  # turn index -> (flat position, GRAE)
    position = 0
    flat_invalid = []
    for g in groups:
        returns = [sum(t.reward for t in tr.turns) for tr in g.trajectories]
        for i, tr in enumerate(g.trajectories):
            for k, turn in enumerate(tr.turns):
                active = [returns[j] for j, other in enumerate(g.trajectories) if len(other.turns) > k]
                rows[k].append((position, returns[i] - sum(active) / len(active)))
                flat_invalid.append(turn.invalid)
                position += 1
    out = np.zeros(position)
    for _k, items in rows.items():
        values = [v for _, v in items]
        mean = sum(values) / len(values)
        std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else 0.0
        for p, v in items:
            z = (v - mean) / std if std > args.std_floor else v - mean
            out[p] = (min(max(z, -args.advantage_clip), args.advantage_clip)
                      - args.invalid_action_penalty * flat_invalid[p])
    return out


@pytest.mark.parametrize("seed", range(5))
def test_loop_equals_vectorised(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for case in range(10):
        groups = []
        for g in range(int(rng.integers(1, 6))):
            trajectories = []
            for _ in range(int(rng.integers(1, 6))):
                length = int(rng.integers(1, 50 if case % 3 == 0 else 6))
                rewards = ([0.0] * length if case % 4 == 1
                           else rng.choice([0.0, 0.0, 1.0, -0.5], size=length).tolist())
                invalid = tuple(np.flatnonzero(rng.random(length) < 0.2).tolist())
                trajectories.append(traj(*rewards, invalid=invalid))
            groups.append(EpisodeGroup(f"g{g}", "t", 0, trajectories))
        args = SeeUPOArgs(advantage_clip=float(rng.choice([3.0, 1.0])),
                          invalid_action_penalty=float(rng.choice([0.0, 0.1])))
        np.testing.assert_allclose(seeupo_advantages(groups, args), seeupo_loop(groups, args), atol=1e-9)


# --- the update plan -----------------------------------------------------------------------------------


def test_phases_run_last_turn_first_and_cover_every_turn_once() -> None:
    index = plan_table(["a", "a", "a", "b", "c", "c"], [0, 1, 2, 0, 0, 1])
    phases = SequentialTurnPlan(SeeUPOArgs()).phases(index)
    assert [p.name for p in phases] == ["turn2", "turn1", "turn0"]
    assert [p.rows.tolist() for p in phases] == [[2], [1, 5], [0, 3, 4]]


def test_cumulative_ratios_are_clipped_and_follow_trajectory_ids_not_rows() -> None:
    # The same turns in two row orders: the ratios must follow the ids.
    ids = np.array(["a", "a", "a", "b", "b"], dtype=object)
    steps = np.array([0, 1, 2, 0, 1])
    for order in ([0, 1, 2, 3, 4], [4, 2, 0, 3, 1]):
        order = np.array(order)
        index = plan_table(ids[order], steps[order])
        plan = SequentialTurnPlan(SeeUPOArgs(ratio_clip=0.2, cumulative_ratio_clip=0.3))
        shifts = {("a", 2): 0.1, ("a", 1): 0.3, ("b", 1): -0.05}  # mean log-ratio of each turn's update
        seen = {}
        for phase in plan.phases(index):
            adv = plan.advantages(phase, index, np.ones(phase.rows.size))
            seen.update({(index.trajectory_id[r], int(index.step[r])): a
                         for r, a in zip(phase.rows, adv, strict=True)})
            old = [np.zeros(3) for _ in phase.rows]
            new = [np.full(3, shifts.get((index.trajectory_id[r], int(index.step[r])), 0.0))
                   for r in phase.rows]
            plan.after_phase(phase, index, old, new)
        e = math.exp
        assert seen[("a", 2)] == 1.0 and seen[("b", 1)] == 1.0  # last turns: nothing updated after them
        assert seen[("a", 1)] == pytest.approx(e(0.1))
        # a's turn 1 moved by e^0.3 = 1.35, clipped to 1.2; the product 1.105·1.2 = 1.326 is clipped to 1.3.
        assert seen[("a", 0)] == pytest.approx(1.3)
        assert seen[("b", 0)] == pytest.approx(e(-0.05))
        assert plan.state_dict()["ratios"] == pytest.approx({"a": 1.3, "b": e(-0.05)})


def test_updates_use_the_later_turns_ratios(tmp_path: Path) -> None:
    """In a real update, each phase trains on its advantages times the product of the clipped sequence
    ratios its trajectory got in the phases before it (recomputed here from the plan's inputs)."""
    cfg = load_config(PRESET, [*SMALL, "sft.enabled=false", "loss.kl_coef=0", "optim.lr=3e-3"])
    run = Trainer(cfg, tmp_path)
    plan = run.plugins.plan
    calls: list[tuple[str, np.ndarray, np.ndarray, np.ndarray]] = []
    ratios_after: list[dict[str, float]] = []
    advantages_of, after_phase = plan.advantages, plan.after_phase

    def record_advantages(phase, index, adv):
        out = advantages_of(phase, index, adv)
        calls.append((phase.name, phase.rows.copy(), adv.copy(), out.copy()))
        return out

    def record_after(phase, index, old, new):
        ratios_after.append({index.trajectory_id[r]: float(np.clip(np.exp(np.mean(n - o)), 0.8, 1.2))
                             for r, o, n in zip(phase.rows, old, new, strict=True)})
        return after_phase(phase, index, old, new)

    plan.advantages, plan.after_phase = record_advantages, record_after
    try:
        groups = run.collector.collect([1, 2, 3], 4, run.sampling(1.0, 0))
        index = TurnTable.from_groups(groups)
        advantages = np.linspace(-1.0, 1.0, index.step.shape[0])
        metrics = run.update(flatten(groups), advantages, index, 1)
    finally:
        run.close()
    assert metrics["perf/update_phases"] == index.step.max() + 1 >= 2
    assert [name for name, *_ in calls] == [f"turn{k}" for k in range(int(index.step.max()), -1, -1)]
    cumulative: dict[str, float] = defaultdict(lambda: 1.0)
    moved = False
    for (_name, rows, given, used), after in zip(calls, ratios_after, strict=True):
        np.testing.assert_allclose(given, advantages[rows])
        expected = np.array([cumulative[index.trajectory_id[r]] for r in rows]) * given
        np.testing.assert_allclose(used, expected, rtol=1e-9)
        moved |= bool(np.any(np.abs(used - given) > 1e-6))
        for tid, ratio in after.items():
            cumulative[tid] = float(np.clip(cumulative[tid] * ratio, 0.8, 1.2))
    assert moved, "no earlier turn was re-weighted: the test did not exercise the ratios"


# --- config, registration, resume, learning ------------------------------------------------------------


def test_registered_with_gspo_and_its_plan() -> None:
    algo = get_algorithm("seeupo")
    assert algo.policy_loss == "gspo" and isinstance(algo.update_plan(algo.make_args({})), SequentialTurnPlan)
    with pytest.raises(ConfigError, match="algorithm.args.ratio_clip must be in"):
        load_config(PRESET, ["algorithm.args.ratio_clip=1.5"])
    with pytest.raises(ConfigError, match="algorithm.args.advantage_clip must be > 0"):
        load_config(PRESET, ["algorithm.args.advantage_clip=0"])


def test_resume_is_exact(tmp_path: Path) -> None:
    full = train(load_config(PRESET, SMALL), tmp_path / "full")
    train(load_config(PRESET, SMALL), tmp_path / "split", stop_after=2)
    resumed = train(load_config(PRESET, SMALL), tmp_path / "split", resume=True)

    def strip(h: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{k: v for k, v in m.items() if not k.startswith("perf/")} for m in h]

    assert strip(resumed["history"]) == strip(full["history"])
    assert any(h["seeupo/cumulative_ratio_mean"] != 1.0 for h in full["history"])
    a = torch.load(tmp_path / "full" / "checkpoint.pt", weights_only=False)
    b = torch.load(tmp_path / "split" / "checkpoint.pt", weights_only=False)
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert a["plugins"]["plan"] == b["plugins"]["plan"] and a["plugins"]["plan"]["ratios"]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_regression_pin_seeupo_learns_the_quickstart_maze_seed2(tmp_path: Path) -> None:
    """SeeUPO's advantage is GRPO's (no step groups), and it learns the maze about as slowly as GRPO does.
    Measured in fresh processes at 76582b8, one torch thread, 60 iterations: seed 2 28% -> 47%; seed 0
    27% -> 27% (no gain: this pins the seed where it learns, and is no evidence for other seeds). With a
    fresh venv's dependencies of 2026-11-26 (transformers 5.24.0, torch 2.13.0, numpy 2.4.6) the same run
    gives seed 2 28% -> 39%, at 0eb1dd7 (which passed with the earlier ones) and at 0981d8b alike."""
    with one_torch_thread():
        assert_learns(train(load_config(PRESET, [*LEARN_FULL, "seed=2"]), tmp_path), min_gain=0.1)
