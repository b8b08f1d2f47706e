"""Asynchronous rollouts (rollout.max_staleness=1): the next iteration is collected during the update,
stale batches are importance-corrected, and without anything stale the run is the synchronous one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from learning import small
from turn_tables import plan_table

from agentgym.rollout.records import Turn
from agentgym.training.config.loading import load_config
from agentgym.training.engine.offpolicy import importance_weights
from agentgym.training.engine.packing import pack_turns
from agentgym.training.run.loop import Trainer, train

SMALL = small("iterations=3", "eval.num_episodes=2", "sft.enabled=false", "model.device=cpu")


def _trajectories(folder: Path) -> list[str]:
    return [path.read_text() for path in sorted((folder / "trajectories").glob("iter_*.jsonl"))]


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
    assert _trajectories(tmp_path)[0] == _trajectories(tmp_path / "sync")[0]  # iteration 1: same weights
    assert len(sync["history"]) == 3


def test_the_final_evaluation_plays_the_saved_weights(tmp_path: Path) -> None:
    """The generator copy catches up with the last update before report.json's "after" is measured, so
    that number is the saved model's, not the weights one update behind it."""
    run = Trainer(load_config(None, [*SMALL, "rollout.max_staleness=1"]), tmp_path)
    run.run()
    assert run.generator is not run.policy  # generation had a copy of its own
    generated, trained = dict(run.generator.model.named_parameters()), dict(run.model.named_parameters())
    assert generated.keys() == trained.keys()
    assert all(torch.equal(generated[name], trained[name]) for name in trained)


def test_without_weight_changes_asynchronous_equals_synchronous(tmp_path: Path) -> None:
    # lr 0-ish is not allowed; freezing the weights through zero advantages: every turn is dropped.
    frozen = [*SMALL, "algorithm.name=grpo", "algorithm.drop_zero_advantage_turns=true", "env.max_turns=1"]
    a = train(load_config(None, [*frozen, "rollout.max_staleness=1"]), tmp_path / "async")
    b = train(load_config(None, frozen), tmp_path / "sync")
    assert all(m.get("loss/skipped") == 1.0 for m in a["history"]), (
        "the weights moved; the test needs them frozen")
    assert _trajectories(tmp_path / "async") == _trajectories(tmp_path / "sync")

    def strip(h: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{k: v for k, v in m.items() if not k.startswith(("perf/", "rollout/staleness"))} for m in h]

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
