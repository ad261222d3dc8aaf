"""Load measured the way serving benchmarks measure it (issue 54): open-loop arrivals, repeats with
intervals, and the rules behind each figure, pinned on requests that differ; then whole sweeps through
the stand-in vLLM server (tests/fixtures/stub_vllm): a rate sweep with repeats whose servers take
turns, levels defined by a duration, a request that hangs, and a server that dies mid-level with the
resume that measures it again."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from test_vllm_backend import _no_server_left, _recipe, stub_engine  # noqa: F401  (a fixture)
from typer.testing import CliRunner

import specbench.engines.load as load_module
from specbench.cli import app
from specbench.engines.load_client import arrival_seed, arrival_times
from specbench.pipeline.analysis.load_figures import (
    FIGURES,
    Repeat,
    level_figures,
    paired_speedups,
    summarize,
    sweep_summary,
)

COMMITTED = (
    Path(__file__).resolve().parents[1] / "results/engines/smollm2_vllm_load/amd-epyc-family26-avx512-bf16"
)


def _request(ttft, e2e, tokens, error=None, sent=0.0) -> dict:
    return {
        "ttft_s": ttft,
        "e2e_s": e2e,
        "tokens": tokens,
        "error": error,
        "sent_s": sent,
        "timed_out": False,
    }


# -- arrivals ----------------------------------------------------------------------------------------


def test_arrivals_are_seeded_gamma_gaps_rescaled_to_the_nominal_rate():
    seed = arrival_seed(0, 2.0, 0)
    times = arrival_times(2.0, 2000, 1.0, seed)
    assert times == arrival_times(2.0, 2000, 1.0, seed)  # the seed replays the level
    assert times != arrival_times(2.0, 2000, 1.0, arrival_seed(0, 2.0, 1))  # each repeat its own draw
    assert times != arrival_times(2.0, 2000, 1.0, arrival_seed(0, 4.0, 0))  # each rate its own
    assert times[-1] == pytest.approx(2000 / 2.0)  # the last arrival at n / rate, as vLLM rescales
    gaps = np.diff([0.0, *times])
    assert (gaps > 0).all()
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.1)  # exponential gaps: CV 1
    bursty = np.diff([0.0, *arrival_times(2.0, 2000, 0.25, seed)])
    assert bursty.std() / bursty.mean() == pytest.approx(2.0, abs=0.3)  # gamma, shape 1/4: CV 2
    assert arrival_times(4.0, 4, math.inf, seed) == pytest.approx([0.25, 0.5, 0.75, 1.0])  # evenly


# -- the rules of each figure, on requests that differ ----------------------------------------------


def test_goodput_misses_a_request_on_ttft_as_well_as_on_tpot():
    slo = (0.5, 0.15)  # TTFT <= 0.5 s and TPOT <= 0.15 s
    good = _request(0.2, 1.2, 11)  # TTFT 0.2, TPOT 0.1
    late_first = _request(0.9, 1.9, 11)  # TTFT 0.9: misses on TTFT only (TPOT 0.1)
    slow = _request(0.2, 3.2, 11)  # TPOT 0.3: misses on TPOT only
    one_token = _request(0.3, 0.3, 1)  # no TPOT: that objective is met
    one_token_late = _request(0.6, 0.6, 1)
    failed = _request(None, 0.1, 0, "HTTP/1.1 500")
    cases = [(good, 1), (late_first, 0), (slow, 0), (one_token, 1), (one_token_late, 0), (failed, 0)]
    for request, counted in cases:
        assert summarize({}, [request], 1.0, {}, slo)["goodput_req_s"] == counted, request
    row = summarize({}, [request for request, _ in cases], 2.0, {}, slo)
    assert row["goodput_req_s"] == pytest.approx(2 / 2.0)
    assert row["completed"] == 5 and row["errors"] == 1


def test_latency_percentiles_on_uneven_requests_match_hand_computed_ones():
    """Linear interpolation between order statistics (rank (n - 1) q), numpy's default and vLLM's; a
    failed request is in no latency. There is one percentile function: the load module's own is gone."""
    ttft = [0.1, 0.2, 0.4, 0.8, 1.6]
    e2e = [1.1, 1.3, 2.4, 1.8, 5.6]
    records = [_request(t, e, 11) for t, e in zip(ttft, e2e, strict=True)]
    records.append(_request(None, 9.0, 0, "TimeoutError: no end within 9 s"))
    row = summarize({}, records, 4.0, {}, (10.0, 10.0))
    # TTFT sorted 0.1 0.2 0.4 0.8 1.6: p50 the 3rd; p90 at rank 3.6: 0.8 + 0.6 x 0.8; p99 at 3.96
    assert row["ttft_p50_s"] == pytest.approx(0.4)
    assert row["ttft_p90_s"] == pytest.approx(1.28)
    assert row["ttft_p99_s"] == pytest.approx(1.568)
    # end-to-end sorted 1.1 1.3 1.8 2.4 5.6
    assert row["e2e_p50_s"] == pytest.approx(1.8)
    assert row["e2e_p90_s"] == pytest.approx(2.4 + 0.6 * 3.2)
    assert row["e2e_p99_s"] == pytest.approx(2.4 + 0.96 * 3.2)
    # TPOT = (e2e - TTFT) / 10: 0.1 0.11 0.2 0.1 0.4, sorted 0.1 0.1 0.11 0.2 0.4
    assert row["tpot_p50_s"] == pytest.approx(0.11)
    assert row["tpot_p90_s"] == pytest.approx(0.2 + 0.6 * 0.2)
    assert row["tpot_p99_s"] == pytest.approx(0.2 + 0.96 * 0.2)
    assert row["per_request_tok_s"] == pytest.approx(np.mean([11 / e for e in e2e]))
    assert row["throughput_tok_s"] == pytest.approx(55 / 4.0)
    assert not hasattr(load_module, "_percentile")


def test_intervals_span_repeats_and_requests_and_speedups_pair_them():
    rng = np.random.default_rng(1)

    def records(scale: float) -> list[dict]:
        return [_request(0.1 * x, x, 20) for x in scale * rng.uniform(0.5, 2.0, 16)]

    first, second = records(1.0), records(1.5)
    ar = [Repeat.of(first, 10.0, 1.0, 1.0), Repeat.of(second, 14.0, 1.0, 1.0)]
    alone = level_figures(ar[:1])
    # every request brought 20 tokens: redrawing one repeat's requests cannot move its throughput,
    # while its per-request speed and TTFT vary with the requests drawn
    assert alone["throughput_tok_s_low"] == alone["throughput_tok_s_high"] == pytest.approx(32.0)
    assert alone["per_request_tok_s_low"] < alone["per_request_tok_s"] < alone["per_request_tok_s_high"]
    both = level_figures(ar)
    assert both["throughput_tok_s"] == pytest.approx(640 / 24.0)
    assert both["throughput_tok_s_low"] < both["throughput_tok_s"] < both["throughput_tok_s_high"]
    for figure in FIGURES:
        assert both[f"{figure}_low"] <= both[f"{figure}_high"], figure
    # speculation that halves every request's time and each repeat's: the paired ratio is 2 in every
    # resample, where unpaired draws of two spread-out cells would give a wide interval
    fast = [
        Repeat.of([_request(r["ttft_s"] / 2, r["e2e_s"] / 2, 20) for r in first], 5.0, 1.0, 1.0),
        Repeat.of([_request(r["ttft_s"] / 2, r["e2e_s"] / 2, 20) for r in second], 7.0, 1.0, 1.0),
    ]
    speedup = paired_speedups(fast, ar)
    for name in ("speedup_throughput", "speedup_per_request"):
        assert speedup[name] == pytest.approx(2.0)
        assert speedup[f"{name}_low"] == pytest.approx(2.0) and speedup[f"{name}_high"] == pytest.approx(2.0)


def test_a_sweep_from_before_requests_were_kept_is_summarized_without_intervals():
    """The committed SmolLM2 sweep (load.csv only, one run per level) still reads, plots and
    summarizes: its figures as measured, its speedups the rows' own, its intervals NaN."""
    summary = {(r["cell"], r["concurrency"]): r for r in sweep_summary(COMMITTED)}
    rows = {(r["cell"], r["concurrency"]): r for r in load_module.read_load(COMMITTED)}
    assert summary.keys() == rows.keys() and len(rows) == 10
    for level, row in rows.items():
        assert summary[level]["throughput_tok_s"] == pytest.approx(row["throughput_tok_s"])
        assert summary[level]["speedup_throughput"] == pytest.approx(row["speedup_throughput"])
        assert math.isnan(summary[level]["throughput_tok_s_low"]) and summary[level]["repeats"] == 1


# -- whole sweeps through the stand-in server ------------------------------------------------------


def _load(tmp_path, recipe: dict, *extra: str):
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return CliRunner().invoke(app, ["load", str(path), "-o", str(tmp_path / "load"), *extra])


def _requests(tmp_path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "load" / "load_requests.jsonl").read_text().splitlines()]


def test_a_rate_sweep_with_repeats_takes_turns_and_gives_every_figure_an_interval(stub_engine):  # noqa: F811
    tmp_path = stub_engine
    load = {"concurrency": [2], "request_rate": [50.0, 100.0], "repeats": 2, "requests": 6, "slo_ttft_s": 5.0}
    result = _load(tmp_path, _recipe(tmp_path, load=load))
    assert result.exit_code == 0, result.output
    assert "load: 2 cell(s), 12 level(s) (concurrency 2; rate 50, 100 req/s) over 2 repeats: 72 requests" in (
        " ".join(result.output.split())
    )
    # round 1: AR then n-gram; round 2 the other way round
    ready = re.findall(r"(vllm-[\w-]+): server ready in \d+ s \(round (\d) of 2\)", result.output)
    assert ready == [("vllm-ar", "1"), ("vllm-ngram", "1"), ("vllm-ngram", "2"), ("vllm-ar", "2")]
    rows = pd.read_csv(tmp_path / "load" / "load.csv")
    assert len(rows) == 12 and rows.complete.all() and (rows.completed == 6).all()
    assert sorted(rows[rows.request_rate.isna()].concurrency.unique()) == [2]
    assert set(rows.repeat) == {0, 1} and (rows.max_in_flight >= 1).all()
    requests = _requests(tmp_path)
    assert len(requests) == 72 and len({(r["key"], r["index"]) for r in requests}) == 72
    for rate in (50.0, 100.0):
        for repeat in (0, 1):
            scheduled = arrival_times(rate, 6, 1.0, arrival_seed(0, rate, repeat))
            for cell in ("vllm-ar", "vllm-ngram"):
                mine = [
                    r
                    for r in requests
                    if (r["cell"], r["level"], r["repeat"]) == (cell, f"@{rate:g} req/s", repeat)
                ]
                assert [r["arrival_s"] for r in sorted(mine, key=lambda r: r["index"])] == pytest.approx(
                    scheduled
                )
                assert all(r["sent_s"] >= r["arrival_s"] - 1e-3 for r in mine)  # never sent early
    summary = pd.read_csv(tmp_path / "load" / "load_summary.csv")
    assert len(summary) == 6 and (summary.repeats == 2).all() and (summary.requests == 12).all()
    for figure in FIGURES:
        assert (
            summary[f"{figure}_low"].notna().all()
            and (summary[f"{figure}_low"] <= summary[f"{figure}_high"]).all()
        )
    for name in ("throughput_tok_s", "per_request_tok_s"):
        assert (summary[f"{name}_low"] <= summary[name] + 1e-9).all()
        assert (summary[name] <= summary[f"{name}_high"] + 1e-9).all()
    ar, ngram = summary[summary.cell == "vllm-ar"], summary[summary.cell == "vllm-ngram"]
    assert (ar.speedup_per_request == 1.0).all() and (ar.speedup_per_request_low == 1.0).all()
    assert (ngram.speedup_per_request_low > 1.0).all()  # the stand-in streams 3 tokens a chunk
    assert "speedup" in result.output and _no_server_left(tmp_path)
    plot = CliRunner().invoke(app, ["plot", str(tmp_path / "load"), "--figure", "load"])
    assert plot.exit_code == 0 and (tmp_path / "load" / "load.png").is_file(), plot.output


def test_levels_defined_by_a_duration(stub_engine):  # noqa: F811
    tmp_path = stub_engine
    load = {"concurrency": [2], "request_rate": [20.0], "duration_s": 0.5, "slo_ttft_s": 5.0}
    result = _load(tmp_path, _recipe(tmp_path, load=load))
    assert result.exit_code == 0, result.output
    assert "and 2 level(s) of 0.5 s" in " ".join(result.output.split())
    rows = pd.read_csv(tmp_path / "load" / "load.csv")
    rated, closed = rows[rows.request_rate.notna()], rows[rows.request_rate.isna()]
    assert (rated.requests == 10).all()  # 20 requests/s x 0.5 s
    assert (closed.requests >= 2).all() and (closed.elapsed_s >= 0.5).all()


def test_a_request_that_hangs_is_a_timed_out_failure_not_dropped(stub_engine, monkeypatch):  # noqa: F811
    tmp_path = stub_engine
    monkeypatch.setenv("STUB_SERVE_HANG_ON_REQUEST", "3")  # the warm-up is the 1st: the level's 2nd
    result = _load(tmp_path, _recipe(tmp_path, load={"concurrency": [2], "requests": 4, "timeout_s": 2.0}))
    assert result.exit_code == 0, result.output
    assert "1 errors, 1 timed out" in " ".join(result.output.split())
    rows = pd.read_csv(tmp_path / "load" / "load.csv")
    assert (rows.requests == 4).all() and (rows.completed == 3).all()
    assert (rows.errors == 1).all() and (rows.timeouts == 1).all() and rows.complete.all()
    hung = [r for r in _requests(tmp_path) if r["timed_out"]]
    assert len(hung) == 2  # one per cell's server
    assert all(r["error"] == "TimeoutError: no end within 2 s" and r["e2e_s"] >= 1.9 for r in hung)
    summary = pd.read_csv(tmp_path / "load" / "load_summary.csv")
    assert (summary.timeouts == 1).all() and (summary.requests == 4).all()
    assert _no_server_left(tmp_path)


def test_a_server_that_dies_mid_level_keeps_its_row_marked_and_resume_measures_it_again(
    stub_engine,  # noqa: F811
    monkeypatch,
):
    tmp_path = stub_engine
    recipe = _recipe(tmp_path, load={"concurrency": [1], "requests": 4})
    monkeypatch.setenv("STUB_SERVE_DIE_ON_REQUEST", "4")  # the warm-up, then the level's 3rd request
    result = _load(tmp_path, recipe)
    message = " ".join(result.output.split())
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "the engine's server exited (code 3) during vllm-ar x1" in message, message
    assert (
        "stub server died mid-level" in message and "marked incomplete" in message and "--resume" in message
    )
    assert _no_server_left(tmp_path)
    rows = pd.read_csv(tmp_path / "load" / "load.csv")
    assert list(rows.cell) == ["vllm-ar"] and not rows.complete.any()
    assert rows.requests.tolist() == [4] and rows.completed.tolist() == [2]
    assert len(_requests(tmp_path)) == 4  # nothing measured is dropped
    # a kill between a level's request lines and its row: lines of a key load.csv lacks, one cut short
    with (tmp_path / "load" / "load_requests.jsonl").open("a") as handle:
        handle.write(json.dumps({"key": "0123456789abcdef", "index": 0, "tokens": 5}) + '\n{"key": "01')
    monkeypatch.delenv("STUB_SERVE_DIE_ON_REQUEST")
    again = _load(tmp_path, recipe, "--resume")
    assert again.exit_code == 0, again.output
    rows = pd.read_csv(tmp_path / "load" / "load.csv")
    assert sorted(rows.cell) == ["vllm-ar", "vllm-ngram"] and rows.complete.all()
    assert rows.key.is_unique and (rows.completed == 4).all()
    requests = _requests(tmp_path)  # every line parses: the cut one and the stray key are gone
    assert {r["key"] for r in requests} == set(rows.key) and len(requests) == 8
    assert sorted((r["key"], r["index"]) for r in requests) == sorted(
        (k, i) for k in rows.key for i in range(4)
    )
    summary = pd.read_csv(tmp_path / "load" / "load_summary.csv")
    assert (summary.incomplete == 0).all() and (summary.requests == 4).all()
