"""``engine: openai`` (issue 54, part 4): a server specbench does not start, measured at its base_url as
it runs. The stand-in vLLM server (tests/fixtures/stub_vllm) plays someone else's server on 127.0.0.1,
with an API key: load and run through it, the key never in a result file, only its routes contacted,
counters from vLLM's or SGLang's names or none (said in the record), a counter that goes down, no token
ids, and an address where nothing answers, each one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pandas as pd
import pytest
import tiny_recipes
import yaml
from test_vllm_backend import STUB, stub_engine  # noqa: F401  (a fixture)
from typer.testing import CliRunner

from specbench.cli import app
from specbench.engines import BACKENDS, ENGINE_NAMES
from specbench.engines.load import free_port
from specbench.engines.load_client import Endpoint
from specbench.engines.openai_compat import counter_names

SERVER = STUB / "vllm" / "entrypoints" / "openai" / "api_server.py"
KEY = "sk-stand-in-0123456789"
SPECULATING = json.dumps({"method": "ngram", "num_speculative_tokens": 4})


@pytest.fixture
def remote(stub_engine, monkeypatch):  # noqa: F811
    """start(speculating, **environment) -> the port of the stand-in started as someone else's server,
    wanting the API key; every server started is killed at the end."""
    tmp_path = stub_engine
    started = []

    def start(speculating: bool = False, **environment: str) -> int:
        port = free_port()
        command = [sys.executable, str(SERVER), "--model", "their-model", "--host", "127.0.0.1"]
        command += ["--port", str(port)] + (["--speculative-config", SPECULATING] if speculating else [])
        env = {**os.environ, "STUB_SERVE_API_KEY": KEY, "STUB_SERVE_LOG": str(tmp_path / "http.log")}
        started.append(subprocess.Popen(command, env=env | environment, stderr=subprocess.DEVNULL))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)
        (tmp_path / "http.log").unlink(missing_ok=True)  # what specbench asks, from here on
        return port

    monkeypatch.setenv("THEIR_KEY", KEY)
    yield tmp_path, start
    for process in started:
        process.kill()
        process.wait()


def _recipe(tmp_path: Path, port: int, **options) -> dict:
    remote = {"base_url": f"http://127.0.0.1:{port}/v1", "api_key_env": "THEIR_KEY", **options}
    remote = {name: value for name, value in remote.items() if value is not None}
    return {
        "name": "theirs",
        "models": {
            "ours": {"source": str(tmp_path / "model"), "dtype": "float64"},
            "theirs": {
                "source": str(tmp_path / "model"),
                "dtype": "float64",
                "engine": "openai",
                "engine_options": remote,
            },
        },
        "generation": {"max_new_tokens": 24},
        "datasets": [{"task": "passages", "limit": 3, "chat_template": False}],
        "methods": [tiny_recipes.ar(target="ours"), tiny_recipes.ar("their-server", "theirs")],
        "load": {"concurrency": [1, 2], "requests": 4, "slo_ttft_s": 5.0},
    }


def _invoke(tmp_path: Path, recipe: dict, command: str = "load"):
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return CliRunner().invoke(app, [command, str(path), "-o", str(tmp_path / command)])


def _files_hold(directory: Path, text: str) -> list[str]:
    return [str(p) for p in directory.rglob("*") if p.is_file() and text.encode() in p.read_bytes()]


def test_a_speculating_server_specbench_did_not_start_is_measured_under_load(remote):
    tmp_path, start = remote
    port = start(speculating=True)
    result = _invoke(tmp_path, _recipe(tmp_path, port))
    assert result.exit_code == 0, result.output
    message = " ".join(result.output.split())
    assert (
        f"measuring the server at http://127.0.0.1:{port}/v1 as it runs (vLLM's /metrics counters" in message
    )
    rows = pd.read_csv(tmp_path / "load" / "load.csv")
    assert sorted(rows.concurrency) == [1, 2] and (rows.cell == "their-server").all()
    assert (
        (rows.engine == "openai").all()
        and (rows.completed == 4).all()
        and (rows.engine_version == "0.0-stub").all()
    )
    assert (rows.output_tokens == 4 * 24).all() and (rows.token_ids == 4).all()
    # the stand-in speculates 3 tokens a chunk: its counters came from the server
    assert (rows.tokens_per_step_est == 2.4).all() and rows.server_figures.str.startswith("vLLM's").all()
    assert (rows.eq_engine_identical == 4).all()  # the server alone and under load agree
    assert _files_hold(tmp_path / "load", KEY) == []  # the key is read, sent, and never written
    assert "THEIR_KEY" in (tmp_path / "load" / "environment.json").read_text()  # its variable is named
    routes = set((tmp_path / "http.log").read_text().splitlines())
    assert routes <= {"GET /v1/models", "GET /metrics", "GET /version", "POST /v1/completions"}
    assert "POST /v1/completions" in routes


def test_run_rows_from_a_server_specbench_did_not_start(remote):
    tmp_path, start = remote
    port = start()
    result = _invoke(tmp_path, _recipe(tmp_path, port), "run")
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (tmp_path / "run" / "examples.jsonl").read_text().splitlines()]
    theirs = [r for r in rows if r["cell"] == "their-server"]
    assert len(theirs) == 3
    for row in theirs:
        record = row["engine_record"]
        assert record["engine"] == "openai" and record["settings"]["api_key_env"] == "THEIR_KEY"
        assert row["n_tokens"] == 24 and len(row["steps"]) == 24  # one token a chunk: one pass each
        assert record["server_figures"].startswith("vLLM's")
        assert row["first_divergence"] is not None  # audited against specbench's AR of the same weights
    assert _files_hold(tmp_path / "run", KEY) == []


def test_a_key_that_is_not_set_and_an_address_where_nothing_answers_are_one_line(remote, monkeypatch):
    tmp_path, start = remote
    port = start()
    monkeypatch.delenv("THEIR_KEY")
    result = _invoke(tmp_path, _recipe(tmp_path, port))
    message = " ".join(result.output.split())
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert (
        "models.theirs.engine_options.api_key_env: the environment variable THEIR_KEY is not set" in message
    )
    nowhere = free_port()
    for command in ("load", "run"):
        began = time.monotonic()
        result = _invoke(
            tmp_path, _recipe(tmp_path, nowhere, api_key_env=None, connect_timeout_s=2.0), command
        )
        message = " ".join(result.output.split())
        assert result.exit_code == 2 and "Traceback" not in result.output, result.output
        assert f"nothing answers at http://127.0.0.1:{nowhere}/v1" in message and "base_url" in message
        assert time.monotonic() - began < 30


def test_a_server_without_token_ids_is_measured_from_its_usage(remote):
    tmp_path, start = remote
    port = start(STUB_SERVE_NO_TOKEN_IDS="1")
    result = _invoke(tmp_path, _recipe(tmp_path, port))
    assert result.exit_code == 0, result.output
    message = " ".join(result.output.split())
    assert "the server returned no token ids: tokens counted from its usage, outputs not checked" in message
    assert "no batch-1 reference for 3 of 3 prompt(s) (the server sent no token ids)" in message
    rows = pd.read_csv(tmp_path / "load" / "load.csv")
    assert (rows.output_tokens == 4 * 24).all() and (rows.token_ids == 0).all()
    assert rows.eq_engine_checked.isna().all()
    run = _invoke(tmp_path, _recipe(tmp_path, port), "run")
    assert run.exit_code == 2 and "returned no token ids" in " ".join(run.output.split())


def test_counters_by_their_names_sglang_s_none_and_one_that_goes_down(remote):
    tmp_path, start = remote
    port = start(speculating=True, STUB_SERVE_METRICS="sglang")
    result = _invoke(tmp_path, _recipe(tmp_path, port))
    assert result.exit_code == 0, result.output
    rows = pd.read_csv(tmp_path / "load" / "load.csv")
    assert (
        rows.server_figures.str.contains("SGLang's /metrics").all() and (rows.server_verify_steps > 0).all()
    )
    assert rows.drafts.isna().all() and rows.tokens_per_step_est.isna().all()  # could not be had
    # the reference's 3 requests and the warm-up's, then the x1 level's 2nd request restarts the counters
    port = start(speculating=True, STUB_SERVE_RESET_ON_REQUEST="6")
    result = CliRunner().invoke(
        app, ["load", str(_write(tmp_path, _recipe(tmp_path, port))), "-o", str(tmp_path / "again")]
    )
    assert result.exit_code == 0, result.output
    message = " ".join(result.output.split())
    assert "their-server x1: the server's counter vllm:spec_decode_num_drafts_total went down" in message
    rows = pd.read_csv(tmp_path / "again" / "load.csv").set_index("concurrency")
    assert pd.isna(rows.loc[1, "drafts"]) and rows.loc[2, "drafts"] > 0 and rows.loc[1, "completed"] == 4
    assert counter_names(None)[0] == {} and "could not be had" in counter_names("x_total 1\n")[1]
    # a run cannot count the steps of a server that sends several tokens a chunk without vLLM's counters
    port = start(speculating=True, STUB_SERVE_METRICS="none")
    run = _invoke(tmp_path, _recipe(tmp_path, port), "run")
    assert run.exit_code == 2 and "its verification steps cannot be counted" in " ".join(run.output.split())


def _write(tmp_path: Path, recipe: dict) -> Path:
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def test_the_backend_is_registered_and_its_base_url_parsed():
    assert "openai" in ENGINE_NAMES and BACKENDS["openai"].serve is None and BACKENDS["openai"].attach
    endpoint = Endpoint.of("https://api.example.org/v1/", (("Authorization", "Bearer x"),))
    assert (endpoint.host, endpoint.port, endpoint.tls, endpoint.prefix) == (
        "api.example.org",
        443,
        True,
        "/v1",
    )
    assert endpoint.url("/completions") == "https://api.example.org:443/v1/completions"
    assert endpoint.url("~/metrics") == "https://api.example.org:443/metrics"
