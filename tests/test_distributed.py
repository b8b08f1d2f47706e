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
from distributed_worker import SETTINGS, initial_parameters

from agentgym.rollout.records import Turn
from agentgym.training.api.plugin_set import PluginSet
from agentgym.training.config.loading import load_config
from agentgym.training.config.schema import OptimConfig
from agentgym.training.engine.packing import pack_turns
from agentgym.training.engine.update import PolicyUpdate
from agentgym.training.run.distributed import aggregation_units

ROOT = Path(__file__).resolve().parents[1]
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


def test_micro_batch_weights_add_up_to_the_whole_minibatch() -> None:
    rng = np.random.default_rng(0)
    turns = [Turn(rng.integers(0, 200, int(n)).tolist(), rng.integers(0, 200, int(m)).tolist(), [0.0] * int(m), 0.0,
                  str(i)) for i, (n, m) in enumerate(zip(rng.integers(2, 12, 7), rng.integers(1, 6, 7)))]
    batch = pack_turns(turns, np.ones(7), pad_token_id=256)
    for mode in ("token-mean", "seq-mean-token-mean"):
        cfg = load_config(None, [f"loss.loss_agg_mode={mode}"])
        update = PolicyUpdate(torch.nn.Linear(1, 1), None, PluginSet.from_config(cfg), cfg.loss, OptimConfig(),
                              temperature=1.0, max_length=64, pad_token_id=256, seed=0, micro_batch_tokens=16)
        parts = update.micro_batches(batch)
        assert len(parts) > 2 and all(p.num_rows * p.seq_len <= 16 or p.num_rows == 1 for p, _ in parts)
        assert sum(w for _, w in parts) == pytest.approx(1.0)
        assert sum(p.num_rows for p, _ in parts) == 7
        assert [w for _, w in parts] == pytest.approx([aggregation_units(p, mode) / aggregation_units(batch, mode)
                                                       for p, _ in parts])


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
    groups = [json.loads(line)["group_id"] for line in (out / "trajectories" / "iter_00001.jsonl").open()]
    assert groups == ["it1-p0-g0", "it1-p1-g0"], groups  # each process collected one of the two tasks
    assert all(np.isfinite(m["loss/policy"]) for m in report["history"])
    assert (out / "checkpoint.pt").is_file() and (out / "model" / "config.json").is_file()
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("ranks")) == []


def _one_update(tmp: Path, overrides: list[str]) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    from agentgym.training.api.turn_table import TurnTable
    from agentgym.training.run.loop import Trainer, flatten

    cfg = load_config(None, ["rollout.num_tasks=2", "rollout.group_size=4", "env.max_turns=3", "sft.enabled=false",
                             "loss.kl_coef=0", "model.device=cpu", *overrides])
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
