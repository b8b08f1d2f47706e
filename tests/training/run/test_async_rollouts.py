"""Asynchronous rollouts (rollout.max_staleness=K): later iterations are collected during updates, every
turn records the version of the weights that sampled it (episodes in flight take new weights at their next
turn with partial_rollouts), stale batches are importance-corrected, weight syncs have a deadline, and
without anything stale the run is the synchronous one."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from learning import small
from turn_tables import plan_table

from agentgym.errors import ConfigError
from agentgym.rollout.episode_log import iteration_lines, read_line
from agentgym.rollout.hooks import RolloutHooks
from agentgym.rollout.records import Turn
from agentgym.training.config.loading import load_config
from agentgym.training.engine.offpolicy import importance_weights
from agentgym.training.engine.packing import pack_turns
from agentgym.training.run.checkpoint import load_checkpoint
from agentgym.training.run.collection import AsyncCollection
from agentgym.training.run.loop import Trainer, train
from agentgym.training.run.weight_sync import InFlightWeights, WeightSyncTimeout, rollout_generator

SMALL = small("iterations=3", "eval.num_episodes=2", "sft.enabled=false", "model.device=cpu")


def _trajectories(folder: Path, *, versions: bool = True) -> list[str]:
    """The iteration files' texts; ``versions=False`` leaves out the turns' ``policy_version`` (a
    synchronous run's turns have none)."""
    texts = [path.read_text() for path in sorted((folder / "trajectories").glob("iter_*.jsonl"))]
    if versions:
        return texts
    episodes = [[r for line in text.splitlines() for r in read_line(line)] for text in texts]
    for episode in (r for iteration in episodes for r in iteration):
        for turn in episode["turns"]:
            turn["extras"].pop("policy_version", None)
    return [json.dumps(iteration) for iteration in episodes]


def _versions(folder: Path) -> list[list[int]]:
    """Per iteration, the policy version of every turn collected for it."""
    out = []
    for text in _trajectories(folder):
        episodes = [r for line in text.splitlines() for r in read_line(line)]
        out.append([turn["extras"]["policy_version"] for r in episodes for turn in r["turns"]])
    return out


def test_asynchronous_run_reports_staleness_overlap_and_correction(tmp_path: Path) -> None:
    report = train(load_config(None, [*SMALL, "rollout.max_staleness=1"]), tmp_path)
    history = report["history"]
    assert [m["rollout/staleness"] for m in history] == [0.0, 1.0, 1.0]
    assert history[0]["perf/overlap_s"] == 0.0 and all(m["perf/overlap_s"] > 0 for m in history[1:])
    assert "offpolicy/is_weight_mean" not in history[0]  # fresh episodes: no correction
    for m in history[1:]:
        assert 0 < m["offpolicy/is_weight_mean"] <= 2.0 and m["offpolicy/logprob_gap"] > 0
    # The tasks are those of a synchronous run; the weights that sampled them are one update older.
    sync = train(load_config(None, SMALL), tmp_path / "sync")

    def seeds(folder: Path) -> list[list[int]]:
        return [[json.loads(line)["seed"] for line in text.splitlines()] for text in _trajectories(folder)]

    assert seeds(tmp_path) == seeds(tmp_path / "sync")
    # iteration 1: same weights
    assert _trajectories(tmp_path, versions=False)[0] == _trajectories(tmp_path / "sync", versions=False)[0]
    assert len(sync["history"]) == 3
    # Iteration 2 was collected during update 1 with the initial weights, iteration 3 during update 2 with
    # those of update 1: every turn says so.
    assert [sorted(set(v)) for v in _versions(tmp_path)] == [[0], [0], [1]]


def test_the_final_evaluation_plays_the_saved_weights(tmp_path: Path) -> None:
    """The generator copy catches up with the last update before report.json's "after" is measured, so
    that number is the saved model's, not the weights one update behind it."""
    run = Trainer(load_config(None, [*SMALL, "rollout.max_staleness=1"]), tmp_path)
    assert isinstance(run.collection, AsyncCollection)  # the mode, chosen once when the run is built
    run.run()
    assert run.generator is not run.policy  # generation had a copy of its own
    generated, trained = dict(run.generator.model.named_parameters()), dict(run.model.named_parameters())
    assert generated.keys() == trained.keys()
    assert all(torch.equal(generated[name], trained[name]) for name in trained)


@pytest.mark.parametrize("asynchrony", [["rollout.max_staleness=1"],
                                        ["rollout.max_staleness=3", "rollout.partial_rollouts=true"]])
def test_without_weight_changes_asynchronous_equals_synchronous(tmp_path: Path,
                                                               asynchrony: list[str]) -> None:
    # lr 0-ish is not allowed; freezing the weights through zero advantages: every turn is dropped.
    frozen = [*SMALL, "iterations=4", "algorithm.name=grpo", "algorithm.drop_zero_advantage_turns=true",
              "env.max_turns=1"]
    a = train(load_config(None, [*frozen, *asynchrony]), tmp_path / "async")
    b = train(load_config(None, frozen), tmp_path / "sync")
    assert all(m.get("loss/skipped") == 1.0 for m in a["history"]), (
        "the weights moved; the test needs them frozen")
    assert _trajectories(tmp_path / "async", versions=False) == _trajectories(tmp_path / "sync",
                                                                              versions=False)

    def strip(h: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{k: v for k, v in m.items() if not k.startswith(("perf/", "rollout/staleness",
                                                                  "rollout/mixed_version"))} for m in h]

    assert strip(a["history"]) == strip(b["history"])


def test_a_stale_batch_is_trained_with_importance_weighted_advantages(tmp_path: Path) -> None:
    """One-token responses make the per-token weight a per-turn one, so the correction can be done by
    hand: a stale update equals a fresh update on advantages times min(exp(old - behaviour), 2)."""
    cfg = load_config(None, [*SMALL, "optim.num_minibatches=1", "loss.kl_coef=0", "loss.entropy_coef=0"])
    rng = np.random.default_rng(3)
    turns = [Turn(rng.integers(0, 200, 6).tolist(), [int(rng.integers(0, 200))],
                  [float(rng.normal(-5.0, 1.0))], 0.0, str(i)) for i in range(6)]
    # Far less likely: capped at 2.
    turns[0] = Turn(turns[0].prompt_ids, turns[0].response_ids, [-12.0], 0.0, "0")
    advantages = np.array([1.0, -0.5, 0.25, -1.0, 0.75, -0.25])
    index = plan_table(list("abcdef"), np.zeros(6, dtype=np.int64))

    def updated(adv: np.ndarray, staleness: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        run = Trainer(cfg, tmp_path / f"run{len(list(tmp_path.iterdir()))}")
        try:
            batch = pack_turns(turns, adv, pad_token_id=run.pad_token_id, max_length=run.max_length)
            mask = batch.response_mask.bool()
            weights = importance_weights(batch.old_logprobs, run.update.logprobs(batch), mask, 2.0)[mask]
            run.update(turns, adv, index, 1, staleness=staleness)
            return {k: v.detach().clone() for k, v in run.model.state_dict().items()}, weights
        finally:
            run.close()

    stale, weights = updated(advantages, 1)
    assert weights.shape == (6,) and (weights != 1).any() and (weights == 2.0).any(), weights
    by_hand, _ = updated(advantages * weights.double().numpy(), 0)
    uncorrected, _ = updated(advantages, 0)
    assert all(torch.allclose(stale[k], by_hand[k], atol=1e-7) for k in stale)
    assert any(not torch.allclose(stale[k], uncorrected[k], atol=1e-5) for k in stale), (
        "the correction changed nothing")


def test_asynchronous_run_resumes_exactly(tmp_path: Path) -> None:
    overrides = [*SMALL, "rollout.max_staleness=1", "checkpoint_every=1"]
    full = train(load_config(None, overrides), tmp_path / "full")
    train(load_config(None, overrides), tmp_path / "split", stop_after=1)
    resumed = train(load_config(None, overrides), tmp_path / "split", resume=True)

    def strip(h: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{k: v for k, v in m.items() if not k.startswith("perf/")} for m in h]

    assert strip(resumed["history"]) == strip(full["history"])
    assert _trajectories(tmp_path / "split") == _trajectories(tmp_path / "full")


def test_staleness_is_bounded_by_k_turn_by_turn(tmp_path: Path) -> None:
    """K = 3 with partial rollouts: however the threads interleave, a turn used at version v (v updates made)
    was sampled by a version in v - 3 .. v, the reported staleness is the oldest turn's age, and the tasks
    are the synchronous run's."""
    overrides = [*SMALL, "iterations=6", "rollout.max_staleness=3", "rollout.partial_rollouts=true"]
    report = train(load_config(None, overrides), tmp_path / "async")
    history = report["history"]
    versions = _versions(tmp_path / "async")
    assert len(versions) == 6
    for iteration, (used, metrics) in enumerate(zip(versions, history, strict=True), start=1):
        version = iteration - 1  # updates made before iteration's own update
        assert all(max(0, version - 3) <= v <= version for v in used), (iteration, sorted(set(used)))
        assert metrics["rollout/staleness"] == version - min(used)
        assert 0 <= metrics["rollout/mixed_version_share"] <= 1
        assert metrics["rollout/staleness_mean"] == pytest.approx(version - sum(used) / len(used))
    assert history[0]["rollout/staleness"] == 0
    sync = train(load_config(None, [*SMALL, "iterations=6"]), tmp_path / "sync")
    assert len(sync["history"]) == 6

    def seeds(folder: Path) -> list[list[int]]:
        return [[json.loads(line)["seed"] for line in text.splitlines()] for text in _trajectories(folder)]

    assert seeds(tmp_path / "async") == seeds(tmp_path / "sync")


def test_episodes_in_flight_take_new_weights_at_their_next_turn(tmp_path: Path) -> None:
    """Partial rollouts: weights published in the middle of a collection reach the episodes still running
    at their next turn; each turn records the version that sampled it, and its log-probs are those of
    that version's weights (teacher-forced)."""
    run = Trainer(load_config(None, [*SMALL, "rollout.max_staleness=1", "rollout.partial_rollouts=true",
                                     "env.max_turns=4"]), tmp_path)
    try:
        before = {k: v.detach().clone() for k, v in run.model.state_dict().items()}

        class UpdateMidway(RolloutHooks):
            """The trainer's update lands after the second turn."""

            def after_turn(self, episodes: Any, context: Any) -> list[Any]:
                if all(len(e.turns) >= 2 for e in episodes) and run.weights.version == 0 \
                        and not getattr(self, "done", False):
                    self.done = True
                    with torch.no_grad():
                        for param in run.model.parameters():
                            param.add_(0.05 * torch.randn_like(param))
                    run.weights.publish(1)
                return []

        sampling = run.sampling(1.0, 11)
        groups = run.collector.collect([5, 6], 2, sampling, hooks=UpdateMidway())
        after = {k: v.detach().clone() for k, v in run.model.state_dict().items()}
        turns = [t for g in groups for tr in g.trajectories for t in tr.turns]
        assert [[t.extras["policy_version"] for t in tr.turns] for g in groups for tr in g.trajectories] == [
            [0, 0, 1, 1][:len(tr.turns)] for g in groups for tr in g.trajectories]
        assert any(len(tr.turns) > 2 for g in groups for tr in g.trajectories), (
            "no episode outlived the update")
        for version, weights in ((0, before), (1, after)):
            run.model.load_state_dict(weights)
            mine = [t for t in turns if t.extras["policy_version"] == version]
            scored = run.policy.score([t.prompt_ids for t in mine], [t.response_ids for t in mine])
            for turn, teacher_forced in zip(mine, scored, strict=True):
                assert np.allclose(turn.response_logprobs, teacher_forced, atol=1e-4)
    finally:
        run.close()


class _Stuck:
    """A generator whose weight loading never returns (a server that stopped answering)."""

    tokenizer = None

    def __init__(self, in_flight: bool) -> None:
        self.takes_weights_in_flight = in_flight
        self.release = threading.Event()

    def sync_weights(self, state_dict: Any) -> None:
        self.release.wait(30)


@pytest.mark.parametrize("in_flight", [False, True])
def test_a_weight_sync_that_hangs_ends_with_a_timeout_naming_the_generator(in_flight: bool) -> None:
    model = torch.nn.Linear(2, 2)
    stuck = _Stuck(in_flight)
    weights = InFlightWeights(stuck, model, partial_rollouts=True, timeout_s=0.2)
    try:
        with pytest.raises(WeightSyncTimeout, match=r"_Stuck did not finish in 0.2 s.*weight_sync_timeout_s"):
            weights.publish(1)  # sent at once to a server; a copy takes it at its next turn
            weights.take()
        with pytest.raises(WeightSyncTimeout):
            weights.sync_now(1)
        assert weights.version == 0  # nothing was loaded
    finally:
        stuck.release.set()


def test_a_training_run_whose_generator_hangs_stops_with_the_timeout(tmp_path: Path) -> None:
    run = Trainer(load_config(None, [*SMALL, "rollout.max_staleness=1", "rollout.weight_sync_timeout_s=0.5"]),
                  tmp_path)
    release = threading.Event()
    run.weights.generator.sync_weights = lambda state: release.wait(30)  # type: ignore[method-assign]
    try:
        with pytest.raises(WeightSyncTimeout, match="TransformersPolicy did not finish in 0.5 s"):
            run.run()
    finally:
        release.set()
        run.close()


@pytest.mark.parametrize(("overrides", "message"), [
    (["rollout.max_staleness=9"], r"max_staleness must be an integer in 0..8"),
    (["rollout.max_staleness=-1"], r"max_staleness must be an integer in 0..8"),
    (["rollout.partial_rollouts=true"], r"partial_rollouts is for asynchronous rollouts"),
    (["rollout.max_staleness=2", "rollout.weight_sync_timeout_s=0"], r"weight_sync_timeout_s must be"),
])
def test_bad_asynchrony_settings_are_one_line_errors(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(None, [*SMALL, *overrides])


def test_the_evaluation_before_rl_plays_the_weights_sft_made(tmp_path: Path) -> None:
    """The asynchronous generator copy is taken before the warm start; SFT's weights reach it before the
    evaluation that RL starts from and before the first collection."""
    overrides = small("iterations=1", "sft.enabled=true", "eval.num_episodes=4", "model.device=cpu")
    a = train(load_config(None, [*overrides, "rollout.max_staleness=2"]), tmp_path / "async")
    b = train(load_config(None, overrides), tmp_path / "sync")
    train(load_config(None, [*overrides, "rollout.max_staleness=2", "sft.enabled=false"]), tmp_path / "raw")
    assert a["eval"]["before"] == b["eval"]["before"]
    played = _trajectories(tmp_path / "async", versions=False)
    assert played == _trajectories(tmp_path / "sync", versions=False)
    assert played != _trajectories(tmp_path / "raw", versions=False), "SFT changed nothing the test can see"


def test_resuming_with_several_iterations_in_flight(tmp_path: Path) -> None:
    """K = 2: the checkpoint keeps every collection under way (finished first), and the resumed run trains
    on them and ends like a run that was never stopped would (same length, staleness still bounded)."""
    overrides = [*SMALL, "iterations=5", "rollout.max_staleness=2", "checkpoint_every=1"]
    stopped = train(load_config(None, overrides), tmp_path, stop_after=2)
    assert stopped["stopped_after"] == 2
    saved = load_checkpoint(tmp_path)["pending_rollout"]
    assert [entry["iteration"] for entry in saved] == [3, 4]
    resumed = train(load_config(None, overrides), tmp_path, resume=True)
    assert [m["iteration"] for m in resumed["history"]] == [1, 2, 3, 4, 5]
    assert all(m["rollout/staleness"] <= 2 for m in resumed["history"])
    # Iterations 3 and 4 trained on the episodes the first run collected before it stopped.
    files = _trajectories(tmp_path)
    for entry in saved:
        groups = entry["result"][0]
        assert files[entry["iteration"] - 1] == "".join(json.dumps(r) + "\n"
                                                        for r in iteration_lines(groups, entry["iteration"]))


class _Sleeper:
    """A colocated engine that sleeps through updates (vLLM's ``sleep`` mode)."""
    pauses_for_updates = True


class _FixedServer:
    """A generator that neither copies the trained model nor takes weights while it generates."""
    is_trained_model = False
    takes_weights_in_flight = False


@pytest.mark.parametrize("policy, world_size, message", [
    (_FixedServer(), 2, "is for one training process"),
    (_Sleeper(), 1, "model.vllm.sleep puts the colocated engine to sleep"),
    (_FixedServer(), 1, "_FixedServer can take new weights neither as a copy nor while it generates"),
])
def test_asynchronous_rollouts_refuse_generators_that_cannot_take_weights(policy: Any, world_size: int,
                                                                           message: str) -> None:
    rollout = load_config(None, ["rollout.max_staleness=1"]).rollout
    with pytest.raises(ConfigError, match=message):
        rollout_generator(policy, torch.nn.Linear(2, 2), rollout, seed=0, world_size=world_size)
    assert rollout_generator(policy, torch.nn.Linear(2, 2), load_config(None, []).rollout, seed=0,
                             world_size=world_size) == (policy, None)  # synchronous: the policy itself
