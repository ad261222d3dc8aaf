"""Target distributions π = T(q, p) of Speculative Cascades against the paper's formulas, its lemmas
(3, 5, 9), and the law of Algorithm 4's verification step (chi-square, exact reference).

Hand-made rows on a 5- or 6-token vocabulary; the formulas are re-derived here one token at a time
(plain Python), independently of the vectorised code.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.stats import binomtest
from test_acceptance import P, Q, assert_matches

from specbench.decoding import deferral
from specbench.decoding.acceptance import cascade_accept, speculative_accept
from specbench.decoding.deferral import RULES, output_law, target, tuned_beta, tv_distance
from specbench.recipe import SPEC_CASCADE_RULES

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
    return {
        "chow": max(q) < 1 - alpha,
        "diff": max(q) < max(p) - alpha,
        "opt": max(q) < max(p) - alpha * tv,
        "chow_log": -nq > alpha,
        "diff_log": nq < np_ - alpha,
        "opt_log": nq < np_ - alpha * tv,
        "bild": -sum(qv * math.log(pv) for qv, pv in zip(q, p, strict=True)) > alpha,
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


def test_rule_names_match_the_recipe_schema():
    assert tuple(RULES) == SPEC_CASCADE_RULES


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
        # and the lossy law then sums to 1 with no renormalisation (Tran-Thien's point)
        pi = target("lossy", q, p, {"alpha": alpha, "tune_beta": True})
        law = torch.minimum(q, pi) + (pi - q).clamp(min=0)
        assert torch.allclose(law.sum(-1), torch.ones(q.shape[0], dtype=F64), atol=1e-12)


@pytest.mark.parametrize("rule", ["chow", "diff", "opt", "chow_log", "diff_log", "opt_log"])
def test_lemma_5_rejection_rate_is_delta_times_tv(rule):
    """Rejection probability Σ_v q(v)(1 − min{1, π(v)/q(v)}) = δ·D_TV(p, q) for π = T_δ(q, p)."""
    for alpha in (0.0, 0.1, 0.3):
        pi = target(rule, Q5, P5, {"alpha": alpha})
        rejection = (Q5 - torch.minimum(Q5, pi)).sum(-1)
        delta = deferral.decision(rule, Q5, P5, {"alpha": alpha})
        assert torch.allclose(rejection, delta * tv_distance(P5, Q5), atol=1e-15)


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


# rules and parameters of the sampling tests: normalised targets and lossy SD (whose law is not π)
SAMPLED = [
    ("opt", {"alpha": 0.1}),
    ("token", {"alpha": 0.3}),
    ("token_v1", {"alpha": 0.1}),
    ("bild", {"alpha": 1.5, "discrepancy": "sampling"}),
    ("lossy", {"alpha": 0.4, "beta": 1.0}),
    ("lossy", {"alpha": 0.3, "tune_beta": True}),
]


@pytest.mark.parametrize("rule, params", SAMPLED, ids=lambda v: str(v))
def test_first_token_of_a_step_follows_the_target_law(rule, params):
    """Drafts sampled from q (k = 2), verified against π: the first committed token follows
    output_law(q_1, π_1), which is π_1 for every rule but lossy SD."""
    k, trials = 2, 4000
    gen = torch.Generator().manual_seed(11)
    q, p = Q[:k], P[: k + 1]
    pi = target(rule, torch.cat([q, Q[2:3]]), p, params)
    law = output_law(q[:1], pi[:1])[0]
    if rule != "lossy":
        assert torch.allclose(law, pi[0], atol=1e-12)
    counts = np.zeros(6)
    drafts_all = torch.multinomial(q, trials, replacement=True, generator=gen).T
    for drafts in drafts_all:
        verdict = cascade_accept(drafts, q, pi, gen)
        n = int(verdict.n_accepted)
        counts[int(drafts[0]) if n >= 1 else int(verdict.next_token)] += 1
    assert_matches(counts, law.numpy(), f"{rule} {params}")


def test_bonus_token_follows_pi_at_position_gamma():
    """All drafts accepted (π = q on the drafted rows): the bonus follows π_{γ+1}."""
    gen = torch.Generator().manual_seed(8)
    q, trials = Q[:2], 3000
    pi = torch.cat([q, target("token", Q[2:3], P[2:3], {"alpha": 0.3})])
    counts = np.zeros(6)
    for drafts in torch.multinomial(q, trials, replacement=True, generator=gen).T:
        verdict = cascade_accept(drafts, q, pi, gen)
        assert int(verdict.n_accepted) == 2
        counts[int(verdict.next_token)] += 1
    assert_matches(counts, pi[2].numpy(), "bonus")
