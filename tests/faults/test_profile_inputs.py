"""Hostile inputs to `probe`, `predict` and every --threads (issue 58): a profile of other models, a
negative or NaN cost, --against another experiment, a dtype no one has, an --out that is a folder, a
grid past the model's context and threads far past the cores. Each is refused before any work, as one
line naming the file or option, the problem and the fix."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from specbench.cli import app
from specbench.cli.common import THREADS_FAR_ABOVE_CORES, check_threads
from specbench.errors import SpecbenchError

ROOT = Path(__file__).resolve().parents[2]
MEASURED = ROOT / "results" / "prediction" / "amd-epyc-family26-avx512-bf16"
runner = CliRunner()

RECIPE = """\
name: profiled
generation: {max_new_tokens: 4, temperature: 0.0}
models:
  target: {source: tiny-llama, dtype: float64, options: {seed: 1}}
  lookup: {source: prompt-lookup}
datasets:
  - {task: arithmetic, limit: 1}
methods:
  - {name: ar, method: autoregressive, target: target}
  - {name: sd, method: speculative, target: target, drafter: lookup, params: {k: 2}}
"""


def write_files(tmp: Path) -> None:
    (tmp / "recipe.yaml").write_text(RECIPE)
    (tmp / "a-folder").mkdir()
    (tmp / "a-file").write_text("x")
    eager = json.loads((MEASURED / "profile_bfloat16_eager.json").read_text())
    eager["models"]["smollm2-135m-instruct"]["table"]["alpha"][2] = float("nan")
    (tmp / "nan.json").write_text(json.dumps(eager))
    other = {"format": "specbench-cost-profile/2", "kind": "probe", "dtype": "float64", "engine": "eager"}
    table = {"sizes": [1], "alpha": [0.01], "gamma": [0.0]}
    other["models"] = {
        "target": {"source": "tiny-llama", "identity": {"source": "tiny-llama"}, "table": table}
    }
    (tmp / "other-models.json").write_text(json.dumps(other))


def cases(tmp: Path) -> list[tuple[str, list[str], str]]:
    """(id, command line, text the one line must name)."""
    recipe, grid = str(tmp / "recipe.yaml"), ["--sizes", "1,2", "--contexts", "4", "--rounds", "1"]
    probe = ["probe", recipe, "--out", str(tmp / "p.json")]
    demo, eager = str(MEASURED / "demo"), str(MEASURED / "profile_bfloat16_eager.json")
    return [
        ("probe --out a folder", ["probe", recipe, "--out", str(tmp / "a-folder"), *grid], "--out"),
        (
            "probe --out under a file",
            ["probe", recipe, "--out", str(tmp / "a-file" / "p.json"), *grid],
            "--out",
        ),
        (
            "probe --sizes past the context",
            [*probe, "--sizes", "100000", "--contexts", "4"],
            "context of 4096",
        ),
        ("probe --contexts 10^7", [*probe, "--sizes", "1", "--contexts", "10000000"], "--sizes/--contexts"),
        ("probe 6000 points", [*probe, "--sizes", ",".join(map(str, range(1, 2001)))], "points"),
        ("probe --threads 4096", [*probe, *grid, "--threads", "4096"], "--threads"),
        ("run --threads 4096", ["run", recipe, "-o", str(tmp / "run"), "--threads", "4096"], "--threads"),
        ("predict --dtype int3", ["predict", demo, "--profile", "h100", "--dtype", "int3"], "--dtype"),
        (
            "predict --dtype with a probe",
            ["predict", demo, "--profile", eager, "--dtype", "float32"],
            "--dtype",
        ),
        ("predict: a NaN cost", ["predict", demo, "--profile", str(tmp / "nan.json")], "table.alpha"),
        (
            "predict: a profile of other models",
            ["predict", demo, "--profile", str(tmp / "other-models.json")],
            "no entry for the run's model 'smollm2'",
        ),
        (
            "predict --against another recipe",
            ["predict", str(MEASURED / "quickstart"), "--profile", eager, "--against", demo],
            "--against",
        ),
    ]


CASES = cases(Path("/nonexistent"))  # ids only


@pytest.mark.parametrize("index", range(len(CASES)), ids=[case[0] for case in CASES])
def test_a_hostile_profile_input_is_one_clean_line(index: int, tmp_path: Path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")
    write_files(tmp_path)
    _, argv, field = cases(tmp_path)[index]
    result = runner.invoke(app, argv)
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert len(lines) == 1 and lines[0].startswith("error:") and "fix:" in lines[0], result.output
    assert field in lines[0]
    assert not (tmp_path / "p.json").exists() and not (tmp_path / "run").exists()  # refused before work


def test_threads_above_the_cores_warn_and_far_above_are_refused(monkeypatch, capsys):
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    check_threads(None)
    check_threads(2)
    assert capsys.readouterr().err == ""
    check_threads(4, "recipe.yaml: threads")  # twice the cores: a warning, and the work goes on
    warned = " ".join(capsys.readouterr().err.split())
    assert "warning: recipe.yaml: threads: 4 threads on 2 cores" in warned
    check_threads(2 * THREADS_FAR_ABOVE_CORES)
    with pytest.raises(SpecbenchError, match="--threads: 9 threads on a machine of 2 cores.*use at most 2"):
        check_threads(2 * THREADS_FAR_ABOVE_CORES + 1)
