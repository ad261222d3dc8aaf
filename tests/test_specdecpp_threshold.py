"""SpecDec++ Theorem 3.1 (Huang et al. 2024): the optimal candidate-length policy of an exactly solved
MDP stops once the chance of a rejection passes a threshold (specbench.papers.specdecpp.threshold)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from specbench.cli import app
from specbench.papers.cs_drafting.theory import ewif_speculative
from specbench.papers.specdecpp.threshold import Problem, rejection_chance, solve, threshold_check


def test_with_one_acceptance_rate_the_solver_finds_the_best_fixed_length():
    # every candidate accepted with chance p: the optimal policy drafts a fixed k, and the time per
    # token far from the end is Leviathan et al.'s 1 / (EWIF of the best k) in target passes
    p, c, tokens = 0.8, 0.1, 60
    problem = Problem(rates=(p,), weights=(1.0,), c=c, tokens=tokens, longest=8)
    policy = solve(problem)
    best = max(range(1, 9), key=lambda k: ewif_speculative(p, k, c))
    stops = [n for n in range(1, 9) if policy[(tokens, (0,) * n)][1]]
    assert stops[0] == best
    per_token = policy[(tokens, (0,) * 1)][0] + c  # the round's first draft pass, then its value
    later = policy[(tokens - 20, (0,))][0] + c
    assert (per_token - later) / 20 == pytest.approx(1 / ewif_speculative(p, best, c), rel=0.01)


@pytest.mark.parametrize("c", [0.05, 0.1, 0.3])
def test_far_from_the_end_the_optimal_policy_is_a_threshold_on_the_rejection_chance(c):
    problem = Problem(c=c, tokens=30)
    rows = threshold_check(problem)
    far = [r for r in rows if r["tokens_left"] > 2 * problem.longest]
    assert far and all(r["threshold"] for r in far)
    # and one that bites: continuing is optimal somewhere, stopping elsewhere
    assert all(r["continue_up_to"] < r["stop_from"] for r in far)
    # near the end a round that already covers the remaining tokens stops whatever its chance
    assert not all(r["threshold"] for r in rows)


def test_dearer_drafts_lower_the_threshold():
    def threshold(c):
        row = threshold_check(Problem(c=c, tokens=30))[-1]
        return (row["continue_up_to"] + row["stop_from"]) / 2

    assert threshold(0.05) > threshold(0.1) > threshold(0.3)


def test_the_rejection_chance_is_one_minus_the_product():
    assert rejection_chance(Problem(), (0, 1)) == pytest.approx(1 - 0.95 * 0.7)


def test_cli_prints_the_check_and_refuses_a_bad_cost():
    runner = CliRunner()
    result = runner.invoke(app, ["theory", "threshold", "--cost", "0.1", "--tokens", "20"])
    assert result.exit_code == 0 and "c = 0.1" in result.output and "yes" in result.output
    result = runner.invoke(app, ["theory", "threshold", "--cost", "1.5"])
    assert result.exit_code == 2 and "--cost" in result.output
