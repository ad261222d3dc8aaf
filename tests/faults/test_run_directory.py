"""Faults of a run directory: a second writer, a file where a directory should be, a resume that ran
nothing, a directory from another results format, a full disk."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from specbench.cli import app
from specbench.errors import SpecbenchError
from specbench.pipeline.records.results import ENVIRONMENT, ExampleLog, RunLock

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "recipes" / "quickstart-tiny.yaml"
runner = CliRunner()


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "specbench.cli", *args], cwd=ROOT, capture_output=True, text=True, timeout=300
    )


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("finished") / "run"
    result = runner.invoke(app, ["run", str(TINY), "--output-dir", str(out)])
    assert result.exit_code == 0, result.output
    return out


def test_a_second_writer_is_refused_and_named(tmp_path: Path):
    out = tmp_path / "run"
    out.mkdir()
    lock = RunLock(out)  # this process plays the first run
    try:
        result = _cli("run", str(TINY), "--output-dir", str(out), "--resume")
        assert result.returncode == 2 and "Traceback" not in result.stderr
        assert f"another specbench run (pid {os.getpid()}) is writing here" in " ".join(result.stderr.split())
        assert not (out / "examples.jsonl").exists()  # it wrote nothing
    finally:
        lock.release()
    with pytest.raises(SpecbenchError, match="pid"):  # one process, two runs: still one writer
        first = RunLock(out)
        try:
            RunLock(out)
        finally:
            first.release()


def test_the_lock_dies_with_its_process(tmp_path: Path):
    # a killed run (kill -9 included) leaves no stale lock: the kernel drops a dead process's flock
    code = (
        "import os, sys; from specbench.pipeline.records.results import RunLock; "
        "RunLock(sys.argv[1]); os._exit(9)"
    )
    assert subprocess.run([sys.executable, "-c", code, str(tmp_path)]).returncode == 9
    RunLock(tmp_path).release()


def test_output_dir_that_is_a_file(tmp_path: Path):
    path = tmp_path / "results.txt"
    path.write_text("not a directory")
    result = runner.invoke(app, ["run", str(TINY), "--output-dir", str(path)])
    assert result.exit_code == 2 and "is a file, not a directory" in result.output
    assert path.read_text() == "not a directory"


def test_a_resume_that_runs_nothing_rewrites_nothing(finished: Path):
    before = {name: (finished / name).read_bytes() for name in ("cells.csv", ENVIRONMENT, "examples.jsonl")}
    result = runner.invoke(app, ["run", str(TINY), "--output-dir", str(finished), "--resume"])
    assert result.exit_code == 0, result.output
    assert {name: (finished / name).read_bytes() for name in before} == before


def test_a_resume_that_runs_nothing_keeps_an_older_resolved_recipe(finished: Path, tmp_path: Path):
    copy = tmp_path / "copy"
    copy.mkdir()
    for name in ("examples.jsonl", ENVIRONMENT, "cells.csv"):
        (copy / name).write_bytes((finished / name).read_bytes())
    older = b"# written by an older specbench, without the fields added since\nname: quickstart-tiny\n"
    (copy / "resolved_recipe.yaml").write_bytes(older)
    result = runner.invoke(app, ["run", str(TINY), "--output-dir", str(copy), "--resume"])
    assert result.exit_code == 0, result.output
    assert (copy / "resolved_recipe.yaml").read_bytes() == older  # what `make demo` must not rewrite


def test_environment_keeps_every_session_and_model(finished: Path, tmp_path: Path):
    env = json.loads((finished / ENVIRONMENT).read_text())
    assert env["results_format"] == 1 and set(env["models"]) == {"target", "draft", "lookup"}
    (session,) = env["sessions"]
    assert session["rows"] == len((finished / "examples.jsonl").read_text().splitlines())
    assert session["ended"] >= session["started"] and session["git"] == env["git"]
    # a resume that computes one row again adds its session and keeps the earlier models' provenance
    copy = tmp_path / "copy"
    copy.mkdir()
    for name in ("examples.jsonl", ENVIRONMENT, "cells.csv"):
        (copy / name).write_bytes((finished / name).read_bytes())
    lines = (copy / "examples.jsonl").read_text().splitlines()
    ar_rows = [i for i, line in enumerate(lines) if json.loads(line)["cell"] == "ar"]
    del lines[ar_rows[-1]]  # the AR cell alone has work left: the drafters are never loaded
    (copy / "examples.jsonl").write_text("\n".join(lines) + "\n")
    result = runner.invoke(app, ["run", str(TINY), "--output-dir", str(copy), "--resume"])
    assert result.exit_code == 0, result.output
    env = json.loads((copy / ENVIRONMENT).read_text())
    assert [s["rows"] for s in env["sessions"]] == [session["rows"], 1]
    assert set(env["models"]) == {"target", "draft", "lookup"}


def test_a_directory_in_another_results_format_is_refused(finished: Path, tmp_path: Path):
    copy = tmp_path / "future"
    copy.mkdir()
    env = json.loads((finished / ENVIRONMENT).read_text())
    (copy / ENVIRONMENT).write_text(json.dumps({**env, "results_format": 99}))
    (copy / "examples.jsonl").write_bytes((finished / "examples.jsonl").read_bytes())
    result = runner.invoke(app, ["run", str(TINY), "--output-dir", str(copy), "--resume"])
    message = " ".join(result.output.split())
    assert result.exit_code == 2 and "holds results in format 99; this specbench writes format 1" in message


def test_a_full_disk_takes_back_the_partial_row(tmp_path: Path, monkeypatch):
    path = tmp_path / "examples.jsonl"
    log = ExampleLog(path)
    log.append({"key": "a"})
    written = path.read_bytes()
    real_write = os.write

    def short_write(fd, data):  # the disk fills up 5 bytes into the line
        return real_write(fd, data[:5])

    monkeypatch.setattr(os, "write", short_write)
    with pytest.raises(SpecbenchError, match="No space left on device.*--resume"):
        log.append({"key": "b", "output_ids": [1, 2, 3]})
    monkeypatch.undo()
    assert path.read_bytes() == written  # no torn line left behind
    assert [r["key"] for r in ExampleLog(path).rows] == ["a"]


def test_a_data_file_whose_answers_changed_is_noticed(tmp_path: Path):
    data = tmp_path / "gsm8k.jsonl"
    rows = [{"question": "What is 2 + 3?", "answer": "2 + 3 = 5\n#### 5"}]
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        TINY.read_text()
        .replace("task: arithmetic", f"task: gsm8k\n    data_files: {data}")
        .replace("max_new_tokens: 24", "max_new_tokens: 4")
    )
    out = tmp_path / "out"
    assert runner.invoke(app, ["run", str(recipe), "-o", str(out)]).exit_code == 0
    rows[0]["answer"] = "2 + 3 = 6\n#### 6"  # the gold changes, the prompt (in the row key) does not
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    result = runner.invoke(app, ["run", str(recipe), "-o", str(out), "--resume"])
    message = " ".join(result.output.split())
    assert result.exit_code == 2 and "the gold answer of example gsm8k/test/0 changed" in message
    rows[0]["question"] = "What is 2 + 4?"  # a changed prompt: its recorded rows would drop out
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    result = runner.invoke(app, ["run", str(recipe), "-o", str(out), "--resume"])
    assert result.exit_code == 2 and "does not produce" in " ".join(result.output.split())
    assert runner.invoke(app, ["run", str(recipe), "-o", str(tmp_path / "new")]).exit_code == 0


def test_a_recipes_bigram_path_starts_at_the_recipes_folder(tmp_path: Path):
    import torch

    from specbench.drafters.bigram import BigramTable

    (tmp_path / "tables").mkdir()
    BigramTable(torch.arange(300)).save(tmp_path / "tables" / "t.json")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        TINY.read_text().replace(
            "  lookup:\n    source: prompt-lookup\n",
            "  lookup:\n    source: maxgram\n    options: {bigram: tables/t.json}\n",
        )
    )
    result = runner.invoke(app, ["run", str(recipe), "-o", str(tmp_path / "out"), "--limit", "1"])
    assert result.exit_code == 0, result.output  # run from the repository root, not the recipe's folder


def test_out_of_memory_while_loading_is_one_line(monkeypatch):
    import torch

    from specbench import sources
    from specbench.models import tiny

    def exhausted(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 512.00 GiB")

    monkeypatch.setattr(tiny, "build_tiny", exhausted)
    with pytest.raises(SpecbenchError, match=r"models.big: out of memory while loading tiny-llama"):
        sources.load(sources.ModelRequest("big", "tiny-llama"))


def test_a_drafter_with_another_tokenizer_fails_before_the_first_row(tmp_path: Path, monkeypatch):
    import copy

    from specbench import sources

    real = sources.load

    def load(request, resolve=None):
        model = real(request, resolve)
        if request.name == "draft":  # a drafter trained on another vocabulary
            model.tokenizer = copy.copy(model.tokenizer)
            model.tokenizer.get_vocab = lambda: {"<other>": 0}
        return model

    monkeypatch.setattr(sources, "load", load)
    out = tmp_path / "out"
    result = runner.invoke(app, ["run", str(TINY), "-o", str(out)])
    message = " ".join(result.output.split())
    assert result.exit_code == 2 and "drafter 'draft' does not share the target's tokenizer" in message
    assert not (out / "examples.jsonl").exists()  # found before the AR cell ran, not after it
