"""Iteration metrics (``iteration_metrics``) and where they go (``MetricsLog``: JSONL, the trackers of
``agentgym.training.run.tracking`` — TensorBoard, MLflow, W&B — and a callback)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from agentgym.rollout.collector import CollectStats
from agentgym.rollout.records import EpisodeGroup
from agentgym.rollout.summary import summarize
from agentgym.run_folder import RunFolder
from agentgym.training.config.schema import TrackingConfig, TrainConfig, config_to_dict
from agentgym.training.run.tracking import Outcome, Sink, numeric, open_sinks, summary_numbers


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
        "rollout/discarded": stats.discarded,
        # a harness's rollouts whose agent crashed or timed out (recorded, zero-rewarded or discarded)
        "rollout/harness_failures": stats.discarded + sum(
            1 for g in groups for t in g.trajectories if t.turns and t.turns[-1].info.get("harness_error")),
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
    """Appends each iteration's metrics to ``metrics.jsonl``, the trackers ``tracking`` asks for and a
    callback; ``finish`` gives the trackers the report's summary. Used as a context manager, it closes the
    trackers with how the run ended: finished (after ``finish``), stopped (a stop signal, or leaving
    early) or failed (an error).

    Args:
        out_dir: the run folder.
        history: metrics already logged (a resumed run rewrites the file from its checkpoint's history:
            iterations logged after the last checkpoint never happened as far as the resumed run is
            concerned).
        on_iteration: called with each iteration's metrics (the CLI's progress display).
        tracking: the run's ``tracking`` section; None: ``metrics.jsonl`` and the callback only (the other
            processes of a multi-process run, whose metrics the main one logs).
        config: the run's config as plain data, the trackers' parameters.
    """

    def __init__(self, out_dir: Path, history: list[dict[str, Any]],
                 on_iteration: Callable[[dict[str, Any]], None] | None = None, *,
                 tracking: TrackingConfig | None = None, config: dict[str, Any] | None = None) -> None:
        folder = RunFolder(out_dir)
        self.path = folder.metrics
        self.path.write_text("".join(json.dumps(h) + "\n" for h in history))
        self.on_iteration = on_iteration
        self.sinks: list[Sink] = ([] if tracking is None
                                  else open_sinks(tracking, folder, config or {}, history))
        self.finished = False
        self.closed = False

    def log(self, metrics: dict[str, Any]) -> None:
        with open(self.path, "a") as fh:
            fh.write(json.dumps(metrics) + "\n")
        numbers = numeric(metrics)
        for sink in self.sinks:
            sink.log(numbers, metrics["iteration"])
        if self.on_iteration is not None:
            self.on_iteration(metrics)

    def finish(self, report: dict[str, Any]) -> None:
        """The finished run's report: its summary numbers (``tracking.summary_numbers``) to the trackers."""
        numbers = summary_numbers(report)
        for sink in self.sinks:
            sink.summarize(numbers, report["iterations"])
        self.finished = True

    def close(self, outcome: Outcome | None = None) -> None:
        """Close every tracker (once), with ``outcome``; None: finished after ``finish``, else stopped."""
        if self.closed:
            return
        self.closed = True
        outcome = outcome or ("finished" if self.finished else "stopped")
        errors = []
        for sink in self.sinks:
            try:
                sink.close(outcome)
            except Exception as exc:  # every tracker is closed before the first error is raised
                errors.append(exc)
        if errors:
            raise errors[0]

    def __enter__(self) -> MetricsLog:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        if exc_type is None:
            self.close()
            return
        # Stop requests are BaseExceptions but not Exceptions (StopNow, KeyboardInterrupt, SystemExit): the
        # run stopped where it can be resumed; an Exception is a failure. A tracker that cannot close then
        # must not hide why the run ended.
        with contextlib.suppress(Exception):
            self.close("failed" if issubclass(exc_type, Exception) else "stopped")


def run_report(cfg: TrainConfig, folder: RunFolder, history: list[dict[str, Any]], extra: dict[str, Any],
               eval_after: dict[str, Any], elapsed_s: float) -> dict[str, Any]:
    """``report.json`` of a finished run: its evaluations before SFT, before RL and after RL, the SFT's
    results, every iteration's metrics, the config and how it changed over resumes."""
    return {
        "algorithm": cfg.algorithm.name,
        "env": cfg.env.id,
        "iterations": cfg.iterations,
        "wall_time_s": extra.get("elapsed_s", 0.0) + elapsed_s,
        "eval": {"before": extra["eval_before"], "after": eval_after,
                 "before_sft": extra.get("eval_before_sft")},
        "sft": extra.get("sft"),
        "history": history,
        "config": config_to_dict(cfg),
        "config_history": folder.config_history(),
    }
