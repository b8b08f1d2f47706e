"""PPO with a learned critic: turn-level GAE advantages from a value model (``ppo``).

The critic baseline of the field (Schulman et al. 2017 with GAE, Schulman et al. 2016, applied at the
level of turns as multi-turn agent papers do): a value model reads the prompt of each turn (the state
the action was taken in) and predicts the discounted return from there, at the turn's last prompt
token. Advantages are GAE over turns,

    δ_t = r_t + γ V(s_{t+1}) − V(s_t),    Â_t = Σ_k (γλ)^k δ_{t+k},

with V = 0 after an episode's last turn, then normalised over the batch. No group baseline: it works
with ``rollout.group_size: 1``.

Plug-in points used, nothing in the loop knows of it:

- a **rollout hook** (``ValueCritic``) owns the critic — a small transformer with a value head, its own
  AdamW state, built on the first batch from the tokenizer's vocabulary. After each collection it writes
  every turn's value under the *current* critic into ``Turn.extras["critic_value"]`` (so the advantages
  use the values the batch was collected under, as PPO does), then fits the critic to the batch's
  λ-returns ``Â_t + V(s_t)`` for ``critic_epochs`` passes; its weights and optimizer state are the
  hook's state, saved in checkpoints (resume is exact);
- the **estimator** (``ppo_advantages``) is a pure function of the records: GAE from the rewards and
  the recorded values, vectorised over turns (``discounted_returns`` with rewards δ and discount γλ).

An episode cut by the turn budget is treated as ended (its last state's value is not recorded, so
there is nothing to bootstrap from); set ``gamma < 1`` to keep such tails short.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from agentgym.errors import ConfigError
from agentgym.rollout.hooks import CollectContext, RolloutHooks
from agentgym.rollout.records import EpisodeGroup
from agentgym.training.api import TurnTable, discounted_returns, last_turns, register_algorithm

#: ``Turn.extras`` key of the critic's value of the turn's prompt (written by ``ValueCritic``).
VALUE_KEY = "critic_value"


@dataclass(frozen=True)
class PPOArgs:
    """Arguments of ``ppo`` (GAE and the critic)."""

    gamma: float = 0.95
    """Discount over turns."""
    lam: float = 0.95
    """GAE λ: 0 gives one-step TD advantages, 1 Monte-Carlo returns minus the value."""
    normalize: bool = True
    """Normalise the advantages over the batch (mean 0, std 1), as PPO implementations do."""
    epsilon: float = 1e-6
    """Added to the std of the normalisation."""
    invalid_action_penalty: float = 0.0
    """Subtracted from the reward of a turn whose action was invalid."""
    critic_hidden_size: int = 64
    """Width of the critic's transformer."""
    critic_layers: int = 2
    """Its decoder layers."""
    critic_heads: int = 4
    """Its attention heads (``critic_hidden_size`` must be a multiple)."""
    critic_lr: float = 1e-3
    """AdamW learning rate of the critic."""
    critic_epochs: int = 2
    """Passes over each batch's turns when the critic is fitted."""
    critic_minibatch: int = 64
    """Turns per critic optimiser step."""
    critic_grad_clip: float = 1.0
    """Gradient-norm clip of the critic's steps."""
    critic_max_tokens: int = 1024
    """The critic reads at most this many last tokens of a prompt."""
    critic_seed: int = 0
    """Seeds the critic's initial weights and its minibatch order (with the iteration)."""

    def __post_init__(self) -> None:
        for name in ("gamma", "lam"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ConfigError(f"algorithm.args.{name} must be in [0, 1], got {value}")
        for name in ("critic_hidden_size", "critic_layers", "critic_heads", "critic_epochs",
                     "critic_minibatch", "critic_max_tokens"):
            if getattr(self, name) < 1:
                raise ConfigError(f"algorithm.args.{name} must be >= 1, got {getattr(self, name)}")
        if self.critic_hidden_size % self.critic_heads:
            raise ConfigError(f"algorithm.args.critic_hidden_size={self.critic_hidden_size} is not a "
                              f"multiple of critic_heads={self.critic_heads}")
        if not self.critic_lr > 0:
            raise ConfigError(f"algorithm.args.critic_lr must be > 0, got {self.critic_lr}")


def gae(table: TurnTable, values: np.ndarray, gamma: float, lam: float,
        invalid_action_penalty: float = 0.0) -> np.ndarray:
    """Turn-level GAE, shape (num_turns,): Â_t = δ_t + γλ Â_{t+1} with δ_t = r_t + γ V_{t+1} − V_t and
    V = 0 past a trajectory's last turn.

    Example:
        >>> from agentgym.rollout.records import Trajectory, Turn
        >>> turns = [Turn([], [], [], r, "s") for r in (0.0, 1.0)]
        >>> table = TurnTable.from_groups([EpisodeGroup("g", "t", 0, [Trajectory(turns, "t", 0)])])
        >>> # δ = (0 + 0.5·0.8 − 0.2, 1 − 0.8) = (0.2, 0.2); Â = (0.2 + 0.5·0.5·0.2, 0.2)
        >>> gae(table, np.array([0.2, 0.8]), gamma=0.5, lam=0.5).round(6).tolist()
        [0.25, 0.2]
    """
    n = table.num_turns
    if n == 0:
        return np.zeros(0)
    following = np.where(last_turns(table), 0.0, np.r_[values[1:], 0.0])
    rewards = table.reward - invalid_action_penalty * table.invalid
    delta = rewards + gamma * following - values
    return discounted_returns(replace(table, reward=delta), gamma * lam)


def recorded_values(groups: Sequence[EpisodeGroup]) -> np.ndarray:
    """The critic's value of every turn (``Turn.extras["critic_value"]``), shape (num_turns,).

    Raises:
        ConfigError: a turn has none (the ``ppo`` rollout hook did not run on these groups).
    """
    values = [turn.extras.get(VALUE_KEY) for g in groups for t in g.trajectories for turn in t.turns]
    if any(v is None for v in values):
        raise ConfigError("ppo needs the critic's value of every turn (Turn.extras['critic_value']), written "
                          "by its rollout hook; collect with algorithm.name=ppo")
    return np.asarray(values, dtype=np.float64)


def ppo_advantages(groups: Sequence[EpisodeGroup], args: PPOArgs) -> np.ndarray:
    """GAE advantages from the recorded critic values (``gae``), normalised over the batch when
    ``args.normalize``.

    Example:
        >>> from agentgym.rollout.records import Trajectory, Turn
        >>> def turn(r, v): return Turn([], [], [], r, "s", extras={VALUE_KEY: v})
        >>> group = EpisodeGroup("g", "t", 0, [Trajectory([turn(0.0, 0.5), turn(1.0, 0.5)], "t", 0)])
        >>> ppo_advantages([group], PPOArgs(gamma=1.0, lam=1.0, normalize=False)).tolist()
        [0.5, 0.5]
    """
    table = TurnTable.of(groups)
    advantages = gae(table, recorded_values(groups), args.gamma, args.lam, args.invalid_action_penalty)
    if args.normalize and advantages.size > 1:
        advantages = (advantages - advantages.mean()) / (advantages.std() + args.epsilon)
    return advantages


class ValueCritic(RolloutHooks):
    """The ``ppo`` critic as a rollout hook: values each collected turn, then fits itself to the batch's
    λ-returns (see the module docstring). Metrics: ``critic/value_loss`` (mean over the fit),
    ``critic/explained_variance`` of the λ-returns by the values the batch was collected under, and
    ``critic/value_mean``."""

    def __init__(self, args: PPOArgs) -> None:
        self.args = args
        self.model: Any = None
        self.optimizer: Any = None
        self._metrics: dict[str, float] = {}
        self._iteration = 0
        self._pending: dict[str, Any] | None = None

    # --- the critic ---------------------------------------------------------------------------------

    def build(self, vocab_size: int) -> None:
        """The critic (a small Llama decoder with a linear value head) and its optimizer."""
        import torch
        from transformers import LlamaConfig, LlamaModel

        a = self.args
        config = LlamaConfig(vocab_size=vocab_size, hidden_size=a.critic_hidden_size,
                             intermediate_size=3 * a.critic_hidden_size, num_hidden_layers=a.critic_layers,
                             num_attention_heads=a.critic_heads, num_key_value_heads=a.critic_heads,
                             max_position_embeddings=a.critic_max_tokens, tie_word_embeddings=False)
        with torch.random.fork_rng(devices=[]):  # the run's own random streams stay untouched
            torch.manual_seed(a.critic_seed)
            body = LlamaModel(config)
            head = torch.nn.Linear(a.critic_hidden_size, 1)
            torch.nn.init.zeros_(head.weight)
            torch.nn.init.zeros_(head.bias)
        self.model = torch.nn.ModuleDict({"body": body, "head": head})
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=a.critic_lr)
        if self._pending is not None:  # a checkpoint loaded before the first batch built the critic
            self.model.load_state_dict(self._pending["model"])
            self.optimizer.load_state_dict(self._pending["optimizer"])
            self._pending = None

    def values(self, prompts: Sequence[Sequence[int]]) -> Any:
        """V of each prompt (a float tensor, shape (len(prompts),)), read at its last token, with grad
        when grad is enabled."""
        import torch

        keep = self.args.critic_max_tokens
        rows = [list(p[-keep:]) or [0] for p in prompts]
        width = max(len(r) for r in rows)
        ids = torch.zeros((len(rows), width), dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):  # left padding: every row's last token is at the last position
            ids[i, width - len(row):] = torch.tensor(row)
            mask[i, width - len(row):] = 1
        hidden = self.model["body"](input_ids=ids, attention_mask=mask).last_hidden_state[:, -1]
        return self.model["head"](hidden).squeeze(-1)

    def _values_no_grad(self, prompts: Sequence[Sequence[int]]) -> np.ndarray:
        import torch

        out = np.zeros(len(prompts))
        step = self.args.critic_minibatch
        with torch.no_grad():
            for start in range(0, len(prompts), step):
                out[start:start + step] = self.values(prompts[start:start + step]).double().numpy()
        return out

    def fit(self, prompts: Sequence[Sequence[int]], targets: np.ndarray) -> float:
        """``critic_epochs`` passes of minibatch regression of V onto ``targets``; the mean loss."""
        import torch

        a = self.args
        rng = np.random.default_rng([a.critic_seed, self._iteration])
        target = torch.as_tensor(targets, dtype=torch.float32)
        losses = []
        for _ in range(a.critic_epochs):
            order = rng.permutation(len(prompts))
            for start in range(0, len(order), a.critic_minibatch):
                chosen = order[start:start + a.critic_minibatch]
                predicted = self.values([prompts[i] for i in chosen])
                loss = 0.5 * torch.mean((predicted - target[chosen]) ** 2)
                self.optimizer.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), a.critic_grad_clip)
                self.optimizer.step()
                losses.append(loss.item())
        return float(np.mean(losses)) if losses else 0.0

    # --- the hook ------------------------------------------------------------------------------------

    def begin_iteration(self, iteration: int, context: CollectContext) -> None:
        self._iteration = iteration
        self._metrics = {}

    def after_collect(self, groups: list[EpisodeGroup], context: CollectContext) -> list[EpisodeGroup]:
        prompts = [turn.prompt_ids for g in groups for t in g.trajectories for turn in t.turns]
        if not prompts:
            return groups
        if self.model is None:
            tokenizer = context.tokenizer
            largest_id = max(max(p, default=0) for p in prompts)
            sizes = [len(tokenizer) if hasattr(tokenizer, "__len__") else 0,  # type: ignore[arg-type]
                     int(getattr(tokenizer, "vocab_size", 0) or 0), largest_id + 1]
            self.build(max(sizes))
        values = self._values_no_grad(prompts)
        table = TurnTable.from_groups(groups)
        a = self.args
        targets = gae(table, values, a.gamma, a.lam, a.invalid_action_penalty) + values
        variance = float(np.var(targets))
        self._metrics = {"critic/value_mean": float(values.mean()),
                         "critic/value_loss": self.fit(prompts, targets)}
        if variance > 0:  # undefined when every target is equal
            self._metrics["critic/explained_variance"] = 1.0 - float(np.var(targets - values)) / variance
        flat = iter(values.tolist())

        def valued(turn: Any) -> Any:
            return replace(turn, extras={**turn.extras, VALUE_KEY: next(flat)})

        return [replace(g, trajectories=[replace(t, turns=[valued(turn) for turn in t.turns])
                                         for t in g.trajectories]) for g in groups]

    def metrics(self) -> dict[str, float]:
        return dict(self._metrics)

    def state_dict(self) -> dict[str, Any]:
        if self.model is None:
            return {}
        # Copies: the live tensors go on changing with the next fit.
        return copy.deepcopy({"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()})

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if not state:
            return
        if self.model is None:  # built on the first batch (its vocabulary comes from the tokenizer)
            self._pending = dict(state)
            return
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])


register_algorithm("ppo", ppo_advantages, PPOArgs, hooks=ValueCritic, min_group_size=1,
                   description="PPO with a learned critic: turn-level GAE from a value model (no group "
                               "baseline)")
