"""Target distributions π = T(q, p) of Speculative Cascades against the paper's formulas, its lemmas
(3, 5, 9), and the law of a whole step of Algorithm 4 (chi-square against an exact reference).

Hand-made rows on a 3- to 6-token vocabulary; the formulas, Tran-Thien's β and the law of a step are
re-derived here one token at a time (plain Python, scipy's root finder), independently of the
vectorised code.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from scipy.optimize import brentq
from scipy.stats import binomtest
from test_acceptance import P, Q, assert_matches

from specbench.decoding import deferral
from specbench.decoding.acceptance import cascade_accept, speculative_accept
from specbench.decoding.deferral import RULES, output_law, target, tuned_beta, tv_distance
from specbench.decoding.spec_cascades import step_target
from specbench.methods import METHODS
from specbench.models.sampling import SamplingParams

F64 = torch.float64

# Each row pair makes some rule defer and another keep q.
Q5 = torch.tensor(
    [
        [0.50, 0.20, 0.15, 0.10, 0.05],  # confident-ish small model
        [0.25, 0.25, 0.20, 0.20, 0.10],  # unsure
        [0.90, 0.05, 0.05, 0.00, 0.00],  # very sure
    ],
    dtype=F64,
)
P5 = torch.tensor(
    [
        [0.10, 0.70, 0.10, 0.05, 0.05],  # disagrees, and is more peaked
        [0.30, 0.30, 0.20, 0.10, 0.10],  # agrees, about as unsure
        [0.60, 0.10, 0.10, 0.10, 0.10],  # agrees, less sure
    ],
    dtype=F64,
)


def rows(t: torch.Tensor) -> list[list[float]]:
    return t.tolist()


def expected_delta(rule: str, q: list[float], p: list[float], alpha: float) -> bool:
    """δ(q, p) of Table 1 / Eqs. 2, 5, 10, 24-26, written out token by token."""
    tv = sum(max(0.0, pv - qv) for pv, qv in zip(p, q, strict=True))
    nq = sum(v * math.log(v) for v in q if v > 0)
    np_ = sum(v * math.log(v) for v in p if v > 0)
    # App. E.1's sampling discrepancy −Σ q log p, infinite where q(v) > 0 = p(v)
    cross = sum(-qv * math.log(pv) if pv > 0 else math.inf for qv, pv in zip(q, p, strict=True) if qv > 0)
    return {
        "chow": max(q) < 1 - alpha,
        "diff": max(q) < max(p) - alpha,
        "opt": max(q) < max(p) - alpha * tv,
        "chow_log": -nq > alpha,
        "diff_log": nq < np_ - alpha,
        "opt_log": nq < np_ - alpha * tv,
        "bild": cross > alpha,
    }[rule]


def expected_token_reject(rule: str, q: list[float], p: list[float], alpha: float) -> list[bool]:
    """r(x_<t, v) of Eqs. 13-15."""
    return [
        {
            "token_v1": qv < max(p) - alpha,
            "token_v2": pv < max(p) - alpha,
            "token": pv < max(p) * (1 - alpha),
        }[rule]
        for qv, pv in zip(q, p, strict=True)
    ]


def expected_beta(q: list[float], p: list[float], alpha: float) -> float:
    """β >= 1 − α with Σ max{0, q − p/(1−α)} = Σ max{0, p/β − q} (App. E.6), by Brent's method;
    inf when nothing is rejected (then p/β plays no part)."""
    excess = sum(max(0.0, qv - pv / (1 - alpha)) for qv, pv in zip(q, p, strict=True))
    if excess == 0:
        return math.inf
    return brentq(lambda b: sum(max(0.0, pv / b - qv) for qv, pv in zip(q, p, strict=True)) - excess,
                  1 - alpha, 1e12, xtol=1e-14, rtol=1e-15)  # fmt: skip


def expected_pi(rule: str, q: list[float], p: list[float], params: dict) -> list[float]:
    """π = T(q, p) of Table 1 and Eqs. 6, 11, token by token."""
    alpha = params.get("alpha", 0.0)
    if rule == "sd":
        return list(p)
    if rule == "lossy":
        beta = expected_beta(q, p, alpha) if params.get("tune_beta") else params["beta"]
        return [max(min(qv, pv / (1 - alpha)), pv / beta) for qv, pv in zip(q, p, strict=True)]
    if RULES[rule].kind == "token":
        r = expected_token_reject(rule, q, p, alpha)
        eta = sum(qv for qv, rv in zip(q, r, strict=True) if rv)
        return [qv * (not rv) + pv * eta for qv, pv, rv in zip(q, p, r, strict=True)]
    return list(p) if expected_delta(rule, q, p, alpha) else list(q)


def expected_position(rule: str, q: list[float], p: list[float], params: dict):
    """(q(v)·P(accept v), residual law) at a drafted position: Algorithm 4 on π, min{1, π/q} and
    norm(max{0, π − q}); for lossy SD Tran-Thien's own rule instead, min{1, p/((1−α)q)} (Eq. 16) and
    norm(max{0, p/β − q}) (Eq. 17)."""
    if rule == "lossy":
        alpha = params["alpha"]
        beta = expected_beta(q, p, alpha) if params.get("tune_beta") else params["beta"]
        kept = [min(qv, pv / (1 - alpha)) for qv, pv in zip(q, p, strict=True)]
        excess = [max(0.0, pv / beta - qv) for qv, pv in zip(q, p, strict=True)]
    else:
        pi = expected_pi(rule, q, p, params)
        kept = [min(qv, piv) for qv, piv in zip(q, pi, strict=True)]
        excess = [max(0.0, piv - qv) for qv, piv in zip(q, pi, strict=True)]
    total = sum(excess)
    return kept, [e / total if total else 0.0 for e in excess]


def test_rule_names_match_the_recipe_schema():
    assert tuple(RULES) == METHODS["spec_cascade"].params["rule"].choices


@pytest.mark.parametrize("alpha", [0.0, 0.05, 0.2, 0.45, 0.8])
@pytest.mark.parametrize("rule", ["chow", "diff", "opt", "chow_log", "diff_log", "opt_log", "bild"])
def test_mixture_rules_follow_equation_6(rule, alpha):
    params = {"alpha": alpha * (4 if rule == "bild" else 1), "discrepancy": "sampling"}
    pi = target(rule, Q5, P5, params)
    for q, p, row in zip(rows(Q5), rows(P5), rows(pi), strict=True):
        delta = expected_delta(rule, q, p, params["alpha"])
        assert row == pytest.approx(p if delta else q, abs=0)


def test_the_rows_make_every_mixture_rule_both_defer_and_keep():
    """The hand-made rows are informative: each rule defers on some row at some α and keeps q on another."""
    for rule in ("chow", "diff", "opt", "chow_log", "diff_log", "opt_log"):
        decisions = {
            expected_delta(rule, q, p, a)
            for a in (0.0, 0.1, 0.3, 1.0)
            for q, p in zip(rows(Q5), rows(P5), strict=True)
        }
        assert decisions == {True, False}, rule


@pytest.mark.parametrize("alpha", [0.0, 0.1, 0.3, 0.6, 1.0])
@pytest.mark.parametrize("rule", ["token_v1", "token_v2", "token"])
def test_token_rules_follow_equation_11(rule, alpha):
    pi = target(rule, Q5, P5, {"alpha": alpha})
    for q, p, row in zip(rows(Q5), rows(P5), rows(pi), strict=True):
        r = expected_token_reject(rule, q, p, alpha)
        eta = sum(qv for qv, rv in zip(q, r, strict=True) if rv)
        assert row == pytest.approx(
            [qv * (not rv) + pv * eta for qv, pv, rv in zip(q, p, r, strict=True)], abs=1e-15
        )
        assert sum(row) == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("alpha", [0.0, 0.2, 0.5, 0.9])
def test_token_v3_is_q_on_the_top_set_and_rescaled_p_elsewhere(alpha):
    """Sec. 4.4: π_TokenV3 = q·1(v ∈ Top_α) + p·Σ_{v ∉ Top_α} q, Top_α = {v : p(v) >= max p·(1 − α)}."""
    pi = target("token", Q5, P5, {"alpha": alpha})
    top = P5 >= P5.amax(-1, keepdim=True) * (1 - alpha)
    outside = (Q5 * ~top).sum(-1, keepdim=True)
    assert torch.allclose(pi, Q5 * top + P5 * outside, atol=1e-15)


# (rule, α, q, p, decision): each rule at its threshold exactly (dyadic rows, so exact in floats),
# then just past it. δ and r are strict inequalities; Top_α of TokenV3 includes its boundary.
QT, PT = [0.5, 0.25, 0.25, 0.0], [0.75, 0.25, 0.0, 0.0]  # max q = 0.5, max p = 0.75, D_TV = 0.25
HALF, SURE = [0.5, 0.5, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]  # entropies log 2 and 0
TIES = [
    ("chow", 0.5, QT, PT, False),  # 0.5 < 1 − 0.5
    ("chow", 0.25, QT, PT, True),
    ("diff", 0.25, QT, PT, False),  # 0.5 < 0.75 − 0.25
    ("diff", 0.125, QT, PT, True),
    ("opt", 1.0, QT, PT, False),  # 0.5 < 0.75 − 1·0.25
    ("opt", 0.5, QT, PT, True),
    ("chow_log", math.log(2), HALF, SURE, False),  # log 2 > log 2
    ("chow_log", 0.69, HALF, SURE, True),
    ("diff_log", math.log(2), HALF, SURE, False),  # −log 2 < 0 − log 2
    ("diff_log", 0.69, HALF, SURE, True),
    ("opt_log", 2 * math.log(2), HALF, SURE, False),  # D_TV = 0.5
    ("opt_log", 1.38, HALF, SURE, True),
    ("token_v1", 0.25, QT, PT, [False, True, True, True]),  # q(v) < 0.75 − 0.25: q(0) = 0.5 is kept
    ("token_v2", 0.5, QT, PT, [False, False, True, True]),  # p(v) < 0.25: p(1) = 0.25 is kept
    ("token", 0.5, QT, [0.5, 0.25, 0.125, 0.125], [False, False, True, True]),  # p(v) < 0.5·0.5
    ("token", 0.5, QT, PT, [False, True, True, True]),  # p(v) < 0.375
]


@pytest.mark.parametrize("rule, alpha, q, p, expected", TIES, ids=lambda v: str(v))
def test_decisions_are_strict_at_their_thresholds(rule, alpha, q, p, expected):
    got = deferral.decision(
        rule, torch.tensor([q], dtype=F64), torch.tensor([p], dtype=F64), {"alpha": alpha}
    )
    assert got[0].tolist() == expected


def test_bild_defers_only_past_the_threshold():
    """δ = 1(D(q, p) > α) (Table 1): D = α keeps q."""
    q, p = torch.tensor([QT], dtype=F64), torch.tensor([PT], dtype=F64)
    d = float(deferral.discrepancy(q, p, "greedy"))
    assert d == pytest.approx(-math.log(0.75), abs=1e-15)
    for alpha, defers in ((d, False), (d - 1e-9, True)):
        pi = target("bild", q, p, {"alpha": alpha, "discrepancy": "greedy"})
        assert torch.equal(pi, p if defers else q)


def test_bild_greedy_discrepancy_is_minus_log_p_of_the_drafters_argmax():
    d = deferral.discrepancy(Q5, P5, "greedy")
    assert d.tolist() == pytest.approx([-math.log(0.10), -math.log(0.30), -math.log(0.60)])
    pi = target("bild", Q5, P5, {"alpha": 1.5, "discrepancy": "greedy"})
    assert torch.equal(pi, torch.stack([P5[0], Q5[1], Q5[2]]))


def test_sd_is_p_and_lossy_with_alpha_0_beta_1_is_exactly_p():
    assert target("sd", Q5, P5, {}) is P5
    assert torch.equal(target("lossy", Q5, P5, {"alpha": 0.0, "beta": 1.0}), P5)


@pytest.mark.parametrize(
    "alpha, beta", [(0.1, 1.0), (0.3, 1.0), (0.3, 0.7), (0.5, 0.8), (0.5, 2.0), (0.8, 1.0)]
)
def test_lemma_3_lossy_target_gives_tran_thiens_acceptance_and_residual(alpha, beta):
    """Algorithm 4 on π = max{min{q, p/(1−α)}, p/β}: accept with min(1, p/((1−α)q)) (Eq. 16) and resample
    from norm(max{0, p/β − q}) (Eq. 17), for β >= 1 − α."""
    for q, p in ((Q5, P5), (Q, P[:3])):
        pi = target("lossy", q, p, {"alpha": alpha, "beta": beta})
        seen = q > 0
        accept = torch.where(seen, torch.clamp(pi / q, max=1), 1)
        lossy_accept = torch.where(seen, torch.clamp(p / ((1 - alpha) * q), max=1), 1)
        assert torch.allclose(accept, lossy_accept, atol=1e-12)
        # the proof's three cases: max{0, π − q} and max{0, p/β − q} agree token by token
        assert torch.allclose((pi - q).clamp(min=0), (p / beta - q).clamp(min=0), atol=1e-15)


@pytest.mark.parametrize("alpha", [0.05, 0.3, 0.7])
def test_tuned_beta_solves_the_condition_of_appendix_e6(alpha):
    for q, p in ((Q5, P5), (Q, P[:3]), (P[:3], Q)):
        beta = tuned_beta(q, p, alpha)
        assert (beta >= 1 - alpha - 1e-12).all()
        left = (q - p / (1 - alpha)).clamp(min=0).sum(-1)
        right = (p / beta[:, None] - q).clamp(min=0).sum(-1)
        assert torch.allclose(left, right, atol=1e-12)
        pi = target("lossy", q, p, {"alpha": alpha, "tune_beta": True})
        expected = [
            expected_pi("lossy", qr, pr, {"alpha": alpha, "tune_beta": True})
            for qr, pr in zip(rows(q), rows(p), strict=True)
        ]
        assert torch.allclose(pi, torch.tensor(expected, dtype=F64), atol=1e-12)
        # and the lossy law then sums to 1 with no renormalisation (Tran-Thien's point)
        law = torch.minimum(q, pi) + (pi - q).clamp(min=0)
        assert torch.allclose(law.sum(-1), torch.ones(q.shape[0], dtype=F64), atol=1e-12)


def test_lossy_target_on_hand_computed_rows():
    """q = (0.6, 0.4, 0), p = (0.2, 0.4, 0.4), α = 0.5: p/(1−α) = (0.4, 0.8, 0.8).
    β = 1: π = max{(0.4, 0.4, 0), (0.2, 0.4, 0.4)} = (0.4, 0.4, 0.4), which sums to 1.2.
    Tuned: the excess Σ max{0, q − 2p} = 0.2 equals Σ max{0, p/β − q} = 0.4/β at β = 2 (App. E.6),
    and π = max{(0.4, 0.4, 0), (0.1, 0.2, 0.2)} = (0.4, 0.4, 0.2) sums to 1."""
    q = torch.tensor([[0.6, 0.4, 0.0]], dtype=F64)
    p = torch.tensor([[0.2, 0.4, 0.4]], dtype=F64)
    one = target("lossy", q, p, {"alpha": 0.5, "beta": 1.0})
    assert one[0].tolist() == pytest.approx([0.4, 0.4, 0.4], abs=1e-15)
    assert float(tuned_beta(q, p, 0.5)[0]) == pytest.approx(2.0, abs=1e-12)
    tuned = target("lossy", q, p, {"alpha": 0.5, "tune_beta": True})
    assert tuned[0].tolist() == pytest.approx([0.4, 0.4, 0.2], abs=1e-12)
    # nothing rejected (q <= p/(1−α) everywhere): π = q, with β = inf where q = 0 < p
    q = torch.tensor([[0.5, 0.5, 0.0], [0.3, 0.3, 0.4]], dtype=F64)
    p = torch.tensor([[0.4, 0.4, 0.2], [0.3, 0.3, 0.4]], dtype=F64)
    assert tuned_beta(q, p, 0.2).tolist() == pytest.approx([math.inf, 1.0])
    assert torch.allclose(target("lossy", q, p, {"alpha": 0.2, "tune_beta": True}), q, atol=1e-15)


@pytest.mark.parametrize("rule", ["chow", "diff", "opt", "chow_log", "diff_log", "opt_log"])
def test_lemma_5_rejection_rate_is_delta_times_tv(rule):
    """Rejection probability Σ_v q(v)(1 − min{1, π(v)/q(v)}) = δ·D_TV(p, q) for π = T_δ(q, p)."""
    for alpha in (0.0, 0.1, 0.3):
        pi = target(rule, Q5, P5, {"alpha": alpha})
        rejection = (Q5 - torch.minimum(Q5, pi)).sum(-1)
        for q, p, rate in zip(rows(Q5), rows(P5), rejection.tolist(), strict=True):
            tv = sum(max(0.0, pv - qv) for pv, qv in zip(p, q, strict=True))
            assert rate == pytest.approx(expected_delta(rule, q, p, alpha) * tv, abs=1e-15)


def test_lemma_5_rejection_rate_by_sampling():
    """The verification step really rejects at rate D_TV(p, q) where the rule defers (binomial test)."""
    q, p = Q[:1], P[:2]
    pi = target("chow", q, p, {"alpha": 0.0})  # max q < 1: defers on every row
    gen = torch.Generator().manual_seed(3)
    trials, rejected = 4000, 0
    for draft in torch.multinomial(q[0], trials, replacement=True, generator=gen):
        rejected += int(cascade_accept(draft.view(1), q, pi, gen).n_accepted) == 0
    assert binomtest(rejected, trials, float(tv_distance(p[0], q[0]))).pvalue > 1e-3


def test_lemma_9_opt_is_diff_at_temperature_0():
    """With greedy rows q̃, p̃ (one-hot) checked and the softmax q, p deciding, OPT's π equals Diff's."""
    gen = torch.Generator().manual_seed(0)
    for _ in range(50):
        q_conf = torch.softmax(3 * torch.randn(8, 7, generator=gen, dtype=F64), -1)
        p_conf = torch.softmax(3 * torch.randn(8, 7, generator=gen, dtype=F64), -1)
        q_conf[:3] = p_conf[:3].flip(-1).roll(1, -1)  # some rows whose argmax agree, some not
        q_hot = torch.nn.functional.one_hot(q_conf.argmax(-1), 7).to(F64)
        p_hot = torch.nn.functional.one_hot(p_conf.argmax(-1), 7).to(F64)
        for alpha in (0.0, 0.1, 0.4, 0.9):
            conf = dict(q_conf=q_conf, p_conf=p_conf)
            opt = target("opt", q_hot, p_hot, {"alpha": alpha}, **conf)
            diff = target("diff", q_hot, p_hot, {"alpha": alpha}, **conf)
            assert torch.equal(opt, diff)


def test_output_law_is_pi_for_distributions_and_the_lossy_law_otherwise():
    pi = target("opt", Q5, P5, {"alpha": 0.1})
    assert torch.allclose(output_law(Q5, pi), pi, atol=1e-15)
    alpha, beta = 0.4, 1.0
    pi = target("lossy", Q5, P5, {"alpha": alpha, "beta": beta})
    accept = torch.clamp(P5 / ((1 - alpha) * Q5), max=1)
    residual = (P5 / beta - Q5).clamp(min=0)
    reject = 1 - (Q5 * accept).sum(-1, keepdim=True)
    law = Q5 * accept + reject * residual / residual.sum(-1, keepdim=True)
    assert torch.allclose(output_law(Q5, pi), law, atol=1e-15)


def test_speculative_accept_is_cascade_accept_with_pi_equal_p():
    for seed in range(20):
        drafts = torch.multinomial(Q, 1, generator=torch.Generator().manual_seed(seed)).view(-1)
        a = speculative_accept(drafts, Q, P, torch.Generator().manual_seed(seed))
        b = cascade_accept(drafts, Q, target("sd", Q, P, {}), torch.Generator().manual_seed(seed))
        assert (int(a.n_accepted), int(a.next_token)) == (int(b.n_accepted), int(b.next_token))


# A step of Algorithm 4 with γ = 2 on a 4-token vocabulary, one row per position (the bonus row
# last): the mixture rules below defer at positions 1 and 3 and keep q at position 2, the token rules
# mix; no row sits on a threshold; q never drafts token 3 at position 2, where p has mass.
QS = [[0.40, 0.30, 0.20, 0.10], [0.70, 0.20, 0.10, 0.00], [0.25, 0.25, 0.25, 0.25]]
PS = [[0.05, 0.15, 0.30, 0.50], [0.50, 0.20, 0.05, 0.25], [0.60, 0.00, 0.30, 0.10]]
STEP_RULES = [
    ("sd", {}),
    ("chow", {"alpha": 0.4}),
    ("opt", {"alpha": 0.1}),
    ("diff_log", {"alpha": 0.05}),
    ("bild", {"alpha": 1.2, "discrepancy": "sampling"}),
    ("token_v1", {"alpha": 0.12}),
    ("token_v2", {"alpha": 0.15}),
    ("token", {"alpha": 0.45}),
    ("lossy", {"alpha": 0.3, "beta": 1.0}),
    ("lossy", {"alpha": 0.3, "tune_beta": True}),
]


def expected_step(rule: str, params: dict) -> dict[tuple[int, ...], float]:
    """Exact law of the tokens one step commits, (a), (a, b) or (a, b, c): the first rejection draws
    from the residual; after two acceptances the bonus follows π_3 (for lossy SD, whose π need not
    sum to 1, the law a drafted token would follow there: Tran-Thien's)."""
    (kept1, res1), (kept2, res2), (kept3, res3) = (
        expected_position(rule, q, p, params) for q, p in zip(QS, PS, strict=True)
    )
    bonus = [k + (1 - sum(kept3)) * r for k, r in zip(kept3, res3, strict=True)]
    if rule != "lossy":
        assert bonus == pytest.approx(expected_pi(rule, QS[2], PS[2], params), abs=1e-15)
    tokens = range(len(QS[0]))
    law = {(a,): (1 - sum(kept1)) * res1[a] for a in tokens}
    law |= {(a, b): kept1[a] * (1 - sum(kept2)) * res2[b] for a, b in itertools.product(tokens, tokens)}
    law |= {(a, b, c): kept1[a] * kept2[b] * bonus[c] for a, b, c in itertools.product(tokens, repeat=3)}
    return law


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("rule, params", STEP_RULES, ids=lambda v: str(v))
def test_a_step_of_algorithm_4_commits_tokens_with_the_exact_law(rule, params):
    """Drafts x_1, x_2 ~ q_1, q_2; π_1..π_3 built by spec_cascades.step_target (T = 1)
    and verified by cascade_accept: the committed tokens follow expected_step, from the paper's
    formulas alone."""
    q, p = torch.tensor(QS, dtype=F64), torch.tensor(PS, dtype=F64)
    expected = [expected_pi(rule, qr, pr, params) for qr, pr in zip(QS, PS, strict=True)]
    assert torch.allclose(target(rule, q, p, params), torch.tensor(expected, dtype=F64), atol=1e-12)
    drafted, pi = step_target(rule, params, q, None, p, SamplingParams(temperature=1.0))
    law = expected_step(rule, params)
    gen = torch.Generator().manual_seed(17)
    counts = dict.fromkeys(law, 0)
    for drafts in torch.multinomial(drafted, 3000, replacement=True, generator=gen).T:
        verdict = cascade_accept(drafts, drafted, pi, gen)
        counts[tuple(drafts[: int(verdict.n_accepted)].tolist()) + (int(verdict.next_token),)] += 1
    assert_matches(list(counts.values()), list(law.values()), f"{rule} {params}")
