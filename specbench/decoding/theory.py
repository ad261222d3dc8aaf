"""What the papers' analyses expect of a measured cell, from the cell's own acceptance.

Speculative decoding (Leviathan et al., "Fast Inference from Transformers via Speculative Decoding",
ICML 2023, Theorem 3.8) and Cascade Speculative Drafting (Chen et al., NeurIPS 2024, Theorems 4.1,
4.3 and 4.5) predict the walltime improvement of a step from acceptance rates and cost coefficients:
E[tokens a target review commits] / E[cost of the step in target passes]. This module evaluates that
expectation for the cells specbench measures, from the acceptance the run measured, so the report
can put the theory beside the measured SWI, and, with the same acceptance, at another cost table
(the papers' own: "what-if").

Two readings of "the measured acceptance":

* ``by position``: each reviewer accepts draft position i with its measured conditional rate
  (accepted once the i-1 before it were), reviews independent of each other;
* ``iid``: one rate per reviewer, the maximum-likelihood alpha of its steps: the papers' assumption.

A draft's length comes from the method's rule: k for speculative decoding; for CS Drafting the
K-matrix rule of Algorithm 1 evaluated exactly over the distribution of every level's draft length
(a renewal recursion, so Theorem 4.3's fixed n of Md1 steps becomes the rule's random number of
blocks). A statistical drafter's draft length is not a rule but a search that may come back short, so
its distribution is taken as measured (Max-Gram's at the level it drafts alone; prompt lookup's at the
target). Edge effects the theory ignores: the prefill pass, EOS and the max_new_tokens cap.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from specbench import methods
from specbench.decoding.steps import acceptance_rates, position_counts
from specbench.models.costs import iid_acceptance, swi

LONGEST = 1024  # draft positions a rate vector covers (positions past a reviewer's measured ones)


@dataclass(frozen=True)
class Expectation:
    """One target step as the theory expects it: tokens committed, and forward passes per model
    other than the target (a target step is one target pass)."""

    tokens: float
    passes: dict[str, float]

    def swi(self, costs: dict[str, float | None], target: str) -> float:
        """Expected walltime improvement under one cost table (per-model cost per pass): SWI of one
        step, a target pass and these passes; NaN when a model that runs has no cost there."""
        return swi(self.tokens, {target: 1.0, **self.passes}, costs, target)


def rates(steps: Sequence[Sequence[int]], iid: bool) -> np.ndarray:
    """A reviewer's acceptance chance at draft positions 1..LONGEST from its (drafted, accepted)
    steps: one alpha everywhere (``iid``), or the conditional rate by position, with that alpha at
    positions it never reviewed."""
    alpha = iid_acceptance(steps)
    alpha = 0.0 if math.isnan(alpha) else alpha
    out = np.full(LONGEST, alpha)
    if not iid:
        _, conditional = acceptance_rates(position_counts(steps))
        measured = np.asarray(conditional[:LONGEST], dtype=float)
        out[: len(measured)] = np.where(np.isnan(measured), alpha, measured)
    return out


def drafted_pmf(steps: Sequence[Sequence[int]]) -> np.ndarray:
    """The measured distribution of a review's draft length, P(J = j), j = 0..max."""
    drafted = np.asarray([d for d, _ in steps], dtype=np.int64)
    if not len(drafted):
        return np.array([1.0])
    return np.bincount(drafted) / len(drafted)


def accepted_pmf(rate: np.ndarray, draft: np.ndarray) -> np.ndarray:
    """P(A = a), a = 0..len(draft)-1, of the accepted prefix of a draft of length J ~ ``draft``:
    A = a when the first a drafts pass and then either the draft ends (J = a) or draft a+1 fails."""
    longest = len(draft) - 1
    survive = np.concatenate([[1.0], np.cumprod(rate[:longest])])  # P(first a accepted | J >= a)
    beyond = np.concatenate([np.cumsum(draft[::-1])[::-1][1:], [0.0]])  # P(J > a)
    fail = np.concatenate([1 - rate[:longest], [0.0]])
    return survive * (draft + beyond * fail)


def expected_tokens(rate: np.ndarray, draft: np.ndarray) -> float:
    """E[A + 1]: the tokens one review of a draft of length J ~ ``draft`` commits (Theorem 4.3's
    operator T_alpha, with rates by position)."""
    return float(1 + accepted_pmf(rate, draft) @ np.arange(len(draft)))


def speculative(rate: np.ndarray, draft: np.ndarray, drafter: str, passes_per_step: float) -> Expectation:
    """Speculative decoding: the target reviews a draft of length J ~ ``draft`` (k every step for a
    model drafter); the drafter runs ``passes_per_step`` passes (k in Leviathan et al.'s count)."""
    return Expectation(expected_tokens(rate, draft), {drafter: passes_per_step})


def cascade(
    K: Sequence[Sequence[int]],
    reviewers: Sequence[np.ndarray],
    names: Sequence[str],
    mag_draft: np.ndarray,
    mag_tail: int,
) -> Expectation:
    """CS Drafting (Algorithm 1) with the cumulative budget matrix ``K`` over n neural drafters.

    ``reviewers[r]`` is the acceptance of the model reviewing level r (0: the target, r: M_dr);
    ``names`` the n neural drafters and then the statistical one; ``mag_draft`` the distribution of
    the statistical drafter's draft length per call. Level r's draft is built as
    ``decoding.cascade_drafting`` builds it: blocks of M_d(c+1) while it is shorter than K[r][c]
    (c = r..n-1), each block being M_d(c+1)'s review of level c+1 (its accepted prefix + 1), then
    Max-Gram calls while shorter than K[r][n-1] + mag_tail (a call that drafts nothing ends it)."""
    n = len(K)
    levels: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    mag_calls = np.zeros(n + 1)
    mag_calls[n] = 1.0
    levels[n] = (mag_draft, mag_calls)
    for r in range(n - 1, -1, -1):
        active, passes = np.array([1.0]), np.zeros(n + 1)
        for c in range(r, n):
            draft, inner = levels[c + 1]
            block = np.concatenate([[0.0], accepted_pmf(reviewers[c + 1], draft)])  # B = A + 1
            block_passes = inner + np.eye(n + 1)[c]
            active, passes = _grow(active, passes, K[r][c], block, block_passes)
        budget = K[r][n - 1] + mag_tail if mag_tail else 0
        ended = np.zeros(1)
        while active[:budget].sum() > 1e-15:
            below = _pad(active[:budget], len(active))
            calls = below.sum()
            ended = _add(ended, below * mag_draft[0])  # found nothing: the level's draft ends here
            more = mag_draft.copy()
            more[0] = 0.0
            active = _add(active - below, np.convolve(below, more))
            passes[n] += calls
        levels[r] = (_add(active, ended), passes)
    draft, passes = levels[0]
    return Expectation(expected_tokens(reviewers[0], draft), dict(zip(names, passes.tolist(), strict=True)))


def _grow(active: np.ndarray, passes: np.ndarray, budget: int, block: np.ndarray, block_passes: np.ndarray):
    """Add blocks to every draft shorter than ``budget`` until none is (a block adds >= 1 token)."""
    while active[:budget].sum() > 1e-15:
        below = _pad(active[:budget], len(active))
        passes = passes + below.sum() * block_passes
        active = _add(active - below, np.convolve(below, block))
    return active, passes


def _pad(head: np.ndarray, length: int) -> np.ndarray:
    return np.concatenate([head, np.zeros(length - len(head))])


def _add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    out = np.zeros(max(len(a), len(b)))
    out[: len(a)] += a
    out[: len(b)] += b
    return out


# -- a measured cell's expectation ----------------------------------------------------------------


def of_cell(rows: list[dict], iid: bool) -> Expectation | None:
    """The theory's expectation for the cell of ``rows``, from the acceptance it measured: the theory
    its method declares (speculative decoding, a speculative cascade, CS Drafting), or None for a
    method without one and for a cell without steps."""
    if not any(r["steps"] for r in rows):
        return None
    # the module, not the registry: a decoding module's METHODS is what the registry collects
    method = methods.METHODS.get(rows[0]["method"])
    return method.theory(rows, iid) if method is not None and method.theory is not None else None


def committed_over_kept(rows: list[dict]) -> float | None:
    """Tokens the cell's rounds committed over the tokens its outputs kept (None without steps).

    Each round commits its accepted drafts and one token of the target's, but an output's last round is
    cut where EOS or the token budget falls, so over short outputs the rounds commit more than the
    outputs keep, and the theory's tokens a round overstate the measured SWI by this ratio.
    """
    committed = sum(step[1] + 1 for r in rows for step in r["steps"] or ())
    kept = sum(r["n_tokens"] for r in rows if r["steps"])
    return committed / kept if kept else None


def committed_over_kept_by_cell(rows: list[dict]) -> dict[tuple[str, str], float | None]:
    """:func:`committed_over_kept` of each (dataset, cell) of a run's rows."""
    cells: dict[tuple[str, str], list[dict]] = {}
    for row in rows:
        cells.setdefault((row["dataset"], row["cell"]), []).append(row)
    return {key: committed_over_kept(group) for key, group in cells.items()}


def of_speculative(rows: list[dict], iid: bool, bonus_pass: bool = False) -> Expectation | None:
    """Speculative decoding's expectation from its own acceptance (None without a drafter or a fixed
    k); ``bonus_pass``: one more drafter pass a step (a speculative cascade's q at the bonus position,
    Narasimhan et al., ICLR 2025)."""
    first = rows[0]
    k = first["params"].get("k")
    if not first.get("drafter") or not isinstance(k, int):
        return None
    steps = [s for r in rows for s in r["steps"]]
    # a pass per drafted token: k, less where the token budget cut the last drafts short
    draft = drafted_pmf(steps)
    passes = float(draft @ np.arange(len(draft))) + bonus_pass
    return speculative(rates(steps, iid), draft, first["drafter"], passes)
