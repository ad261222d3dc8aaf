"""Checksums that cannot be switched off, files written as the umask allows, and a full disk at the start.

A row carries its checksum (``row_sha``) and cells.csv one beside it (cells.sha256); once a directory has
written one, checksums.json records that it did, so deleting a row's checksum or cells.sha256 before
editing is named by every reader (report, a resume, ``specbench check``) like the edit itself. Deleting
checksums.json too is named as well: environment.json's sessions say when the rows were written.
Directories written before checksums existed (some committed under results/) read as they always did.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
from pathlib import Path

import pytest
from conftest import TWO_CELL_RECIPE
from typer.testing import CliRunner

from specbench.cli import app
from specbench.errors import SpecbenchError
from specbench.models.cache import write_atomic
from specbench.models.checksums import RUN_CHECKSUMS_SINCE
from specbench.pipeline.records.results import (
    CELLS,
    CELLS_SHA,
    CHECKSUM,
    ENVIRONMENT,
    EXAMPLES,
    MARKER,
    REJECTED,
    RESOLVED_RECIPE,
    ExampleLog,
    read_cells_csv,
)
from specbench.pipeline.run.provenance import check_run

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


def _one_line(output: str) -> str:
    assert "Traceback" not in output, output
    return " ".join(output.split())


@pytest.fixture(scope="module")
def recipe(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("recipe") / "r.yaml"
    path.write_text(TWO_CELL_RECIPE)
    return path


@pytest.fixture(scope="module")
def finished(tmp_path_factory, recipe: Path) -> Path:
    out = tmp_path_factory.mktemp("finished") / "run"
    result = runner.invoke(app, ["run", str(recipe), "--output-dir", str(out)])
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture
def run(finished: Path, tmp_path: Path) -> Path:
    """A copy of the finished run, to edit."""
    return Path(shutil.copytree(finished, tmp_path / "run"))


def _lines(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / EXAMPLES).read_text().splitlines()]


def _write(run: Path, rows: list[dict]) -> None:
    (run / EXAMPLES).write_text("".join(json.dumps(row, separators=(",", ":")) + "\n" for row in rows))


def _faster_without_checksum(row: dict) -> dict:
    """The issue's edit: the checksum deleted, then the walltime cut (4000 tok/s in the report)."""
    edited = {key: value for key, value in row.items() if key != CHECKSUM}
    edited["walltime"] = row["walltime"] / 1000
    return edited


def test_a_run_records_that_it_writes_checksums(finished: Path):
    marker = json.loads((finished / MARKER).read_text())
    assert marker == {"cells_sha": True, "row_sha": True, "rows_before_checksums": {}}
    assert all(CHECKSUM in row for row in _lines(finished)) and (finished / CELLS_SHA).is_file()


def test_a_row_whose_checksum_was_deleted_is_refused_then_measured_again(run: Path, recipe: Path):
    rows = _lines(run)
    edited = _faster_without_checksum(rows[2])
    _write(run, [*rows[:2], edited, *rows[3:]])
    with pytest.raises(SpecbenchError, match=rf"line 3: has no checksum \({CHECKSUM}\).*{MARKER}.*--resume"):
        ExampleLog(run / EXAMPLES)
    by_category = runner.invoke(app, ["report", str(run), "--by", "category"])
    assert by_category.exit_code == 2 and "line 3: has no checksum" in _one_line(by_category.output)
    finding = check_run(run)
    assert not finding.accepted and "line 3: has no checksum" in finding.altered[0]
    checked = runner.invoke(app, ["check", str(run)])
    assert checked.exit_code == 1 and "altered" in checked.output
    resumed = runner.invoke(app, ["run", str(recipe), "--output-dir", str(run), "--resume"])
    assert resumed.exit_code == 0, resumed.output
    assert "line 3 has no checksum" in _one_line(resumed.output)
    assert "has no checksum" in (run / REJECTED).read_text()
    again = {row["key"]: row for row in _lines(run)}[edited["key"]]
    assert CHECKSUM in again and again["walltime"] != edited["walltime"]  # measured again
    assert check_run(run).altered == [] and runner.invoke(app, ["report", str(run)]).exit_code == 0


def test_deleting_the_record_too_still_names_a_row_after_a_checksummed_one(run: Path):
    rows = _lines(run)
    (run / MARKER).unlink()
    _write(run, [*rows[:-1], _faster_without_checksum(rows[-1])])  # the last row: nothing after it
    with pytest.raises(SpecbenchError, match=rf"line {len(rows)}: has no checksum.*an earlier row has one"):
        ExampleLog(run / EXAMPLES)
    assert check_run(run).altered


def test_cells_csv_edited_after_its_checksum_was_deleted_is_refused(run: Path, recipe: Path):
    written = (run / CELLS).read_text()
    (run / CELLS_SHA).unlink()
    (run / CELLS).write_text(written.replace(",2,", ",4812,", 1))
    result = runner.invoke(app, ["report", str(run)])
    message = _one_line(result.output)
    assert result.exit_code == 2 and f"cells.csv: has no {CELLS_SHA} beside it" in message
    assert MARKER in message and "--resume" in message
    assert check_run(run).altered and runner.invoke(app, ["check", str(run)]).exit_code == 1
    compared = runner.invoke(app, ["compare", str(run), str(run)])
    assert compared.exit_code == 2 and f"has no {CELLS_SHA}" in _one_line(compared.output)
    (run / MARKER).unlink()  # and the record deleted as well: the rows' checksums still tell
    result = runner.invoke(app, ["report", str(run)])
    assert result.exit_code == 2 and "its run's rows carry checksums" in _one_line(result.output)
    resumed = runner.invoke(app, ["run", str(recipe), "--output-dir", str(run), "--resume"])
    assert resumed.exit_code == 0, resumed.output
    assert (run / CELLS).read_text() == written and (run / CELLS_SHA).is_file() and (run / MARKER).is_file()


def _strip_every_checksum(run: Path) -> list[dict]:
    """The issue's deletion: checksums.json, every row's checksum and cells.sha256; the rows left."""
    rows = [{key: value for key, value in row.items() if key != CHECKSUM} for row in _lines(run)]
    for name in (MARKER, CELLS_SHA):
        (run / name).unlink()
    _write(run, rows)
    return rows


def _as_if_before_checksums(run: Path) -> None:
    """environment.json as a run from before checksums wrote it: its sessions began before them."""
    environment = json.loads((run / ENVIRONMENT).read_text())
    assert RUN_CHECKSUMS_SINCE == "2026-11-25T12:56:22+00:00"  # commit ba86a00
    for session in environment["sessions"]:
        session["started"], session["ended"] = "2026-11-25T10:00:00+00:00", "2026-11-25T10:01:00+00:00"
    (run / ENVIRONMENT).write_text(json.dumps(environment, indent=2))


def test_deleting_every_checksum_and_the_record_is_still_refused_by_every_reader(run: Path, recipe: Path):
    """The issue's case: checksums.json, every row's checksum and cells.sha256 deleted, then cells.csv
    and a row edited. environment.json's session (after checksums existed) tells it from a run of
    before; report, plot, check and a resume each name it in one line."""
    rows = _strip_every_checksum(run)
    written = (run / CELLS).read_text()
    (run / CELLS).write_text(written.replace(",2,", ",4812,", 1))
    result = runner.invoke(app, ["report", str(run)])
    message = _one_line(result.output)
    assert result.exit_code == 2 and f"cells.csv: has no {CELLS_SHA} beside it" in message
    assert f"{ENVIRONMENT} records a session of" in message and "after they carried checksums" in message
    compared = runner.invoke(app, ["compare", str(run), str(run)])
    assert compared.exit_code == 2 and f"has no {CELLS_SHA}" in _one_line(compared.output)
    _write(run, [*rows[:2], _faster_without_checksum(rows[2]), *rows[3:]])
    for argv in (["plot", str(run)], ["report", str(run), "--by", "category"]):
        result = runner.invoke(app, argv)
        message = _one_line(result.output)
        assert result.exit_code == 2 and f"line 1: has no checksum ({CHECKSUM})" in message, argv
        assert f"{ENVIRONMENT} records a session" in message and "--resume" in message
    finding = check_run(run)
    assert not finding.accepted and any("after they carried checksums" in a for a in finding.altered)
    checked = runner.invoke(app, ["check", str(run)])
    assert checked.exit_code == 1 and "altered" in checked.output
    # environment.json deleted as well: the run wrote it before its first row (resolved_recipe.yaml says)
    (run / ENVIRONMENT).unlink()
    assert (run / RESOLVED_RECIPE).is_file()
    with pytest.raises(SpecbenchError, match=rf"line 1: has no checksum.*{ENVIRONMENT} before its first row"):
        ExampleLog(run / EXAMPLES)
    result = runner.invoke(app, ["report", str(run)])
    assert result.exit_code == 2 and "it is gone" in _one_line(result.output)
    # a resume takes no stripped row as measured: each goes to examples.rejected and is measured again
    resumed = runner.invoke(app, ["run", str(recipe), "--output-dir", str(run), "--resume"])
    assert resumed.exit_code == 0, resumed.output
    assert _one_line(resumed.output).count("has no checksum") == len(rows)
    again = _lines(run)
    assert len(again) == len(rows) and all(CHECKSUM in row for row in again)
    assert {row["key"] for row in again} == {row["key"] for row in rows}
    assert check_run(run).altered == [] and runner.invoke(app, ["report", str(run)]).exit_code == 0


def test_a_directory_from_before_checksums_reads_as_it_did_and_is_guarded_once_resumed(
    run: Path, recipe: Path
):
    rows = _strip_every_checksum(run)
    _as_if_before_checksums(run)
    cells = (run / CELLS).read_bytes()
    assert [row["key"] for row in ExampleLog(run / EXAMPLES).rows] == [row["key"] for row in rows]
    assert len(read_cells_csv(run / CELLS)) == 2 and check_run(run).altered == []
    report = runner.invoke(app, ["report", str(run)])
    assert report.exit_code == 0, report.output
    # resumed with one row to measure: the old rows are recorded by their checksums, then guarded
    _write(run, rows[:-1])
    resumed = runner.invoke(app, ["run", str(recipe), "--output-dir", str(run), "--resume"])
    assert resumed.exit_code == 0, resumed.output
    marker = json.loads((run / MARKER).read_text())
    assert sorted(marker["rows_before_checksums"]) == sorted(row["key"] for row in rows[:-1])
    assert (run / CELLS).read_bytes() != cells and (run / CELLS_SHA).is_file()
    now = _lines(run)
    assert CHECKSUM not in now[0] and CHECKSUM in now[-1]
    _write(run, [{**now[0], "walltime": now[0]["walltime"] / 1000}, *now[1:]])
    with pytest.raises(SpecbenchError, match=rf"line 1: was edited .*its checksum in {MARKER}"):
        ExampleLog(run / EXAMPLES)
    _write(run, [*now[:-1], _faster_without_checksum(now[-1])])
    with pytest.raises(SpecbenchError, match=rf"line {len(now)}: has no checksum"):
        ExampleLog(run / EXAMPLES)


def test_a_corrupted_checksum_record_is_one_line(run: Path):
    (run / MARKER).write_text("[1, 2")
    result = runner.invoke(app, ["report", str(run), "--by", "category"])
    message = _one_line(result.output)
    assert result.exit_code == 2 and f"{MARKER}: is not the checksum record" in message and "fix:" in message


def test_every_committed_run_reads_without_a_checksum_record():
    """results/ holds runs from before checksums (no row_sha, no cells.sha256) and after (both): each
    reads as it did, and none is called altered (CI runs specbench check over them). The six from
    before say so in environment.json (sessions begun before checksums, or none recorded); every
    other one's sessions began after, so stripping its checksums would be named."""
    from specbench.engines.load import read_load
    from specbench.models.checksums import run_written_after_checksums

    directories = sorted(path.parent for path in (ROOT / "results").rglob(EXAMPLES))
    assert len(directories) > 40
    before = []
    for directory in directories:
        ExampleLog(directory / EXAMPLES)
        if (directory / CELLS).is_file():
            read_cells_csv(directory / CELLS)
        signed = CHECKSUM.encode() in (directory / EXAMPLES).read_bytes()
        assert (run_written_after_checksums(directory) is not None) == signed, directory
        before += [] if signed else [directory.relative_to(ROOT / "results").as_posix()]
    assert len(before) == 6 and "quickstart" in before
    sweeps = sorted(path.parent for path in (ROOT / "results").rglob("load.csv"))
    assert sweeps and all(read_load(sweep) for sweep in sweeps)  # from before sweeps had checksums


# -- files as the umask allows -----------------------------------------------------------------------


def _modes(directory: Path) -> dict[str, int]:
    return {p.name: stat.S_IMODE(p.stat().st_mode) for p in directory.iterdir() if p.is_file()}


@pytest.mark.parametrize("mask", [0o022, 0o027, 0o002])
def test_write_atomic_gives_the_mode_the_umask_allows(tmp_path: Path, mask: int):
    kept = os.umask(mask)
    try:
        write_atomic(tmp_path / "a.txt", "text\n")
        write_atomic(tmp_path / "b.bin", b"\x00")
    finally:
        os.umask(kept)
    assert _modes(tmp_path) == {"a.txt": 0o666 & ~mask, "b.bin": 0o666 & ~mask}


def test_every_run_file_is_readable_as_the_umask_allows(tmp_path: Path, recipe: Path):
    out = tmp_path / "run"
    kept = os.umask(0o027)
    try:
        result = runner.invoke(app, ["run", str(recipe), "--output-dir", str(out), "--limit", "1"])
    finally:
        os.umask(kept)
    assert result.exit_code == 0, result.output
    modes = _modes(out)
    expected = {EXAMPLES, CELLS, CELLS_SHA, MARKER, "environment.json", "resolved_recipe.yaml"}
    assert expected <= set(modes)
    assert {name: mode for name, mode in modes.items() if mode != 0o640} == {}  # not mkstemp's 0600


# -- a full disk at the start ------------------------------------------------------------------------


def _full_disk(monkeypatch) -> None:
    """The disk is full: every file specbench writes fails when it is flushed to the disk."""

    def no_space(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", no_space)


def test_a_full_disk_at_the_start_of_a_run_is_one_line(tmp_path: Path, recipe: Path, monkeypatch):
    out = tmp_path / "run"
    _full_disk(monkeypatch)
    result = runner.invoke(app, ["run", str(recipe), "--output-dir", str(out)])
    monkeypatch.undo()
    message = _one_line(result.output)
    assert result.exit_code == 2 and "No space left on device" in message and "free space" in message
    assert "resolved_recipe.yaml: cannot be written" in message
    assert sorted(p.name for p in out.iterdir()) == [".specbench.lock"]  # no temporary file left
