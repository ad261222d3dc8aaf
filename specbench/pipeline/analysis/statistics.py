"""Spread and bootstrap intervals of a cell's example rows (pure numpy).

* ``percentiles``: the one percentile function (numpy's linear interpolation, vLLM's
  ``benchmark_serving``'s): the p50 / p90 / p99 of per-request values (latency, TTFT, TPOT, load
  levels' included) and the bounds of every bootstrap interval; ``spread`` adds the mean and the
  sample standard deviation.
* ``paired_bootstrap_ratio``: a percentile bootstrap interval for a ratio of sums over examples
  (tokens/s, SWI, speedup over AR), resampling example indices; two cells' rows on the same
  prompts are resampled together.
* ``paired_bootstrap_difference``: the same for a difference of means (a quality metric of two cells
  on the same prompts, e.g. accuracy).

Acceptance from a cell's steps (by position, per step) is :mod:`specbench.decoding.steps`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0
BOOTSTRAP_LEVEL = 0.95
_CHUNK = 1 << 21  # example indices drawn at once: ~16 MB whatever n is


def percentiles(values: Iterable[float], qs: Sequence[float] = (50, 90, 99)) -> dict[str, float]:
    """``{"p50": ..., "p90": ..., "p99": ...}`` by numpy's linear interpolation; NaN when empty.

    A NaN among the values (an unmeasured time) makes every percentile NaN, never a silent drop."""
    x = np.asarray(list(values), dtype=float)
    if not len(x) or np.isnan(x).any():
        return {f"p{q:g}": math.nan for q in qs}
    return {f"p{q:g}": float(v) for q, v in zip(qs, np.percentile(x, qs), strict=True)}


def spread(values: Iterable[float]) -> dict[str, float]:
    """mean, std (sample, ddof=1; NaN for fewer than two values), p50, p90, p99."""
    x = np.asarray(list(values), dtype=float)
    mean = float(x.mean()) if len(x) else math.nan
    std = float(x.std(ddof=1)) if len(x) > 1 else math.nan
    return {"mean": mean, "std": std, **percentiles(x)}


def paired_bootstrap_ratio(
    num_a: Sequence[float],
    den_a: Sequence[float],
    num_b: Sequence[float] | None = None,
    den_b: Sequence[float] | None = None,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
    level: float = BOOTSTRAP_LEVEL,
) -> tuple[float, float]:
    """(low, high) of a percentile bootstrap interval for (Σ num_a / Σ den_a) / (Σ num_b / Σ den_b).

    Element i of the four arrays belongs to example i (one prompt): each of the ``resamples`` (B)
    resamples draws n example indices with replacement and takes the ratio of the resampled sums, the
    same indices for a and b, so the prompts' shared difficulty cancels (a paired bootstrap). The
    interval is the percentile interval (Efron & Tibshirani 1993, ch. 13): the (1 - level)/2 and
    (1 + level)/2 percentiles of the B ratios (numpy's linear interpolation). Without ``num_b`` and
    ``den_b`` it is the interval of Σ num_a / Σ den_a alone. The draws come from
    ``numpy.random.default_rng(seed)``: a seed and the same inputs give the same interval. (NaN, NaN)
    for fewer than two examples, a non-finite input, or a resample whose ratio is undefined (a zero
    sum below a fraction bar). Defaults: B = 2000, seed 0, level 0.95 (what cells.csv uses).
    """
    columns = [num_a, den_a] + ([num_b, den_b] if num_b is not None else [])
    values = np.column_stack([np.asarray(c, dtype=float) for c in columns])  # (n examples, 2 or 4)
    n = len(values)
    if n < 2 or not np.isfinite(values).all():
        return math.nan, math.nan
    rng = np.random.default_rng(seed)
    sums = np.empty((resamples, values.shape[1]))
    chunk = max(1, _CHUNK // n)  # a function of n only, so the draws do not depend on anything else
    for start in range(0, resamples, chunk):
        stop = min(resamples, start + chunk)
        indices = rng.integers(0, n, size=(stop - start, n))
        for j, column in enumerate(values.T):  # column by column: contiguous sums, 6x faster than 3-d
            sums[start:stop, j] = column[indices].sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = sums[:, 0] / sums[:, 1]
        if values.shape[1] == 4:
            ratios = ratios / (sums[:, 2] / sums[:, 3])
    if not np.isfinite(ratios).all():
        return math.nan, math.nan
    low, high = percentiles(ratios, (50 * (1 - level), 50 * (1 + level))).values()
    return low, high


def paired_bootstrap_difference(
    a: Sequence[float],
    b: Sequence[float],
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
    level: float = BOOTSTRAP_LEVEL,
) -> tuple[float, float]:
    """(low, high) of the percentile bootstrap interval of mean(a) - mean(b), element i of both
    belonging to example i: each resample draws the same example indices for a and b (the draws of
    ``paired_bootstrap_ratio``), so a question both cells get right or wrong adds no spread."""
    differences = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    ones = np.ones_like(differences)
    return paired_bootstrap_ratio(differences, ones, resamples=resamples, seed=seed, level=level)


def bootstrap_ratio(num: Sequence[float], den: Sequence[float], **options) -> tuple[float, float]:
    """The percentile bootstrap interval of Σ num / Σ den over examples (``paired_bootstrap_ratio``)."""
    return paired_bootstrap_ratio(num, den, **options)
