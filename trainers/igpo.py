"""IGPO: information-gain-based policy optimisation (``igpo``; arXiv 2510.14967, ICLR 2026).

Every turn that does not end the episode earns an *information-gain* reward: how much more likely
the policy finds the ground-truth answer after the turn's env/tool reply than before it,

    v(c) = mean_j log π_θ(a_j | c, prefix, a_<j)          (teacher-forced, over the answer's tokens)
    IG_t = v(c_{t+1}) − v(c_t)        (``log_prob_diff``)   or   exp v(c_{t+1}) − exp v(c_t)   (``prob_diff``)

where c_t is the context the policy saw before turn t (its prompt), a the env's privileged
``info["answer"]`` (first alternative when there are several) and ``prefix`` a fixed text that
opens an answer (``<answer>`` for search-qa). The last turn gets the outcome reward (the
trajectory's return) instead. Rewards are normalised within the episode group (``joint``: outcome
and IG values pooled; ``separate``: each z-scored on its own; population std), then every turn's
advantage is its discounted sum of later normalised rewards, A_t = r̃_t + γ A_{t+1}.

Scoring is one batched teacher-forced pass after collection (``IGPOScoring``, an ``after_collect``
hook): a turn's recorded prompt is exactly the context after the previous observation, so the
values of all turns of all trajectories — identical prompts scored once — come from the policy's
``Scorer.score`` with the weights that sampled them (the reference scores before each generation
round with the same weights; its v2 option ``use_vectorized_gt_logprob`` batches after the rollout
too). The answer never enters a prompt: it is only ever appended to a copy of one, for scoring.
Metrics: ``igpo/score_s`` (the pass's wall time; compare with ``perf/generate_s``),
``igpo/scored_contexts``, ``igpo/scored_tokens``, ``igpo/info_gain_mean``, ``igpo/info_gain_pos_frac``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np

from agentgym.errors import ConfigError
from agentgym.rollout.hooks import CollectContext, RolloutHooks
from agentgym.rollout.records import EpisodeGroup, Trajectory
from agentgym.training.api import (
    AlgorithmNeeds,
    TurnTable,
    discounted_returns,
    last_turns,
    register_algorithm,
)

#: ``Turn.extras`` key of the teacher-forced answer value v(c_t) of the turn's prompt.
VALUE_KEY = "igpo_value"


@dataclass(frozen=True)
class IGPOArgs:
    """Arguments of ``igpo`` (defaults: the authors' released v2 ``train.sh``)."""

    info_gain_type: Literal["log_prob_diff", "prob_diff"] = "log_prob_diff"
    """``log_prob_diff``: IG = difference of mean answer log-probs; ``prob_diff`` (the paper's formula):
    difference of their exponentials (geometric-mean answer probabilities)."""
    norm_mode: Literal["separate", "joint"] = "separate"
    """``separate``: outcome rewards and IG rewards are z-scored within the group each on its own;
    ``joint``: pooled into one set of statistics."""
    gamma: float = 1.0
    """Discount of the turn returns A_t = r̃_t + γ A_{t+1}."""
    normalize_std: bool = True
    """Divide by the (population) std; False only subtracts the mean (``norm_adv_by_std_in_grpo``)."""
    answer_prefix: str = "<answer>"
    """Text placed between the context and the answer when scoring (not itself scored); match the
    env's answer syntax so the answer is scored where the policy would write it."""
    epsilon: float = 1e-6
    """Added to the std: r̃ = (r − μ) / (σ + ε)."""
    variance_floor: float = 1e-8
    """σ = sqrt(population variance + this), as the reference; σ = 1 for a set of one value."""
    score_batch_size: int = 64
    """Contexts per teacher-forced forward pass."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.gamma <= 1.0:
            raise ConfigError(f"IGPOArgs.gamma must be in [0, 1], got {self.gamma}")
        if self.epsilon < 0 or self.variance_floor < 0:
            raise ConfigError("IGPOArgs.epsilon and IGPOArgs.variance_floor must be >= 0")
        if isinstance(self.score_batch_size, bool) or self.score_batch_size < 1:
            raise ConfigError("IGPOArgs.score_batch_size must be an integer >= 1, "
                              f"got {self.score_batch_size!r}")


def answer_text(answer: Any) -> str:
    """The ground truth scored for information gain: the first alternative of a list, as text.

    Example:
        >>> answer_text(["Ostavia", "the Republic of Ostavia"]), answer_text(42)
        ('Ostavia', '42')
    """
    if isinstance(answer, (list, tuple)):
        if not answer:
            raise ConfigError("igpo: info['answer'] is an empty list; the env must give at least one answer")
        answer = answer[0]
    return str(answer)


def encode(tokenizer: Any, text: str) -> list[int]:
    """Token ids of ``text`` without special tokens (the tokenizer must offer ``encode``)."""
    if not hasattr(tokenizer, "encode"):
        raise ConfigError("igpo needs a tokenizer with encode() to score answers; "
                          f"{type(tokenizer).__name__} has none")
    return list(tokenizer.encode(text, add_special_tokens=False))


def group_statistics(ids: np.ndarray, values: np.ndarray, member: np.ndarray, num_ids: int,
                     variance_floor: float) -> tuple[np.ndarray, np.ndarray]:
    """Per id, mean and σ = sqrt(population variance + floor) of the member values (σ = 1 for ≤ 1 member).

    Example:
        >>> mean, std = group_statistics(np.array([0, 0, 0, 1]), np.array([1.0, 3.0, 9.0, 5.0]),
        ...                              np.array([True, True, False, True]), 2, 0.0)
        >>> mean.tolist(), std.tolist()
        ([2.0, 5.0], [1.0, 1.0])
    """
    weights = member.astype(np.float64)
    count = np.bincount(ids, weights=weights, minlength=num_ids)
    mean = np.bincount(ids, weights=values * weights, minlength=num_ids) / np.maximum(count, 1.0)
    squares = np.bincount(ids, weights=(values - mean[ids]) ** 2 * weights, minlength=num_ids)
    std = np.sqrt(squares / np.maximum(count, 1.0) + variance_floor)
    return mean, np.where(count > 1, std, 1.0)


def turn_rewards(groups: Sequence[EpisodeGroup], args: IGPOArgs) -> tuple[TurnTable, np.ndarray, np.ndarray]:
    """The raw IGPO turn rewards: IG on turns followed by another, the outcome on each last turn.

    Returns:
        ``(table, reward, is_ig)``: shape (num_turns,) each; ``is_ig`` marks the turns whose reward is
        a (finite, non-zero) information gain. A turn without a recorded value gets no IG.
    """
    table = TurnTable.of(groups)
    values = np.array([float(turn.extras.get(VALUE_KEY, math.nan))
                       for g in groups for t in g.trajectories for turn in t.turns], dtype=np.float64)
    if args.info_gain_type == "prob_diff":
        values = np.exp(values)
    n = table.num_turns
    last = last_turns(table)
    following = np.r_[values[1:], math.nan] if n else values
    with np.errstate(invalid="ignore"):
        gain = following - values
    # The reference skips NaN/inf gains and only normalises non-zero ones (a zero marks "no gain").
    is_ig = ~last & np.isfinite(gain) & (gain != 0)
    outcome = table.trajectory_return[table.trajectory]
    reward = np.where(last, outcome, np.where(is_ig, gain, 0.0))
    return table, reward, is_ig


def igpo_advantages(groups: Sequence[EpisodeGroup], args: IGPOArgs) -> np.ndarray:
    """Per-turn IGPO advantages, shape (num_turns,), order group → trajectory → turn.

    Normalised rewards r̃ = (r − μ)/(σ + ε) over the group's outcome rewards and non-zero IG rewards
    (``joint``: one pool; ``separate``: outcome and IG apart), 0 for turns with neither; then
    A_t = r̃_t + γ A_{t+1} within each trajectory.

    Example (two trajectories of one task. A: values −2 → −1 (IG +1), then answers right (1);
    B: −2 → −3 (IG −1), then wrong (0). ``separate`` (ε = 0, no floor): outcomes {1, 0}, mean 0.5,
    σ 0.5 → ±1; IGs {+1, −1}, mean 0, σ 1 → ±1. γ = 1: A = [1 + 1, 1], B = [−1 − 1, −1]):
        >>> from agentgym.rollout.records import Trajectory, Turn
        >>> def turn(v, r): return Turn([], [], [], r, "s", extras={VALUE_KEY: v})
        >>> a = Trajectory([turn(-2.0, 0.0), turn(-1.0, 1.0)], "t", 0)
        >>> b = Trajectory([turn(-2.0, 0.0), turn(-3.0, 0.0)], "t", 0)
        >>> args = IGPOArgs(epsilon=0.0, variance_floor=0.0)
        >>> np.round(igpo_advantages([EpisodeGroup("g", "t", 0, [a, b])], args), 6).tolist()
        [2.0, 1.0, -2.0, -1.0]
    """
    table, reward, is_ig = turn_rewards(groups, args)
    n = table.num_turns
    if n == 0:
        return np.zeros(0)
    last = last_turns(table)
    member = last | is_ig
    if args.norm_mode == "joint":
        ids, num_ids = table.group, int(table.group.max()) + 1
    elif args.norm_mode == "separate":
        ids, num_ids = table.group * 2 + is_ig, 2 * (int(table.group.max()) + 1)
    else:
        raise ConfigError(f"IGPOArgs.norm_mode must be 'joint' or 'separate', got {args.norm_mode!r}")
    mean, std = group_statistics(ids, reward, member, num_ids, args.variance_floor)
    centred = reward - mean[ids]
    if args.normalize_std:
        scale = std[ids] + args.epsilon
        centred = centred / np.where(scale > 0, scale, 1.0)  # σ = 0 only with floor and ε both 0
    normalised = np.where(member, centred, 0.0)
    return discounted_returns(replace(table, reward=normalised), args.gamma)


class IGPOScoring(RolloutHooks):
    """After collection: the policy's teacher-forced answer value of every turn's prompt, in one batched pass.

    Writes ``Turn.extras["igpo_value"]`` (mean log-prob of the answer tokens after ``answer_prefix``).
    Identical (prompt, answer) pairs — e.g. the first prompt of a group's members — are scored once.
    Metrics accumulate over the collection rounds of one iteration.

    Example (a tiny policy scores the answer after each of a trajectory's prompts):
        >>> from agentgym.backends import TinyModelConfig
        >>> from agentgym.backends.tiny import build_tiny_model
        >>> from agentgym.backends.transformers_backend import TransformersPolicy
        >>> from agentgym.rollout.records import Turn
        >>> policy = TransformersPolicy(*build_tiny_model(TinyModelConfig(hidden_size=32, num_layers=1,
        ...                                                               intermediate_size=64)))
        >>> turns = [Turn(policy.tokenizer.encode(text), [1], [0.0], 0.0, "s")
        ...          for text in ("Q?", "Q? Paris.")]
        >>> group = EpisodeGroup("g", "t", 0, [Trajectory(turns, "t", 0, answer=["Paris"])])
        >>> hook = IGPOScoring(IGPOArgs())
        >>> [scored] = hook.after_collect([group], CollectContext(policy.tokenizer, policy))
        >>> ([turn.extras[VALUE_KEY] < 0 for turn in scored.trajectories[0].turns],
        ...  hook.metrics()["igpo/scored_contexts"])
        ([True, True], 2.0)
    """

    def __init__(self, args: IGPOArgs) -> None:
        self.args = args
        self._totals: dict[str, float] = {}
        self._gains: list[float] = []

    def begin_iteration(self, iteration: int, context: CollectContext) -> None:
        self._totals, self._gains = {}, []

    def after_collect(self, groups: list[EpisodeGroup], context: CollectContext) -> list[EpisodeGroup]:
        if context.scorer is None:
            raise ConfigError("igpo needs a policy that can score "
                              "(a Scorer, e.g. model.backend=transformers)")
        started = time.perf_counter()
        prefix = encode(context.tokenizer, self.args.answer_prefix) if self.args.answer_prefix else []
        answers: dict[str, list[int]] = {}
        pairs: dict[tuple[tuple[int, ...], str], int] = {}  # unique (prompt, answer) → index into the batch
        for group in groups:
            for trajectory in group.trajectories:
                text = self._answer(trajectory)
                if text not in answers:
                    answers[text] = encode(context.tokenizer, text)
                for turn in trajectory.turns:
                    pairs.setdefault((tuple(turn.prompt_ids), text), len(pairs))
        keys = list(pairs)
        prompts = [list(prompt) for prompt, _ in keys]
        continuations = [prefix + answers[text] for _, text in keys]
        scored = (context.scorer.score(prompts, continuations, batch_size=self.args.score_batch_size)
                  if keys else [])
        values = [float(np.mean(lp[len(prefix):])) if len(lp) > len(prefix) else math.nan for lp in scored]
        out = []
        for group in groups:
            trajectories = []
            for trajectory in group.trajectories:
                text = self._answer(trajectory)
                turns = [replace(turn, extras={**turn.extras,
                                               VALUE_KEY: values[pairs[(tuple(turn.prompt_ids), text)]]})
                         for turn in trajectory.turns]
                trajectories.append(replace(trajectory, turns=turns))
            out.append(replace(group, trajectories=trajectories))
        _, reward, is_ig = turn_rewards(out, self.args)
        self._gains += reward[is_ig].tolist()
        scored_tokens = sum(len(p) + len(c) for p, c in zip(prompts, continuations, strict=True))
        for key, value in (("score_s", time.perf_counter() - started), ("scored_contexts", float(len(keys))),
                           ("scored_tokens", float(scored_tokens))):
            self._totals[key] = self._totals.get(key, 0.0) + value
        return out

    @staticmethod
    def _answer(trajectory: Trajectory) -> str:
        if trajectory.answer is None:
            raise ConfigError(f"igpo: trajectory {trajectory.trajectory_id!r} of task {trajectory.task_id!r} "
                              "has no info['answer']; igpo needs an env that gives the ground truth "
                              "(e.g. search-qa-v0)")
        return answer_text(trajectory.answer)

    def metrics(self) -> dict[str, float]:
        gains = np.array(self._gains)
        return {**{f"igpo/{k}": v for k, v in self._totals.items()},
                "igpo/info_gain_mean": float(gains.mean()) if gains.size else 0.0,
                "igpo/info_gain_pos_frac": float((gains > 0).mean()) if gains.size else 0.0,
                "igpo/info_gain_turns": float(gains.size)}


register_algorithm("igpo", igpo_advantages, IGPOArgs, hooks=IGPOScoring,
                   needs=AlgorithmNeeds(answer=True, scorer=True),
                   description="IGPO: information-gain turn rewards (teacher-forced answer log-probs) + "
                               "outcome, group-normalised, discounted")
