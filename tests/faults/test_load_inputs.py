"""``specbench load`` against hostile inputs, through the stand-in vLLM server (tests/fixtures/stub_vllm):
a directory of another recipe, settings or machine, repeated levels, levels that cannot run as they say
(a rate of 0 or below, fewer requests than the concurrency, a duration that sends none, no level at
all), a sweep too large for the process's open files, a level where every request fails, ``-o`` naming
a file, and a full disk at the start. Each ends as one line (exit 2) or, for the failed level, a row of
NaN speedups and a warning. A hanging request and a server that dies mid-level:
tests/test_load_open_loop.py."""

from __future__ import annotations

import errno
import math
import os
import resource

import pandas as pd
import pytest
import tiny_recipes
import yaml
from test_vllm_backend import _no_server_left, _recipe, stub_engine  # noqa: F401  (a fixture)
from typer.testing import CliRunner

from specbench.cli import app
from specbench.engines.load import level_of, read_load, write_load
from specbench.errors import SpecbenchError
from specbench.pipeline.analysis.load_figures import speedups
from specbench.recipe import parse_recipe

runner = CliRunner()


def _load(tmp_path, recipe: dict, *extra: str):
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return runner.invoke(app, ["load", str(path), "-o", str(tmp_path / "load"), *extra])


def _one_line(output: str) -> str:
    assert "Traceback" not in output, output
    return " ".join(output.split())


def test_a_level_listed_twice_is_refused(stub_engine):  # noqa: F811
    tmp_path = stub_engine
    with pytest.raises(SpecbenchError, match=r"load\.concurrency.*1, 4 more than once.*\[1, 2, 4\]"):
        parse_recipe(_recipe(tmp_path, load={"concurrency": [1, 1, 4, 2, 4]}), tmp_path / "r.yaml")
    result = _load(tmp_path, _recipe(tmp_path, load={"concurrency": [1, 1, 1]}))
    assert result.exit_code == 2 and "load.concurrency" in _one_line(result.output)
    assert not (tmp_path / "load").exists()


@pytest.mark.parametrize(
    ("load", "where", "says"),
    [
        ({"request_rate": [1.0, 0]}, "load.request_rate", "0 is not a request rate"),
        ({"request_rate": [-2.5]}, "load.request_rate", "-2.5 is not a request rate"),
        ({"request_rate": [float("nan")]}, "load.request_rate", "nan is not a request rate"),
        ({"request_rate": [float("inf")]}, "load.request_rate", "use a concurrency level"),
        ({"request_rate": [1.0, 2.0, 1.0]}, "load.request_rate", "rate 1 more than once"),
        ({"burstiness": 0.0, "request_rate": [1.0]}, "load.burstiness", "too small"),
        ({"concurrency": [1, 8], "requests": 4}, "load.requests", "4 requests per level cannot keep 8"),
        ({"concurrency": [1], "requests": 1}, "load.requests", "without an interval"),
        ({"request_rate": [1.0], "requests": 8, "duration_s": 10.0}, "load.duration_s", "not both"),
        ({"request_rate": [0.1], "duration_s": 4.0}, "load.duration_s", "sends no request"),
        ({"repeats": 3}, "load", "lists no level"),
        ({"concurrency": [1], "repeats": 0}, "load.repeats", "too small"),
    ],
)
def test_a_level_that_cannot_run_as_it_says_is_one_line(stub_engine, load, where, says):  # noqa: F811
    tmp_path = stub_engine
    with pytest.raises(SpecbenchError) as error:
        parse_recipe(_recipe(tmp_path, load=load), tmp_path / "r.yaml")
    message = str(error.value)
    assert f"r.yaml: {where}:" in message and says in message and "fix:" in message, message
    assert "\n" not in message


def test_output_that_is_a_file_is_one_line(stub_engine):  # noqa: F811
    tmp_path = stub_engine
    (tmp_path / "load").write_text("mine")
    result = _load(tmp_path, _recipe(tmp_path, load={"concurrency": [1]}))
    assert result.exit_code == 2 and "is a file, not a directory" in _one_line(result.output)
    assert (tmp_path / "load").read_text() == "mine"


def test_a_million_requests_at_4096_print_their_size_and_a_level_past_the_open_files_is_refused(
    stub_engine,  # noqa: F811
):
    tmp_path = stub_engine
    recipe = _recipe(tmp_path, load={"concurrency": [4096], "requests": 1_000_000})
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    limit = 1024 if hard == resource.RLIM_INFINITY else min(1024, hard)  # a common default
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
    try:
        result = _load(tmp_path, recipe)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    message = _one_line(result.output)
    assert (
        "load: 2 cell(s), 2 level(s) (concurrency 4096): 2,000,000 requests of up to 24 new tokens" in message
    )
    assert "48,000,000 tokens at most" in message
    assert result.exit_code == 2 and "load.concurrency: 4096 requests at a time" in message
    assert "ulimit -n 4160" in message
    assert not (tmp_path / "load" / "load.csv").exists() and _no_server_left(tmp_path)


def test_a_level_where_every_request_times_out_is_a_row_of_nan_speedups(stub_engine):  # noqa: F811
    tmp_path = stub_engine
    recipe = _recipe(tmp_path, load={"concurrency": [1], "requests": 2, "timeout_s": 1e-6})
    result = _load(tmp_path, recipe)
    assert result.exit_code == 0, result.output
    message = _one_line(result.output)
    assert (
        "warning: vllm-ar x1: none of its 2 requests completed (first: TimeoutError: no end within 1e-06 s)"
        in message
    )
    assert "speedups against it are NaN" in message and "warm-up request failed" in message
    rows = pd.read_csv(tmp_path / "load" / "load.csv")
    assert (rows.completed == 0).all() and (rows.throughput_tok_s == 0).all()
    assert rows.speedup_throughput.isna().all() and rows.speedup_per_request.isna().all()
    assert "—" in result.output and _no_server_left(tmp_path)


def test_speedups_against_a_level_that_delivered_nothing_are_nan():
    rows = [
        {"cell": "ar", "concurrency": 1, "throughput_tok_s": 0.0, "per_request_tok_s": math.nan},
        {"cell": "sd", "concurrency": 1, "throughput_tok_s": 30.0, "per_request_tok_s": 15.0},
        {"cell": "ar", "concurrency": 2, "throughput_tok_s": 20.0, "per_request_tok_s": 10.0},
        {"cell": "sd", "concurrency": 2, "throughput_tok_s": 0.0, "per_request_tok_s": math.nan},
    ]
    out = speedups(rows, {"ar": "ar", "sd": "ar"}, level_of)
    assert all(math.isnan(row["speedup_throughput"]) for row in out[:2])
    assert out[2]["speedup_throughput"] == 1.0 and out[3]["speedup_throughput"] == 0.0
    assert math.isnan(out[3]["speedup_per_request"])


def test_a_sweep_belongs_to_its_recipe_settings_and_machine(stub_engine):  # noqa: F811
    tmp_path = stub_engine
    load = {"concurrency": [1], "requests": 2}
    first = _load(tmp_path, _recipe(tmp_path, load=load))
    assert first.exit_code == 0, first.output
    assert "load: 2 cell(s), 2 level(s) (concurrency 1): 4 requests of up to 24 new tokens" in _one_line(
        first.output
    )
    csv = tmp_path / "load" / "load.csv"
    measured = csv.read_bytes()
    # another token budget: the issue's case, where the old levels' speedups were taken against new rows
    other = _load(tmp_path, _recipe(tmp_path, load=load, **{"generation.max_new_tokens": 16}), "--resume")
    message = _one_line(other.output)
    assert other.exit_code == 2 and "belongs to another recipe than" in message and "recipe digest" in message
    more = _load(tmp_path, _recipe(tmp_path, load={**load, "requests": 3}), "--resume")
    message = _one_line(more.output)
    assert (
        more.exit_code == 2
        and "load: " in message
        and "other load: settings (requests 2 there, 3 here)" in message
    )
    assert csv.read_bytes() == measured and _no_server_left(tmp_path)
    # without the binding (a directory from before it, or environment.json deleted) the rows still tell
    (tmp_path / "load" / "environment.json").unlink()
    other = _load(tmp_path, _recipe(tmp_path, load=load, **{"generation.max_new_tokens": 16}), "--resume")
    message = _one_line(other.output)
    assert other.exit_code == 2 and "load.csv: holds vllm-ar at concurrency 1 measured otherwise" in message
    kept, rows = csv.read_bytes(), read_load(csv.parent)
    moved = [{**row, "machine": "0123456789ab", "machine_described": "another machine"} for row in rows]
    write_load(csv.parent, moved)  # written as a sweep writes it: its checksums match
    elsewhere = _load(tmp_path, _recipe(tmp_path, load={**load, "concurrency": [1, 2]}), "--resume")
    message = _one_line(elsewhere.output)
    assert elsewhere.exit_code == 2 and "was measured on another machine; this is" in message
    csv.write_bytes(kept)
    # the same recipe with a level added: only that level is measured
    grown = _load(tmp_path, _recipe(tmp_path, load={**load, "concurrency": [1, 2]}), "--resume")
    assert grown.exit_code == 0, grown.output
    assert "load: 2 cell(s), 2 level(s) (concurrency 2)" in _one_line(grown.output)
    assert sorted(pd.read_csv(csv).concurrency) == [1, 1, 2, 2]


def test_a_full_disk_at_the_start_of_a_sweep_is_one_line(stub_engine, monkeypatch):  # noqa: F811
    tmp_path = stub_engine

    def no_space(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", no_space)
    result = _load(tmp_path, _recipe(tmp_path, load={"concurrency": [1], "requests": 2}))
    monkeypatch.undo()
    message = _one_line(result.output)
    assert result.exit_code == 2 and "checksums.json: cannot be written (No space left on device)" in message
    assert "free space" in message and _no_server_left(tmp_path)
    assert [p.name for p in (tmp_path / "load").iterdir()] == []  # no temporary file left


URL = "http://127.0.0.1:8000/v1"
THEIR_NGRAM = tiny_recipes.speculative("lookup", 4, name="theirs-ngram", target="served")


@pytest.mark.parametrize(
    ("options", "methods", "where", "says"),
    [
        ({}, [], "engine_options.base_url", "needs the server's address"),
        ({"base_url": "ftp://127.0.0.1/v1"}, [], "engine_options.base_url", "is not an http(s) URL"),
        ({"base_url": "http://127.0.0.1:99999/v1"}, [], "engine_options.base_url", "has no valid port"),
        ({"base_url": "http://me:pw@127.0.0.1/v1"}, [], "engine_options.base_url", "holds credentials"),
        ({"base_url": URL, "api_key_env": "sk-123"}, [], "engine_options.api_key_env", "never holds the key"),
        ({"base_url": URL, "settle_s": 0.0}, [], "engine_options.settle_s", "takes no option"),
        ({"base_url": URL}, [THEIR_NGRAM], "methods", "cannot set its speculation"),
    ],
)
def test_a_server_specbench_does_not_start_is_named_in_one_line(stub_engine, options, methods, where, says):  # noqa: F811
    tmp_path = stub_engine
    recipe = _recipe(tmp_path, **{"models.served.engine": "openai", "models.served.engine_options": options})
    recipe["methods"] = recipe["methods"][:3] + methods  # an AR cell on the server, and the case's
    with pytest.raises(SpecbenchError) as error:
        parse_recipe(recipe, tmp_path / "r.yaml")
    message = str(error.value)
    assert where in message and says in message and "fix:" in message and "\n" not in message, message
