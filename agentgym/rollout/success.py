"""Success rates of evaluation episodes: pass@k, the Wilson interval, the success rate's 95% interval over
tasks (``task_success``) and the tasks × episodes count they rest on.

Episodes of one task are not independent draws (a task a policy solves once it tends to solve again), so
the interval treats the *task* as the unit: ``task_success`` clusters episodes by task. Training's held-out
evaluations and ``agentgym eval`` both report them (``agentgym.rollout.summary``); the paired comparison
of two policies is evaluation's (``agentgym.eval.statistics``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from statistics import NormalDist

import numpy as np

from agentgym.errors import ConfigError

Z95 = NormalDist().inv_cdf(0.975)
"""The normal distribution's two-sided 95% critical value (1.95996...)."""

def pass_at_k(num_samples: int, num_correct: int, k: int) -> float:
    """Unbiased pass@k of one task: the chance that at least one of k samples drawn without
    replacement from ``num_samples`` (of which ``num_correct`` succeeded) succeeds.

    ``1 - C(n - c, k) / C(n, k)`` (Chen et al., 2021, Eq. 1), computed as a product so it stays exact
    for large n.

    Raises:
        ConfigError: ``k`` outside ``1..num_samples`` or ``num_correct`` outside ``0..num_samples``.

    Example:
        >>> pass_at_k(4, 1, 1), pass_at_k(4, 1, 4), round(pass_at_k(4, 1, 2), 4)
        (0.25, 1.0, 0.5)
        >>> pass_at_k(3, 0, 3)
        0.0
    """
    if not 1 <= k <= num_samples:
        raise ConfigError(f"pass@k needs 1 <= k <= samples per task ({num_samples}), got k={k}")
    if not 0 <= num_correct <= num_samples:
        raise ConfigError(f"num_correct must be in 0..{num_samples}, got {num_correct}")
    if num_samples - num_correct < k:
        return 1.0
    # C(n-c, k) / C(n, k) = prod_{i=n-c+1}^{n} (1 - k / i)
    return 1.0 - float(np.prod(1.0 - k / np.arange(num_samples - num_correct + 1, num_samples + 1)))


def mean_pass_at_k(outcomes: Sequence[Sequence[bool]], k: int) -> float:
    """pass@k averaged over tasks; ``outcomes[t]`` lists task t's samples' successes.

    Example:
        >>> mean_pass_at_k([[True, False], [False, False]], 2)
        0.5
    """
    if not outcomes:
        return 0.0
    return float(np.mean([pass_at_k(len(o), sum(map(bool, o)), k) for o in outcomes]))


def pass_at_k_table(outcomes: Sequence[Sequence[bool]]) -> dict[str, float]:
    """``{"pass@1": ..., "pass@2": ..., "pass@K": ...}`` for k = 1, powers of two, and K (the fewest
    samples any task has).

    Example:
        >>> {k: round(v, 4) for k, v in pass_at_k_table([[True, False, False]]).items()}
        {'pass@1': 0.3333, 'pass@2': 0.6667, 'pass@3': 1.0}
    """
    if not outcomes:
        return {}
    most = min(len(o) for o in outcomes)
    ks = sorted({1, most, *(2**i for i in range(1, most.bit_length()) if 2**i <= most)})
    return {f"pass@{k}": mean_pass_at_k(outcomes, k) for k in ks}


def wilson_interval(successes: float, n: float, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion ``successes / n`` (``n`` may be an effective,
    non-integer count); ``(0, 1)`` when ``n`` is 0. The bound at an observed 0 or 1 is exactly 0 or 1.

    Example:
        >>> [round(x, 3) for x in wilson_interval(8, 10)]
        [0.49, 0.943]
        >>> wilson_interval(0, 0)
        (0.0, 1.0)
    """
    if n <= 0:
        return 0.0, 1.0
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    # At p = 0 (or 1) centre − half is 0 (or centre + half 1) in exact arithmetic; rounding would leave 1e-17.
    return (0.0 if p <= 0 else max(0.0, centre - half)), (1.0 if p >= 1 else min(1.0, centre + half))


def _t_two_sided(t: float, df: int) -> float:
    """P(|T| <= t) for Student's t with ``df`` degrees of freedom: the finite series of Abramowitz &
    Stegun 26.7.3 (odd df) and 26.7.4 (even df), exact for integer df."""
    theta = math.atan(t / math.sqrt(df))
    cos2 = math.cos(theta) ** 2
    if df % 2:
        if df == 1:
            return 2 * theta / math.pi
        # cos θ + (2/3) cos³θ + ... + (2·4···(df−3))/(1·3···(df−2)) cos^(df−2) θ
        term = total = math.cos(theta)
        for k in range(1, (df - 1) // 2):
            term *= cos2 * (2 * k) / (2 * k + 1)
            total += term
        return 2 / math.pi * (theta + math.sin(theta) * total)
    # 1 + (1/2) cos²θ + ... + (1·3···(df−3))/(2·4···(df−2)) cos^(df−2) θ
    term = total = 1.0
    for k in range(df // 2 - 1):
        term *= cos2 * (2 * k + 1) / (2 * k + 2)
        total += term
    return math.sin(theta) * total


@lru_cache(maxsize=256)
def t_quantile(df: int, level: float = 0.95) -> float:
    """The two-sided ``level`` critical value of Student's t with ``df`` degrees of freedom (1.96 as df
    grows); ``inf`` for ``df`` < 1, where there is no spread to estimate.

    Exact series inverted by bisection up to 300 degrees of freedom, the Cornish-Fisher expansion
    (Abramowitz & Stegun 26.7.5, error below 1e-9 there) beyond.

    Example:
        >>> [round(t_quantile(df), 3) for df in (1, 2, 3, 31, 1000)]
        [12.706, 4.303, 3.182, 2.04, 1.962]
    """
    if df < 1:
        return math.inf
    x = NormalDist().inv_cdf((1 + level) / 2)
    if df > 300:
        g1 = (x**3 + x) / 4
        g2 = (5 * x**5 + 16 * x**3 + 3 * x) / 96
        g3 = (3 * x**7 + 19 * x**5 + 17 * x**3 - 15 * x) / 384
        g4 = (79 * x**9 + 776 * x**7 + 1482 * x**5 - 1920 * x**3 - 945 * x) / 92160
        return x + g1 / df + g2 / df**2 + g3 / df**3 + g4 / df**4
    low, high = x, 2 * x
    while _t_two_sided(high, df) < level:
        low, high = high, 2 * high
    for _ in range(100):
        mid = (low + high) / 2
        low, high = (mid, high) if _t_two_sided(mid, df) < level else (low, mid)
    return (low + high) / 2


@dataclass(frozen=True)
class TaskSuccess:
    """The success rate of a set of episodes and its 95% interval over tasks (``task_success``)."""

    tasks: int
    """Distinct tasks played."""
    episodes: int
    """Episodes played, over all tasks."""
    episodes_per_task: tuple[int, int]
    """The fewest and the most episodes any task has."""
    rate: float
    """Share of all episodes that succeeded."""
    ci95: tuple[float, float]
    """95% interval of ``rate`` over tasks, within [0, 1]."""
    effective_episodes: float
    """How many independent episodes the data are worth (``n*_df`` of ``task_success``): about the number
    of tasks when outcomes are identical within each task, up to the number of episodes; 0 where the
    interval is [0, 1] (one task, no episodes)."""
    method: str
    """How ``ci95`` was computed: ``wilson-clustered`` (two or more tasks), ``one-task`` (the interval is
    [0, 1]: one task says nothing about other tasks) or ``no-episodes``."""


def task_success(outcomes: Sequence[Sequence[bool]], *, level: float = 0.95) -> TaskSuccess:
    """Success rate over episodes with an interval over tasks: episodes of one task are correlated, so
    the interval clusters them by task instead of counting every episode as an independent draw.

    With ``T`` tasks, task ``t`` having ``m_t`` episodes of which ``s_t`` succeeded, ``n = Σ m_t``:

    - rate ``p = Σ s_t / n``;
    - its cluster-robust (sandwich) variance, tasks as clusters: ``V = Σ_t (s_t − m_t·p)² / n²``
      (with the same ``m`` for every task this is ``Σ_t (r_t − p)² / T²``, the between-task variance of
      the per-task success rates ``r_t = s_t / m_t`` over ``T``);
    - the effective number of episodes ``n* = p(1 − p) / V`` (the design effect's ``n / deff``), at most
      ``n``, and ``n`` when ``V`` is 0 (every episode the same outcome, or every task at exactly ``p``);
    - a degrees-of-freedom correction for few tasks (Korn & Graubard, 1998):
      ``n*_df = n* · (t(n − 1) / t(T − 1))²``, ``t(d)`` Student's two-sided critical value with ``d``
      degrees of freedom;
    - the Wilson score interval of ``p`` at ``n*_df`` episodes, so the bounds stay within [0, 1] and are
      not degenerate when every task succeeds or every task fails.

    Relations: with one episode per task, ``n*_df = n`` and the interval is exactly the Wilson interval
    over episodes. When the outcomes within each task are identical (and tasks have equal episode
    counts), ``n* = T``: the evidence of ``T`` episodes however many were played, a wider interval.
    One task gives [0, 1] (``method`` ``one-task``): one task's episodes say nothing about other tasks.

    Args:
        outcomes: per distinct task, its episodes' successes.
        level: the interval's coverage.

    Example:
        >>> s = task_success([[True, True], [False, True], [False, False]])
        >>> s.tasks, s.episodes, s.rate, [round(x, 3) for x in s.ci95], s.method
        (3, 6, 0.5, [0.08, 0.92], 'wilson-clustered')
        >>> [round(x, 3) for x in task_success([[True]] * 8 + [[False]] * 2).ci95]  # = wilson_interval(8, 10)
        [0.49, 0.943]
        >>> task_success([[True, False, True]]).ci95, task_success([[True, False, True]]).method
        ((0.0, 1.0), 'one-task')
    """
    sizes = [len(o) for o in outcomes if len(o)]
    wins = [sum(map(bool, o)) for o in outcomes if len(o)]
    tasks, n = len(sizes), sum(sizes)
    spread = (min(sizes), max(sizes)) if sizes else (0, 0)
    if n == 0:
        return TaskSuccess(0, 0, spread, 0.0, (0.0, 1.0), 0.0, "no-episodes")
    p = sum(wins) / n
    if tasks == 1:
        return TaskSuccess(1, n, spread, p, (0.0, 1.0), 0.0, "one-task")
    variance = sum((s - m * p) ** 2 for s, m in zip(wins, sizes, strict=True)) / n**2
    # V = 0 leaves p(1 - p) / V undefined: all episodes alike, or every task exactly at p. Then n (Korn &
    # Graubard's convention) keeps the interval monotone: one failure among n successes must not give a
    # narrower interval than none.
    effective = n if variance <= 1e-15 else min(float(n), p * (1 - p) / variance)
    effective *= (t_quantile(n - 1, level) / t_quantile(tasks - 1, level)) ** 2 if n > 1 else 1.0
    z = NormalDist().inv_cdf((1 + level) / 2)
    low, high = wilson_interval(p * effective, effective, z)
    return TaskSuccess(tasks, n, spread, p, (low, high), effective, "wilson-clustered")


def count_text(tasks: int, episodes: int, episodes_per_task: Sequence[int], *, short: bool = False) -> str:
    """How many tasks and episodes, exactly: ``32 tasks × 2 episodes``; with unequal counts per task
    ``23 tasks × 1–3 episodes = 32 episodes``. ``short``: the table cell (``32 × 2``, ``23 × 1–3 = 32``).

    Example:
        >>> count_text(32, 64, (2, 2)), count_text(1, 1, (1, 1)), count_text(32, 64, (2, 2), short=True)
        ('32 tasks × 2 episodes', '1 task × 1 episode', '32 × 2')
        >>> count_text(23, 32, (1, 3)), count_text(23, 32, (1, 3), short=True)
        ('23 tasks × 1–3 episodes = 32 episodes', '23 × 1–3 = 32')
    """
    low, high = episodes_per_task
    if short:
        return f"{tasks} × {low}" if low == high else f"{tasks} × {low}–{high} = {episodes}"
    head = f"{tasks} task{'' if tasks == 1 else 's'}"
    if low == high:
        return f"{head} × {low} episode{'' if low == 1 else 's'}"
    return f"{head} × {low}–{high} episodes = {episodes} episodes"
