"""kill -9 in the middle of a run, then --resume: nothing lost, nothing duplicated."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from specbench.pipeline.results import ExampleLog

ROOT = Path(__file__).resolve().parents[1]


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _run(recipe: Path, out: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "specbench.cli", "run", str(recipe), "--output-dir", str(out), *extra],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def test_kill_then_resume(tmp_path: Path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text((ROOT / "recipes" / "quickstart-tiny.yaml").read_text().replace("limit: 4", "limit: 6"))
    examples = tmp_path / "killed" / "examples.jsonl"
    proc = _run(recipe, tmp_path / "killed")
    deadline = time.time() + 120
    while time.time() < deadline and (not examples.exists() or len(examples.read_text().splitlines()) < 5):
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    partial = len(examples.read_text().splitlines())
    assert 5 <= partial < 42, "the run should have been killed mid-way"
    with open(examples, "ab") as handle:  # what a kill during a write would leave behind
        handle.write(b'{"key": "half-writ')

    assert _run(recipe, tmp_path / "killed", "--resume").wait(timeout=300) == 0
    assert _run(recipe, tmp_path / "clean").wait(timeout=300) == 0

    resumed, clean = _rows(examples), _rows(tmp_path / "clean" / "examples.jsonl")
    assert len(resumed) == len(clean) == 6 * 7
    assert len({r["key"] for r in resumed}) == len(resumed)  # no duplicates
    by_key = {r["key"]: r["output_ids"] for r in clean}
    assert {r["key"]: r["output_ids"] for r in resumed} == by_key  # nothing lost, same outputs


def test_partial_line_is_trimmed(tmp_path: Path):
    path = tmp_path / "examples.jsonl"
    path.write_bytes(b'{"key": "a"}\n{"key": "b"}\n{"key": "c", "tru')
    log = ExampleLog(path)
    assert [r["key"] for r in log.rows] == ["a", "b"]
    log.append({"key": "c"})
    assert [r["key"] for r in _rows(path)] == ["a", "b", "c"]
