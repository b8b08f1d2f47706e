"""The two updates: ``PolicyUpdate`` (RL: phases × epochs × minibatches of policy loss + loss terms) and
``sft_update``.

``PolicyUpdate`` is built once per run from the run's plug-ins (policy loss, loss terms, update plan) and
called once per iteration with the iteration's turns and advantages. For every phase of the plan it
packs the phase's turns (advantages broadcast to response tokens in one place: ``pack_turns``),
recomputes the "old" log-probs with the current weights (as verl does: they then match the first
minibatch's own forward pass exactly), and takes ``optim.num_epochs`` passes of
``optim.num_minibatches`` optimiser steps. Under several processes each takes its share of every
minibatch's rows, in micro-batches of at most ``optim.micro_batch_tokens`` padded tokens, with the
loss normalised over the whole minibatch (``agentgym.training.run.distributed``): the run's
``Aggregation`` (``agentgym.training.engine.aggregation``), built once from ``loss``, weighs each
micro-batch and, resolved for each minibatch, reduces the policy loss and the loss terms.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

import agentgym.training.engine.losses  # noqa: F401  (registers the built-in policy losses' functions)
from agentgym.errors import ConfigError
from agentgym.rollout.records import Turn
from agentgym.training.api.aggregation import Aggregation
from agentgym.training.api.terms import ForwardOutputs, total_loss
from agentgym.training.api.turn_table import TurnTable
from agentgym.training.engine.offpolicy import DEFAULT_CAP, importance_corrected
from agentgym.training.engine.packing import (
    TokenBatch,
    minibatches,
    pack_turns,
    sequence_logprobs,
    token_minibatches,
)
from agentgym.training.engine.prefix import prefix_order, shared_prefix_logprobs
from agentgym.training.engine.processes import OneProcess, Processes

if TYPE_CHECKING:
    from agentgym.training.api.plugin_set import PluginSet
    from agentgym.training.config.schema import LossConfig, OptimConfig, SFTConfig

#: Rows per no-grad forward pass when recomputing log-probs (bounds activation memory).
LOGPROB_CHUNK_ROWS = 64


class PolicyUpdate:
    """The RL update step of a run.

    Args:
        model: the policy model being trained.
        optimizer: its optimiser.
        plugins: the run's plug-ins (policy loss, loss terms, update plan).
        loss: the loss settings.
        optim: epochs, minibatches, gradient clipping.
        temperature: the sampling temperature; ratios are taken under the distribution the rollouts
            were drawn from (logits / T), as verl does; greedy rollouts (0) use T = 1.
        max_length: longest packed row (prompt cut from the left beyond it).
        pad_token_id: id written into padding.
        seed: the run's seed (minibatch order derives from it and the iteration).
        drop_zero_advantage_turns: leave rows whose advantage is exactly 0 out.
        ref_model: the frozen reference policy, needed when a loss term reads reference log-probs.
        dist: the run's processes (default: this one alone); ``model`` is then the wrapped model.
        micro_batch_tokens: budget of padded tokens per forward/backward pass (gradient accumulation
            within a minibatch); None: one pass per process and minibatch.
        tis_cap: truncated importance sampling: weight each response token's policy loss by
            min(π_old / π_sampler, tis_cap), the gap between the trainer's recomputed log-probs and the
            sampler's (``agentgym.training.engine.offpolicy``); None: no correction unless the batch is stale.
        poll: called between log-prob chunks, minibatches and micro-batches; what it raises ends the
            update there (a run's stop: ``StopSignals.poll``). None: the update always runs to its end.
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, plugins: PluginSet,
                 loss: LossConfig, optim: OptimConfig, *, temperature: float, max_length: int,
                 pad_token_id: int, seed: int, drop_zero_advantage_turns: bool = False,
                 ref_model: torch.nn.Module | None = None,
                 dist: Processes | None = None, micro_batch_tokens: int | None = None,
                 response_logits: bool = False, share_prefixes: bool = False,
                 tis_cap: float | None = None, poll: Callable[[], None] | None = None) -> None:
        self.model = model
        self.optimizer = optimizer
        self.plugins = plugins
        self.loss_cfg = loss
        self.agg = Aggregation.from_config(loss)
        """How the loss aggregates (``loss.loss_agg_mode``); ``for_minibatch`` resolves it per minibatch."""
        self.optim = optim
        self.temperature = temperature if temperature > 0 else 1.0
        self.max_length = max_length
        self.pad_token_id = pad_token_id
        self.seed = seed
        self.drop_zero_advantage_turns = drop_zero_advantage_turns
        self.ref_model = ref_model
        self.dist: Processes = dist or OneProcess()
        self.micro_batch_tokens = micro_batch_tokens
        self.all_positions = not response_logits
        if share_prefixes and self.dist.world_size > 1:
            raise ConfigError("optim.share_prefixes runs in one process (two passes per segment do not fit "
                              "the gradient synchronisation of several); set it to false to run distributed")
        self.share_prefixes = share_prefixes
        self.tis_cap = tis_cap
        self.poll = poll
        self.stepped = False
        """The last call changed the weights (an optimiser step began): cut short now, it leaves them
        neither before nor after the update."""

    def _poll(self) -> None:
        if self.poll is not None:
            self.poll()

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def __call__(self, turns: Sequence[Turn], advantages: np.ndarray, table: TurnTable,
                 iteration: int, *, staleness: int = 0) -> dict[str, float]:
        """Update on one iteration's turns; returns metrics (means over minibatches).

        ``table`` is the turns' ``TurnTable`` (same order; ``TurnTable.of(groups)``, the estimator's):
        the plan splits on it and packing takes each row's turn position from it.

        ``staleness``: updates made since the turns were sampled (asynchronous rollouts); a stale batch
        is always importance-corrected (cap ``tis_cap``, or ``offpolicy.DEFAULT_CAP``).
        """
        cap = self.tis_cap if self.tis_cap is not None else (DEFAULT_CAP if staleness > 0 else None)
        self.stepped = False
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + iteration)
        plan = self.plugins.plan
        collected: dict[str, list[float]] = {}
        train_tokens = loss_tokens = 0.0
        phases = plan.phases(table)
        for phase in phases:
            rows = phase.rows
            phase_advantages = np.asarray(plan.advantages(phase, table, advantages[rows]), dtype=np.float64)
            if self.drop_zero_advantage_turns:
                keep = phase_advantages != 0
                rows, phase_advantages = rows[keep], phase_advantages[keep]
            if rows.size == 0:
                continue
            batch = pack_turns([turns[i] for i in rows], phase_advantages, pad_token_id=self.pad_token_id,
                               max_length=self.max_length, skip_forced=self.loss_cfg.skip_forced_tokens,
                               turn_step=table.step[rows])
            # One optimiser step on the phase's rows: its forward pass sees the old weights itself.
            reuse = self.optim.old_logprobs_from_update and not plan.wants_logprobs_after
            if not reuse:
                old = self.logprobs(batch)
                if cap is not None:
                    batch = importance_corrected(batch, old, cap, collected)
                batch = dataclasses.replace(batch, old_logprobs=old)
            self.model.train()
            for _ in range(self.optim.num_epochs):
                num_minibatches = min(self.optim.num_minibatches, batch.num_rows)
                for mb in minibatches(batch, num_minibatches, generator=generator):
                    self._poll()
                    for key, value in self._step(mb, old_from_pass=reuse, cap=cap).items():
                        collected.setdefault(key, []).append(value)
            train_tokens += float(batch.attention_mask.sum()) * self.optim.num_epochs
            loss_tokens += float(batch.response_mask.sum())
            if plan.wants_logprobs_after:
                new = self.logprobs(batch)
                mask = batch.response_mask.bool()
                for key, value in plan.after_phase(phase, table, _rows(old, mask), _rows(new, mask)).items():
                    collected.setdefault(key, []).append(value)
        if not collected:
            return {"loss/skipped": 1.0}
        out = {key: float(np.mean(values)) for key, values in collected.items()}
        out["perf/train_tokens"] = train_tokens
        # Response tokens in the loss (forced ones left out on request).
        out["update/loss_tokens"] = loss_tokens
        out["perf/update_phases"] = float(len(phases))
        return out

    def logprobs(self, batch: TokenBatch) -> torch.Tensor:
        """Log-probs of the batch's tokens under the current weights (no grad), on the CPU; each process
        computes its share of the rows and the shares are gathered."""
        self.model.eval()
        mine = batch.select(self.dist.shard(batch.num_rows))
        order = prefix_order(mine) if self.share_prefixes else torch.arange(mine.num_rows)
        with torch.no_grad(), self.dist.autocast():
            chunks = []
            for i in range(0, mine.num_rows, LOGPROB_CHUNK_ROWS):
                self._poll()
                rows = mine.select(order[i : i + LOGPROB_CHUNK_ROWS]).to(self.device)
                logprobs, _ = self._sequence_logprobs(self.model, rows)
                chunks.append(logprobs.float().cpu())  # select keeps the batch's width
        local = torch.zeros((mine.num_rows, batch.seq_len))
        if chunks:
            local[order] = torch.cat(chunks)
        return self.dist.gather_rows(local, batch.num_rows)

    def _sequence_logprobs(self, model: torch.nn.Module, part: TokenBatch,
                           return_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``sequence_logprobs`` of ``part``, or its shared-prefix form (``optim.share_prefixes``)."""
        compute = shared_prefix_logprobs if self.share_prefixes else sequence_logprobs
        return compute(model, part, temperature=self.temperature, return_entropy=return_entropy,
                       all_positions=self.all_positions)

    def micro_batches(self, mb: TokenBatch) -> list[tuple[TokenBatch, float]]:
        """This process's micro-batches of minibatch ``mb``, each with its loss weight
        (``Aggregation.weight``: its share of the minibatch's aggregation units, or 1 where micro-batch
        losses add up), so weighted losses summed over micro-batches and processes equal the loss of
        ``mb`` in one piece. A process left without rows gets one row at weight 0 (every process must
        run a backward pass for the gradient all-reduce)."""
        rows = self.dist.shard(mb.num_rows)
        mine = mb.select(rows or [0]).trim()
        if self.share_prefixes:  # rows with common prefixes side by side, so that passes share them
            mine = mine.select(prefix_order(mine))
        if self.micro_batch_tokens is None:
            parts = [mine]
        else:
            parts = token_minibatches(mine, self.micro_batch_tokens, shuffle=False)
        if not rows:
            return [(parts[0].select([0]).trim(), 0.0)]
        return [(part, self.agg.weight(part.response_mask, mb.response_mask)) for part in parts]

    def _step(self, mb: TokenBatch, *, old_from_pass: bool = False,
              cap: float | None = None) -> dict[str, float]:
        """One optimiser step on minibatch ``mb``. ``old_from_pass``: ``mb.old_logprobs`` are still the
        sampler's, and each micro-batch's old log-probs are its own forward pass's, detached (importance-
        corrected against the sampler's with ``cap`` when set)."""
        plugins, dist = self.plugins, self.dist
        # L of seq-mean-token-sum-norm: the padded width of the whole minibatch, not of each (trimmed)
        # micro-batch, so every micro-batch divides by the same constant.
        agg = self.agg.for_minibatch(mb.response_mask)
        parts = self.micro_batches(mb)
        self.optimizer.zero_grad(set_to_none=True)
        sums: dict[str, float] = {}
        for index, (part, weight) in enumerate(parts):
            self._poll()
            part = part.to(self.device)
            sync = dist.no_sync(self.model) if index < len(parts) - 1 else contextlib.nullcontext()
            with sync:
                with dist.autocast():
                    logprobs, entropy = self._sequence_logprobs(self.model, part, plugins.needs_entropy)
                    if old_from_pass:
                        old = logprobs.detach().float() * part.response_mask
                        if cap is not None:
                            corrections: dict[str, list[float]] = {}
                            part = importance_corrected(part, old, cap, corrections)
                            tokens = float(part.response_mask.sum()) / max(float(mb.response_mask.sum()), 1.0)
                            for key, values in corrections.items():  # token means, like the separate pass's
                                sums[key] = sums.get(key, 0.0) + values[0] * tokens
                        part = dataclasses.replace(part, old_logprobs=old)
                    ref_logprobs = None
                    if plugins.needs_reference:
                        with torch.no_grad():
                            ref_logprobs, _ = self._sequence_logprobs(self.ref_model, part)
                outputs = ForwardOutputs(logprobs.float(), None if entropy is None else entropy.float(),
                                         None if ref_logprobs is None else ref_logprobs.float(), agg=agg)
                loss, metrics = total_loss(plugins.policy_loss, plugins.terms, part, outputs, self.loss_cfg)
                # Gradients are averaged over processes (DDP/FSDP): scale up so they add up instead.
                dist.backward(loss * (weight * dist.world_size))
            # Metrics are weighted like the loss, or by token share where micro-batch losses add up
            # (Aggregation.metric_share); a process's stand-in row (weight 0) counts for nothing.
            share = agg.metric_share(part.response_mask, mb.response_mask) if weight else 0.0
            for key, value in metrics.items():
                sums[key] = sums.get(key, 0.0) + share * value
        names = sorted(sums)
        totals = dist.sum(torch.tensor([sums[k] for k in names], dtype=torch.float64)).tolist()
        grad_norm = dist.clip_grad_norm([p for p in self.model.parameters() if p.requires_grad],
                                        self.optim.grad_clip or float("inf"))
        self._poll()
        self.stepped = True  # before the step: a stop raised inside it leaves the weights half-updated
        self.optimizer.step()
        out = dict(zip(names, totals, strict=True))
        out["loss/grad_norm"] = float(grad_norm)
        return out


def _rows(values: torch.Tensor, mask: torch.Tensor) -> list[np.ndarray]:
    """Per row, the values at the masked (response) positions."""
    return [values[i][mask[i]].numpy().astype(np.float64) for i in range(values.shape[0])]


def sft_update(model: torch.nn.Module, turns: list[Turn], cfg: SFTConfig, *, max_length: int,
               pad_token_id: int, grad_clip: float, seed: int,
               on_step: Callable[[int, int, float], None] | None = None,
               poll: Callable[[], None] | None = None, response_logits: bool = False,
               share_prefixes: bool = False) -> dict[str, Any]:
    """Cross-entropy on the expert's response tokens (prompt tokens are masked out).

    ``on_step(step, total_steps, loss)`` is called after every optimiser step (progress display);
    ``poll()`` before every minibatch: what it raises ends the warm start there (a run's stop).
    ``response_logits`` and ``share_prefixes`` are the RL update's options (``OptimConfig``) applied to
    these passes: the demonstrations' turns share the env's instructions and their episodes' histories.
    """
    device = next(model.parameters()).device
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    batch = pack_turns(turns, np.zeros(len(turns)), pad_token_id=pad_token_id, max_length=max_length)
    generator = torch.Generator().manual_seed(seed)
    num_minibatches = max(1, math.ceil(batch.num_rows / cfg.batch_size))
    model.train()
    losses = []
    total_steps = cfg.num_epochs * num_minibatches
    compute = shared_prefix_logprobs if share_prefixes else sequence_logprobs
    for _ in range(cfg.num_epochs):
        for mb in minibatches(batch, num_minibatches, generator=generator):
            if poll is not None:
                poll()
            mb = mb.to(device)
            if share_prefixes:  # the loss is a sum over rows: their order is free
                mb = mb.select(prefix_order(mb))
            logprobs, _ = compute(model, mb, all_positions=not response_logits)
            mask = mb.response_mask.to(logprobs.dtype)
            loss = -(logprobs * mask).sum() / mask.sum().clamp(min=1)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip or float("inf"))
            optimizer.step()
            losses.append(float(loss.detach()))
            if on_step is not None:
                on_step(len(losses), total_steps, losses[-1])
    return {"sft/loss_first": losses[0], "sft/loss_last": losses[-1], "sft/steps": float(len(losses))}
