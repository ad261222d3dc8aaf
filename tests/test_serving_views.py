"""The views serving engineers read from a load sweep (issue 54, part 5): the Pareto points and frontier,
the k schedule (vLLM's per-batch-size format), acceptance pooled beside per request, and the time split,
checked against numbers computed by hand from a small sweep written here, and against the committed
SmolLM2 vLLM sweep; then the command, the figure and the page that show them."""

from __future__ import annotations

import asyncio
import json
import math
import shutil
from pathlib import Path

import pandas as pd
import pytest
from test_html_pages import Page
from typer.testing import CliRunner

from specbench.cli import app
from specbench.engines import load_client
from specbench.engines.request_counts import request_counts
from specbench.errors import SpecbenchError
from specbench.pipeline.analysis import statistics
from specbench.pipeline.analysis.serving import (
    Units,
    acceptance_side_by_side,
    frontier,
    pareto_points,
    read_sweep,
    serving_units,
    time_split,
)
from specbench.pipeline.views.run_page import render_run
from specbench.pipeline.views.serving_view import K_SCHEDULE, schedule_document

COMMITTED = (
    Path(__file__).resolve().parents[1] / "results/engines/smollm2_vllm_load/amd-epyc-family26-avx512-bf16"
)
NGRAM = {"method": "ngram", "prompt_lookup_max": 3, "prompt_lookup_min": 1}
# cell -> (k, {level: (TPOT of both requests, elapsed s)}); every request 11 tokens, TTFT 0.1 s
SWEEP = {
    "ar": (0, {1: (0.1, 2.2), 4: (0.2, 1.1)}),
    "ng2": (2, {1: (0.02, 1.1), 4: (0.25, 0.88)}),
    "ng4": (4, {1: (0.04, 0.55), 4: (0.5, 22 / 30)}),
}
ACCEPTED = {("ng2", 1): (5, 1), ("ng2", 4): (2, 2)}  # per-request accepted drafts where counts came


def _write_sweep(
    directory: Path, engine: str = "vllm", k_key: str = "num_speculative_tokens", rate: bool = False
) -> Path:
    """Two levels (x1, x4) of three cells, one repeat of two requests each, an SLO of TPOT <= 0.3 s;
    with ``rate``, x4's requests again as an open-loop level of 2 requests/s."""
    directory.mkdir(parents=True)
    rows, lines = [], []
    for cell, (k, levels) in SWEEP.items():
        config = None if k == 0 else json.dumps({**NGRAM, k_key: k})
        for concurrency, (tpot, elapsed) in [*levels.items(), *([("r2", levels[4])] if rate else [])]:
            key = f"{cell}-{concurrency}"
            counts = ACCEPTED.get((cell, 4 if concurrency == "r2" else concurrency))
            for index in range(2):
                spec = {"draft_tokens": 8, "accepted": counts[index], "steps": None} if counts else None
                lines.append(
                    {
                        "key": key,
                        "index": index,
                        "arrival_s": None,
                        "sent_s": 0.0,
                        "ttft_s": 0.1,
                        "e2e_s": 0.1 + tpot * 10,
                        "tokens": 11,
                        "error": None,
                        "timed_out": False,
                        "spec": spec,
                    }
                )
            accepted = sum(counts) if counts else (3 if k else 0)
            rows.append(
                {
                    "key": key,
                    "cell": cell,
                    "concurrency": math.nan if concurrency == "r2" else concurrency,
                    "request_rate": 2.0 if concurrency == "r2" else math.nan,
                    "repeat": 0,
                    "complete": True,
                    "requests": 2,
                    "completed": 2,
                    "errors": 0,
                    "timeouts": 0,
                    "elapsed_s": elapsed,
                    "output_tokens": 22,
                    "drafts": 8 if k else 0,
                    "accepted": accepted,
                    "slo_ttft_s": 1.0,
                    "slo_tpot_s": 0.3,
                    "target": "tiny",
                    "method": "autoregressive" if k == 0 else "ngram",
                    "engine": engine,
                    "machine": "m",
                    "machine_described": "CPU · 4 threads / 4 cores · torch",
                    "speculative_config": config,
                }
            )
    pd.DataFrame(rows).to_csv(directory / "load.csv", index=False)
    (directory / "load_requests.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    (directory / "environment.json").write_text(json.dumps({"machine": {"cores": 4, "gpus": []}}))
    return directory


@pytest.fixture
def sweep_dir(tmp_path) -> Path:
    return _write_sweep(tmp_path / "sweep")


@pytest.fixture
def fewer_resamples(monkeypatch):
    """200 bootstrap resamples where a command would draw 2000 (the intervals' width is not tested)."""
    monkeypatch.setattr(statistics, "BOOTSTRAP_RESAMPLES", 200)


def _by(points: list[dict]) -> dict[tuple, dict]:
    return {(p["cell"], p["level"]): p for p in points}


def test_pareto_points_and_frontier_by_hand(sweep_dir):
    sweep = read_sweep(sweep_dir, resamples=200)
    assert sweep.units == Units(4, "core", "environment.json machine.cores")
    points = _by(pareto_points(sweep.summary, sweep.units))
    # per user = 1 / TPOT p50; per core = 22 tokens / elapsed / 4 cores
    expected = {
        ("ar", "x1"): (10.0, 2.5),
        ("ar", "x4"): (5.0, 5.0),
        ("ng2", "x1"): (50.0, 5.0),
        ("ng2", "x4"): (4.0, 6.25),
        ("ng4", "x1"): (25.0, 10.0),
        ("ng4", "x4"): (2.0, 7.5),
    }
    for key, (per_user, per_core) in expected.items():
        assert points[key]["per_user_tok_s"] == pytest.approx(per_user), key
        assert points[key]["per_unit_tok_s"] == pytest.approx(per_core), key
        assert points[key]["per_core_tok_s"] == pytest.approx(per_core), key
    # (10, 25) and (5, 50) beat every other point on both axes; nothing beats them
    assert {key for key, p in points.items() if p["frontier"]} == {("ng4", "x1"), ("ng2", "x1")}
    for p in points.values():  # the TPOT interval turned over; equal TPOTs leave no width
        assert p["per_user_low"] <= p["per_user_tok_s"] + 1e-9 <= p["per_user_high"] + 2e-9


def test_frontier_rules():
    # ties on one axis: the better on the other wins; an equal point is not dominated twice; NaN never
    assert frontier([(1, 5), (1, 3), (2, 1), (0.5, 6), (math.nan, 9)]) == {0, 2, 3}
    assert frontier([(1, 1), (2, 2), (3, 3)]) == {2}
    assert frontier([]) == set()


def test_serving_units_gpu_first_then_cores_then_the_description():
    assert serving_units({"machine": {"gpus": ["H200", "H200"], "cores": 64}}, []) == Units(
        2, "GPU", "environment.json machine.gpus"
    )
    gpu_box = "NVIDIA H200, NVIDIA H200, NVIDIA H200 · AMD EPYC, AMX · 8 threads / 64 cores · torch 2.9"
    assert serving_units({}, [{"machine_described": gpu_box}]) == Units(
        3, "GPU", "load.csv machine_described"
    )
    cpu = "AMD EPYC (family 26, model 2), AVX512-BF16, no AMX · 2 threads / 2 cores · torch 2.13.0+cpu"
    assert serving_units({}, [{"machine_described": cpu}]).count == 2
    with pytest.raises(SpecbenchError, match="names no cores or GPUs"):
        serving_units({}, [{}])


def test_k_schedule_by_goodput_and_by_throughput_in_vllms_format(sweep_dir):
    document = schedule_document(read_sweep(sweep_dir, resamples=200))
    (family,) = document["families"]
    assert family["setting"] == NGRAM and family["ks"] == [2, 4]
    x1, x4 = family["levels"]
    # x1: goodput AR 2/2.2, k2 2/1.1, k4 2/0.55 -> k 4 (most throughput too: 40 tok/s)
    assert (x1["k_goodput"], x1["k_throughput"]) == (4, 4)
    assert x1["goodput"] == pytest.approx(2 / 0.55) and x1["runner_up_k_goodput"] == 2
    # x4: k4's TPOT 0.5 misses the 0.3 s objective: goodput 0, yet the most throughput (30 tok/s)
    assert (x4["k_goodput"], x4["k_throughput"]) == (2, 4)
    assert x4["goodput"] == pytest.approx(2 / 0.88) and x4["throughput"] == pytest.approx(30.0)
    config = family["vllm"]["speculative_config"]
    assert config == {
        **NGRAM,
        "num_speculative_tokens": 4,
        "num_speculative_tokens_per_batch_size": [[1, 3, 4], [4, 4, 2]],
    }
    by_throughput = family["vllm"]["speculative_config_by_throughput"]
    assert by_throughput["num_speculative_tokens_per_batch_size"] == [[1, 3, 4], [4, 4, 4]]
    assert "num_speculative_tokens_per_batch_size" in family["note"]


def test_rate_levels_join_the_schedule_but_not_vllms_batch_sizes(tmp_path, fewer_resamples):
    sweep = read_sweep(_write_sweep(tmp_path / "sweep", rate=True), resamples=50)
    text, _ = render_run(sweep.directory)
    assert text.count("requests per second (open loop)") == 2  # its own pair of speedup charts
    (family,) = schedule_document(sweep)["families"]
    assert [e["level"] for e in family["levels"]] == ["x1", "x4", "@2 req/s"]
    rated = family["levels"][2]
    assert rated["request_rate"] == 2.0 and rated["concurrency"] is None
    assert (rated["k_goodput"], rated["k_throughput"]) == (2, 4)  # x4's requests again
    ranges = family["vllm"]["speculative_config"]["num_speculative_tokens_per_batch_size"]
    assert ranges == [[1, 3, 4], [4, 4, 2]] and "request-rate levels are in levels only" in family["note"]
    points = _by(pareto_points(sweep.summary, sweep.units))
    assert points[("ng2", "@2 req/s")]["kind"] == "rate"
    assert points[("ng2", "@2 req/s")]["per_user_tok_s"] == pytest.approx(4.0)
    entries = {
        (e["cell"], e["level"]): e for e in acceptance_side_by_side(sweep.summary, sweep.rows, sweep.requests)
    }
    assert entries[("ng2", "@2 req/s")]["per_request_mean"] == pytest.approx(11 / 9)


def test_a_llamacpp_family_gets_specbenchs_own_schedule(tmp_path):
    sweep = read_sweep(_write_sweep(tmp_path / "sweep", engine="llama.cpp", k_key="n_max"), resamples=50)
    (family,) = schedule_document(sweep)["families"]
    assert family["vllm"] is None and "specbench's own schedule" in family["note"]
    assert [e["k_goodput"] for e in family["levels"]] == [4, 2]
    assert {e["engine"] for e in time_split(sweep.summary)} == {"llama.cpp"}
    assert all("predicted_ms" in e["split"] for e in time_split(sweep.summary))


def test_acceptance_pooled_beside_per_request(sweep_dir):
    sweep = read_sweep(sweep_dir, resamples=50)
    entries = {
        (e["cell"], e["level"]): e for e in acceptance_side_by_side(sweep.summary, sweep.rows, sweep.requests)
    }
    assert set(entries) == {("ng2", "x1"), ("ng2", "x4"), ("ng4", "x1"), ("ng4", "x4")}  # AR has none
    x1 = entries[("ng2", "x1")]
    # pooled: 22 tokens, 6 accepted -> 22 / 16; the server's 1 + 6 / 8
    assert x1["pooled_tokens_per_step"] == pytest.approx(22 / 16)
    assert x1["server_mean_acceptance_length"] == pytest.approx(1 + 6 / 8)
    # per request: 11 / 6 and 11 / 10
    low, high = 11 / 10, 11 / 6
    assert x1["per_request_n"] == 2 and x1["per_request_mean"] == pytest.approx((low + high) / 2)
    assert x1["per_request_p10"] == pytest.approx(low + 0.1 * (high - low))
    assert x1["per_request_p90"] == pytest.approx(low + 0.9 * (high - low))
    assert entries[("ng2", "x4")]["per_request_mean"] == pytest.approx(11 / 9)
    ng4 = entries[("ng4", "x1")]  # no per-request counts came: the level's only
    assert ng4["per_request_n"] == 0 and math.isnan(ng4["per_request_mean"])
    assert ng4["pooled_tokens_per_step"] == pytest.approx(22 / 19)


def test_the_time_split_is_named_not_exposed_per_engine(sweep_dir):
    split = time_split(read_sweep(sweep_dir, resamples=50).summary)
    assert [e["cell"] for e in split] == ["ng2", "ng4"]
    assert all(e["split"].startswith("not exposed: vLLM 0.32's /metrics") for e in split)


def test_the_committed_sweep():
    sweep = read_sweep(COMMITTED, resamples=50)
    load = pd.read_csv(COMMITTED / "load.csv")
    assert sweep.units == Units(2, "core", "load.csv machine_described")  # no environment.json there
    points = _by(pareto_points(sweep.summary, sweep.units))
    for row in load.itertuples():
        point = points[(row.cell, f"x{row.concurrency}")]
        assert point["per_user_tok_s"] == pytest.approx(1 / row.tpot_p50_s)
        assert point["per_unit_tok_s"] == pytest.approx(row.throughput_tok_s / 2)
    assert {key for key, p in points.items() if p["frontier"]} == {
        ("vllm-ngram", f"x{c}") for c in (1, 2, 4, 8, 16)
    }
    (family,) = schedule_document(sweep)["families"]
    # AR's 4.64 requests/s beat the n-gram cell's 3.82 at x16; its throughput did not (157.5 < 167.5)
    ranges = family["vllm"]["speculative_config"]["num_speculative_tokens_per_batch_size"]
    assert ranges == [[1, 1, 4], [2, 3, 4], [4, 7, 4], [8, 15, 4], [16, 16, 0]]
    assert [e["k_throughput"] for e in family["levels"]] == [4] * 5
    entries = acceptance_side_by_side(sweep.summary, sweep.rows, sweep.requests)
    assert all(e["per_request_n"] == 0 for e in entries)  # vLLM's counters: per level only
    vllm_al = load[load.cell == "vllm-ngram"].set_index("concurrency")["vllm_mean_acceptance_length"]
    for e in entries:
        assert e["server_mean_acceptance_length"] == pytest.approx(vllm_al[int(e["level"][1:])])


# -- per-request counts from the stream ---------------------------------------------------------------


def test_request_counts_from_llamacpp_timings_and_vllm_metrics():
    llamacpp = {"choices": [], "timings": {"predicted_ms": 12.0, "draft_n": 9, "draft_n_accepted": 4}}
    assert request_counts(llamacpp) == {"draft_tokens": 9, "accepted": 4, "steps": None}
    assert request_counts({"timings": {"predicted_ms": 3.0}}) is None  # not drafted yet
    vllm = {
        "usage": {"completion_tokens": 7},
        "metrics": {
            "speculative_decoding": {
                "num_draft_tokens": 6,
                "num_accepted_draft_tokens": 5,
                "num_spec_steps": 2,
            }
        },
    }
    assert request_counts(vllm) == {"draft_tokens": 6, "accepted": 5, "steps": 2}
    assert request_counts({"usage": {"completion_tokens": 7}}) is None
    result = load_client.Result(0.0)
    for message in (llamacpp, {"choices": [{"text": "x"}]}):  # a later message without counts keeps them
        load_client._event(b"data: " + json.dumps(message).encode(), result)
    assert load_client.request_record(result, 0.0)["spec"] == {
        "draft_tokens": 9,
        "accepted": 4,
        "steps": None,
    }


# -- the command, the figure and the page ---------------------------------------------------------------


def test_the_command_prints_every_view_and_writes_its_files(sweep_dir, fewer_resamples):
    result = CliRunner().invoke(app, ["serving", str(sweep_dir)])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    for shown in ("tok/s per core", "throughput speedup", "k (goodput)", "per level only", "not exposed"):
        assert shown in text, shown
    assert "[1, 3, 4]" not in text  # the schedule goes to the file
    document = json.loads((sweep_dir / K_SCHEDULE).read_text())
    assert document["families"][0]["vllm"]["speculative_config"]["num_speculative_tokens"] == 4
    pareto = pd.read_csv(sweep_dir / "pareto.csv")
    assert len(pareto) == 6 and pareto.frontier.sum() == 2 and (sweep_dir / "pareto.png").stat().st_size > 0
    plot = CliRunner().invoke(app, ["plot", str(sweep_dir), "--figure", "pareto"])
    assert plot.exit_code == 0, plot.output
    help_text = " ".join(CliRunner().invoke(app, ["serving", "--help"]).output.split())
    for view in ("pareto:", "speedup:", "k:", "acceptance:", "split:"):
        assert view in help_text, view


def test_a_directory_without_load_data_is_one_line(tmp_path):
    for args in (
        ["serving", str(tmp_path)],
        ["serving", str(tmp_path / "none")],
        ["plot", str(tmp_path), "--figure", "pareto"],
    ):
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 2 and "Traceback" not in result.output, result.output
        assert len(result.output.strip().splitlines()) == 1 and "specbench load" in result.output
    bad = CliRunner().invoke(app, ["serving", str(tmp_path), "--view", "nope"])
    assert bad.exit_code == 2 and "unknown view 'nope'" in bad.output


def test_the_page_draws_speedups_with_intervals_and_the_frontier(sweep_dir, fewer_resamples):
    text, twin = render_run(sweep_dir)
    page = Page(text)
    frontier_marks = [m for m in page.marks if m["data-series"] == "frontier tiny"]
    assert sorted(float(m["data-x"]) for m in frontier_marks) == pytest.approx([5.0, 10.0])
    assert all(m["fill"] == "none" for m in frontier_marks)  # ringed around the measured points
    assert text.count('data-interval="ng2"') >= 4  # error bars: two speedup charts, two levels
    section = json.loads(twin)["sections"]["Load"]
    assert section["k_schedule"]["families"][0]["levels"][1]["k_goodput"] == 2
    assert "per level only" in text and "not exposed" in text


def test_the_committed_sweep_page_is_read_only(tmp_path):
    copy = tmp_path / "sweep"
    shutil.copytree(COMMITTED, copy)
    before = sorted(p.name for p in copy.iterdir())
    render_run(copy)
    assert sorted(p.name for p in copy.iterdir()) == before  # the page writes nothing beside the sweep


def test_stream_counts_reach_the_request_record_through_a_real_socket():
    """A stand-in server streaming llama.cpp's OpenAI route's final message: the count rides through."""

    async def main() -> dict:
        final = {
            "choices": [],
            "usage": {"completion_tokens": 3},
            "timings": {"draft_n": 4, "draft_n_accepted": 2},
        }
        events = [{"choices": [{"text": "a"}]}, final]
        body = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"

        async def answer(reader, writer):
            while (await reader.readline()) not in (b"\r\n", b""):
                pass
            await reader.read(100)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n" + body.encode())
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(answer, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            result = await _stream(port)
        return load_client.request_record(result, result.started)

    record = asyncio.run(main())
    assert record["error"] is None and record["tokens"] == 3
    assert record["spec"] == {"draft_tokens": 4, "accepted": 2, "steps": None}


async def _stream(port: int):
    body = load_client.completion_body("m", [1, 2], 3, [])
    return await load_client.stream_completion(load_client.Endpoint.local(port), body, 5.0)


# -- `specbench report --html` on a sweep alone ---------------------------------------------------------


def test_report_html_on_a_sweep_alone_writes_its_serving_page(sweep_dir, fewer_resamples, tmp_path):
    before = sorted(p.name for p in sweep_dir.iterdir())
    page, twin = tmp_path / "page.html", tmp_path / "page.json"
    result = CliRunner().invoke(app, ["report", str(sweep_dir), "--html", str(page), "--json", str(twin)])
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert "holds a load sweep and no cells.csv" in said and f"specbench serving {sweep_dir}" in said
    text = page.read_text()
    assert "<title>specbench load sweep sweep</title>" in text
    assert text.count('data-interval="ng2"') >= 4  # the speedup charts' error bars
    assert "frontier tiny" in text and "per level only" in text  # ng4 sent no request's counts
    sections = json.loads(twin.read_text())["sections"]
    assert sorted(sections) == ["Load", "Machine"]
    assert sections["Load"]["k_schedule"]["families"][0]["levels"][1]["k_goodput"] == 2
    ng2 = {e["level"]: e for e in sections["Load"]["acceptance"] if e["cell"] == "ng2"}
    assert ng2["x1"]["per_request_n"] == 2 and ng2["x1"]["per_request_mean"] == pytest.approx(
        (11 / 6 + 11 / 10) / 2
    )
    assert sorted(p.name for p in sweep_dir.iterdir()) == before  # nothing written beside the sweep


def test_report_on_a_sweep_alone_without_a_page_or_unreadable_is_one_line(sweep_dir, tmp_path):
    plain = CliRunner().invoke(app, ["report", str(sweep_dir)])
    assert plain.exit_code == 2 and len(plain.output.strip().splitlines()) == 1, plain.output
    said = " ".join(plain.output.split())
    assert "holds a load sweep (load.csv) and no cells.csv" in said and "--html FILE" in said
    pd.read_csv(sweep_dir / "load.csv").drop(columns=["key"]).to_csv(sweep_dir / "load.csv", index=False)
    page = tmp_path / "page.html"
    broken = CliRunner().invoke(app, ["report", str(sweep_dir), "--html", str(page)])
    assert broken.exit_code == 2 and len(broken.output.strip().splitlines()) == 1, broken.output
    assert "has no column 'key'" in broken.output and not page.exists()  # not a page with a paragraph
