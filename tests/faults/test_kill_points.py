"""kill -9 at chosen points of a run (and of a resume, and of a report), then resume: compared with an
uninterrupted run, no row is lost, none is duplicated, and cells.csv is the same apart from timing.

Each point is reached exactly: the killed process runs the real CLI with one function wrapped so
that it sends itself SIGKILL at its n-th call (nothing in specbench knows about this).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import tiny_recipes
import yaml
from typer.testing import CliRunner

from specbench.cli import app

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()

RECIPE = tiny_recipes.recipe(
    "kills",
    {
        "target": tiny_recipes.tiny(seed=1, init_std=0.3),
        "draft": tiny_recipes.tiny(seed=1, init_std=0.3, layers=1),
        "lookup": tiny_recipes.lookup(),
    },
    [tiny_recipes.ar(), tiny_recipes.speculative(), tiny_recipes.speculative("lookup", [3], name="pl")],
    limit=3,
    max_new_tokens=12,
    temperature=0.0,
    seed=0,
    warmup=0,
)
ROWS = 3 * 4

# Runs the CLI with FUNCTION (module:attribute) wrapped: its CALL-th call kills the process, BEFORE or
# AFTER the real call. "os:write" with "half" writes half its bytes, then dies (a torn line).
KILLER = """
import importlib, os, signal, sys
target, call, when = sys.argv[1], int(sys.argv[2]), sys.argv[3]
module_name, _, attribute = target.rpartition(":")
owner_name, _, method = attribute.rpartition(".")
module = importlib.import_module(module_name)
owner = getattr(module, owner_name) if owner_name else module
real = getattr(owner, method)
calls = 0
def wrapper(*args, **kwargs):
    global calls
    calls += 1
    if calls == call and when == "half":
        real(args[0], args[1][: len(args[1]) // 2])
        os.kill(os.getpid(), signal.SIGKILL)
    if calls == call and when == "before":
        os.kill(os.getpid(), signal.SIGKILL)
    result = real(*args, **kwargs)
    if calls == call and when == "after":
        os.kill(os.getpid(), signal.SIGKILL)
    return result
setattr(owner, method, wrapper)
from specbench.cli import app
sys.argv = ["specbench", *sys.argv[4:]]
app()
"""

# (id, function, n-th call, when, resume first): at least 10 points across a run's life
POINTS = [
    ("loading the target", "specbench.sources:load", 1, "before", False),
    ("during the first row", "specbench.pipeline.run.runner:Runner._generate", 1, "after", False),
    ("a torn first row", "os:write", 1, "half", False),
    ("after the first append", "specbench.pipeline.records.results:ExampleLog.append", 1, "after", False),
    ("mid-cell, a torn row", "os:write", 5, "half", False),
    ("after append 7", "specbench.pipeline.records.results:ExampleLog.append", 7, "after", False),
    ("after the last append", "specbench.pipeline.records.results:ExampleLog.append", ROWS, "after", False),
    (
        "between the last append and cells.csv",
        "specbench.pipeline.run.runner:write_cells_csv",
        1,
        "before",
        False,
    ),
    ("renaming cells.csv into place", "os:replace", 3, "before", False),
    ("writing environment.json", "specbench.pipeline.run.runner:write_environment", 2, "before", False),
    ("during a resume", "specbench.pipeline.records.results:ExampleLog.append", 2, "after", True),
    ("during the report", "specbench.pipeline.views.report:read_cells_csv", 1, "after", True),
]


def _kill(function: str, call: int, when: str, *argv: str) -> int:
    command = [sys.executable, "-c", KILLER, function, str(call), when, *argv]
    return subprocess.run(command, cwd=ROOT, capture_output=True, timeout=300).returncode


@pytest.fixture(scope="module")
def recipe(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("recipe") / "kills.yaml"
    path.write_text(yaml.safe_dump(RECIPE))
    return path


@pytest.fixture(scope="module")
def clean(recipe: Path) -> Path:
    out = recipe.parent / "clean"
    assert runner.invoke(app, ["run", str(recipe), "-o", str(out)]).exit_code == 0
    return out


def _rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "examples.jsonl").read_text().splitlines()]


COUNTED = (
    "dataset",
    "cell",
    "params",
    "n",
    "generated_tokens",
    "target_forwards",
    "drafter_forwards",
    "forwards",
)
COUNTED_PREFIXES = ("swi_", "accept", "draft_acceptance", "quality_", "lossless_")


def _untimed(out: Path) -> pd.DataFrame:
    """cells.csv without what a clock measures: the counts, SWI, acceptance, quality, lossless."""
    cells = pd.read_csv(out / "cells.csv")
    keep = [c for c in cells.columns if c in COUNTED or c.startswith(COUNTED_PREFIXES)]
    assert len(keep) >= 12
    return cells[keep]


@pytest.mark.parametrize("point", POINTS, ids=[p[0] for p in POINTS])
def test_kill_then_resume_loses_and_duplicates_nothing(point, recipe: Path, clean: Path, tmp_path: Path):
    label, function, call, when, resume_first = point
    out = tmp_path / "run"
    run = ["run", str(recipe), "-o", str(out)]
    if label == "during the report":
        assert runner.invoke(app, run).exit_code == 0
        assert _kill(function, call, when, "report", str(out)) == -signal.SIGKILL
    else:
        if resume_first:  # a first kill, then a resume that is killed in turn
            assert (
                _kill("specbench.pipeline.records.results:ExampleLog.append", 4, "after", *run)
                == -signal.SIGKILL
            )
            run.append("--resume")
        assert _kill(function, call, when, *run) == -signal.SIGKILL
    result = runner.invoke(app, ["run", str(recipe), "-o", str(out), "--resume"])
    assert result.exit_code == 0, result.output
    rows, reference = _rows(out), _rows(clean)
    assert len(rows) == len(reference) == ROWS
    assert len({r["key"] for r in rows}) == ROWS  # none duplicated
    assert {r["key"]: r["output_ids"] for r in rows} == {r["key"]: r["output_ids"] for r in reference}
    pd.testing.assert_frame_equal(_untimed(out), _untimed(clean))
    assert runner.invoke(app, ["report", str(out)]).exit_code == 0
