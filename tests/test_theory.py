"""Tests for specbench.papers.cs_drafting.theory (Cascade Speculative Drafting theory, Chen et al. 2024,
Section 4)."""

import itertools
import math

import numpy as np
import pytest

from specbench.papers.cs_drafting import theory as th


def leviathan(alpha, gamma, c):
    return (1 - alpha ** (gamma + 1)) / ((1 - alpha) * (gamma * c + 1))


def test_ewif_speculative_matches_leviathan_and_hand_value():
    # alpha=0.8, k=4, c=0.1: (1 - 0.8^5) / (0.2 * 1.4) = 0.67232 / 0.28
    assert th.ewif_speculative(0.8, 4, 0.1) == pytest.approx(0.67232 / 0.28, rel=1e-12)
    for a, k, c in itertools.product([0.1, 0.5, 0.9, 0.99], [1, 3, 7, 20], [0.0, 0.05, 0.5]):
        assert th.ewif_speculative(a, k, c) == pytest.approx(leviathan(a, k, c), rel=1e-12)


def test_edge_cases():
    assert th.ewif_speculative(0.7, 0, 0.3) == 1.0
    assert th.ewif_speculative(0.0, 5, 0.1) == pytest.approx(1 / 1.5)
    assert th.ewif_speculative(1.0, 5, 0.1) == pytest.approx(6 / 1.5)
    assert th.ewif_horizontal([], []) == 1.0
    assert th.ewif_horizontal([0.0, 0.9], [0.1, 0.1]) == pytest.approx(1 / 1.2)
    assert th.simulate_speculative(0.0, 5, 0.1, steps=1000) == pytest.approx(1 / 1.5)
    assert th.simulate_speculative(1.0, 5, 0.1, steps=1000) == pytest.approx(6 / 1.5)
    assert th.simulate_speculative(0.6, 0, 0.1, steps=1000) == 1.0
    assert th.best_k(0.0, 0.1) == (0, 1.0)
    assert th.ewif_vertical(0.8, 0.7, 3, 0, 0.1, 0.01) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        th.ewif_horizontal([0.5], [0.1, 0.2])


@pytest.mark.parametrize("alpha,k", [(0.3, 1), (0.8, 4), (0.95, 10), (1.0, 3)])
def test_pgf_theorem_4_1(alpha, k):
    p = th.pgf_coefficients(alpha, k)
    assert p.sum() == pytest.approx(1.0)
    assert np.all(p >= 0)
    # phi'(1) = expected tokens (Corollary 4.2 numerator)
    assert (np.arange(k + 2) * p).sum() == pytest.approx(th.expected_tokens_speculative(alpha, k))
    for x in [0.0, 0.3, 0.9, 1.0, 1.7]:
        assert th.pgf_speculative(alpha, k, x) == pytest.approx(th.pgf_speculative_closed(alpha, k, x))
        assert th.pgf_speculative(alpha, k, x) == pytest.approx(np.polyval(p[::-1], x))


def test_operator_T_alpha_maps_monomials():
    alpha = 0.7
    for j in range(6):
        coeffs = np.zeros(j + 1)
        coeffs[j] = 1
        assert th.expected_tokens_from_pgf(coeffs, alpha) == pytest.approx(
            (1 - alpha ** (j + 1)) / (1 - alpha)
        )


def test_vertical_closed_forms_agree_and_corollary_4_4():
    for a, ap, k, n in itertools.product([0.5, 0.8], [0.3, 0.9], [1, 4], [1, 3]):
        v = th.ewif_vertical(a, ap, k, n, 0.05, 0.01)
        assert v == pytest.approx(th.ewif_vertical_closed(a, ap, k, n, 0.05, 0.01), rel=1e-10)
        # Corollary 4.4: phi_(a',k)(a) < a, so with c_d2 = 0 vertical beats SD with step size n
        assert th.pgf_speculative_closed(ap, k, a) < a
        assert th.ewif_vertical(a, ap, k, n, 0.05, 0.0) > th.ewif_speculative(a, n, 0.05)


def test_horizontal_reduces_to_speculative():
    assert th.ewif_horizontal([0.7] * 5, [0.03] * 5) == pytest.approx(th.ewif_speculative(0.7, 5, 0.03))


def mc_tol(alpha, k, c, steps):
    # std of tokens per step <= (k+1)/2 -> generous 5-sigma bound on the ratio
    return 5 * (k + 1) / 2 / math.sqrt(steps) / (1 + k * c)


def test_simulators_match_closed_forms():
    steps = 200_000
    for a, k, c in [(0.8, 4, 0.1), (0.65, 9, 0.007), (0.3, 2, 0.5)]:
        sim = th.simulate_speculative(a, k, c, steps=steps, seed=1)
        assert sim == pytest.approx(th.ewif_speculative(a, k, c), abs=mc_tol(a, k, c, steps))
    alphas, costs = [0.9, 0.8, 0.6, 0.5], [0.1, 0.05, 0.01, 0.01]
    sim = th.simulate_horizontal(alphas, costs, steps=steps, seed=2)
    assert sim == pytest.approx(th.ewif_horizontal(alphas, costs), abs=mc_tol(0, 4, 0, steps))
    for a, ap, k, n in [(0.8, 0.7, 3, 2), (0.6, 0.9, 5, 3)]:
        sim = th.simulate_vertical(a, ap, k, n, 0.04, 0.01, steps=steps, seed=3)
        tol = mc_tol(0, n * (k + 1), 0, steps)
        assert sim == pytest.approx(th.ewif_vertical(a, ap, k, n, 0.04, 0.01), abs=tol)


def test_horizontal_gradient_vs_finite_differences():
    rng = np.random.default_rng(0)
    for _ in range(5):
        k = int(rng.integers(1, 7))
        a = rng.uniform(0.05, 0.95, k)
        c = rng.uniform(0.0, 0.2, k)
        ga, gc = th.ewif_horizontal_gradient(a, c)
        h = 1e-6
        for pos in range(k):
            e = np.zeros(k)
            e[pos] = h
            fd_a = (th.ewif_horizontal(a + e, c) - th.ewif_horizontal(a - e, c)) / (2 * h)
            fd_c = (th.ewif_horizontal(a, c + e) - th.ewif_horizontal(a, c - e)) / (2 * h)
            assert ga[pos] == pytest.approx(fd_a, rel=1e-6, abs=1e-9)
            assert gc[pos] == pytest.approx(fd_c, rel=1e-6, abs=1e-9)
    # special cases of Corollary 4.6, including alpha_l = 0
    a, c = np.array([0.0, 0.5, 0.4]), np.array([0.1, 0.1, 0.1])
    ga, _ = th.ewif_horizontal_gradient(a, c)
    assert ga[0] == pytest.approx((1 + 0.5 + 0.5 * 0.4) / 1.3)
    assert ga[2] == pytest.approx(0.0)


def test_best_k_monotone_in_cost():
    for alpha in [0.5, 0.7, 0.8, 0.9, 0.95]:
        ks = [th.best_k(alpha, c)[0] for c in [0.5, 0.2, 0.1, 0.05, 0.02, 0.01, 0.001]]
        assert ks == sorted(ks)
        k, v = th.best_k(alpha, 0.05)
        assert v == max(th.ewif_speculative(alpha, j, 0.05) for j in range(65))


def test_best_horizontal_matches_brute_force():
    alphas, costs = [0.8, 0.7, 0.5], [0.05, 0.02, 0.0]
    for length in range(0, 6):
        assign, v = th.best_horizontal(alphas, costs, length)
        brute = max(
            (
                th.ewif_horizontal([alphas[m] for m in ms], [costs[m] for m in ms])
                for ms in itertools.product(range(3), repeat=length)
            ),
            default=1.0,
        )
        assert v == pytest.approx(brute, rel=1e-12)
        assert len(assign) == length


def test_table1_reproduces_paper():
    rows = th.table1_rows(steps=50_000)
    assert len(rows) == len(th.PAPER_TABLE1) == 6
    for r in rows:
        # closed form (t=0 acceptance, parameter-ratio costs) within 0.015 of the paper's values
        assert r["ewif"] == pytest.approx(r["paper_ewif"], abs=0.015)
        assert r["ewif_sim"] == pytest.approx(r["ewif"], abs=0.05)
        if r["md2"] is None:
            assert r["best_k1"] == r["k1"]  # paper's SD draft lengths are the optima
    # the cascade beats both SD rows on each dataset (the paper's claim)
    for ds in ("cnndm", "ende"):
        sd = max(r["ewif"] for r in rows if r["dataset"] == ds and r["md2"] is None)
        hc = [r["ewif"] for r in rows if r["dataset"] == ds and r["md2"] is not None][0]
        assert hc > sd
    ende_hc = rows[5]
    assert (ende_hc["best_k1"], ende_hc["best_k2"]) == (5, 8)
    # Leviathan's wall-time costs (Table 4) do not reproduce Table 1
    lev = th.table1_rows(costs=th.LEVIATHAN_COSTS, steps=10)
    assert lev[0]["ewif"] == pytest.approx(2.389, abs=0.01)


# -- the theory beside the measured SWI (cells.csv's swi_<table>_theory columns) ------------------------


@pytest.mark.parametrize(("alpha", "k", "c"), [(0.3, 1, 0.1), (0.7, 4, 0.05), (0.9, 3, 0.0), (1.0, 2, 0.2)])
def test_theory_by_position_with_equal_rates_is_the_papers_closed_form(alpha, k, c):
    from specbench.decoding import theory
    from specbench.papers.cs_drafting.theory import ewif_speculative, expected_tokens_speculative

    rates, draft = np.full(theory.LONGEST, alpha), np.eye(k + 1)[k]  # k drafts every step
    assert theory.expected_tokens(rates, draft) == pytest.approx(expected_tokens_speculative(alpha, k))
    step = theory.speculative(rates, draft, "d", k)
    assert step.swi({"t": 1.0, "d": c}, "t") == pytest.approx(ewif_speculative(alpha, k, c))


def test_the_iid_alpha_is_the_maximum_likelihood_of_the_steps():
    from specbench.models.costs import iid_acceptance

    steps = [(3, 3), (3, 1), (3, 0), (3, 2)]  # 6 accepted, 3 first rejections (the full step had none)
    assert iid_acceptance(steps) == pytest.approx(6 / 9)
    alphas = np.linspace(0.05, 0.95, 181)
    likelihood = [a**6 * (1 - a) ** 3 for a in alphas]
    assert alphas[int(np.argmax(likelihood))] == pytest.approx(6 / 9, abs=0.005)


def test_a_speculative_cells_theory_uses_its_rates_by_position_and_its_drafters_cost():
    from specbench.pipeline.analysis.summary import summarise

    steps = [[2, 2], [2, 1], [2, 0], [2, 2]] * 5  # position 1: 15/20 accepted; position 2: 10/15
    rows = []
    for i, (cell, method, drafter, forwards) in enumerate(
        [("ar", "autoregressive", None, {"t": 40}), ("sd", "speculative", "d", {"t": 20, "d": 40})]
    ):
        rows.append(
            {
                "key": str(i), "dataset": "x", "cell": cell, "method_name": cell, "method": method,
                "params": {"k": 2} if drafter else {}, "target": "t", "drafter": drafter,
                "example_id": "e", "n_tokens": 40, "walltime": 1.0, "ttft": 0.1, "quality": {},
                "steps": steps if drafter else [[0, 0]] * 40, "accepted_by_position": [],
                "first_divergence": None, "prompt_tokens": 5,
                "forwards": {m: {"forward_passes": n, "seconds": 0.4} for m, n in forwards.items()},
                "costs": {"ms": {"t": 1.0, "d": 0.1}, "pw": {"t": 1.0, "d": 0.2}},
            }
        )  # fmt: skip
    sd = summarise(rows).set_index("cell").loc["sd"]
    expected = 1 + 0.75 + 0.75 * (10 / 15)
    assert sd["swi_ms_theory"] == pytest.approx(expected / (1 + 2 * 0.1))
    assert sd["swi_pw_theory"] == pytest.approx(expected / (1 + 2 * 0.2))
    alpha = 25 / (25 + 10)
    assert sd["swi_ms_theory_iid"] == pytest.approx((1 + alpha + alpha**2) / 1.2)
