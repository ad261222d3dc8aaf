"""Target distributions π = T(q, p) and deferral decisions of "Faster Cascades via Speculative
Decoding" (Narasimhan et al., ICLR 2025), as pure, vectorised functions over rows ``[n, V]``.

``q`` is the drafter's (small model's) next-token distribution, ``p`` the verifier's (large
model's), one row per position. Every rule is one entry of :data:`RULES`:

==========  ==================================================  ====================================
rule        decision                                            π (paper)
==========  ==================================================  ====================================
sd          —                                                   p  (Algorithm 1, lossless)
lossy       —                                                   max{min{q, p/(1−α)}, p/β}  (Lemma 3)
bild        δ = 1(D(q, p) > α)                                  Eq. 6  (BiLD*, Sec. 5, App. E.1)
chow        δ = 1(max q < 1 − α)                                Eq. 6  (Eq. 2)
diff        δ = 1(max q < max p − α)                            Eq. 6  (Eq. 5)
opt         δ = 1(max q < max p − α·D_TV(p, q))                 Eq. 6  (Eq. 10)
chow_log    δ = 1(entropy(q) > α)                               Eq. 6  (Eq. 24)
diff_log    δ = 1(Σ q log q < Σ p log p − α)                    Eq. 6  (Eq. 25)
opt_log     δ = 1(Σ q log q < Σ p log p − α·D_TV(p, q))         Eq. 6  (Eq. 26)
token_v1    r(v) = 1(q(v) < max p − α)                          Eq. 11 (Eq. 13)
token_v2    r(v) = 1(p(v) < max p − α)                          Eq. 11 (Eq. 14)
token       r(v) = 1(p(v) < max p · (1 − α)), the paper's Token  Eq. 11 (Eq. 15)
==========  ==================================================  ====================================

Eq. 6: T_δ(q, p) = (1 − δ)·q + δ·p.  Eq. 11: π(v) = q(v)·(1 − r(v)) + p(v)·Σ_v' r(v')·q(v').

The decision may read other rows than the mixture: :func:`target` takes the rows that are sampled
from (``q``, ``p``) and, apart, the rows the decision reads (``q_conf``, ``p_conf``); they differ
only at temperature 0 (see specbench.decoding.spec_cascades).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from specbench.methods import ParamSpec, given_params


def tv_distance(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """D_TV(p, q) = Σ_v max{0, p(v) − q(v)} per row (Lemma 5): the rejection rate of π = p."""
    return (p - q).clamp(min=0).sum(-1)


def neg_entropy(q: torch.Tensor) -> torch.Tensor:
    """Σ_v q(v)·log q(v) per row, with 0·log 0 = 0."""
    return torch.special.xlogy(q, q).sum(-1)


def discrepancy(q: torch.Tensor, p: torch.Tensor, metric: str) -> torch.Tensor:
    """BiLD's D(q, p) (App. E.1): ``greedy`` −log p(argmax q); ``sampling`` −Σ_v q(v)·log p(v)."""
    if metric == "greedy":
        return -torch.log(p.gather(-1, q.argmax(-1, keepdim=True)).squeeze(-1))
    if metric == "sampling":
        return -torch.special.xlogy(q, p).sum(-1)
    raise ValueError(f"unknown discrepancy {metric!r} (use 'greedy' or 'sampling')")


def mixture(q: torch.Tensor, p: torch.Tensor, defer: torch.Tensor) -> torch.Tensor:
    """Eq. 6: T_δ(q, p) = (1 − δ)·q + δ·p, with δ ``[n]`` bool."""
    return torch.where(defer[..., None], p, q)


def token_mixture(q: torch.Tensor, p: torch.Tensor, reject: torch.Tensor) -> torch.Tensor:
    """Eq. 11 / Algorithm 6: π(v) = q(v)·(1 − r(v)) + p(v)·η, η = Σ_v' r(v')·q(v'); r ``[n, V]`` bool."""
    eta = (q * reject).sum(-1, keepdim=True)
    return q * ~reject + p * eta


def lossy_target(q: torch.Tensor, p: torch.Tensor, alpha: float, beta: float | torch.Tensor) -> torch.Tensor:
    """Lossy SD (Tran-Thien 2023) as a target (Table 1, Lemma 3): max{min{q, p/(1−α)}, p/β}.

    Not normalised in general; Algorithm 4 only reads min(1, π/q) and norm(max{0, π − q}).
    """
    if isinstance(beta, torch.Tensor):  # one β per row
        beta = beta[..., None]
    return torch.maximum(torch.minimum(q, p / (1 - alpha)), p / beta)


def tuned_beta(q: torch.Tensor, p: torch.Tensor, alpha: float, iterations: int = 64) -> torch.Tensor:
    """β >= 1 − α per row solving Tran-Thien's condition (App. E.6, Lossy⋆):

        Σ_v max{0, q(v) − p(v)/(1−α)} = Σ_v max{0, p(v)/β − q(v)}.

    The right side grows with s = 1/β from 0 (s = 0) past the left side (s = 1/(1−α)), so bisection
    on s finds the root exactly (the paper grid-searches 1000 values of β in [α, 10]); the largest
    such s is kept. Where nothing is rejected (left side 0) every s <= min q/p fits and π = q.
    """
    excess = (q - p / (1 - alpha)).clamp(min=0).sum(-1)
    low = torch.zeros_like(excess)
    high = torch.full_like(excess, 1 / (1 - alpha))
    for _ in range(iterations):
        mid = (low + high) / 2
        fits = (mid[..., None] * p - q).clamp(min=0).sum(-1) <= excess
        low, high = torch.where(fits, mid, low), torch.where(fits, high, mid)
    return 1 / low  # inf where only s = 0 fits (q = 0 < p on some token): then p/β = 0


# -- deferral decisions δ(q, p) -> [n] bool, token-specific r(q, p) -> [n, V] bool -----------------


def chow_defers(q, p, *, alpha: float, tv=None) -> torch.Tensor:
    return q.amax(-1) < 1 - alpha


def diff_defers(q, p, *, alpha: float, tv=None) -> torch.Tensor:
    return q.amax(-1) < p.amax(-1) - alpha


def opt_defers(q, p, *, alpha: float, tv=None) -> torch.Tensor:
    tv = tv_distance(p, q) if tv is None else tv
    return q.amax(-1) < p.amax(-1) - alpha * tv


def chow_log_defers(q, p, *, alpha: float, tv=None) -> torch.Tensor:
    return -neg_entropy(q) > alpha


def diff_log_defers(q, p, *, alpha: float, tv=None) -> torch.Tensor:
    return neg_entropy(q) < neg_entropy(p) - alpha


def opt_log_defers(q, p, *, alpha: float, tv=None) -> torch.Tensor:
    tv = tv_distance(p, q) if tv is None else tv
    return neg_entropy(q) < neg_entropy(p) - alpha * tv


def bild_defers(q, p, *, alpha: float, metric: str) -> torch.Tensor:
    return discrepancy(q, p, metric) > alpha


def token_v1_rejects(q, p, *, alpha: float) -> torch.Tensor:
    return q < p.amax(-1, keepdim=True) - alpha


def token_v2_rejects(q, p, *, alpha: float) -> torch.Tensor:
    return p < p.amax(-1, keepdim=True) - alpha


def token_v3_rejects(q, p, *, alpha: float) -> torch.Tensor:
    return p < p.amax(-1, keepdim=True) * (1 - alpha)


@dataclass(frozen=True)
class Rule:
    """One row of the table above: how π is built, which parameters it takes, where it comes from."""

    name: str
    kind: str  # "target": π in closed form; "mixture": Eq. 6 with δ; "token": Eq. 11 with r
    params: tuple[str, ...]
    equation: str
    decide: Callable[..., torch.Tensor] | None = None  # δ or r, for "mixture" and "token"
    alpha_max: float | None = None  # inclusive bound of α, when α is a probability threshold
    # Only Algorithm 2 can run it: the decision reads q alone (δ(q_t, ∅))
    needs_only_q: bool = False


RULES: dict[str, Rule] = {
    rule.name: rule
    for rule in (
        Rule("sd", "target", (), "Algorithm 1: π = p (lossless)"),
        Rule("lossy", "target", ("alpha", "beta", "tune_beta"), "Table 1, Lemma 3, App. E.6", None, 1.0),
        Rule("bild", "mixture", ("alpha", "discrepancy"), "Sec. 5, App. E.1 (BiLD*)", bild_defers),
        Rule("chow", "mixture", ("alpha",), "Eq. 2", chow_defers, 1.0, needs_only_q=True),
        Rule("diff", "mixture", ("alpha",), "Eq. 5", diff_defers, 1.0),
        Rule("opt", "mixture", ("alpha",), "Eq. 10", opt_defers),
        Rule("chow_log", "mixture", ("alpha",), "Eq. 24", chow_log_defers, needs_only_q=True),
        Rule("diff_log", "mixture", ("alpha",), "Eq. 25", diff_log_defers),
        Rule("opt_log", "mixture", ("alpha",), "Eq. 26", opt_log_defers),
        Rule("token_v1", "token", ("alpha",), "Eq. 13, Algorithm 6", token_v1_rejects, 1.0),
        Rule("token_v2", "token", ("alpha",), "Eq. 14, Algorithm 6", token_v2_rejects, 1.0),
        Rule("token", "token", ("alpha",), "Eq. 15, Algorithm 6 (TokenV3)", token_v3_rejects, 1.0),
    )
}


def resolve_discrepancy(metric: str, greedy: bool) -> str:
    """``auto``: the paper's choice, the greedy metric at temperature 0 and the sampling one above."""
    if metric == "auto":
        return "greedy" if greedy else "sampling"
    return metric


def decision(rule: str, q: torch.Tensor, p: torch.Tensor, params: dict, *, tv=None) -> torch.Tensor:
    """δ(q, p) ``[n]`` of a mixture rule, or r(v) ``[n, V]`` of a token rule, on rows q, p.

    ``tv`` replaces D_TV(p, q) in OPT's cost (the rejection rate of the rows actually sampled);
    ``params["discrepancy"]`` must be resolved (greedy or sampling) for BiLD.
    """
    spec = RULES[rule]
    if spec.kind == "token":
        return spec.decide(q, p, alpha=params["alpha"])
    if rule == "bild":
        return bild_defers(q, p, alpha=params["alpha"], metric=params["discrepancy"])
    return spec.decide(q, p, alpha=params["alpha"], tv=tv)


def target(
    rule: str,
    q: torch.Tensor,
    p: torch.Tensor,
    params: dict,
    *,
    q_conf: torch.Tensor | None = None,
    p_conf: torch.Tensor | None = None,
) -> torch.Tensor:
    """π = T(q, p) row by row (Table 1, Eqs. 6 and 11).

    ``q``, ``p``: the rows drafts and corrections are drawn from; ``q_conf``, ``p_conf``: the rows the
    deferral decision reads (default: the same). OPT's D_TV is always that of ``q`` and ``p``, the
    rejection rate it prices (Lemma 5, Lemma 9).
    """
    spec = RULES[rule]
    if rule == "sd":
        return p
    if rule == "lossy":
        beta = tuned_beta(q, p, params["alpha"]) if params.get("tune_beta") else params["beta"]
        return lossy_target(q, p, params["alpha"], beta)
    q_conf = q if q_conf is None else q_conf
    p_conf = p if p_conf is None else p_conf
    if spec.kind == "token":
        return token_mixture(q, p, decision(rule, q_conf, p_conf, params))
    return mixture(q, p, decision(rule, q_conf, p_conf, params, tv=tv_distance(p, q)))


def output_law(q: torch.Tensor, pi: torch.Tensor) -> torch.Tensor:
    """The exact law of the token Algorithm 4 emits at a position whose draft x ~ q is checked
    against π: min(q, π) + (1 − Σ min(q, π))·norm(max{0, π − q}). Equal to π when π sums to 1;
    for lossy SD it is the lossy law (Lemma 3), whatever π's total."""
    kept = torch.minimum(q, pi)
    residual = (pi - q).clamp(min=0)
    total = residual.sum(-1, keepdim=True)
    residual = torch.where(total > 0, residual / total.clamp(min=torch.finfo(pi.dtype).tiny), 0.0)
    return kept + (1 - kept.sum(-1, keepdim=True)) * residual


# -- recipe parameters the cascade methods share ----------------------------------------------------

ORACLE_RULES = ("bild", "chow", "diff", "opt", "chow_log", "diff_log", "opt_log")  # the δ(q, p) rules
CASCADE_ALPHA = ParamSpec(
    float, 0.0, "cost α of deferring to the large model; higher: fewer deferrals (swept for the curves)", 0
)
DISCREPANCY = ParamSpec(
    str,
    "auto",
    "BiLD's D(q, p): greedy -log p(argmax q), sampling -Σ q log p; auto: greedy at temperature 0",
    choices=("auto", "greedy", "sampling"),
)


def check_rule_params(
    params: dict, spec, allowed: tuple[str, ...], rules: tuple[str, ...]
) -> tuple[str, str, str] | None:
    """The rule is given, takes every rule parameter the recipe sets, and α is in its range."""
    rule = params["rule"]
    if rule is None:
        return (
            "rule",
            f"{spec.method} needs rule:, its deferral rule",
            f"add rule: with one of {', '.join(rules)}",
        )
    takes = RULES[rule].params
    for name in sorted(given_params(spec) & set(allowed) - set(takes)):
        fix = f"remove {name} (rule {rule} takes {', '.join(takes) or 'no parameter'})"
        if "rule" in spec.grid:
            fix += ", or give rules with different parameters their own method entry"
        return name, f"rule {rule!r} takes no parameter {name!r}", fix
    alpha, alpha_max = params.get("alpha", 0.0), RULES[rule].alpha_max
    if rule == "lossy" and alpha >= 1:
        return "alpha", f"lossy SD needs α < 1 (it divides by 1 - α), got {alpha}", "use 0 <= alpha < 1"
    if alpha_max is not None and alpha > alpha_max:
        return (
            "alpha",
            f"rule {rule!r} thresholds a probability, so α = {alpha} > 1 never defers",
            "use alpha <= 1",
        )
    return None
