"""Committed results cannot go stale silently (``specbench check``, pipeline/run/provenance.py): every
committed run directory is what today's code measures, or says which commit made it and why it stays."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from conftest import TWO_CELL_RECIPE
from typer.testing import CliRunner

from specbench.cli import app
from specbench.models import cache
from specbench.pipeline.run.provenance import PROVENANCE, check_run, result_directories

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()
DATA = Path(os.environ.get("SPECBENCH_DATA_DIR") or ROOT.parent / "shared" / "data")


@pytest.mark.skipif(not DATA.is_dir(), reason=f"no offline data at {DATA}: set SPECBENCH_DATA_DIR")
@pytest.mark.parametrize("run", result_directories(ROOT / "results"), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_committed_run_is_current_or_says_which_commit_made_it(run, monkeypatch):
    monkeypatch.setenv("SPECBENCH_DATA_DIR", str(DATA))
    finding = check_run(run)
    assert finding.accepted, f"{run}: {finding.problems} (re-run it, or declare it in {PROVENANCE})"


@pytest.fixture
def tiny_run(tmp_path: Path) -> Path:
    recipe = tmp_path / "r.yaml"
    recipe.write_text(TWO_CELL_RECIPE)
    out = tmp_path / "run"
    assert runner.invoke(app, ["run", str(recipe), "--output-dir", str(out)]).exit_code == 0
    return out


def test_a_run_is_current_until_its_code_keys_its_rows_otherwise(tiny_run: Path):
    assert check_run(tiny_run).problems == []
    assert runner.invoke(app, ["check", str(tiny_run)]).exit_code == 0
    # as if a method's default had changed since: the resolved recipe now gives the SD cell other keys
    resolved = tiny_run / "resolved_recipe.yaml"
    recipe = yaml.safe_load(resolved.read_text())
    recipe["methods"][1]["params"]["k"] = 3
    resolved.write_text(yaml.safe_dump(recipe))
    finding = check_run(tiny_run)
    assert len(finding.problems) == 1 and "3 row(s) are keyed otherwise" in finding.problems[0]
    assert "3 row(s) of its recipe were never measured" in finding.notes[0]
    result = runner.invoke(app, ["check", str(tiny_run)])
    assert result.exit_code == 1 and "stale" in result.output
    # kept on purpose: the declaration must name the commit that made it
    (tiny_run / PROVENANCE).write_text("Kept: measured before the change, see the note\n")
    assert not check_run(tiny_run).accepted
    (tiny_run / PROVENANCE).write_text("# Made at 67dbdc4 with k = 2; kept as the baseline of note 35\n")
    assert check_run(tiny_run).accepted
    assert runner.invoke(app, ["check", str(tiny_run)]).exit_code == 0


def test_a_recipe_that_no_longer_validates_is_stale(tiny_run: Path):
    resolved = tiny_run / "resolved_recipe.yaml"
    recipe = yaml.safe_load(resolved.read_text())
    recipe["methods"][1]["params"]["lenience_kind"] = "cs"  # a parameter no method takes (any more)
    resolved.write_text(yaml.safe_dump(recipe))
    (problem,) = check_run(tiny_run).problems
    assert problem.startswith("its recipe does not run under today's code") and "lenience_kind" in problem


def test_a_drafter_trained_otherwise_than_the_local_copy_makes_its_rows_stale(
    tiny_run: Path, tmp_path: Path, monkeypatch
):
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    folder = cache.distilled_dir("t/small")
    folder.mkdir(parents=True)
    record = {"teacher": {"key": "a", "data_dir": "/here"}, "student": {"epochs": 3.0}}
    (folder / "distill.json").write_text(json.dumps(record))
    today = cache.trained_identity(folder)
    # the data path is the machine's, not the training's
    (folder / "distill.json").write_text(json.dumps(record | {"teacher": {"key": "a", "data_dir": "/there"}}))
    assert cache.trained_identity(folder) == today
    environment = tiny_run / "environment.json"
    env = json.loads(environment.read_text())
    env["models"]["small"] = {"source": "distilled:t/small", "identity": today}
    environment.write_text(json.dumps(env))
    assert check_run(tiny_run).problems == []
    # the same configuration, trained by a later revision of its trainer (a head's architecture changed)
    (folder / "distill.json").write_text(json.dumps(record | {"trainer_revision": 2}))
    (problem,) = check_run(tiny_run).problems
    assert "model small (distilled:t/small) was trained otherwise" in problem
    (folder / "distill.json").write_text(json.dumps(record | {"student": {"epochs": 8.0}}))  # retrained
    (problem,) = check_run(tiny_run).problems
    assert "model small (distilled:t/small) was trained otherwise" in problem
    env["models"]["small"].pop("identity")  # a run from before identities: said, not judged
    environment.write_text(json.dumps(env))
    finding = check_run(tiny_run)
    assert finding.problems == [] and any("training was not recorded" in n for n in finding.notes)


def test_a_new_run_records_its_trained_models_training(tmp_path: Path, monkeypatch):
    from specbench import sources

    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    folder = cache.distilled_dir("t/small")
    folder.mkdir(parents=True)
    (folder / "distill.json").write_text(json.dumps({"teacher": {"key": "a"}, "student": {}}))
    assert sources.identity("distilled:t/small") == cache.trained_identity(folder)
    assert sources.identity("medusa:t/small") == cache.trained_identity(folder)  # heads: the same record
    assert sources.identity("tiny-llama") is None and sources.identity("prompt-lookup") is None
    from specbench.pipeline.run.environment import _identity

    assert _identity("distilled:t/small") == {"identity": cache.trained_identity(folder)}
    assert _identity("tiny-llama") == {}


def test_checking_a_run_leaves_this_process_threads_as_they_were(tiny_run: Path):
    import torch

    resolved = tiny_run / "resolved_recipe.yaml"
    recipe = yaml.safe_load(resolved.read_text())
    recipe["threads"] = 1  # a runner takes the recipe's threads; a check must not keep them
    resolved.write_text(yaml.safe_dump(recipe))
    before = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        check_run(tiny_run)
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)


def test_a_run_keyed_on_a_bfloat16_machine_is_current_when_checked_on_another(tmp_path, monkeypatch):
    """``dtype: auto`` enters a row's key as the dtype it resolved to; re-keying the rows must resolve it
    as the run's machine did (environment.json), not as the checking CPU would (AVX2-only: float32)."""
    from specbench import sources
    from specbench.models import devices

    recipe = tmp_path / "r.yaml"
    recipe.write_text(TWO_CELL_RECIPE.replace("dtype: float64", "dtype: auto"))
    out = tmp_path / "run"
    plain = devices.dtype_choice

    def bfloat16_machine(rule, dtype, device):
        return ("bfloat16", "auto: this CPU has AMX") if dtype == "auto" else plain(rule, dtype, device)

    with monkeypatch.context() as patched:  # the run's machine: auto is bfloat16 there
        patched.setattr(devices, "dtype_choice", bfloat16_machine)
        assert runner.invoke(app, ["run", str(recipe), "--output-dir", str(out)]).exit_code == 0
    env = json.loads((out / "environment.json").read_text())
    assert env["models"]["target"]["dtype"] == "torch.bfloat16"
    assert sources.dtype_choice("auto", "cpu", "tiny-llama")[0] == "float32"  # this machine's answer
    assert check_run(out).problems == []
