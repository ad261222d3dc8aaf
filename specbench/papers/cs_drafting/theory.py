"""Closed-form theory of Cascade Speculative Drafting (Chen et al., NeurIPS 2024, Section 4 / Appendix C).

Notation follows the paper: ``alpha`` (α) is the expected acceptance rate α(Mt, Md) of a draft token, ``k``
the number of draft tokens per step, ``c`` the cost coefficient c(Mt, Md) (time of one draft-model run divided
by one target-model run), ``n`` the number of Md1-steps the target Mt reviews in a vertical cascade.  EWIF is
the expected walltime improvement factor = expected tokens produced per step / expected cost of a step (in
units of one target run), under the assumption that token acceptances are i.i.d. Bernoulli trials.

Cost coefficients used for Table 1
----------------------------------
The paper says Table 1 uses "the information provided by Leviathan et al." (their Table 3 acceptance rates,
T5-XXL target, argmax sampling t=0).  Leviathan's Table 4 cost coefficients (small 0.02, base 0.04,
large 0.11) do *not* reproduce Table 1 (e.g. CNNDM/SMALL/k=9 gives 2.39, not 2.65).  Solving Table 1's SD
rows for c gives c_small ≈ 0.0069 and c_base ≈ 0.022, which are the ratios of the true FLAN-T5 parameter
counts (77M / 11.1B and 248M / 11.1B) -- the "model size" cost convention of the paper's SWI (MS) metric.
We therefore use ``PARAM_COSTS`` (parameter-count ratios) for ``table1_rows`` and keep ``LEVIATHAN_COSTS``
for reference.  (A target size of 11.3B fits the paper's numbers even more closely, within 0.005.)
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np

# Leviathan et al. 2023, Table 3: acceptance rates for a T5-XXL target, (t=0, t=1).
LEVIATHAN_ALPHAS = {
    "ende": {"small": (0.75, 0.62), "base": (0.80, 0.68), "large": (0.82, 0.71)},
    "cnndm": {"small": (0.65, 0.53), "base": (0.73, 0.55), "large": (0.74, 0.56)},
}
# Leviathan et al. 2023, Table 4: cost coefficients relative to T5-XXL (wall time).
LEVIATHAN_COSTS = {"small": 0.02, "base": 0.04, "large": 0.11}
# FLAN-T5 parameter counts (small 77M, base 248M, large 783M, XXL 11.1B); cost = params / target params.
_PARAMS = {"small": 77e6, "base": 248e6, "large": 783e6, "xl": 2.85e9, "xxl": 11.1e9}
PARAM_COSTS = {m: _PARAMS[m] / _PARAMS["xxl"] for m in ("small", "base", "large")}

# Paper's Table 1 (Chen et al. 2024), transcribed: (dataset, Md1, Md2, k1, k2, EWIF).  Rows with Md2=None are
# vanilla speculative decoding with k = k1; rows with Md2 are the horizontal
# cascade (k1 tokens by Md1, then k2 tokens by Md2).
PAPER_TABLE1 = [
    {"dataset": "cnndm", "md1": "small", "md2": None, "k1": 9, "k2": None, "ewif": 2.65},
    {"dataset": "cnndm", "md1": "base", "md2": None, "k1": 8, "k2": None, "ewif": 2.96},
    {"dataset": "cnndm", "md1": "base", "md2": "small", "k1": 5, "k2": 3, "ewif": 3.03},
    {"dataset": "ende", "md1": "small", "md2": None, "k1": 12, "k2": None, "ewif": 3.61},
    {"dataset": "ende", "md1": "base", "md2": None, "k1": 11, "k2": None, "ewif": 3.75},
    {"dataset": "ende", "md1": "base", "md2": "small", "k1": 5, "k2": 8, "ewif": 3.93},
]


# ------------------------------------------------------------------------------------------ Theorem 4.1
def pgf_speculative(alpha: float, k: int, x):
    """Theorem 4.1, Eq. (1)/(3): PGF ϕ_(α,k)(x) of the number of tokens produced by one SD step.

    p_i = α^(i-1) - α^i for i = 1..k (i-1 drafts accepted, then a rejection and one corrected token) and
    p_(k+1) = α^k (all k accepted plus the bonus token), so
    ϕ(x) = α^k x^(k+1) + Σ_{i=0}^{k-1} (α^i - α^(i+1)) x^(i+1) = 1 + (x-1) (1 - α^(k+1) x^(k+1)) / (1 - αx).
    (Appendix Eq. (6) prints the leading term as "x"; Eq. (1)'s "1" is the correct one.)
    """
    x = np.asarray(x, dtype=float)
    i = np.arange(k)
    terms = (alpha**i - alpha ** (i + 1))[:, None] * x.reshape(1, -1) ** (i + 1)[:, None]
    out = alpha**k * x.reshape(-1) ** (k + 1) + terms.sum(axis=0)
    return out.reshape(x.shape) if x.ndim else float(out[0])


def pgf_speculative_closed(alpha: float, k: int, x: float) -> float:
    """Theorem 4.1, Eq. (1) closed form 1 + (x-1)(1 - (αx)^(k+1)) / (1 - αx) (geometric sum if αx = 1)."""
    ax = alpha * x
    s = (k + 1) if ax == 1 else (1 - ax ** (k + 1)) / (1 - ax)
    return 1 + (x - 1) * s


def pgf_coefficients(alpha: float, k: int) -> np.ndarray:
    """Coefficients [p_0, ..., p_(k+1)] of ϕ_(α,k) (Eq. (3)); p_j = P(one SD step produces j tokens)."""
    p = np.zeros(k + 2)
    for i in range(k):
        p[i + 1] = alpha**i - alpha ** (i + 1)
    p[k + 1] = alpha**k
    return p


def expected_tokens_from_pgf(coeffs: Sequence[float], alpha: float) -> float:
    """Operator T_α of Appendix C.2: T_α(f) = (1 - α f(α)) / (1 - α).

    ``coeffs`` are the coefficients of a PGF f of the number j of draft tokens handed to a reviewer whose
    per-token acceptance is α; T_α maps x^j to (1 - α^(j+1))/(1 - α) = expected tokens produced by the review
    (accepted drafts + 1).  For α = 1 the limit Σ_j f_j (j+1) is used.
    """
    c = np.asarray(coeffs, dtype=float)
    j = np.arange(len(c))
    if alpha == 1:
        return float(np.sum(c * (j + 1)))
    return float((1 - alpha * np.polyval(c[::-1], alpha)) / (1 - alpha))


# ------------------------------------------------------------------------------------------ Corollary 4.2
def expected_tokens_speculative(alpha: float, k: int) -> float:
    """ϕ'_(α,k)(1) = (1 - α^(k+1)) / (1 - α): expected tokens per SD step (Corollary 4.2 numerator)."""
    if alpha == 1:
        return float(k + 1)
    return (1 - alpha ** (k + 1)) / (1 - alpha)


def ewif_speculative(alpha: float, k: int, c: float) -> float:
    """Corollary 4.2: EWIF of speculative decoding = ϕ'(1)/(ck+1) = (1 - α^(k+1)) / ((1 - α)(ck + 1)).

    Identical to Leviathan et al. 2023 (Theorem 3.8 with γ = k).  k = 0 gives 1 (autoregressive decoding).
    """
    return expected_tokens_speculative(alpha, k) / (c * k + 1)


# ------------------------------------------------------------------------------------------ Theorem 4.3
def ewif_vertical(alpha: float, alpha_prime: float, k: int, n: int, c_d1: float, c_d2: float) -> float:
    """Theorem 4.3, Eq. (2): EWIF of a 2-level vertical cascade.

    EWIF = (1 - α ϕ^n(α)) / ((1 - α)(1 + n c_d1 + n k c_d2)).

    Quantities (as in the proof, Appendix C.2):
      * ``alpha`` = α = α(Mt, Md1): acceptance of the target Mt on tokens drafted (by the Md1/Md2 system);
      * ``alpha_prime`` = α' = α(Md1, Md2): acceptance of Md1 on tokens drafted by Md2;
      * ``k``: SD draft length between Md1 (reviewer) and Md2 (drafter);
      * ``n``: number of Md1-Md2 SD steps performed before Mt reviews;
      * ``c_d1`` = c(Mt, Md1), ``c_d2`` = c(Mt, Md2).
    ϕ = ϕ_(α',k) is the PGF of tokens from one Md1-Md2 step, so ϕ^n (n-th power) is the PGF of the draft
    length J handed to Mt, and T_α (``expected_tokens_from_pgf``) gives the expected tokens of Mt's
    review.  The cost counts n Md1 calls and exactly n k Md2 calls per step, as in the paper.
    """
    coeffs = np.array([1.0])
    step = pgf_coefficients(alpha_prime, k)
    for _ in range(n):
        coeffs = np.convolve(coeffs, step)
    return expected_tokens_from_pgf(coeffs, alpha) / (1 + n * c_d1 + n * k * c_d2)


def ewif_vertical_closed(alpha: float, alpha_prime: float, k: int, n: int, c_d1: float, c_d2: float) -> float:
    """Eq. (2) evaluated with the closed form of ϕ_(α',k)(α) (Theorem 4.1); same value as ewif_vertical."""
    phi = pgf_speculative_closed(alpha_prime, k, alpha)
    num = n + 1 if alpha == 1 else (1 - alpha * phi**n) / (1 - alpha)
    return num / (1 + n * c_d1 + n * k * c_d2)


# ------------------------------------------------------------------------------------------ Theorem 4.5
def ewif_horizontal(alphas: Sequence[float], costs: Sequence[float]) -> float:
    """Theorem 4.5: T(k, α_1..α_k, c_1..c_k) = Σ_{i=0}^k Π_{j=1}^i α_j / (1 + Σ_{i=1}^k c_i).

    Draft position i (1-based) is produced by a drafter with acceptance ``alphas[i-1]`` and cost
    ``costs[i-1]``; by Corollary 4.6 the i-th draft token is accepted with probability Π_{j<=i} α_j.
    With all α_i = α and c_i = c this is ``ewif_speculative(α, k, c)``.
    """
    a = np.asarray(alphas, dtype=float)
    c = np.asarray(costs, dtype=float)
    if a.shape != c.shape:
        raise ValueError("alphas and costs must have the same length")
    return float((1 + np.cumprod(a).sum()) / (1 + c.sum()))


def ewif_horizontal_gradient(
    alphas: Sequence[float], costs: Sequence[float]
) -> tuple[np.ndarray, np.ndarray]:
    """Corollary 4.6: (dT/dα_l, dT/dc_l) for l = 1..k.

    dT/dα_l = Σ_{i=l}^k Π_{j<=i, j≠l} α_j / (1 + Σ c_i) (no division by α_l, so α_l = 0 is fine);
    in particular dT/dα_1 = Σ_{i=1}^k Π_{j=2}^i α_j / D and dT/dα_k = Π_{j<k} α_j / D.
    dT/dc_l = -T / (1 + Σ c_i) (not in the paper; included for completeness).
    """
    a = np.asarray(alphas, dtype=float)
    c = np.asarray(costs, dtype=float)
    k = len(a)
    denom = 1 + c.sum()
    grad_a = np.zeros(k)
    for pos in range(k):
        a_wo = a.copy()
        a_wo[pos] = 1.0
        grad_a[pos] = np.cumprod(a_wo)[pos:].sum() / denom
    grad_c = np.full(k, -ewif_horizontal(a, c) / denom)
    return grad_a, grad_c


# ------------------------------------------------------------------------------------------ searches
def best_k(alpha: float, c: float, k_max: int = 64) -> tuple[int, float]:
    """argmax_{0<=k<=k_max} of Corollary 4.2's EWIF; returns (k, EWIF). Ties -> smallest k."""
    vals = [ewif_speculative(alpha, k, c) for k in range(k_max + 1)]
    k = int(np.argmax(vals))
    return k, vals[k]


def best_horizontal(
    alphas_by_model: Sequence[float], costs_by_model: Sequence[float], length: int
) -> tuple[list[int], float]:
    """Best drafter per draft position for the horizontal cascade (Theorem 4.5), fixed draft ``length``.

    Returns (assignment, EWIF), assignment[i] = index of the model drafting position i+1.  Exact search: the
    denominator 1 + Σ c_i does not depend on the order, and every prefix product Π_{j<=i} α_j is maximised
    simultaneously by placing drafters in decreasing α, so it suffices to enumerate how many positions each
    model drafts (C(length + M - 1, M - 1) candidates for M models) and sort them by decreasing α.
    """
    a = np.asarray(alphas_by_model, dtype=float)
    c = np.asarray(costs_by_model, dtype=float)
    order = [int(m) for m in np.argsort(-a, kind="stable")]
    best: tuple[list[int], float] = ([], 1.0 if length == 0 else -np.inf)
    for combo in itertools.combinations_with_replacement(order, length):
        assign = sorted(combo, key=order.index)
        v = ewif_horizontal(a[assign], c[assign])
        if v > best[1] + 1e-15:
            best = (assign, v)
    return best


def best_horizontal_two(
    alpha1: float, c1: float, alpha2: float, c2: float, k_max: int = 32
) -> tuple[int, int, float]:
    """Table 1 setting: grid search of k1 tokens by Md1 followed by k2 tokens by Md2 (Theorem 4.5)."""
    best = (0, 0, 1.0)
    for k1, k2 in itertools.product(range(k_max + 1), repeat=2):
        v = ewif_horizontal([alpha1] * k1 + [alpha2] * k2, [c1] * k1 + [c2] * k2)
        if v > best[2] + 1e-12:
            best = (k1, k2, v)
    return best


# ------------------------------------------------------------------------------------------ simulators
def _leading_accepts(rng: np.random.Generator, alpha: float, cap, size: int) -> np.ndarray:
    """Number of leading successes of i.i.d. Bernoulli(α) trials, capped at ``cap`` (scalar or array)."""
    if alpha >= 1:
        return np.broadcast_to(np.asarray(cap), (size,)).astype(np.int64).copy()
    if alpha <= 0:
        return np.zeros(size, dtype=np.int64)
    return np.minimum(rng.geometric(1 - alpha, size=size) - 1, cap)


def simulate_speculative(alpha: float, k: int, c: float, steps: int = 200_000, seed: int = 0) -> float:
    """Monte-Carlo EWIF of SD: tokens / total cost (target run = 1, draft run = c), i.i.d. acceptance."""
    rng = np.random.default_rng(seed)
    tokens = _leading_accepts(rng, alpha, k, steps) + 1
    return float(tokens.sum() / (steps * (1 + k * c)))


def simulate_horizontal(
    alphas: Sequence[float], costs: Sequence[float], steps: int = 200_000, seed: int = 0
) -> float:
    """Monte-Carlo EWIF of the horizontal cascade: position i accepted w.p. α_i given earlier accepted."""
    rng = np.random.default_rng(seed)
    a = np.asarray(alphas, dtype=float)
    acc = rng.random((steps, len(a))) < a
    tokens = np.cumprod(acc, axis=1).sum(axis=1) + 1
    return float(tokens.sum() / (steps * (1 + float(np.sum(costs)))))


def simulate_vertical(
    alpha: float,
    alpha_prime: float,
    k: int,
    n: int,
    c_d1: float,
    c_d2: float,
    steps: int = 200_000,
    seed: int = 0,
) -> float:
    """Monte-Carlo EWIF of Theorem 4.3's two-level vertical cascade.

    n Md1-Md2 SD steps each produce (leading accepts of k Bernoulli(α') trials) + 1 tokens; their total J is
    reviewed by Mt, producing (leading accepts of J Bernoulli(α) trials) + 1 tokens.
    Cost per step 1 + n c_d1 + n k c_d2.
    """
    rng = np.random.default_rng(seed)
    j = np.zeros(steps, dtype=np.int64)
    for _ in range(n):
        j += _leading_accepts(rng, alpha_prime, k, steps) + 1
    tokens = _leading_accepts(rng, alpha, j, steps) + 1
    return float(tokens.sum() / (steps * (1 + n * c_d1 + n * k * c_d2)))


# ------------------------------------------------------------------------------------------ Table 1
def table1_rows(
    costs: dict[str, float] | None = None, temperature_index: int = 0, steps: int = 200_000, seed: int = 0
) -> list[dict]:
    """Reproduce the structure of the paper's Table 1 (T5-XXL target, t=0 acceptance rates by default).

    For each PAPER_TABLE1 row, returns closed-form and simulated EWIF at the paper's k's plus our optimal k's
    (``best_k`` for SD rows, ``best_horizontal_two`` for cascade rows).  Costs default to ``PARAM_COSTS``.
    """
    costs = PARAM_COSTS if costs is None else costs
    rows = []
    for i, p in enumerate(PAPER_TABLE1):
        al = LEVIATHAN_ALPHAS[p["dataset"]]
        a1, c1 = al[p["md1"]][temperature_index], costs[p["md1"]]
        row = dict(p)
        row.pop("ewif")
        row["paper_ewif"] = p["ewif"]
        if p["md2"] is None:
            row["ewif"] = ewif_speculative(a1, p["k1"], c1)
            row["ewif_sim"] = simulate_speculative(a1, p["k1"], c1, steps=steps, seed=seed + i)
            row["best_k1"], row["best_ewif"] = best_k(a1, c1)
            row["best_k2"] = None
        else:
            a2, c2 = al[p["md2"]][temperature_index], costs[p["md2"]]
            alphas = [a1] * p["k1"] + [a2] * p["k2"]
            cs = [c1] * p["k1"] + [c2] * p["k2"]
            row["ewif"] = ewif_horizontal(alphas, cs)
            row["ewif_sim"] = simulate_horizontal(alphas, cs, steps=steps, seed=seed + i)
            row["best_k1"], row["best_k2"], row["best_ewif"] = best_horizontal_two(a1, c1, a2, c2)
        rows.append(row)
    return rows
