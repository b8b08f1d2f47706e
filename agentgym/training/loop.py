"""The training loop: SFT warm start, then RL iterations (collect → estimate → pack → update → log).

Read ``train`` top to bottom: it is the whole algorithm-independent recipe. What differs between
algorithms is only the estimator (``agentgym.training.algorithm``). Every iteration's task seeds, sampling
seed and minibatch order derive from ``(cfg.seed, iteration)``, so a resumed run replays exactly
what an uninterrupted one would have done.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import random
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agentgym.training.algorithm import get_algorithm
from agentgym.backends.transformers_backend import TransformersPolicy
from agentgym.rollout.collector import Collector
from agentgym.training.config import TrainConfig, config_to_dict
from agentgym.core import Env
from agentgym.rollout.demos import collect_demos
from agentgym.errors import ConfigError
from agentgym.eval.summary import summarize
from agentgym.training.losses import LossConfig, total_loss
from agentgym.training.packing import minibatches, pack_turns, sequence_logprobs
from agentgym.rollout.policy import SamplingParams
from agentgym.rollout.prompt import PromptRenderer
from agentgym.rollout.records import EpisodeGroup, Turn
from agentgym.backends.tiny import TinyModelConfig, load_model_and_tokenizer

CHECKPOINT = "checkpoint.pt"


# --- set-up ---------------------------------------------------------------------------------------


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def build_model(cfg: TrainConfig) -> tuple[torch.nn.Module, Any]:
    """The policy model and tokenizer: a local HF directory, or the tiny model from the config."""
    m = cfg.model
    source: Any = m.path if m.path else TinyModelConfig(
        arch=m.arch, hidden_size=m.hidden_size, num_layers=m.num_layers, num_heads=m.num_heads,
        num_kv_heads=m.num_kv_heads, intermediate_size=m.intermediate_size,
        max_position_embeddings=m.max_position_embeddings, seed=cfg.seed)
    model, tokenizer = load_model_and_tokenizer(source, dtype=getattr(torch, m.dtype))
    return model.to(_device(m.device)), tokenizer


def env_factory(cfg: TrainConfig) -> Callable[[], Env]:
    """In-process envs, or sessions on an env service when ``env.url`` is set (one shared client)."""
    if cfg.env.url:
        from agentgym.http.client import EnvClient, RemoteEnv

        client = EnvClient(cfg.env.url, token=cfg.env.token)
        return lambda: RemoteEnv(cfg.env.id, client=client, max_turns=cfg.env.max_turns, **cfg.env.kwargs)
    import agentgym

    return lambda: agentgym.make(cfg.env.id, max_turns=cfg.env.max_turns, **cfg.env.kwargs)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def task_seeds(cfg: TrainConfig, iteration: int) -> list[int]:
    """Training task seeds of an iteration: below ``eval.seed_offset``, so never an eval task."""
    rng = np.random.default_rng([cfg.seed, iteration])
    return [int(s) for s in rng.integers(0, cfg.eval.seed_offset, size=cfg.rollout.num_tasks)]


def flatten(groups: list[EpisodeGroup]) -> list[Turn]:
    """Turns in estimator order: group → trajectory → turn."""
    return [turn for g in groups for t in g.trajectories for turn in t.turns]


# --- the two updates ----------------------------------------------------------------------------


def sft_update(model: torch.nn.Module, turns: list[Turn], cfg: TrainConfig, pad_token_id: int) -> dict[str, float]:
    """Cross-entropy on the expert's response tokens (prompt tokens are masked out)."""
    device = next(model.parameters()).device
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.sft.lr)
    batch = pack_turns(turns, np.zeros(len(turns)), pad_token_id=pad_token_id,
                       max_length=cfg.rollout.max_prompt_tokens + cfg.rollout.max_new_tokens)
    generator = torch.Generator().manual_seed(cfg.seed)
    num_minibatches = max(1, math.ceil(batch.num_rows / cfg.sft.batch_size))
    model.train()
    losses = []
    for _ in range(cfg.sft.num_epochs):
        for mb in minibatches(batch, num_minibatches, generator=generator):
            mb = mb.to(device)
            logprobs, _ = sequence_logprobs(model, mb)
            mask = mb.response_mask.to(logprobs.dtype)
            loss = -(logprobs * mask).sum() / mask.sum().clamp(min=1)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip or float("inf"))
            optimizer.step()
            losses.append(float(loss.detach()))
    return {"sft/loss_first": losses[0], "sft/loss_last": losses[-1], "sft/steps": float(len(losses))}


def rl_update(model: torch.nn.Module, ref_model: torch.nn.Module | None, optimizer: torch.optim.Optimizer,
              turns: list[Turn], advantages: np.ndarray, cfg: TrainConfig, iteration: int,
              pad_token_id: int) -> dict[str, float]:
    """PPO-style update on one iteration's turns (advantages broadcast to response tokens in packing)."""
    device = next(model.parameters()).device
    if cfg.algorithm.drop_zero_advantage_turns:
        keep = np.flatnonzero(advantages != 0)
        turns, advantages = [turns[i] for i in keep], advantages[keep]
    if not turns:
        return {"loss/skipped": 1.0}
    batch = pack_turns(turns, advantages, pad_token_id=pad_token_id,
                       max_length=cfg.rollout.max_prompt_tokens + cfg.rollout.max_new_tokens)
    loss_cfg = LossConfig(**asdict(cfg.loss))
    # The ratio is taken under the distribution the rollouts were sampled from (logits / T), as
    # verl does; greedy rollouts (T = 0) fall back to the model's own distribution.
    temperature = cfg.rollout.temperature if cfg.rollout.temperature > 0 else 1.0
    # "Old" log-probs are recomputed with the current weights before the update (as verl does):
    # they then match the update's own forward pass exactly at the first minibatch.
    model.eval()
    with torch.no_grad():
        chunks = [sequence_logprobs(model, batch.select(torch.arange(i, min(i + 64, batch.num_rows))).to(device),
                                    temperature=temperature)[0]
                  for i in range(0, batch.num_rows, 64)]
    batch = dataclasses.replace(batch, old_logprobs=torch.cat([c.cpu() for c in chunks]))
    generator = torch.Generator().manual_seed(cfg.seed * 1_000_003 + iteration)
    model.train()
    metrics: dict[str, list[float]] = {}
    for _ in range(cfg.optim.num_epochs):
        for mb in minibatches(batch, min(cfg.optim.num_minibatches, batch.num_rows), generator=generator):
            mb = mb.to(device)
            logprobs, entropy = sequence_logprobs(model, mb, temperature=temperature,
                                                  return_entropy=cfg.loss.entropy_coef > 0)
            ref_logprobs = None
            if ref_model is not None:
                with torch.no_grad():
                    ref_logprobs = sequence_logprobs(ref_model, mb, temperature=temperature)[0]
            loss, step_metrics = total_loss(logprobs, mb.old_logprobs, mb.advantages, mb.response_mask, loss_cfg,
                                            ref_logprobs=ref_logprobs, entropy=entropy)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip or float("inf"))
            optimizer.step()
            step_metrics["loss/grad_norm"] = float(grad_norm)
            for key, value in step_metrics.items():
                metrics.setdefault(key, []).append(value)
    out = {key: float(np.mean(values)) for key, values in metrics.items()}
    out["perf/train_tokens"] = float(batch.attention_mask.sum()) * cfg.optim.num_epochs
    return out


# --- checkpoints ----------------------------------------------------------------------------------


def save_checkpoint(out_dir: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any,
                    iteration: int, history: list[dict[str, Any]], extra: dict[str, Any]) -> None:
    """Everything an exact resume needs; written atomically (tmp file + rename)."""
    state = {
        "iteration": iteration, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(), "history": history, "extra": extra,
        "rng": {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()},
    }
    tmp = out_dir / (CHECKPOINT + ".tmp")
    torch.save(state, tmp)
    tmp.replace(out_dir / CHECKPOINT)


def load_checkpoint(out_dir: Path) -> dict[str, Any]:
    path = out_dir / CHECKPOINT
    if not path.is_file():
        raise ConfigError(f"--resume {out_dir}: no {CHECKPOINT} there; was the run started with --out {out_dir}?")
    return torch.load(path, weights_only=False)


def _schedule(cfg: TrainConfig) -> Callable[[int], float]:
    def factor(step: int) -> float:
        warm = cfg.optim.warmup_iterations
        if warm and step < warm:
            return (step + 1) / warm
        progress = (step - warm) / max(1, cfg.iterations - warm)
        if cfg.optim.schedule == "cosine":
            return 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))
        if cfg.optim.schedule == "linear":
            return max(0.0, 1 - progress)
        return 1.0

    return factor


# --- the run --------------------------------------------------------------------------------------


class Run:
    """Everything a training run holds; ``train`` drives it."""

    def __init__(self, cfg: TrainConfig, out_dir: Path) -> None:
        self.cfg = cfg
        self.out_dir = out_dir
        seed_everything(cfg.seed)
        self.model, self.tokenizer = build_model(cfg)
        self.policy = TransformersPolicy(self.model, self.tokenizer)
        self.ref_model: torch.nn.Module | None = None
        r = cfg.rollout
        self.renderer = PromptRenderer(
            self.tokenizer, mode=r.prompt_mode, window_turns=r.window_turns, action_format=r.action_format,
            system_prompt=r.system_prompt, show_admissible_actions=r.show_admissible_actions,
            include_instructions=r.include_instructions, tool_messages=r.tool_messages)
        self.make_env = env_factory(cfg)
        self.collector = Collector(self.make_env, self.policy, self.renderer, action_format=r.action_format,
                                   max_prompt_tokens=r.max_prompt_tokens)
        self.algorithm = get_algorithm(cfg.algorithm.name)
        self.algorithm_args = self.algorithm.make_args(cfg.algorithm.args)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=cfg.optim.lr, betas=cfg.optim.betas,
                                           weight_decay=cfg.optim.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, _schedule(cfg))
        self.pad_token_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0

    def freeze_reference(self) -> None:
        """The KL anchor is the policy RL starts from (after SFT), never the untrained init."""
        if self.cfg.loss.kl_coef > 0:
            self.ref_model = copy.deepcopy(self.model).eval()
            self.ref_model.requires_grad_(False)

    def sampling(self, temperature: float, seed: int) -> SamplingParams:
        r = self.cfg.rollout
        return SamplingParams(max_new_tokens=r.max_new_tokens, temperature=temperature, top_p=r.top_p,
                              top_k=r.top_k, seed=seed)

    def evaluate(self, tag: str) -> dict[str, Any]:
        """Held-out episodes (seeds from ``eval.seed_offset``), one per task, at ``eval.temperature``."""
        e = self.cfg.eval
        seeds = [e.seed_offset + i for i in range(e.num_episodes)]
        groups = self.collector.collect(seeds, 1, self.sampling(e.temperature, self.cfg.seed + 7),
                                        group_prefix=f"eval-{tag}-")
        return summarize(groups)

    def close(self) -> None:
        self.collector.close()


def train(cfg: TrainConfig, out_dir: str | Path, *, resume: bool = False,
          on_iteration: Callable[[dict[str, Any]], None] | None = None,
          stop_after: int | None = None) -> dict[str, Any]:
    """Run (or resume) a training job; writes checkpoints, metrics, trajectories, report and plot.

    Args:
        cfg: the validated config.
        out_dir: run folder; ``resume=True`` continues the run saved there.
        on_iteration: called with each iteration's metrics (the CLI's progress bar).
        stop_after: stop after this iteration number without finishing the run (tests use it to
            simulate a killed run; the checkpoint of that iteration is written first).

    Returns:
        The report (also written to ``out_dir/report.json``).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "trajectories").mkdir(exist_ok=True)
    started = time.perf_counter()
    run = Run(cfg, out)
    history: list[dict[str, Any]] = []
    extra: dict[str, Any] = {}
    start_iteration = 0
    try:
        if resume:
            state = load_checkpoint(out)
            run.model.load_state_dict(state["model"])
            run.optimizer.load_state_dict(state["optimizer"])
            run.scheduler.load_state_dict(state["scheduler"])
            random.setstate(state["rng"]["python"])
            np.random.set_state(state["rng"]["numpy"])
            torch.set_rng_state(state["rng"]["torch"])
            history, extra, start_iteration = state["history"], state["extra"], state["iteration"]
            # Iterations logged after the last checkpoint never happened as far as the resumed run
            # is concerned: rewrite the log from the checkpoint's history.
            (out / "metrics.jsonl").write_text("".join(json.dumps(h) + "\n" for h in history))
        else:
            (out / "config.json").write_text(json.dumps(config_to_dict(cfg), indent=2))
            (out / "metrics.jsonl").write_text("")
            extra["eval_before_sft"] = run.evaluate("before") if cfg.sft.enabled else None
            if cfg.sft.enabled:
                demo_seeds = [cfg.sft.seed_offset + i for i in range(cfg.sft.num_episodes)]
                demos, demo_stats = collect_demos(run.make_env, run.renderer, demo_seeds,
                                                  action_format=cfg.rollout.action_format)
                extra["sft"] = {**demo_stats, **sft_update(run.model, demos, cfg, run.pad_token_id)}
            extra["eval_before"] = run.evaluate("before-rl")
            torch.save(run.model.state_dict(), out / "reference.pt")
        if cfg.loss.kl_coef > 0:
            # Resumed runs rebuild the same anchor from the saved post-SFT weights.
            current = copy.deepcopy(run.model.state_dict())
            run.model.load_state_dict(torch.load(out / "reference.pt", weights_only=True))
            run.freeze_reference()
            run.model.load_state_dict(current)
        writer = _tensorboard(out)

        for iteration in range(start_iteration + 1, cfg.iterations + 1):
            it_started = time.perf_counter()
            # --- collect ---------------------------------------------------------------------
            groups = run.collector.collect(task_seeds(cfg, iteration), cfg.rollout.group_size,
                                           run.sampling(cfg.rollout.temperature, cfg.seed * 100_003 + iteration),
                                           group_prefix=f"it{iteration}-g")
            collect_stats = run.collector.last_stats
            _write_trajectories(out / "trajectories" / f"iter_{iteration:05d}.jsonl", groups)
            # --- estimate ---------------------------------------------------------------------
            turns = flatten(groups)
            advantages = run.algorithm.estimator(groups, run.algorithm_args)
            # --- update (policy weights are shared with the generation backend: nothing to sync) --
            update_started = time.perf_counter()
            update_metrics = rl_update(run.model, run.ref_model, run.optimizer, turns, advantages, cfg, iteration,
                                       run.pad_token_id)
            run.scheduler.step()
            run.policy.sync_weights(None)
            update_s = time.perf_counter() - update_started
            # --- log --------------------------------------------------------------------------
            iteration_s = time.perf_counter() - it_started
            metrics = _iteration_metrics(iteration, groups, advantages, update_metrics, collect_stats, update_s,
                                         iteration_s, run.scheduler.get_last_lr()[0])
            if cfg.eval.every and iteration % cfg.eval.every == 0 and iteration != cfg.iterations:
                metrics["eval/success_rate"] = run.evaluate(f"it{iteration}")["success_rate"]
            history.append(metrics)
            with open(out / "metrics.jsonl", "a") as fh:
                fh.write(json.dumps(metrics) + "\n")
            if writer is not None:
                for key, value in metrics.items():
                    if isinstance(value, (int, float)) and key != "iteration":
                        writer.add_scalar(key, value, iteration)
            if on_iteration is not None:
                on_iteration(metrics)
            if (cfg.checkpoint_every and iteration % cfg.checkpoint_every == 0) or iteration == cfg.iterations \
                    or iteration == stop_after:
                extra_now = {**extra, "elapsed_s": extra.get("elapsed_s", 0.0) + time.perf_counter() - started}
                save_checkpoint(out, run.model, run.optimizer, run.scheduler, iteration, history, extra_now)
            if stop_after is not None and iteration >= stop_after:
                return {"stopped_after": iteration, "history": history}

        eval_after = run.evaluate("after")
        report = {
            "algorithm": cfg.algorithm.name,
            "env": cfg.env.id,
            "iterations": cfg.iterations,
            "wall_time_s": extra.get("elapsed_s", 0.0) + time.perf_counter() - started,
            "eval": {"before": extra["eval_before"], "after": eval_after,
                     "before_sft": extra.get("eval_before_sft")},
            "sft": extra.get("sft"),
            "history": history,
            "config": config_to_dict(cfg),
        }
        (out / "report.json").write_text(json.dumps(report, indent=2))
        run.model.save_pretrained(out / "model")
        run.tokenizer.save_pretrained(out / "model")
        plot_learning_curve(report, out / "learning_curve.png")
        if writer is not None:
            writer.close()
        return report
    finally:
        run.close()


def _tensorboard(out: Path) -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:  # tensorboard is in the train extra; metrics.jsonl is always written
        return None
    return SummaryWriter(str(out / "tensorboard"))


def _write_trajectories(path: Path, groups: list[EpisodeGroup]) -> None:
    with open(path, "w") as fh:
        fh.writelines(json.dumps(group.to_json()) + "\n" for group in groups)


def _iteration_metrics(iteration: int, groups: list[EpisodeGroup], advantages: np.ndarray,
                       update: dict[str, float], stats: Any, update_s: float, iteration_s: float,
                       lr: float) -> dict[str, Any]:
    summary = summarize(groups)
    outside = iteration_s - stats.generate_s - update_s
    metrics: dict[str, Any] = {
        "iteration": iteration,
        "rollout/success_rate": summary["success_rate"],
        "rollout/mean_turns": summary["mean_turns"],
        "rollout/invalid_rate": summary["invalid_rate"],
        "rollout/truncation_rate": summary["truncation_rate"],
        "rollout/turns": stats.turns,
        "reward/mean_return": summary["mean_return"],
        "adv/mean": float(advantages.mean()) if advantages.size else 0.0,
        "adv/std": float(advantages.std()) if advantages.size else 0.0,
        "adv/abs_mean": float(np.abs(advantages).mean()) if advantages.size else 0.0,
        "adv/zero_frac": float((advantages == 0).mean()) if advantages.size else 0.0,
        "perf/iteration_s": iteration_s,
        "perf/generate_s": stats.generate_s,
        "perf/env_s": stats.env_s,
        "perf/update_s": update_s,
        "perf/overhead_frac": max(0.0, outside) / iteration_s if iteration_s else 0.0,
        "perf/gen_tokens_per_s": stats.generated_tokens / stats.generate_s if stats.generate_s else 0.0,
        "perf/lr": lr,
    }
    metrics.update(update)
    if "perf/train_tokens" in update and update_s > 0:
        metrics["perf/train_tokens_per_s"] = update["perf/train_tokens"] / update_s
    return metrics


def plot_learning_curve(report: dict[str, Any], path: Path) -> None:
    """Training-rollout success per iteration, with the held-out evals before and after."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    history = report["history"]
    fig, ax = plt.subplots(figsize=(7, 4))
    xs = [h["iteration"] for h in history]
    ax.plot(xs, [h["rollout/success_rate"] for h in history], label="training rollouts (sampled)")
    evals = [(h["iteration"], h["eval/success_rate"]) for h in history if "eval/success_rate" in h]
    points = [(0, report["eval"]["before"]["success_rate"]), *evals,
              (report["iterations"], report["eval"]["after"]["success_rate"])]
    ax.plot([p[0] for p in points], [p[1] for p in points], "o--", label="held-out eval (greedy)")
    ax.set_xlabel("iteration")
    ax.set_ylabel("success rate")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(f"{report['algorithm']} on {report['env']}")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
