"""A load sweep's files are checksummed as a run's are (issue 58): every row of load.csv and
load_summary.csv carries its checksum (a last column ``row_sha``) and every request line one (a field),
checksums.json records that the directory writes them, and environment.json's sessions say when the
sweep was written. An edited row, or checksums deleted (even all of them, the record too), is refused in
one line by ``report``, ``compare``, ``plot``, ``load --resume`` and ``specbench check``; a sweep from
before checksums (the committed SmolLM2 one) reads as it did, and a resume adopts it. Through the
stand-in vLLM server (tests/fixtures/stub_vllm)."""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from test_vllm_backend import STUB, _no_server_left, _recipe, stub_engine  # noqa: F401  (a fixture)
from typer.testing import CliRunner

from specbench.cli import app
from specbench.engines.load import (
    LOAD_CSV,
    LOAD_REQUESTS,
    LOAD_SUMMARY,
    SIGNED,
    adopt,
    read_load,
    read_requests,
)
from specbench.errors import SpecbenchError
from specbench.models.checksums import CHECKSUM, LOAD_CHECKSUMS_SINCE, MARKER
from specbench.pipeline.run.provenance import check_run

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "results/engines/smollm2_vllm_load/amd-epyc-family26-avx512-bf16"
LOAD = {"concurrency": [1, 2], "requests": 4, "warmup_requests": 1}
SMALL = {"datasets.0.limit": 1, "generation.max_new_tokens": 8}  # the run beside the sweep: 4 rows
runner = CliRunner()


def _one_line(output: str) -> str:
    assert "Traceback" not in output, output
    return " ".join(output.split())


def _invoke(*argv: str):
    return runner.invoke(app, [str(a) for a in argv])


def _measure(tmp_path: Path, out: Path, *extra: str, run_too: bool = False):
    """The stand-in recipe's sweep into ``out`` (after its run, with ``run_too``: a directory of both)."""
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(_recipe(tmp_path, load=LOAD, **SMALL)))
    if run_too:
        ran = _invoke("run", path, "-o", out)
        assert ran.exit_code == 0, ran.output
    return _invoke("load", path, "-o", out, *extra)


def _csv(path: Path) -> list[list[str]]:
    return list(csv.reader(io.StringIO(path.read_text())))


def _write_csv(path: Path, rows: list[list[str]]) -> None:
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(rows)
    path.write_text(out.getvalue())


def _edit_load_row(out: Path) -> None:
    """The issue's kind of edit: a level's throughput doubled in load.csv, its checksum kept."""
    rows = _csv(out / LOAD_CSV)
    column = rows[0].index("throughput_tok_s")
    rows[1][column] = str(2 * float(rows[1][column]))
    _write_csv(out / LOAD_CSV, rows)


def _strip_checksum_column(path: Path) -> None:
    rows = _csv(path)
    assert rows[0][-1] == CHECKSUM
    _write_csv(path, [row[:-1] for row in rows])


def _stand_in(root: Path, patch: pytest.MonkeyPatch, build: bool) -> None:
    """What test_vllm_backend's stub_engine sets up: a tiny model on disk (``build``) and the stand-in
    vLLM importable by the engine's interpreter."""
    if build:
        from specbench.models.tiny import build_tiny

        model, tokenizer = build_tiny("tiny-llama", seed=3, init_std=0.5)
        model.to(dtype=__import__("torch").float64).save_pretrained(root / "model")
        tokenizer.save_pretrained(root / "model")
    patch.setenv("PYTHONPATH", os.pathsep.join([str(STUB), os.environ.get("PYTHONPATH", "")]))
    patch.setenv("SPECBENCH_VLLM_PYTHON", sys.executable)
    patch.setenv("SPECBENCH_DATA_DIR", str(root / "no-data"))


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> Path:
    """A run and its sweep in one directory (report and compare read a run's cells.csv), measured once."""
    root = tmp_path_factory.mktemp("measured")
    with pytest.MonkeyPatch.context() as patch:
        _stand_in(root, patch, build=True)
        result = _measure(root, root / "both", run_too=True)
    assert result.exit_code == 0, result.output
    return root


@pytest.fixture
def swept(measured: Path, tmp_path: Path, monkeypatch) -> Path:
    """A copy of the measured directory to edit, the stand-in engine reachable."""
    _stand_in(measured, monkeypatch, build=False)
    return Path(shutil.copytree(measured / "both", tmp_path / "both"))


def test_a_sweep_writes_a_checksum_into_every_row_and_request_line(swept: Path):
    for name in (LOAD_CSV, LOAD_SUMMARY):
        rows = _csv(swept / name)
        assert rows[0][-1] == CHECKSUM and all(len(row[-1]) == 16 for row in rows[1:])
    lines = [json.loads(line) for line in (swept / LOAD_REQUESTS).read_text().splitlines()]
    assert len(lines) == 2 * 2 * 4 and all(len(line[CHECKSUM]) == 16 for line in lines)
    assert json.loads((swept / MARKER).read_text())[SIGNED] is True
    sessions = json.loads((swept / "environment.json").read_text())["sessions"]
    assert sessions[-1]["command"] == "load" and "command" not in sessions[0]  # the run's, then the sweep's
    rows = read_load(swept)
    assert len(rows) == 4 and CHECKSUM not in rows[0]
    requests = read_requests(swept, {row["key"] for row in rows})
    assert sum(map(len, requests.values())) == 16 and CHECKSUM not in next(iter(requests.values()))[0]
    assert check_run(swept).altered == []


def test_an_edited_load_row_is_refused_by_every_reader_in_one_line(measured: Path, swept: Path):
    written = (swept / LOAD_CSV).read_bytes()
    _edit_load_row(swept)
    recipe = measured / "recipe.yaml"
    for argv in (
        ("report", swept),
        ("compare", swept, swept),
        ("plot", swept, "--figure", "load"),
        ("load", recipe, "-o", swept, "--resume"),
    ):
        result = _invoke(*argv)
        message = _one_line(result.output)
        assert result.exit_code == 2, (argv, result.output)
        assert f"{LOAD_CSV}: line 2: was edited after it was written (its checksum differs)" in message, argv
        assert "fix: restore the files" in message and message.count("error:") == 1, argv
    finding = check_run(swept)
    assert not finding.accepted and f"{LOAD_CSV}: line 2: was edited" in finding.altered[0]
    checked = _invoke("check", swept)
    assert checked.exit_code == 1 and "altered" in checked.output
    assert _no_server_left(measured)
    (swept / LOAD_CSV).write_bytes(written)
    # a request line edited (its end-to-end time): the intervals are drawn from them
    lines = (swept / LOAD_REQUESTS).read_text().splitlines()
    first = json.loads(lines[0])
    lines[0] = json.dumps({**first, "e2e_s": first["e2e_s"] / 10})
    (swept / LOAD_REQUESTS).write_text("\n".join(lines) + "\n")
    result = _invoke("plot", swept, "--figure", "load")
    message = _one_line(result.output)
    assert result.exit_code == 2 and f"{LOAD_REQUESTS}: line 1: was edited after it was written" in message
    assert any(f"{LOAD_REQUESTS}: line 1" in a for a in check_run(swept).altered)
    # the summary a sweep prints from
    (swept / LOAD_REQUESTS).write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n")
    summary = _csv(swept / LOAD_SUMMARY)
    summary[1][1] = "99"
    _write_csv(swept / LOAD_SUMMARY, summary)
    assert any(f"{LOAD_SUMMARY}: line 2: was edited" in a for a in check_run(swept).altered)


def test_deleting_every_checksum_of_a_sweep_is_still_refused(measured: Path, swept: Path):
    """The checksum column and checksums.json deleted, then a row edited: environment.json's session
    says the sweep was written after sweeps carried checksums; environment.json deleted as well, the
    columns of load.csv say a sweep that writes one wrote it."""
    _edit_load_row(swept)
    _strip_checksum_column(swept / LOAD_CSV)
    marker = json.loads((swept / MARKER).read_text())
    (swept / MARKER).write_text(json.dumps({key: v for key, v in marker.items() if key != SIGNED}))
    recipe = measured / "recipe.yaml"
    for argv in (
        ("report", swept),
        ("plot", swept, "--figure", "load"),
        ("load", recipe, "-o", swept, "--resume"),
    ):
        result = _invoke(*argv)
        message = _one_line(result.output)
        assert result.exit_code == 2, (argv, result.output)
        assert (
            f"{LOAD_CSV}: has no checksum column ({CHECKSUM}), though environment.json records a " in message
        )
    (swept / MARKER).unlink()
    (swept / "environment.json").unlink()
    result = _invoke("plot", swept, "--figure", "load")
    message = _one_line(result.output)
    assert result.exit_code == 2 and "its columns say) also wrote environment.json, and it is gone" in message
    assert any("it is gone" in a for a in check_run(swept).altered)
    with pytest.raises(SpecbenchError, match=rf"{LOAD_REQUESTS}: line 1: has no checksum \({CHECKSUM}\)"):
        lines = [json.loads(line) for line in (swept / LOAD_REQUESTS).read_text().splitlines()]
        (swept / LOAD_REQUESTS).write_text("".join(json.dumps(_without(line)) + "\n" for line in lines))
        read_requests(swept, {line["key"] for line in lines})


def _without(line: dict) -> dict:
    return {key: value for key, value in line.items() if key != CHECKSUM}


def test_a_sweep_from_before_checksums_reads_as_it_did_and_a_resume_adopts_it(stub_engine):  # noqa: F811
    """The committed sweep (load.csv only, no environment.json) reads and plots; a sweep of this
    afternoon (environment.json, sessions before sweeps carried checksums) too, and its resume keeps
    every row as it was, now with checksums."""
    tmp_path = stub_engine
    old = Path(shutil.copytree(COMMITTED, tmp_path / "committed"))
    rows = read_load(old)
    assert len(rows) == 10 and _invoke("plot", old, "--figure", "load").exit_code == 0
    assert check_run(old).altered == []
    adopt(old, {row["key"] for row in rows})
    assert _csv(old / LOAD_CSV)[0][-1] == CHECKSUM and json.loads((old / MARKER).read_text())[SIGNED]
    assert pd.DataFrame(read_load(old)).equals(pd.DataFrame(rows))  # NaN where NaN
    # a sweep written before this change: no checksums, its sessions before LOAD_CHECKSUMS_SINCE
    out = tmp_path / "sweep"
    first = _measure(tmp_path, out)
    assert first.exit_code == 0, first.output
    _strip_checksum_column(out / LOAD_CSV)
    _strip_checksum_column(out / LOAD_SUMMARY)
    lines = [_without(json.loads(line)) for line in (out / LOAD_REQUESTS).read_text().splitlines()]
    (out / LOAD_REQUESTS).write_text("".join(json.dumps(line) + "\n" for line in lines))
    (out / MARKER).unlink()
    environment = json.loads((out / "environment.json").read_text())
    assert LOAD_CHECKSUMS_SINCE == "2026-11-28T16:30:00+00:00"
    for session in environment["sessions"]:
        session["started"], session["ended"] = "2026-11-28T15:00:00+00:00", "2026-11-28T15:01:00+00:00"
        del session["command"]  # written since
    (out / "environment.json").write_text(json.dumps(environment))
    before = {row["key"]: row for row in read_load(out)}
    assert check_run(out).altered == [] and _invoke("plot", out, "--figure", "load").exit_code == 0
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(_recipe(tmp_path, load={**LOAD, "concurrency": [1, 2, 4]}, **SMALL)))
    grown = _invoke("load", path, "-o", out, "--resume")
    assert grown.exit_code == 0, grown.output
    after = {row["key"]: row for row in read_load(out)}
    assert len(after) == 6 and before.keys() < after.keys()
    unchanged = ("throughput_tok_s", "ttft_p50_s", "completed", "elapsed_s")
    assert all(after[key][c] == before[key][c] for key in before for c in unchanged)
    assert _csv(out / LOAD_CSV)[0][-1] == CHECKSUM and check_run(out).altered == []
    assert all(CHECKSUM in json.loads(line) for line in (out / LOAD_REQUESTS).read_text().splitlines())
    assert _no_server_left(tmp_path)
