"""Acceptance rules: pure functions from draft tokens and the (q, p) distributions to a verdict.

Every speculative loop in specbench verifies with one of these, so a new rule (lossy SD, a cascade
deferral rule) is a new function here, not a new loop. A rule takes

    drafts  [k]       the candidate tokens x_1..x_k
    q       [k, V]    the drafter's distributions (None: one-hot on ``drafts``, as for prompt lookup)
    p       [k+1, V]  the verifier's distributions after the prefix and after each candidate
    generator         the torch random generator (unused by greedy rules)

and returns a :class:`Verdict`: how many leading drafts are accepted (``n``, 0-d tensor) and the
token that follows them (the correction, or the bonus token when all k are accepted). Nothing here
synchronises with the host; the caller reads ``n`` once per step.

Lenience (loosening the review, for inner reviews of a cascade) has two conventions:

* ``cs`` — CS Drafting (Chen et al. 2024, Sec. 3): l >= 1, accept x when q(x) <= l * p(x),
  otherwise reject with probability 1 - l * p(x) / q(x). Greedy: accept when x = argmax p or
  q(x) <= l * p(x).
* ``leviathan`` — Leviathan et al. 2023 (App. A.5): l in (0, 1], accept with probability
  min(1, p(x) / (l * q(x))). It is the same rule with l_cs = 1 / l_leviathan.

After a lenient rejection the correction is drawn from norm(max(0, p - q / l_cs)), which is the
exact SD residual at l = 1 (l = 1 in either convention is lossless).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from specbench.models.sampling import greedy_token, sample


@dataclass(frozen=True)
class Verdict:
    n_accepted: torch.Tensor  # 0-d long
    next_token: torch.Tensor  # 0-d long


AcceptanceRule = Callable[
    [torch.Tensor, "torch.Tensor | None", torch.Tensor, "torch.Generator | None"], Verdict
]


def lenience_factor(lenience: float, convention: str = "cs") -> float:
    """The CS-convention multiplier l_cs >= 1 on p(x) for either documented convention."""
    if convention == "cs":
        if lenience < 1.0:
            raise ValueError(f"CS Drafting lenience must be >= 1, got {lenience}")
        return float(lenience)
    if convention == "leviathan":
        if not 0.0 < lenience <= 1.0:
            raise ValueError(f"Leviathan lenience must be in (0, 1], got {lenience}")
        return 1.0 / lenience
    raise ValueError(f"unknown lenience convention {convention!r} (use 'cs' or 'leviathan')")


def _leading_true(mask: torch.Tensor) -> torch.Tensor:
    """Number of leading True values of a 1-D bool tensor, as a 0-d long tensor."""
    return torch.cumprod(mask.long(), dim=0).sum()


def _draft_probs(drafts: torch.Tensor, q: torch.Tensor | None, rows: torch.Tensor) -> torch.Tensor:
    if q is None:
        return torch.ones(drafts.shape[0], dtype=torch.float64, device=drafts.device)
    return q[rows, drafts]


def greedy_accept(
    drafts: torch.Tensor, q: torch.Tensor | None, p: torch.Tensor, generator=None, *, lenience: float = 1.0
) -> Verdict:
    """Greedy verification: keep drafts while they equal the argmax of p (lenient: or q(x) <= l p(x))."""
    best = greedy_token(p)  # [k+1]
    k = drafts.shape[0]
    agree = drafts == best[:k]
    if lenience != 1.0 and k:
        rows = torch.arange(k, device=drafts.device)
        px = p[rows, drafts]
        agree = agree | (_draft_probs(drafts, q, rows).to(px.dtype) <= lenience * px)
    n = _leading_true(agree)
    return Verdict(n, best[n])


def speculative_accept(
    drafts: torch.Tensor,
    q: torch.Tensor | None,
    p: torch.Tensor,
    generator: torch.Generator | None,
    *,
    lenience: float = 1.0,
) -> Verdict:
    """Speculative sampling (Leviathan et al. 2023, Algorithm 1), with CS-convention lenience l >= 1.

    Accept x_i with probability min(1, l p_i(x_i) / q_i(x_i)); at the first rejection draw from
    norm(max(0, p_i - q_i / l)); if all k are accepted draw the bonus token from p_{k+1}.
    """
    k, vocab = drafts.shape[0], p.shape[-1]
    rows = torch.arange(k, device=p.device)
    px = p[rows, drafts]
    qx = _draft_probs(drafts, q, rows).to(p.dtype)
    u = torch.rand(k, generator=generator, device=p.device, dtype=p.dtype)
    n = _leading_true(u * qx < lenience * px)

    # q padded with a zero row, so that "all accepted" (n = k) draws the bonus from p_{k+1} unchanged
    q_at_n = torch.zeros(vocab, dtype=p.dtype, device=p.device)
    if k:
        if q is None:
            q_at_n = q_at_n.scatter(0, drafts[n.clamp(max=k - 1)].view(1), 1.0)
        else:
            q_at_n = q[n.clamp(max=k - 1)].to(p.dtype)
        q_at_n = q_at_n * (n < k)
    p_at_n = p[n]
    residual = torch.clamp(p_at_n - q_at_n / lenience, min=0.0)
    total = residual.sum()
    # p == q / l exactly leaves no residual mass; the rejection then had probability 0 (or the
    # rule was lenient), and p itself is the right fallback.
    residual = torch.where(total > 0, residual / total.clamp(min=torch.finfo(p.dtype).tiny), p_at_n)
    return Verdict(n, sample(residual, generator))


def cascade_accept(
    drafts: torch.Tensor, q: torch.Tensor | None, pi: torch.Tensor, generator: torch.Generator | None
) -> Verdict:
    """GenSpecSample's verification (Narasimhan et al. 2025, Algorithm 4) against a target π = T(q, p).

    Accept x_i with probability min(1, π_i(x_i) / q_i(x_i)); at the first rejection draw from
    norm(max(0, π_i − q_i)); if all k are accepted draw the bonus token from π_{k+1}. It is
    speculative sampling with p replaced by π: ``speculative_accept`` is the case π = p.
    """
    return speculative_accept(drafts, q, pi, generator)


def exact_rule(greedy: bool, lenience: float = 1.0) -> AcceptanceRule:
    """The lossless rule for greedy or sampled decoding (lenience l_cs >= 1 loosens it)."""
    if greedy:
        return lambda drafts, q, p, generator: greedy_accept(drafts, q, p, generator, lenience=lenience)
    return lambda drafts, q, p, generator: speculative_accept(drafts, q, p, generator, lenience=lenience)
