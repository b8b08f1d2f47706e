"""Evaluation statistics: the paired comparison of two policies on the same tasks. (pass@k and the success
rate's interval over tasks, which training reports too, are ``agentgym.rollout.success``'s.)

Episodes of one task are not independent draws (a task a policy solves once it tends to solve again), so
the comparison treats the *task* as the unit: it resamples tasks.

Two policies evaluated on identical tasks (same env, seeds and options) are compared *per task*:
each task contributes the difference of the two policies' success on it (with K samples per task,
of their success rates), so task difficulty cancels out. The comparison reports

- the mean difference with a 95% **paired bootstrap** interval (tasks resampled with replacement,
  a seeded generator, so the same data always gives the same interval), and
- an **exact** paired test: McNemar's exact (binomial) test when every score is 0 or 1 (one sample
  per task), otherwise a paired sign-flip permutation test (exact up to 16 differing tasks, Monte
  Carlo with 20,000 seeded flips beyond).

A difference is called significant only when both agree (the interval excludes 0 and p < 0.05):
with few tasks the percentile bootstrap is too narrow, and the exact test keeps the verdict honest.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from agentgym.errors import ConfigError

ALPHA = 0.05
BOOTSTRAP_RESAMPLES = 10_000
_EXACT_FLIPS_UP_TO = 16
_MONTE_CARLO_FLIPS = 20_000


def scores_by_task(task_ids: Sequence[str], scores: Sequence[float]) -> dict[str, float]:
    """The mean score of each distinct task, in order of first appearance: the unit a paired comparison
    pairs (two seeds that reset to the same task are one task, not two independent pairs).

    Raises:
        ConfigError: the two lists differ in length.

    Example:
        >>> scores_by_task(["a", "b", "a"], [1.0, 0.0, 0.0])
        {'a': 0.5, 'b': 0.0}
    """
    if len(task_ids) != len(scores):
        raise ConfigError(f"{len(task_ids)} task ids for {len(scores)} scores; give one id per score")
    by_task: dict[str, list[float]] = {}
    for task, score in zip(task_ids, scores, strict=True):
        by_task.setdefault(str(task), []).append(float(score))
    return {task: sum(values) / len(values) for task, values in by_task.items()}


def mcnemar_exact_p(a_only: int, b_only: int) -> float:
    """Two-sided exact McNemar p-value from the discordant pair counts.

    Under "no difference" each discordant task is equally likely to favour either policy, so the
    smaller count is Binomial(a_only + b_only, 1/2); the p-value doubles its tail (capped at 1).

    Example:
        >>> mcnemar_exact_p(0, 3)
        0.25
        >>> mcnemar_exact_p(0, 0)
        1.0
        >>> round(mcnemar_exact_p(1, 9), 4)
        0.0215
    """
    n = a_only + b_only
    if n == 0:
        return 1.0
    low = min(a_only, b_only)
    tail = sum(math.comb(n, i) for i in range(low + 1)) / 2**n
    return min(1.0, 2 * tail)


def sign_flip_p(differences: Sequence[float], *, seed: int = 0) -> float:
    """Two-sided paired permutation p-value: how often randomly flipping the signs of the per-task
    differences gives a mean at least as far from 0 as the observed one.

    Zero differences cannot flip and are dropped. Exact (every sign pattern) up to 16 non-zero
    differences; beyond, 20,000 seeded random flips (the observed pattern counted once, so p > 0).

    Example:
        >>> sign_flip_p([0.5, 0.5, 0.5])
        0.25
        >>> sign_flip_p([0.0, 0.0])
        1.0
    """
    d = np.asarray([x for x in differences if x != 0], dtype=np.float64)
    if d.size == 0:
        return 1.0
    observed = abs(d.sum()) - 1e-12  # tolerance: equal sums must count as "at least as extreme"
    if d.size <= _EXACT_FLIPS_UP_TO:
        signs = np.array(list(itertools.product((1.0, -1.0), repeat=d.size)))
        return float(np.mean(np.abs(signs @ d) >= observed))
    rng = np.random.default_rng(seed)
    signs = rng.choice((1.0, -1.0), size=(_MONTE_CARLO_FLIPS, d.size))
    return float((np.sum(np.abs(signs @ d) >= observed) + 1) / (_MONTE_CARLO_FLIPS + 1))


def paired_bootstrap_ci(differences: Sequence[float], *, resamples: int = BOOTSTRAP_RESAMPLES,
                        seed: int = 0, level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean per-task difference (tasks resampled together).

    Example:
        >>> paired_bootstrap_ci([0.0, 0.0, 0.0])
        (0.0, 0.0)
        >>> low, high = paired_bootstrap_ci([1.0] * 8 + [0.0] * 2)
        >>> 0.5 <= low < 0.8 < high <= 1.0
        True
    """
    d = np.asarray(differences, dtype=np.float64)
    if d.size == 0:
        return 0.0, 0.0
    rng = np.random.default_rng(seed)
    means = d[rng.integers(0, d.size, size=(resamples, d.size))].mean(axis=1)
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    return float(low), float(high)


@dataclass(frozen=True)
class PairedComparison:
    """Policy ``b`` against policy ``a`` on the same tasks of one env (differences are b − a)."""

    env: str
    """The env id."""
    metric: str
    """What is compared per task: ``success`` (success rate) or ``return`` (mean episode return)."""
    a: str
    """Baseline policy name."""
    b: str
    """Compared policy name."""
    tasks: int
    """Tasks both policies played (the pairs)."""
    a_mean: float
    """``a``'s mean of the metric over those tasks."""
    b_mean: float
    """``b``'s mean of the metric over those tasks."""
    difference: float
    """Mean per-task difference (b − a)."""
    ci95: tuple[float, float]
    """95% paired bootstrap interval of ``difference``."""
    p_value: float
    """Exact paired test (McNemar for 0/1 outcomes, sign-flip permutation otherwise)."""
    test: str
    """Which test gave ``p_value``."""
    b_better: int
    """Tasks where ``b`` did better."""
    a_better: int
    """Tasks where ``a`` did better."""
    significant: bool
    """The interval excludes 0 and p < 0.05."""
    verdict: str
    """The result in one plain sentence."""

    def to_json(self) -> dict[str, Any]:
        """A dict that survives ``json.dumps``."""
        return {**asdict(self), "ci95": list(self.ci95)}


def compare_paired(env: str, a: str, b: str, a_scores: Sequence[float], b_scores: Sequence[float], *,
                   metric: str = "success", seed: int = 0) -> PairedComparison:
    """Compare two policies' per-task scores (same tasks, same order).

    Args:
        env: env id (for the verdict).
        a, b: policy names; differences are ``b - a``.
        a_scores, b_scores: per task, the policy's score on it: its success rate (0 or 1 with one
            sample) for ``metric="success"``, its mean return for ``metric="return"``.
        metric: ``success`` (reported in percentage points) or ``return``.
        seed: seeds the bootstrap and any Monte Carlo test, so results are reproducible.

    Raises:
        ConfigError: the two score lists differ in length.

    Example:
        >>> c = compare_paired("maze-v0", "random", "expert", [0, 0, 1, 0] * 5, [1, 1, 1, 1] * 5)
        >>> c.difference, c.significant, c.test
        (0.75, True, 'mcnemar-exact')
        >>> compare_paired("maze-v0", "a", "b", [1, 0, 1],
        ...                [0, 1, 1]).verdict  # doctest: +NORMALIZE_WHITESPACE
        'maze-v0, success: b vs a: +0 points (95% CI -100 to +100, exact p = 1): not significant;
        these tasks cannot tell them apart.'
        >>> compare_paired("tictactoe-v0", "random", "expert", [-1.0] * 9, [0.0] * 9,
        ...                metric="return").verdict  # doctest: +NORMALIZE_WHITESPACE
        'tictactoe-v0, return: expert vs random: +1 (95% CI +1 to +1, exact p = 0.0039): expert is better
        than random, and the difference is significant.'
    """
    if len(a_scores) != len(b_scores):
        raise ConfigError(f"paired comparison on {env}: {a} has {len(a_scores)} task scores, {b} has "
                          f"{len(b_scores)}; both must play the same tasks")
    if metric not in ("success", "return"):
        raise ConfigError(f"metric must be 'success' or 'return', got {metric!r}")
    sa, sb = np.asarray(a_scores, dtype=np.float64), np.asarray(b_scores, dtype=np.float64)
    d = sb - sa
    low, high = paired_bootstrap_ci(d, seed=seed)
    binary = bool(np.all(np.isin(sa, (0.0, 1.0))) and np.all(np.isin(sb, (0.0, 1.0))))
    b_better, a_better = int(np.sum(d > 0)), int(np.sum(d < 0))
    if binary:
        p, test = mcnemar_exact_p(a_better, b_better), "mcnemar-exact"
    else:
        p, test = sign_flip_p(d, seed=seed), "sign-flip-permutation"
    diff = float(d.mean()) if d.size else 0.0
    significant = bool(d.size) and (low > 0 or high < 0) and p < ALPHA
    fmt = _points if metric == "success" else _signed
    numbers = (f"{fmt(diff)}{' points' if metric == 'success' else ''} (95% CI {fmt(low)} to {fmt(high)}, "
               f"exact p = {p:.2g})")
    head = f"{env}, {metric}: {b} vs {a}: {numbers}"
    if significant:
        better, worse = (b, a) if diff > 0 else (a, b)
        verdict = f"{head}: {better} is better than {worse}, and the difference is significant."
    else:
        verdict = f"{head}: not significant; these tasks cannot tell them apart."
    return PairedComparison(env, metric, a, b, int(d.size), float(sa.mean()) if sa.size else 0.0,
                            float(sb.mean()) if sb.size else 0.0, diff, (low, high), p, test, b_better,
                            a_better, significant, verdict)


def _points(x: float) -> str:
    value = round(100 * x)
    return f"{value:+d}" if value else "+0" if x >= 0 else "-0"


def _signed(x: float) -> str:
    text = f"{x:+.3g}"
    return "+0" if text in ("+0", "-0") else text
