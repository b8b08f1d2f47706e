"""Several training processes (gloo on CPU, launched by ``accelerate launch``): the update of two
processes with micro-batches equals the update of one process on the same batch, and ``accelerate
launch -m agentgym train`` runs a whole training job."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from distributed_worker import SETTINGS, initial_parameters, turns_and_advantages

from agentgym.rollout.collector import CollectStats
from agentgym.rollout.records import EpisodeGroup, Turn
from agentgym.training.api.plugin_set import PluginSet
from agentgym.training.config.loading import load_config
from agentgym.training.config.schema import AGG_MODES, OptimConfig
from agentgym.training.engine.aggregation import Aggregation
from agentgym.training.engine.packing import pack_turns
from agentgym.training.engine.update import PolicyUpdate
from agentgym.training.run.distributed import Distributed

ROOT = Path(__file__).resolve().parents[3]
WORKER = ROOT / "tests" / "distributed_worker.py"
ACCELERATE = Path(sys.executable).parent / "accelerate"


def _launch(*args: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    """``accelerate launch`` with two processes; without CUDA they are CPU processes over gloo."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [str(ACCELERATE), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
               "--mixed_precision", "no", "--dynamo_backend", "no", *args]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout,
                            check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def _single(tmp: Path, budget: str) -> dict:
    out = tmp / f"one-{budget}.pt"
    subprocess.run([sys.executable, str(WORKER), str(out), budget], cwd=ROOT, check=True, timeout=300,
                   env={**os.environ, "OMP_NUM_THREADS": "1", "WORLD_SIZE": "1"})
    return torch.load(out)


def test_one_process_answers_the_loops_questions_as_the_identity(tmp_path: Path) -> None:
    """What the loop asks of its processes, with one: no share tag, the run folder itself, its own groups,
    writes done, an update a stop may cut short."""
    dist = Distributed()
    groups = [EpisodeGroup("g", "t", 0, [])]
    stats = CollectStats(turns=3)
    assert dist.share_tag == "" and dist.run_dir(tmp_path) == tmp_path
    assert dist.gather_groups(groups, stats) == (groups, stats)
    written: list[int] = []
    dist.on_main(written.append, 1)
    assert written == [1] and dist.main_only("tracking") == "tracking"
    assert dist.update_region == "abandonable" and dist.update_poll(print) is print
    dist.release_run_dir(tmp_path)
    assert tmp_path.is_dir()  # the run folder stays


def test_two_processes_with_micro_batches_update_like_one_process(tmp_path: Path) -> None:
    one = _single(tmp_path, "none")
    one_micro = _single(tmp_path, "20")  # one process, micro-batches of at most 20 padded tokens
    _launch(str(WORKER), str(tmp_path / "two.pt"), "20")
    two = torch.load(tmp_path / "two.pt")
    start = initial_parameters()
    assert set(two) == set(one) == set(SETTINGS)
    for name in SETTINGS:
        a, b, c = one[name]["params"], two[name]["params"], one_micro[name]["params"]
        moved = max((a[k] - start[k]).abs().max().item() for k in a)
        assert moved > 1e-2, f"{name}: the update hardly moved the weights ({moved})"
        for other, label in ((b, "two processes"), (c, "micro-batches")):
            gap = max((a[k] - other[k]).abs().max().item() for k in a)
            assert gap < 1e-6, f"{name}: {label} differ from one process by {gap}"
        if name != "seq-mean-token-sum-norm":  # the loss value of the minibatch, whatever the split
            assert abs(one[name]["loss"].item() - two[name]["loss"].item()) < 1e-5


def _random_batch(seed: int, rows: int = 7):
    """Turns of random prompt and response lengths, packed (so rows, tokens and padding all differ)."""
    rng = np.random.default_rng(seed)
    lengths = zip(rng.integers(2, 12, rows), rng.integers(1, 6, rows), strict=True)
    turns = [Turn(rng.integers(0, 200, int(n)).tolist(), rng.integers(0, 200, int(m)).tolist(),
                  [0.0] * int(m), 0.0, str(i)) for i, (n, m) in enumerate(lengths)]
    return pack_turns(turns, np.ones(rows), pad_token_id=256)


def _update_for(cfg, micro_batch_tokens: int, dist: Distributed | None = None) -> PolicyUpdate:
    """A ``PolicyUpdate`` good for ``micro_batches`` only (no model to speak of, no optimiser)."""
    return PolicyUpdate(torch.nn.Linear(1, 1), None, PluginSet.from_config(cfg), cfg.loss, OptimConfig(),
                        temperature=1.0, max_length=64, pad_token_id=256, seed=0,
                        micro_batch_tokens=micro_batch_tokens, dist=dist)


#: What each mode divides by, counted by hand over a batch (response tokens, or rows that have some).
UNITS = {"token-mean": lambda b: float(b.response_mask.sum()),
         "seq-mean-token-mean": lambda b: float((b.response_mask.sum(-1) > 0).sum())}


def test_micro_batch_weights_add_up_to_the_whole_minibatch() -> None:
    batch = _random_batch(0)
    for mode in ("token-mean", "seq-mean-token-mean"):
        cfg = load_config(None, [f"loss.loss_agg_mode={mode}"])
        parts = _update_for(cfg, 16).micro_batches(batch)
        assert len(parts) > 2 and all(p.num_rows * p.seq_len <= 16 or p.num_rows == 1 for p, _ in parts)
        assert sum(w for _, w in parts) == pytest.approx(1.0)
        assert sum(p.num_rows for p, _ in parts) == 7
        assert [w for _, w in parts] == pytest.approx([UNITS[mode](p) / UNITS[mode](batch) for p, _ in parts])


class _Rank(Distributed):
    """Process ``rank`` of ``world_size``, as far as ``PolicyUpdate.micro_batches`` goes (its shard)."""

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank, self.world_size = rank, world_size


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("overrides", [[f"loss.loss_agg_mode={m}"] for m in AGG_MODES]
                         + [["loss.loss_agg_mode=seq-mean-token-sum-norm", "loss.loss_agg_norm_tokens=50"]])
def test_weighted_micro_batch_losses_add_up_to_the_minibatch_loss(overrides: list[str], seed: int) -> None:
    """For every mode, on a random minibatch cut into micro-batches of uneven rows and widths (and shared
    among 1, 2 or 3 processes), the micro-batch losses reduced with the minibatch's aggregation and
    weighted by ``micro_batches`` sum to the minibatch's loss in one piece."""
    batch = _random_batch(seed, rows=9)
    values = torch.randn(batch.response_mask.shape, generator=torch.Generator().manual_seed(seed)) * 3
    cfg = load_config(None, overrides)
    for world_size in (1, 2, 3):
        parts = []
        for rank in range(world_size):
            update = _update_for(cfg, 24, _Rank(rank, world_size))
            parts += update.micro_batches(batch)
        agg = update.agg.for_minibatch(batch.response_mask)
        assert agg.mode == cfg.loss.loss_agg_mode
        assert agg.norm_tokens == (cfg.loss.loss_agg_norm_tokens or batch.seq_len if agg.additive else None)
        assert sorted(i for p, _ in parts for i in p.turn_index.tolist()) == list(range(9))
        assert len({p.num_rows for p, _ in parts}) > 1 and min(p.seq_len for p, _ in parts) < batch.seq_len
        # Rows are right-padded, so a trimmed micro-batch keeps its rows' columns from the left.
        split = sum(w * agg.reduce(values[p.turn_index, : p.seq_len], p.response_mask).item()
                    for p, w in parts)
        whole = agg.reduce(values, batch.response_mask).item()
        assert split == pytest.approx(whole, rel=1e-5, abs=1e-6), f"{world_size} processes"


def test_an_update_never_replaces_the_loss_config() -> None:
    """The policy loss and every term get the very ``LossConfig`` given to ``PolicyUpdate`` (unchanged),
    and the minibatch's aggregation beside it: under seq-mean-token-sum-norm with no L set, L is the
    minibatch's padded width also in micro-batches trimmed narrower than that."""
    from agentgym.backends.builder import make_policy
    from agentgym.backends.config import ModelConfig, TinyModelConfig
    from agentgym.training.api.terms import LossTerm
    from agentgym.training.engine.losses import POLICY_LOSSES, policy_loss, register_policy_loss

    seen: list[tuple[str, object, Aggregation, int]] = []  # (who, cfg, agg, width of the batch it got)

    def recording_loss(logprobs, old_logprobs, advantages, mask, cfg, agg):
        seen.append(("policy", cfg, agg, mask.shape[-1]))
        return policy_loss(logprobs, old_logprobs, advantages, mask, cfg, agg)

    class RecordingTerm(LossTerm):
        def __call__(self, batch, outputs, cfg):
            seen.append(("term", cfg, outputs.agg, batch.seq_len))
            return outputs.logprobs.new_zeros(()), {}

    register_policy_loss("test_recording", override=True)(recording_loss)
    try:
        cfg = load_config(None, ["loss.loss_agg_mode=seq-mean-token-sum-norm",
                                 "loss.loss_mode=test_recording", "optim.num_minibatches=2",
                                 "algorithm.name=grpo"])
        given = cfg.loss
        before = repr(given)
        plugins = PluginSet.from_config(cfg)
        plugins.terms["recording"] = RecordingTerm()
        model, reference = (make_policy(ModelConfig(tiny=TinyModelConfig(num_layers=1), device="cpu"),
                                        seed=seed).model for seed in (1, 2))
        update = PolicyUpdate(model, torch.optim.SGD(model.parameters(), lr=0.1), plugins, given, cfg.optim,
                              temperature=1.0, max_length=64, pad_token_id=256, seed=0, micro_batch_tokens=20,
                              ref_model=reference)
        steps: list[tuple[int, list]] = []  # per optimiser step: the minibatch's width, the calls it made
        step = update._step

        def recording_step(mb, **options):
            start = len(seen)
            out = step(mb, **options)
            steps.append((mb.seq_len, seen[start:]))
            return out

        update._step = recording_step
        turns, advantages, table = turns_and_advantages()
        update(turns, advantages, table, 1)
    finally:
        POLICY_LOSSES.unregister("test_recording")
    assert update.loss_cfg is given and repr(given) == before
    assert len(steps) == 2 and {who for who, *_ in seen} == {"policy", "term"}
    assert all(cfg is given for _, cfg, _, _ in seen)
    for mb_width, calls in steps:
        assert len(calls) >= 4  # several micro-batches, each calling the policy loss and the term
        assert all(agg.mode == "seq-mean-token-sum-norm" for _, _, agg, _ in calls)
        assert all(agg.norm_tokens == mb_width for _, _, agg, _ in calls)
    assert any(width < mb_width for mb_width, calls in steps for *_, width in calls)  # trimmed micro-batches


def test_accelerate_launch_trains(tmp_path: Path) -> None:
    out = tmp_path / "run"
    overrides = ["iterations=2", "checkpoint_every=1", "rollout.num_tasks=2", "rollout.group_size=4",
                 "eval.num_episodes=2", "sft.num_episodes=4", "sft.num_epochs=1", "env.max_turns=4",
                 "loss.kl_coef=0.05", "optim.micro_batch_tokens=64", "model.device=cpu"]
    _launch("-m", "agentgym", "train", *[a for o in overrides for a in ("--set", o)], "--out", str(out),
            timeout=600)
    report = json.loads((out / "report.json").read_text())
    assert len(report["history"]) == 2
    assert report["history"][0]["rollout/groups"] == 2.0
    lines = [json.loads(line) for line in (out / "trajectories" / "iter_00001.jsonl").open()]
    groups = list(dict.fromkeys(line["group_id"] for line in lines))  # one line per episode, 4 per group
    assert groups == ["it1-p0-g0", "it1-p1-g0"], groups  # each process collected one of the two tasks
    assert len(lines) == 8
    assert all(np.isfinite(m["loss/policy"]) for m in report["history"])
    assert (out / "checkpoint.pt").is_file() and (out / "model" / "config.json").is_file()
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("ranks")) == []


def _one_update(tmp: Path, overrides: list[str]) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    from agentgym.training.api.turn_table import TurnTable
    from agentgym.training.run.loop import Trainer, flatten

    cfg = load_config(None, ["rollout.num_tasks=2", "rollout.group_size=4", "env.max_turns=3",
                             "sft.enabled=false", "loss.kl_coef=0", "model.device=cpu", *overrides])
    run = Trainer(cfg, tmp)
    try:
        groups = run.collector.collect([1, 2], 4, run.sampling(1.0, 0))
        advantages = np.linspace(-1.0, 1.0, len(flatten(groups)))
        metrics = run.update(flatten(groups), advantages, TurnTable.from_groups(groups), 1)
        return {k: v.detach().clone() for k, v in run.model.state_dict().items()}, metrics
    finally:
        run.close()


def test_gradient_checkpointing_changes_memory_not_the_update(tmp_path: Path) -> None:
    plain, _ = _one_update(tmp_path / "a", [])
    checkpointed, _ = _one_update(tmp_path / "b", ["model.gradient_checkpointing=true"])
    assert all(torch.allclose(plain[k], checkpointed[k], atol=1e-6) for k in plain)


def test_bf16_mixed_precision_trains_float32_weights_close_to_float32(tmp_path: Path) -> None:
    plain, _ = _one_update(tmp_path / "a", [])
    mixed, metrics = _one_update(tmp_path / "b", ["optim.mixed_precision=bf16"])
    assert all(v.dtype == torch.float32 for v in mixed.values())  # master weights stay float32
    assert np.isfinite(metrics["loss/policy"])
    gaps = [(plain[k] - mixed[k]).abs().max().item() for k in plain]
    assert 0 < max(gaps) < 1e-2  # bfloat16 forward passes: a different, nearby update
