"""kill -9 in the middle of a run, then --resume: nothing lost, nothing duplicated."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specbench.errors import SpecbenchError
from specbench.pipeline.records.results import REJECTED, ExampleLog

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


def test_a_torn_last_line_is_named_by_readers_and_repaired_by_a_resume(tmp_path: Path):
    path = tmp_path / "examples.jsonl"
    path.write_bytes(b'{"key": "a"}\n{"key": "b"}\n{"key": "c", "tru')
    with pytest.raises(SpecbenchError, match=r"examples.jsonl: line 3: is cut short .*--resume"):
        ExampleLog(path)  # a reader (plot, paper views) never drops it unsaid
    assert path.read_bytes().endswith(b'"tru')  # and changes nothing
    log = ExampleLog(path, repair=True)
    assert [r["key"] for r in log.rows] == ["a", "b"] and [b.number for b in log.rejected] == [3]
    log.append({"key": "c"})
    assert [r["key"] for r in _rows(path)] == ["a", "b", "c"]
    assert (
        tmp_path / REJECTED
    ).read_bytes() == b'# line 3: is cut short (no newline: a killed write)\n{"key": "c", "tru\n'


@pytest.mark.parametrize(
    "middle, why",
    [
        (b'{"key": "x", "output_ids": [1, 2', "is not a JSON row"),  # torn, then a newline
        (b"\xff\xfe garbage", "is not a JSON row"),  # not UTF-8
        (b"[1, 2, 3]", "is JSON but not a result row"),
        (b'{"no_key": 1}', "is JSON but not a result row"),
        (b'{"key": "a", "again": true}', "repeats the row of line 1"),  # two writers, one key
    ],
)
def test_a_bad_middle_line_is_never_parsed_as_a_row(tmp_path: Path, middle: bytes, why: str):
    path = tmp_path / "examples.jsonl"
    path.write_bytes(b'{"key": "a"}\n' + middle + b'\n{"key": "b"}\n')
    with pytest.raises(SpecbenchError, match=f"line 2: {why}"):
        ExampleLog(path)
    log = ExampleLog(path, repair=True)
    assert [r["key"] for r in log.rows] == ["a", "b"] and [b.number for b in log.rejected] == [2]
    assert [r["key"] for r in _rows(path)] == ["a", "b"]  # the file holds rows only
    assert middle in (tmp_path / REJECTED).read_bytes()  # kept verbatim for inspection
