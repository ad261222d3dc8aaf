"""kill -9 of a whole command (issue 58, part 5): a real ``specbench run`` and a real ``specbench load``,
each started as its own process with an engine serving (the stand-in vLLM worker and server,
tests/fixtures/stub_vllm), are killed outright while a request is in flight. No process specbench
started outlives it (the parent-death guard of specbench.engines.process: kill -9 runs no handler),
and a later ``--resume`` finishes with every row once: none lost, none measured twice, the ones
written before the kill kept as they were."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import yaml
from test_vllm_backend import _recipe, stub_engine  # noqa: F401  (a fixture)
from typer.testing import CliRunner

from specbench.cli import app
from specbench.engines.load import read_load

ROOT = Path(__file__).resolve().parents[2]
GONE_WITHIN_S = 10.0


def _descendants(pid: int) -> dict[int, str]:
    """pid -> command line of every process below ``pid`` (children, theirs, ...)."""
    table = subprocess.run(["ps", "-ww", "-eo", "pid=,ppid=,args="], capture_output=True, text=True).stdout
    children: dict[int, list[tuple[int, str]]] = {}
    for line in table.splitlines():
        fields = line.split(None, 2)
        if len(fields) >= 2:
            children.setdefault(int(fields[1]), []).append(
                (int(fields[0]), fields[2] if len(fields) > 2 else "")
            )
    found, todo = {}, [pid]
    while todo:
        for child, args in children.get(todo.pop(), []):
            found[child] = args
            todo.append(child)
    return found


def _alive(pid: int) -> bool:
    """Running (a zombie has exited: it waits only to be reaped by init)."""
    try:
        os.kill(pid, 0)
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (ProcessLookupError, FileNotFoundError):
        return False


def _start(tmp_path: Path, *argv: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen(
        [sys.executable, "-m", "specbench.cli", *argv],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "command.log").open("w"),
        start_new_session=True,  # the test's own group is not the command's
    )


def _wait_for(what, process: subprocess.Popen, tmp_path: Path, timeout: float = 240.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        assert process.poll() is None, (tmp_path / "command.log").read_text()[-3000:]
        if what():
            return
        time.sleep(0.2)
    process.kill()
    raise AssertionError((tmp_path / "command.log").read_text()[-3000:])


def _kill_and_check_nothing_survives(process: subprocess.Popen, engine_word: str) -> dict[int, str]:
    """kill -9 of the command; every process below it (the engine among them) gone within seconds."""
    below = _descendants(process.pid)
    assert any(engine_word in args for args in below.values()), below  # an engine is serving
    process.send_signal(signal.SIGKILL)
    process.wait(10)
    deadline = time.time() + GONE_WITHIN_S
    while time.time() < deadline and any(_alive(pid) for pid in below):
        time.sleep(0.1)
    left = {pid: args for pid, args in below.items() if _alive(pid)}
    for pid in left:  # never leave them to the next test
        os.kill(pid, signal.SIGKILL)
    assert left == {}, f"outlived specbench's kill -9 by {GONE_WITHIN_S} s: {left}"
    return below


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def _raw_rows(path: Path) -> dict[str, str]:
    """key -> the row's line as written (its bytes: NaN fields compare too)."""
    return {json.loads(line)["key"]: line for line in path.read_text().splitlines() if line.endswith("}")}


def test_kill_9_of_a_run_leaves_no_engine_and_a_resume_loses_and_repeats_no_row(
    stub_engine,  # noqa: F811
    monkeypatch,
):
    tmp_path = stub_engine
    recipe, out = tmp_path / "recipe.yaml", tmp_path / "out"
    small = {"datasets.0.limit": 2, "generation.max_new_tokens": 8}
    recipe.write_text(yaml.safe_dump(_recipe(tmp_path, **small)))  # 4 cells x 2 examples; 2 on the engine
    monkeypatch.setenv("STUB_VLLM_HANG_ON_REQUEST", "3")  # each engine's warm-up, its first row, then hangs
    run = _start(tmp_path, "run", str(recipe), "-o", str(out))

    def an_engine_row_is_written_and_the_next_hangs() -> bool:
        rows = _lines(out / "examples.jsonl") if (out / "examples.jsonl").is_file() else []
        return any(row["cell"].startswith("vllm-") for row in rows)

    _wait_for(an_engine_row_is_written_and_the_next_hangs, run, tmp_path)
    time.sleep(1.0)  # the engine's next request is in flight (hung)
    before = _raw_rows(out / "examples.jsonl")
    _kill_and_check_nothing_survives(run, "vllm_worker.py")
    assert 0 < len(before) < 8
    monkeypatch.delenv("STUB_VLLM_HANG_ON_REQUEST")
    resumed = CliRunner().invoke(app, ["run", str(recipe), "-o", str(out), "--resume"])
    assert resumed.exit_code == 0, resumed.output
    rows = _lines(out / "examples.jsonl")
    assert len(rows) == 8 and len({row["key"] for row in rows}) == 8
    after = _raw_rows(out / "examples.jsonl")
    assert all(after[key] == line for key, line in before.items())  # kept as written, not measured again
    assert len(pd.read_csv(out / "cells.csv")) == 4


def test_kill_9_of_a_load_sweep_leaves_no_server_and_a_resume_loses_and_repeats_no_row(
    stub_engine,  # noqa: F811
    monkeypatch,
):
    tmp_path = stub_engine
    recipe, out = tmp_path / "recipe.yaml", tmp_path / "load"
    load = {"concurrency": [1, 2], "requests": 2, "warmup_requests": 1}
    recipe.write_text(yaml.safe_dump(_recipe(tmp_path, load=load)))
    # the first server: its warm-up (1), concurrency 1's requests (2, 3), then concurrency 2's first hangs
    monkeypatch.setenv("STUB_SERVE_HANG_ON_REQUEST", "4")
    sweep = _start(tmp_path, "load", str(recipe), "-o", str(out))
    _wait_for(lambda: (out / "load.csv").is_file(), sweep, tmp_path)
    time.sleep(1.0)  # concurrency 2 is under way, one of its requests hung
    before = {row["key"]: row for row in read_load(out)}
    assert len(before) == 1 and all(row["complete"] for row in before.values())
    _kill_and_check_nothing_survives(sweep, "api_server")
    monkeypatch.delenv("STUB_SERVE_HANG_ON_REQUEST")
    resumed = CliRunner().invoke(app, ["load", str(recipe), "-o", str(out), "--resume"])
    assert resumed.exit_code == 0, resumed.output
    rows = read_load(out)
    assert len(rows) == 4 and len({row["key"] for row in rows}) == 4 and all(row["complete"] for row in rows)
    levels = sorted((row["cell"], row["concurrency"]) for row in rows)
    assert levels == [(cell, c) for cell in ("vllm-ar", "vllm-ngram") for c in (1, 2)]
    by_key = {row["key"]: row for row in rows}
    for key, row in before.items():  # the level finished before the kill is kept, not measured again
        assert by_key[key]["throughput_tok_s"] == row["throughput_tok_s"]
        assert by_key[key]["elapsed_s"] == row["elapsed_s"]
    requests = _lines(out / "load_requests.jsonl")  # each level's requests once, none of the killed level's
    assert sorted((r["key"], r["index"]) for r in requests) == sorted(
        (k, i) for k in by_key for i in range(2)
    )
