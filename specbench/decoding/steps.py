"""A loop's steps, one (drafted, accepted) pair per target verification (Generation.steps), and what
they say about acceptance (pure numpy):

* the mean tokens committed per step (Spec-Bench's "mean accepted tokens", Xia et al., Findings of
  ACL 2024) and the histogram of accepted drafts per step;
* per draft position the marginal rate (vLLM's per-position acceptance, accepted at i / drafts, is
  this one) and the conditional rate, Leviathan et al.'s per-token α measured at each position (flat
  if acceptance were i.i.d.);
* a speculative cascade's reviewed drafts and rejections.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np


def _steps(steps: Iterable[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    pairs = np.asarray(list(steps), dtype=np.int64).reshape(-1, 2)
    return pairs[:, 0], pairs[:, 1]


def mean_accepted_per_step(steps: Iterable[Sequence[int]]) -> float:
    """Tokens committed per target step, averaged over steps: mean of (accepted + 1).

    Spec-Bench's "mean accepted tokens"; vLLM's mean acceptance length (1 + accepted / drafts) where
    every step drafts. cells.csv's older
    ``acceptance_length`` is generated tokens / steps instead: the two differ when an EOS or the token
    budget cut a step's tokens short. NaN without steps."""
    _, accepted = _steps(steps)
    return float(accepted.mean() + 1) if len(accepted) else math.nan


def accepted_histogram(steps: Iterable[Sequence[int]]) -> list[int]:
    """How many steps accepted 0, 1, ..., kmax drafts (kmax: the most drafts any step accepted or made)."""
    drafted, accepted = _steps(steps)
    if not len(accepted):
        return []
    return np.bincount(accepted, minlength=int(max(drafted.max(), accepted.max())) + 1).tolist()


def position_counts(steps: Iterable[Sequence[int]]) -> np.ndarray:
    """Per draft position i = 1..L (rows): proposed, accepted, reached.

    proposed: steps that drafted at least i tokens; accepted: steps whose first i drafts were all
    accepted (a speculative step accepts a prefix, so this is ``accepted_by_position`` of the rows);
    reached: steps that proposed position i after accepting positions 1..i-1, the steps where
    position i was reviewed at all."""
    drafted, accepted = _steps(steps)
    longest = int(drafted.max()) if len(drafted) else 0
    i = np.arange(1, longest + 1)[:, None]
    proposed = drafted[None, :] >= i
    return np.column_stack(
        [
            proposed.sum(axis=1),
            (proposed & (accepted[None, :] >= i)).sum(axis=1),
            (proposed & (accepted[None, :] >= i - 1)).sum(axis=1),
        ]
    ).reshape(-1, 3)


def acceptance_rates(counts: np.ndarray) -> tuple[list[float], list[float]]:
    """(marginal, conditional) acceptance rate per draft position from ``position_counts``.

    marginal_i = accepted_i / proposed_i (CS Drafting's Figure 2, ``draft_acceptance_rate`` by
    position); conditional_i = accepted_i / reached_i, the chance that draft i is accepted once the
    i-1 before it were (position 1: the marginal rate). When every step drafts the same k, reached_i
    = accepted_{i-1} and conditional_i = accepted_i / accepted_{i-1}; with varying draft lengths
    (SpecDec++, Max-Gram) a step that accepted all of its i-1 drafts never reviewed a position i and
    is left out. NaN where the denominator is 0."""
    counts = np.asarray(counts, dtype=float).reshape(-1, 3)
    with np.errstate(divide="ignore", invalid="ignore"):
        marginal = counts[:, 1] / counts[:, 0]
        conditional = counts[:, 1] / counts[:, 2]
    return marginal.tolist(), conditional.tolist()


def reviewed_and_rejected(steps) -> tuple[int, int]:
    """A speculative cascade's drafts the target reviewed (each step's up to its first rejection) and
    its rejections (the steps that rejected one), from (drafted, accepted) steps."""
    return sum(min(a + 1, d) for d, a in steps), sum(1 for d, a in steps if a < d)
