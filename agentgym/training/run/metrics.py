"""Iteration metrics (``iteration_metrics``) and where they go (``MetricsLog``: JSONL, TensorBoard, a
callback)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from agentgym.eval.summary import summarize
from agentgym.rollout.collector import CollectStats
from agentgym.rollout.records import EpisodeGroup
from agentgym.run_folder import RunFolder


def iteration_metrics(iteration: int, groups: list[EpisodeGroup], advantages: np.ndarray, stats: CollectStats,
                      timings: dict[str, float], lr: float) -> dict[str, Any]:
    """The ``section/name`` metrics of one iteration's rollouts, advantages and timings.

    Args:
        iteration: the iteration number.
        groups: the groups trained on.
        advantages: their per-turn advantages.
        stats: the collection's statistics (summed over collection rounds).
        timings: ``iteration_s`` and ``update_s`` of the iteration.
        lr: the learning rate used.
    """
    summary = summarize(groups)
    iteration_s, update_s = timings["iteration_s"], timings["update_s"]
    outside = iteration_s - stats.generate_s - update_s
    has = bool(advantages.size)
    return {
        "iteration": iteration,
        "rollout/success_rate": summary["success_rate"],
        "rollout/mean_turns": summary["mean_turns"],
        "rollout/invalid_rate": summary["invalid_rate"],
        "rollout/truncation_rate": summary["truncation_rate"],
        "rollout/tool_calls_per_episode": summary["tool_calls_per_episode"],
        "rollout/turns": stats.turns,
        "rollout/forks": stats.forks,
        "reward/mean_return": summary["mean_return"],
        "adv/mean": float(advantages.mean()) if has else 0.0,
        "adv/std": float(advantages.std()) if has else 0.0,
        "adv/abs_mean": float(np.abs(advantages).mean()) if has else 0.0,
        "adv/zero_frac": float((advantages == 0).mean()) if has else 0.0,
        "perf/iteration_s": iteration_s,
        "perf/generate_s": stats.generate_s,
        "perf/env_s": stats.env_s,
        "perf/hooks_s": stats.hooks_s,
        "perf/update_s": update_s,
        "perf/overhead_frac": max(0.0, outside) / iteration_s if iteration_s else 0.0,
        "perf/gen_tokens_per_s": stats.generated_tokens / stats.generate_s if stats.generate_s else 0.0,
        "perf/lr": lr,
    }


class MetricsLog:
    """Appends each iteration's metrics to ``metrics.jsonl``, ``tensorboard/`` (if installed) and a callback.

    Args:
        out_dir: the run folder.
        history: metrics already logged (a resumed run rewrites the file from its checkpoint's history:
            iterations logged after the last checkpoint never happened as far as the resumed run is
            concerned).
        on_iteration: called with each iteration's metrics (the CLI's progress display).
    """

    def __init__(self, out_dir: Path, history: list[dict[str, Any]],
                 on_iteration: Callable[[dict[str, Any]], None] | None = None) -> None:
        folder = RunFolder(out_dir)
        self.path = folder.metrics
        self.path.write_text("".join(json.dumps(h) + "\n" for h in history))
        self.on_iteration = on_iteration
        self._writer = _tensorboard(folder.tensorboard)

    def log(self, metrics: dict[str, Any]) -> None:
        with open(self.path, "a") as fh:
            fh.write(json.dumps(metrics) + "\n")
        if self._writer is not None:
            for key, value in metrics.items():
                if isinstance(value, (int, float)) and key != "iteration":
                    self._writer.add_scalar(key, value, metrics["iteration"])
        if self.on_iteration is not None:
            self.on_iteration(metrics)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()

    def __enter__(self) -> MetricsLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _tensorboard(logdir: Path) -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:  # tensorboard is in the train extra; metrics.jsonl is always written
        return None
    return SummaryWriter(str(logdir))
