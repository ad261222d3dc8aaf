"""Spread, bootstrap intervals and acceptance statistics (statistics.py), and the cells.csv columns,
report cells and plot table built from them."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from specbench.decoding.generation import Generation
from specbench.decoding.steps import (
    acceptance_rates,
    accepted_histogram,
    mean_accepted_per_step,
    position_counts,
)
from specbench.pipeline.analysis.statistics import (
    BOOTSTRAP_RESAMPLES,
    bootstrap_ratio,
    paired_bootstrap_ratio,
    percentiles,
    spread,
)
from specbench.pipeline.analysis.summary import summarise
from specbench.pipeline.records.results import ExampleLog
from specbench.pipeline.views.plots import acceptance_by_position
from specbench.pipeline.views.report import display_frame, render

# -- spread -------------------------------------------------------------------------------------


def test_spread_matches_numpy_sample_std_and_linear_percentiles():
    values = np.random.default_rng(3).lognormal(size=37)
    out = spread(values)
    assert out["mean"] == pytest.approx(values.mean())
    assert out["std"] == pytest.approx(values.std(ddof=1))
    for q in (50, 90, 99):
        assert out[f"p{q}"] == pytest.approx(np.percentile(values, q, method="linear"))
    # by hand: 1, 2, 3, 4 -> p50 2.5, p90 at rank 2.7 -> 3.7, p99 at rank 2.97 -> 3.97
    assert percentiles([4, 1, 3, 2]) == pytest.approx({"p50": 2.5, "p90": 3.7, "p99": 3.97})


def test_spread_of_one_value_has_no_std_and_an_unmeasured_value_makes_it_nan():
    one = spread([2.0])
    assert one["mean"] == one["p50"] == one["p99"] == 2.0 and math.isnan(one["std"])
    assert all(math.isnan(v) for v in spread([]).values())
    assert all(math.isnan(v) for v in percentiles([1.0, math.nan, 3.0]).values())


# -- bootstrap ----------------------------------------------------------------------------------


def test_bootstrap_of_two_examples_spans_the_two_one_example_resamples():
    # n = 2: a resample is {0,0}, {0,1} or {1,1} (probability 1/4, 1/2, 1/4); with B = 2000 both
    # extremes are drawn ~500 times, so the 2.5th and 97.5th percentiles are exactly the extremes.
    assert bootstrap_ratio([1.0, 3.0], [1.0, 1.0]) == (1.0, 3.0)
    # paired: {0,0} -> (2/1)/(1/1) = 2, {1,1} -> (6/1)/(1/2) = 12, {0,1} -> (8/2)/(2/3) = 6
    assert paired_bootstrap_ratio([2.0, 6.0], [1.0, 1.0], [1.0, 1.0], [1.0, 2.0]) == (2.0, 12.0)


def test_bootstrap_is_the_percentile_interval_of_index_resamples_from_the_seed():
    rng = np.random.default_rng(11)
    num_a, den_a, num_b, den_b = rng.uniform(1, 5, size=(4, 30))
    got = paired_bootstrap_ratio(num_a, den_a, num_b, den_b, resamples=500, seed=7, level=0.9)
    # the same method written as a loop over resamples
    indices = np.random.default_rng(7).integers(0, 30, size=(500, 30))
    ratios = [(num_a[i].sum() / den_a[i].sum()) / (num_b[i].sum() / den_b[i].sum()) for i in indices]
    assert got == pytest.approx(tuple(np.percentile(ratios, [5, 95])), rel=1e-12)


def test_bootstrap_is_deterministic_per_seed_and_holds_the_point_estimate():
    rng = np.random.default_rng(5)
    tokens = rng.integers(20, 200, size=60).astype(float)
    walltime = tokens / rng.uniform(10, 30, size=60)
    ar_walltime = tokens / rng.uniform(8, 20, size=60)
    args = (tokens, walltime, tokens, ar_walltime)
    low, high = paired_bootstrap_ratio(*args)
    assert paired_bootstrap_ratio(*args) == (low, high)
    assert paired_bootstrap_ratio(*args, seed=1) != (low, high)
    point = (tokens.sum() / walltime.sum()) / (tokens.sum() / ar_walltime.sum())
    assert low < point < high
    narrow = paired_bootstrap_ratio(*args, level=0.5)
    assert low < narrow[0] < point < narrow[1] < high


def test_pairing_cancels_what_two_cells_share_on_a_prompt():
    # each prompt's time varies 10x, but the cell is exactly twice as fast as AR on every prompt
    tokens = np.array([10.0, 50.0, 20.0, 80.0, 5.0])
    ar_walltime = np.array([1.0, 9.0, 0.5, 4.0, 3.0])
    low, high = paired_bootstrap_ratio(tokens, ar_walltime / 2, tokens, ar_walltime)
    assert low == pytest.approx(2.0, rel=1e-12) and high == pytest.approx(2.0, rel=1e-12)
    # a ratio that is the same on every example collapses the interval too
    assert bootstrap_ratio(3 * ar_walltime, ar_walltime) == pytest.approx((3.0, 3.0), rel=1e-12)


def test_bootstrap_covers_the_true_ratio_about_95_percent_of_the_time():
    rng = np.random.default_rng(2024)
    covered = 0
    for trial in range(200):
        den = rng.uniform(1, 3, size=40)
        num = 2.0 * den + rng.normal(0, 0.5, size=40)  # E[num] / E[den] = 2
        low, high = bootstrap_ratio(num, den, resamples=1000, seed=trial)
        covered += low <= 2.0 <= high
    assert 0.88 <= covered / 200 <= 0.99


def test_bootstrap_is_undefined_below_two_examples_or_with_an_unmeasured_time():
    assert all(math.isnan(x) for x in bootstrap_ratio([1.0], [2.0]))
    assert all(math.isnan(x) for x in paired_bootstrap_ratio([1, 2], [1, math.nan], [1, 2], [1, 1]))


# -- acceptance ---------------------------------------------------------------------------------

# (drafted, accepted) per target step; the fourth step drafted only 2, the fifth none
STEPS = [[3, 0], [3, 3], [3, 1], [2, 2], [0, 0], [3, 2]]


def test_accepted_per_step_is_the_mean_of_accepted_plus_one_over_steps():
    assert mean_accepted_per_step(STEPS) == pytest.approx((1 + 4 + 2 + 3 + 1 + 3) / 6)
    assert math.isnan(mean_accepted_per_step([]))
    assert accepted_histogram(STEPS) == [2, 1, 2, 1]  # accepted 0: two steps, 1: one, 2: two, 3: one
    assert accepted_histogram([[4, 1], [4, 0]]) == [1, 1, 0, 0, 0]  # up to the longest draft
    assert accepted_histogram([]) == []


def test_conditional_rate_counts_only_steps_that_reached_the_position():
    counts = position_counts(STEPS)
    # position 1: proposed by 5 steps, accepted by 4, reached by all 5
    # position 2: proposed by 5, accepted by 3 ([3,3] [2,2] [3,2]), reached by 4 (position 1 accepted)
    # position 3: proposed by 4, accepted by 1 ([3,3]), reached by 2 ([3,3] [3,2]; [2,2] drafted no 3rd)
    assert counts.tolist() == [[5, 4, 5], [5, 3, 4], [4, 1, 2]]
    marginal, conditional = acceptance_rates(counts)
    assert marginal == pytest.approx([4 / 5, 3 / 5, 1 / 4])
    assert conditional == pytest.approx([4 / 5, 3 / 4, 1 / 2])
    # proposed and accepted are what every row stores as accepted_by_position
    stored = Generation(tokens=[], walltime=0.0, ttft=0.0, steps=[tuple(s) for s in STEPS])
    assert [list(p) for p in stored.accepted_by_position()] == counts[:, :2].tolist()


def test_with_a_fixed_draft_length_conditional_is_accepted_over_accepted_before():
    rng = np.random.default_rng(0)
    steps = [[4, int(a)] for a in rng.integers(0, 5, size=300)]
    counts = position_counts(steps)
    marginal, conditional = acceptance_rates(counts)
    accepted = counts[:, 1]
    assert conditional[1:] == pytest.approx((accepted[1:] / accepted[:-1]).tolist())
    assert conditional[0] == marginal[0]


# -- cells.csv ----------------------------------------------------------------------------------


def row(cell: str, example: str, tokens: int, walltime: float, ttft: float, steps, drafts: int = 0, **extra):
    ar = cell == "ar"
    forwards = {"t": {"forward_passes": tokens if ar else len(steps), "seconds": walltime / 2}}
    if not ar:
        forwards["d"] = {"forward_passes": drafts, "seconds": walltime / 4}
    return {
        "key": f"{cell}/{example}", "dataset": "toy", "cell": cell, "method_name": cell,
        "method": "autoregressive" if ar else "speculative", "params": {} if ar else {"k": 2},
        "target": "t", "drafter": None if ar else "d", "example_id": example, "n_tokens": tokens,
        "walltime": walltime, "ttft": ttft, "forwards": forwards, "steps": steps,
        "accepted_by_position": [], "quality": {}, "first_divergence": None,
        "costs": {"ms": {"t": 1.0, "d": 0.1}, "pw": {"t": 1.0, "d": 0.5}}, **extra,
    }  # fmt: skip


def toy_rows() -> list[dict]:
    ar = [row("ar", "e1", 4, 1.0, 0.3, [[0, 0]] * 4), row("ar", "e2", 4, 2.0, 0.4, [[0, 0]] * 4)]
    # twice as fast as AR on each prompt; listed in the other order, so pairing must go by example_id
    sd = [
        row("sd", "e2", 4, 1.0, 0.2, [[2, 1], [1, 1]], drafts=3),
        row("sd", "e1", 4, 0.5, 0.1, [[2, 2], [2, 0]], drafts=4),
    ]
    # the same cell replayed: the same counts, no time measured
    replayed = [
        {**r, "key": "re/" + r["example_id"], "cell": "re", "method_name": "re", "replayed": True}
        | {"walltime": math.nan, "ttft": math.nan}
        for r in sd
    ]
    return ar + sd + replayed


def test_summary_writes_spread_intervals_and_acceptance_columns():
    cells = summarise(toy_rows()).set_index("cell")
    sd = cells.loc["sd"]
    # per request, in e2, e1 order: walltime 1.0, 0.5; ttft 0.2, 0.1; 4 tokens each
    assert sd["tokens_per_s_std"] == pytest.approx(np.std([4.0, 8.0], ddof=1))
    assert (sd["latency_mean_s"], sd["latency_std_s"]) == pytest.approx((0.75, np.std([1.0, 0.5], ddof=1)))
    assert (sd["latency_p50_s"], sd["latency_p90_s"], sd["latency_p99_s"]) == pytest.approx(
        (0.75, 0.95, 0.995)
    )
    assert (sd["ttft_p50_s"], sd["ttft_p90_s"], sd["ttft_p99_s"]) == pytest.approx((0.15, 0.19, 0.199))
    tpot = [(1.0 - 0.2) / 3, (0.5 - 0.1) / 3]
    assert sd["tpot_mean_s"] == pytest.approx(np.mean(tpot))
    assert sd["tpot_p90_s"] == pytest.approx(np.percentile(tpot, 90))
    # speedup 2 on both prompts: the paired interval is [2, 2]; AR's own is [1, 1]
    assert sd["speedup_vs_ar"] == pytest.approx(2.0)
    assert (sd["speedup_vs_ar_low"], sd["speedup_vs_ar_high"]) == pytest.approx((2.0, 2.0))
    assert (cells.loc["ar", "speedup_vs_ar_low"], cells.loc["ar", "speedup_vs_ar_high"]) == (1.0, 1.0)
    # SWI per example: e1 4 / (2 + 4 x 0.1) and e2 4 / (2 + 3 x 0.1); two examples -> the two extremes
    assert (sd["swi_ms_low"], sd["swi_ms_high"]) == pytest.approx((4 / 2.4, 4 / 2.3))
    assert sd["swi_ms"] == pytest.approx(8 / 4.7) and sd["swi_ms_low"] < sd["swi_ms"] < sd["swi_ms_high"]
    assert (sd["swi_pw_low"], sd["swi_pw_high"]) == pytest.approx((1.0, 4 / 3.5))
    assert (cells.loc["ar", "swi_ms_low"], cells.loc["ar", "swi_ms_high"]) == (1.0, 1.0)
    # steps [2,1] [1,1] [2,2] [2,0]: (accepted + 1) averages 2; position 2 reached by [2,1] and [2,2]
    assert sd["accepted_per_step_mean"] == pytest.approx(2.0) and sd["acceptance_length"] == 2.0
    assert json.loads(sd["accepted_hist"]) == [1, 2, 1]
    assert json.loads(sd["acceptance_marginal"]) == pytest.approx([3 / 4, 1 / 3], abs=1e-6)
    assert json.loads(sd["acceptance_conditional"]) == pytest.approx([3 / 4, 1 / 2], abs=1e-6)
    assert json.loads(cells.loc["ar", "acceptance_marginal"]) == []
    assert cells.loc["ar", "accepted_per_step_mean"] == 1.0
    assert (sd["bootstrap_seed"], sd["bootstrap_resamples"]) == (0, BOOTSTRAP_RESAMPLES)


def test_replayed_cells_keep_counts_and_swi_intervals_but_no_timing():
    cells = summarise(toy_rows()).set_index("cell")
    sd, replayed = cells.loc["sd"], cells.loc["re"]
    timing = ["tokens_per_s_std", "latency_mean_s", "latency_p99_s", "ttft_p50_s", "tpot_mean_s"]
    assert replayed[timing + ["speedup_vs_ar_low", "speedup_vs_ar_high"]].isna().all()
    same = ["swi_ms_low", "swi_ms_high", "swi_pw_low", "accepted_per_step_mean", "acceptance_conditional"]
    assert replayed[same].tolist() == sd[same].tolist()


def test_report_shows_intervals_and_still_reads_cells_csv_without_them(tmp_path):
    cells = summarise(toy_rows())
    cells.insert(0, "run", "toy")
    shown = display_frame(cells).set_index("method")
    assert shown.loc["sd", "speedup"] == "2.00x [2.00, 2.00]"
    assert shown.loc["sd", "SWI MS"] == f"1.70 [{4 / 2.4:.2f}, {4 / 2.3:.2f}]"
    assert shown.loc["re", "speedup"] == "" and shown.loc["re", "SWI PW"].startswith("1.07 [1.00, 1.14]")
    legacy = tmp_path / "legacy"  # a cells.csv as written before the intervals
    legacy.mkdir()
    before = [c for c in cells.columns if c.endswith(("_low", "_high")) or c.startswith("bootstrap_")]
    cells.drop(columns=[*before, "run"]).to_csv(legacy / "cells.csv", index=False)
    old = render(legacy, "csv")
    assert "2.00x" in old and "[" not in old


def test_plot_table_has_the_conditional_rate(tmp_path):
    log = ExampleLog(tmp_path / "examples.jsonl")
    for r in toy_rows():
        log.append(r)
    table = acceptance_by_position(tmp_path)
    sd = table[table["cell"] == "sd"].set_index("position")
    assert sd["proposed"].tolist() == [4, 3] and sd["accepted"].tolist() == [3, 1]
    assert sd["reached"].tolist() == [4, 2]
    assert sd["acceptance_rate"].tolist() == pytest.approx([3 / 4, 1 / 3])
    assert sd["conditional_rate"].tolist() == pytest.approx([3 / 4, 1 / 2])
    assert set(table["cell"]) == {"sd", "re"}  # AR drafts nothing


def test_a_report_gives_a_run_written_before_the_intervals_its_swi_intervals_from_the_rows(tmp_path):
    from specbench.pipeline.records.results import write_cells
    from specbench.pipeline.views.report import load_cells

    run = tmp_path / "legacy"
    run.mkdir()
    log = ExampleLog(run / "examples.jsonl")
    for row in toy_rows():
        log.append(row)
    cells = summarise(toy_rows())
    old = [c for c in cells.columns if c.endswith(("_low", "_high")) or c.startswith("bootstrap_")]
    write_cells(run, cells.drop(columns=old).to_csv(index=False))  # today's rows: their cells.sha256 too
    before = (run / "cells.csv").read_text()
    shown = load_cells(run).set_index("cell")
    for column in ("swi_ms_low", "swi_ms_high", "swi_pw_low", "swi_pw_high"):
        assert shown[column].tolist() == pytest.approx(
            cells.set_index("cell").loc[shown.index, column].tolist()
        )
    assert "speedup_vs_ar_low" not in shown.columns  # walltime intervals are not derived
    assert (run / "cells.csv").read_text() == before
