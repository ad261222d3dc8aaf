"""Walltime from counts: the cost of one forward pass, and what a run's rows would take with it.

A run's forward counts and acceptance do not depend on the hardware; its walltime does. This module
joins the two halves. The time of one pass depends on the tokens it feeds, n (1 for autoregressive
decoding, k + 1 for a chain verification, a tree's node count, the prompt for the prefill), and on the
context it reads, c (the cached positions before it). A row records, for every model, how many passes
fed each n and the sum of their contexts (``ForwardCounter.shapes``); rows from before they did are
reconstructed from the prompt length, the steps and the token counts (:func:`row_shapes`).

A *pass cost* turns those shapes into seconds. Three kinds:

- :class:`SizeTable`, from a probe (``specbench probe``): passes timed on a grid of n and c; for each
  probed n, t = alpha_n + gamma_n * c by least squares over the probed contexts, and linear in n between
  probed sizes. Measured, so it holds what no formula does (on the CPU a one-token pass over a long
  context can cost more than a two-token one: another attention kernel).
- :class:`Linear`, fitted to a run's own rows: t = a1 (one token) or a (more) + b n + e c + f n c,
  non-negative least squares of each row's measured model seconds on its shapes' sums (the sums
  are all a linear model needs).
- :class:`Roofline`, from a device's public figures where no probe exists: t = floor +
  max(weight bytes / bandwidth, 2 x parameters x n / peak FLOP/s) + KV bytes x c / bandwidth.

A row's predicted walltime is the sum of its models' predicted seconds plus its loop overhead (walltime
less model seconds: Python, drafting by statistical drafters, sampling), which the model does not
predict: it is carried as measured (or, fitted on some rows, as seconds per step of the same cell).
A cell's predicted speedup is its predicted tokens/s over the predicted tokens/s of the AR cell of
the same dataset and target.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

# (tokens fed n, passes, sum of their contexts); n may be fractional for reconstructed rows
Shape = tuple[float, int | float, float]
ENCODER = "encoder:"


def row_shapes(row: dict, model: str) -> tuple[list[Shape], bool]:
    """The pass shapes of ``model`` in ``row`` and whether they were recorded (False: reconstructed).

    An encoder pass counts as a pass of its prompt tokens at context 0."""
    counts = row["forwards"][model]
    recorded = counts.get("shapes")
    if recorded is not None:
        shapes = []
        for key, (passes, context) in recorded.items():
            n = float(key[len(ENCODER) :]) if key.startswith(ENCODER) else float(key)
            shapes.append((n, passes, float(context)))
        return shapes, True
    return _reconstructed(row, model, counts), False


def _reconstructed(row: dict, model: str, counts: dict) -> list[Shape]:
    """Shapes of a row from before rows recorded them: the target's from its steps where they account
    for its passes (step j fed its drafted tokens and the last committed one, the first also the
    prompt), else a prefill of the prompt and equal passes over the mean context."""
    passes, tokens = counts.get("forward_passes", 0), counts.get("tokens_scored", 0)
    prompt, generated = row.get("prompt_tokens", 0), row.get("n_tokens", 0)
    shapes: list[Shape] = []
    encoders = counts.get("encoder_passes", 0)
    if encoders:
        shapes.append((float(prompt), encoders, 0.0))
    if not passes:
        return shapes
    steps = row.get("steps") or []
    if model == row.get("target") and len(steps) == passes and not encoders:
        fed = [d + 1 for d, _ in steps]
        fed[0] += prompt - 1
        if sum(fed) == tokens:
            committed, by_size = prompt - 1, {}  # cached positions before each pass but the first
            for j, (n, (_, accepted)) in enumerate(zip(fed, steps, strict=True)):
                entry = by_size.setdefault(float(n), [0, 0.0])
                entry[0] += 1
                entry[1] += committed if j else 0
                committed += accepted + 1
            return shapes + [(n, count, ctx) for n, (count, ctx) in by_size.items()]
    prefix = prompt if not encoders else 1
    mean_context = prefix + generated / 2
    if tokens >= prefix + passes - 1 and passes > 1:
        rest = (tokens - prefix) / (passes - 1)
        return shapes + [(float(prefix), 1, 0.0), (rest, passes - 1, mean_context * (passes - 1))]
    return shapes + [(tokens / passes, passes, mean_context * passes)]


def shape_sums(shapes: Iterable[Shape]) -> np.ndarray:
    """What a :class:`Linear` pass cost needs of a row: [one-token passes, longer passes, tokens,
    context sum, sum of tokens x context]."""
    sums = np.zeros(5)
    for n, passes, context in shapes:
        sums += (passes if n == 1 else 0, 0 if n == 1 else passes, n * passes, context, n * context)
    return sums


@dataclass(frozen=True)
class Linear:
    """t = a1 (one token) or a (more) + b n + e c + f n c seconds, for a pass of n tokens after c.

    One-token passes (decoding and drafting steps) have an intercept of their own because they run
    other kernels: on the CPU attention for a single query takes another path than for a block
    (probed on SmolLM2 in bfloat16: a one-token pass over 1024 cached positions took 34 ms, a
    two-token one 27 ms). Separate context slopes too were tried and fitted noise on small runs."""

    a1: float
    a: float
    b: float
    e: float
    f: float

    def seconds(self, shapes: Sequence[Shape]) -> float:
        return float(shape_sums(shapes) @ np.array([self.a1, self.a, self.b, self.e, self.f]))

    def pass_seconds(self, n: float, c: float) -> float:
        return (self.a1 if n == 1 else self.a) + self.b * n + self.e * c + self.f * n * c


@dataclass(frozen=True)
class SizeTable:
    """Probed: for each size ``sizes[i]``, t = alpha[i] + gamma[i] c seconds; linear in n between
    sizes, extrapolated from the last two beyond the largest but never below the largest's cost (and
    held at the smallest below it)."""

    sizes: tuple[float, ...]
    alpha: tuple[float, ...]
    gamma: tuple[float, ...]

    def pass_seconds(self, n: float, c: float) -> float:
        sizes = self.sizes
        if n <= sizes[0] or len(sizes) == 1:
            return self.alpha[0] + self.gamma[0] * c
        i = min(int(np.searchsorted(sizes, n)), len(sizes) - 1)  # sizes[i - 1] < n <= sizes[i]
        lo, hi = sizes[i - 1], sizes[i]
        w = (n - lo) / (hi - lo)
        at = [self.alpha[j] + self.gamma[j] * c for j in (i - 1, i)]
        if n > hi:  # more tokens never cost less than the largest size probed: noisy small sizes that
            return max(at[1], at[0] + w * (at[1] - at[0]))  # fall with n would extrapolate below 0
        return at[0] + w * (at[1] - at[0])

    def seconds(self, shapes: Sequence[Shape]) -> float:
        total = 0.0
        for n, passes, context in shapes:  # t is linear in c for each n: the mean context suffices
            total += passes * self.pass_seconds(n, context / passes) if passes else 0.0
        return total


@dataclass(frozen=True)
class Roofline:
    """t = floor + max(weight bytes / bandwidth, flops per token x n / peak) + KV bytes x c / bandwidth."""

    weight_bytes: float
    flops_per_token: float  # 2 x parameters
    kv_bytes_per_token: float
    bandwidth: float  # bytes / s
    peak_flops: float  # FLOP / s
    floor: float = 0.0  # seconds a pass takes however small (launches, Python), where known

    def pass_seconds(self, n: float, c: float) -> float:
        weights = max(self.weight_bytes / self.bandwidth, self.flops_per_token * n / self.peak_flops)
        return self.floor + weights + self.kv_bytes_per_token * c / self.bandwidth

    def seconds(self, shapes: Sequence[Shape]) -> float:
        return sum(passes * self.pass_seconds(n, context / passes) for n, passes, context in shapes if passes)


PassCost = Linear | SizeTable | Roofline


def fit_linear(samples: Sequence[tuple[Sequence[Shape], float]]) -> Linear:
    """The non-negative least-squares :class:`Linear` of (shapes, measured seconds) samples (rows), each
    weighted by 1 / seconds so that short rows count as much as long ones (relative error). A model
    with no one-token passes (or only those) gets those coefficients 0: nothing to fit them to."""
    if not samples:
        raise ValueError("no rows to fit a pass cost to")
    x = np.array([shape_sums(shapes) for shapes, _ in samples])
    y = np.array([seconds for _, seconds in samples])
    weights = 1.0 / np.maximum(y, 1e-9)
    coefficients = nnls(x * weights[:, None], y * weights)
    return Linear(*map(float, coefficients))


def nnls(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """argmin ||x b - y|| over b >= 0 (Lawson and Hanson's active set; 5 unknowns here)."""
    n = x.shape[1]
    scale = np.linalg.norm(x, axis=0)
    scale[scale == 0] = 1.0
    xs = x / scale
    free = np.zeros(n, dtype=bool)
    b = np.zeros(n)
    for _ in range(3 * n):
        gradient = xs.T @ (y - xs @ b)
        candidates = np.where(~free & (gradient > 1e-12 * max(1.0, np.abs(gradient).max())))[0]
        if not len(candidates):
            break
        free[candidates[np.argmax(gradient[candidates])]] = True
        while True:
            trial = np.zeros(n)
            trial[free] = np.linalg.lstsq(xs[:, free], y, rcond=None)[0]
            if (trial[free] > 0).all():
                b = trial
                break
            negative = free & (trial <= 0)
            steps = b[negative] / np.maximum(b[negative] - trial[negative], 1e-300)
            alpha = min(1.0, steps.min()) if len(steps) else 1.0
            b = b + alpha * (trial - b)
            free &= b > 1e-15
            b[~free] = 0.0
    return b / scale


def fit_size_table(points: Sequence[tuple[float, float, float]]) -> SizeTable:
    """A :class:`SizeTable` from probed (n, c, seconds) points: per n, least squares in c with alpha and
    gamma >= 0 (a pass cannot cost less than nothing: a negative intercept is refitted through 0)."""
    by_size: dict[float, list[tuple[float, float]]] = {}
    for n, c, seconds in points:
        by_size.setdefault(float(n), []).append((float(c), float(seconds)))
    sizes, alpha, gamma = [], [], []
    for n in sorted(by_size):
        cs, ts = map(np.array, zip(*by_size[n], strict=True))
        if len(set(cs.tolist())) > 1:
            slope, intercept = np.polyfit(cs, ts, 1)
            if slope < 0:  # a context that costs nothing more: the mean
                slope, intercept = 0.0, float(ts.mean())
            elif intercept < 0:  # cost that grows faster than linearly in c: the line through 0
                slope, intercept = float((cs * ts).sum() / (cs * cs).sum()), 0.0
        else:
            slope, intercept = 0.0, float(ts.mean())
        sizes.append(n)
        alpha.append(float(intercept))
        gamma.append(float(slope))
    return SizeTable(tuple(sizes), tuple(alpha), tuple(gamma))


def fit_quality(cost: PassCost, points: Sequence[tuple[float, float, float]]) -> dict[str, float]:
    """How well ``cost`` reproduces probed (n, c, seconds) points: R², median and worst relative error."""
    measured = np.array([t for _, _, t in points])
    predicted = np.array([cost.pass_seconds(n, c) for n, c, _ in points])
    residual = ((measured - predicted) ** 2).sum()
    spread = ((measured - measured.mean()) ** 2).sum()
    relative = np.abs(predicted / measured - 1)
    return {
        "r2": float(1 - residual / spread) if spread else math.nan,
        "median_relative_error": float(np.median(relative)),
        "max_relative_error": float(relative.max()),
    }
