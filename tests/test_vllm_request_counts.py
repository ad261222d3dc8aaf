"""vLLM's own per-request speculative counts under load (issue 54, part 5's acceptance view): specbench
starts every speculating vLLM server with ``--per-request-spec-decode-metrics summary``, so each request's
stream ends in a usage chunk carrying ``metrics.speculative_decoding``; those become the request's own
counts, load.csv's ``request_counts`` says how many requests sent them, and ``specbench serving --view
acceptance`` shows their mean and p10/p50/p90 beside the pooled /metrics figure.

The sweep runs against the stand-in vLLM server (tests/fixtures/stub_vllm), which answers as vLLM 0.32
does: the counts only with the flag and only where the request asked for usage, with vLLM's field
names, and, as vLLM does, it refuses to start with the flag and no speculative config."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import yaml
from test_vllm_backend import _no_server_left, _recipe, stub_engine  # noqa: F401  (a fixture)
from typer.testing import CliRunner

from specbench.cli import app
from specbench.engines import load_client
from specbench.pipeline.analysis.serving import acceptance_side_by_side, read_sweep

# What a request of the stand-in's n-gram cell (k = 4) drafts: 24 tokens, a first chunk of 3 without a
# draft, then 7 verify steps that each accept 2 of 4 drafts.
OWN_COUNTS = {"draft_tokens": 28, "accepted": 14, "steps": 7}
TOKENS_PER_STEP = 24 / (24 - 14)

# vLLM 0.32's last chunk of such a stream (entrypoints/openai/completion/serving.py dumps it with
# exclude_none; v1/metrics/stats.py RequestSpecDecodeMetrics.to_dict fills speculative_decoding)
FINAL_CHUNK = {
    "id": "cmpl-1",
    "object": "text_completion",
    "created": 1,
    "model": "m",
    "choices": [],
    "usage": {"prompt_tokens": 5, "total_tokens": 29, "completion_tokens": 24},
    "metrics": {
        "speculative_decoding": {
            "mean_acceptance_length": 3.0,
            "draft_acceptance_rate": 0.5,
            "acceptance_histogram": [0, 0, 7, 0, 0],
            "num_spec_steps": 7,
            "num_accepted_draft_tokens": 14,
            "num_draft_tokens": 28,
            "num_spec_tokens": 4,
        }
    },
}


def test_vllms_final_usage_chunk_is_the_requests_own_counts():
    result = load_client.Result(0.0)
    first = {"choices": [{"index": 0, "text": "abc", "token_ids": [1, 2, 3]}]}
    for message in (first, FINAL_CHUNK):
        load_client._event(b"data: " + json.dumps(message).encode(), result)
    record = load_client.request_record(result, 0.0)
    assert record["tokens"] == 24 and record["spec"] == OWN_COUNTS


def _sweep(tmp_path) -> tuple:
    recipe = _recipe(tmp_path, load={"concurrency": [1, 2], "requests": 4, "slo_ttft_s": 5.0})
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    out = tmp_path / "load"
    return CliRunner().invoke(app, ["load", str(path), "-o", str(out)]), out


def test_a_vllm_sweep_reads_each_requests_own_counts_and_shows_their_spread(stub_engine):  # noqa: F811
    tmp_path = stub_engine
    result, out = _sweep(tmp_path)
    # the AR servers started too: the stand-in, as vLLM, exits on the flag without --speculative-config
    assert result.exit_code == 0, result.output
    assert _no_server_left(tmp_path)
    rows = pd.read_csv(out / "load.csv")
    ngram, ar = rows[rows.cell == "vllm-ngram"], rows[rows.cell == "vllm-ar"]
    assert ngram.request_counts.tolist() == [4, 4] and ar.request_counts.tolist() == [0, 0]
    assert ngram.tokens_per_step_est.tolist() == pytest.approx([TOKENS_PER_STEP] * 2)  # /metrics: still there
    lines = [json.loads(line) for line in (out / "load_requests.jsonl").read_text().splitlines()]
    assert [line["spec"] for line in lines if line["cell"] == "vllm-ngram"] == [OWN_COUNTS] * 8
    assert all(line["spec"] is None for line in lines if line["cell"] == "vllm-ar")
    summary = pd.read_csv(out / "load_summary.csv")
    assert summary[summary.cell == "vllm-ngram"].request_counts.tolist() == [4, 4]

    sweep = read_sweep(out, resamples=50)
    entries = {e["level"]: e for e in acceptance_side_by_side(sweep.summary, sweep.rows, sweep.requests)}
    assert sorted(entries) == ["x1", "x2"]  # AR cells have no acceptance
    for entry in entries.values():
        assert entry["per_request_n"] == 4
        assert entry["per_request_mean"] == pytest.approx(TOKENS_PER_STEP)
        assert entry["pooled_tokens_per_step"] == pytest.approx(TOKENS_PER_STEP)
        assert [entry[f"per_request_p{q}"] for q in (10, 50, 90)] == pytest.approx([TOKENS_PER_STEP] * 3)
        assert entry["server_mean_acceptance_length"] == pytest.approx(1 + 14 / 7)

    shown = CliRunner().invoke(app, ["serving", str(out), "--view", "acceptance"])
    assert shown.exit_code == 0, shown.output
    text = " ".join(shown.output.split())
    assert "per level only" not in text and "2.40 / 2.40 / 2.40" in text


def test_a_server_run_without_the_flag_falls_back_to_its_counters(stub_engine, monkeypatch):  # noqa: F811
    """A vLLM that sends no request's counts (older, or a remote one run without the flag; here the
    stand-in told to ignore the flag): the level's /metrics counters alone, 'per level only'."""
    monkeypatch.setenv("STUB_SERVE_PER_REQUEST_IGNORED", "1")
    tmp_path = stub_engine
    result, out = _sweep(tmp_path)
    assert result.exit_code == 0, result.output
    rows = pd.read_csv(out / "load.csv")
    assert (rows.request_counts == 0).all()
    ngram = rows[rows.cell == "vllm-ngram"]
    assert ngram.tokens_per_step_est.tolist() == pytest.approx([TOKENS_PER_STEP] * 2)
    shown = CliRunner().invoke(app, ["serving", str(out), "--view", "acceptance"])
    assert shown.exit_code == 0 and "per level only" in shown.output, shown.output
