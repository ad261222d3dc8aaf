"""Result files of a run directory, written so that a killed run loses and duplicates nothing.

    examples.jsonl         one JSON line per (cell, example), keyed by a content hash
    cells.csv              one tidy row per (dataset, cell), recomputed from examples.jsonl
    cells.sha256           the checksum of cells.csv as written: readers name a hand edit
    checksums.json         written with the directory's first checksum: from then on every row and
                           cells.csv must carry one (the rows from before checksums listed, by theirs)
    resolved_recipe.yaml   the recipe with every default filled in
    environment.json       versions, git hash, device, dtypes, threads, model origins, sessions
    examples.rejected      lines a resume took out of examples.jsonl (torn or corrupted), verbatim
    .specbench.lock        held (flock) by the one run that writes here

Each example row is appended with a single ``write`` of a complete line followed by ``fsync``. A
line that is not a complete row (a kill can cut the last one short; a disk or an editor can spoil any)
is never parsed as a row or dropped unsaid: a run that resumes moves it to ``examples.rejected``, names
it by line number and computes its row again; readers (``plot``, the paper views) refuse the file and
say which line to repair. A row carries its own checksum (``row_sha``) and cells.csv one beside it, so a
hand edit is named like a corrupted line; deleting a checksum does not switch the check off: checksums.json
records that the directory writes them (and a checksummed row before an unchecksummed one, or rows with
checksums beside a cells.csv without its own, tell the same of directories from before the record), and
so do environment.json's sessions when every checksum is gone (:mod:`specbench.models.checksums`).
Directories written before checksums existed have none of them and are read as they always were.
Whole files (CSV, YAML, JSON) are written to a temporary name and renamed
into place. Only one run writes a directory at a time: a second one stops and names the first's pid.
environment.json is written by :mod:`specbench.pipeline.run.environment` (which asks torch); it is read
here (:func:`read_environment`, :func:`machines_of`, :func:`measured_on`), so that reports do not.
"""

from __future__ import annotations

import fcntl
import functools
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from specbench.errors import SpecbenchError
from specbench.models.cache import write_atomic  # noqa: F401  (the pipeline's writers import it here)
from specbench.models.checksums import (  # noqa: F401  (readers import them here)
    CHECKSUM,
    MARKER,
    mark,
    read_marker,
    row_checksum,
    run_written_after_checksums,
    text_checksum,
)
from specbench.models.machine import NO_BF16_UNITS, Machine, recorded_machine, session_machine

if TYPE_CHECKING:
    import pandas as pd

EXAMPLES = "examples.jsonl"
CELLS = "cells.csv"
RESOLVED_RECIPE = "resolved_recipe.yaml"
ENVIRONMENT = "environment.json"
REJECTED = "examples.rejected"
LOCK = ".specbench.lock"
CELLS_SHA = "cells.sha256"  # the checksum of cells.csv as the run wrote it
# MARKER (checksums.json): that the directory writes checksums, written by this module's writers the
# first time they write one; it lists the rows from before checksums by their checksums
# the layout of rows and keys; a directory written in another layout is refused, never mixed.
# Directories from before the field existed are layout 1.
RESULTS_FORMAT = 1


@dataclass
class BadLine:
    number: int  # 1-based line number in examples.jsonl
    raw: bytes
    why: str


@dataclass
class ExampleLog:
    """Append-only JSONL of example rows, resumable by the rows' ``key``.

    ``repair=True`` (a run that resumes, holding the directory's lock) moves bad lines out of the file;
    otherwise a bad line is a :class:`SpecbenchError` naming it.
    """

    path: Path
    repair: bool = False
    load: bool = True  # False: start empty (a runner reads the file once it holds the lock)
    rows: list[dict] = field(default_factory=list)
    by_key: dict[str, dict] = field(default_factory=dict)
    rejected: list[BadLine] = field(default_factory=list)
    _marked: bool = field(default=False, init=False, repr=False)  # checksums.json written

    def __post_init__(self):
        self.path = Path(self.path)
        if self.load and self.path.exists():
            self._load()

    def _load(self) -> None:
        try:
            data = self.path.read_bytes()
        except OSError as error:
            raise SpecbenchError(str(self.path), f"cannot be read ({error.strerror})") from None
        lines = data.split(b"\n")
        tail = lines.pop()  # b"" when the file ends with a newline; else a line cut short
        good: list[bytes] = []
        first_line_of: dict[str, int] = {}
        before = rows_before_checksums(self.path.parent)
        signed = False  # a row with a checksum was read: every later row was written with one
        after = functools.cache(lambda: run_written_after_checksums(self.path.parent))  # asked once
        for number, raw in enumerate(lines, start=1):
            if not raw.strip():
                continue
            why = _problem(raw)
            row = json.loads(raw) if why is None else None
            if row is not None and CHECKSUM not in row:
                why = _unsigned_problem(row, before, signed, after)
            signed = signed or (row is not None and CHECKSUM in row)
            if row is not None and why is None and row["key"] in first_line_of:
                why = f"repeats the row of line {first_line_of[row['key']]} (key {row['key']})"
            if why is not None:
                self.rejected.append(BadLine(number, raw, why))
                continue
            first_line_of[row["key"]] = number
            good.append(raw)
            self.rows.append(row)
            self.by_key[row["key"]] = row
        if tail.strip():
            self.rejected.append(BadLine(len(lines) + 1, tail, "is cut short (no newline: a killed write)"))
        if not self.rejected:
            return
        if not self.repair:
            bad = self.rejected[0]
            more = f" (and {len(self.rejected) - 1} more)" if len(self.rejected) > 1 else ""
            raise SpecbenchError(
                f"{self.path}: line {bad.number}",
                f"{bad.why}{more}",
                "resume the run (`specbench run RECIPE -o DIR --resume`): it moves bad lines to "
                f"{REJECTED} and computes their rows again",
            )
        with open(self.path.parent / REJECTED, "ab") as handle:
            for bad in self.rejected:
                handle.write(f"# line {bad.number}: {bad.why}\n".encode() + bad.raw + b"\n")
        write_atomic(self.path, b"".join(raw + b"\n" for raw in good).decode())

    @property
    def done(self) -> set[str]:
        return set(self.by_key)

    def mark(self) -> None:
        """Record that the directory writes checksums, and the rows from before them by theirs (a log
        that marks has read its file: the runner's, under the lock); done by the first append."""
        if not self._marked:
            _mark(self.path.parent, rows={r["key"]: row_checksum(r) for r in self.rows if CHECKSUM not in r})
            self._marked = True

    def append(self, row: dict) -> None:
        """Append ``row`` with its checksum (marking the directory first)."""
        self.mark()
        row = {**row, CHECKSUM: row_checksum(row)}
        line = (json.dumps(row, separators=(",", ":")) + "\n").encode()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)  # less the umask
        try:
            written = os.write(fd, line)
            if written != len(line):  # a full disk can take part of a line: take it back
                os.ftruncate(fd, os.fstat(fd).st_size - written)
                raise OSError(28, "No space left on device (a partial row was taken back)")
            os.fsync(fd)
        except OSError as error:
            raise SpecbenchError(
                str(self.path),
                f"cannot append a row ({error.strerror or error})",
                "free space (or fix permissions) and resume with --resume: finished rows are kept",
            ) from None
        finally:
            os.close(fd)
        self.rows.append(row)
        self.by_key[row["key"]] = row


def _problem(raw: bytes) -> str | None:
    """Why ``raw`` is not a result row, or None."""
    try:
        row = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return "is not a JSON row (torn or corrupted)"
    if not isinstance(row, dict) or not isinstance(row.get("key"), str):
        return "is JSON but not a result row (no key)"
    if CHECKSUM in row and row[CHECKSUM] != row_checksum(row):
        return "was edited after it was written (its checksum differs)"
    return None


def _unsigned_problem(row: dict, before: dict[str, str] | None, signed: bool, after) -> str | None:
    """Why a row without a checksum is not one written before checksums, or None. ``before``: the
    directory's record of those rows (None: it has none), ``signed``: an earlier row has a checksum,
    ``after()``: why environment.json says the rows were written since rows carried checksums."""
    if before is not None:
        if row["key"] not in before:
            return (
                f"has no checksum ({CHECKSUM}), though this directory writes one into every row ({MARKER}): "
                "it was edited after it was written"
            )
        if before[row["key"]] != row_checksum(row):
            return f"was edited after it was written (it differs from its checksum in {MARKER})"
        return None
    if signed:
        return (
            f"has no checksum ({CHECKSUM}), though an earlier row has one: it was edited after it was written"
        )
    why = after()
    if why:
        return f"has no checksum ({CHECKSUM}), {why}: it was edited after it was written"
    return None


def rows_before_checksums(directory: Path) -> dict[str, str] | None:
    """Key -> checksum of the rows written before the directory's rows had checksums, where it records
    that its rows have them; None where it does not (a directory from before the record)."""
    marker = read_marker(directory)
    if not marker or not marker.get("row_sha"):
        return None
    return marker.get("rows_before_checksums") or {}


def _mark(directory: Path, rows: dict[str, str] | None = None) -> None:
    """Record that ``directory`` writes cells.sha256 and, given ``rows`` (those from before checksums),
    a checksum into every row; once recorded, never taken back."""
    wanted = {"cells_sha": True}
    if rows is not None and not (read_marker(directory) or {}).get("row_sha"):
        wanted |= {"row_sha": True, "rows_before_checksums": rows}
    mark(directory, wanted)


def write_cells(run_dir: Path, text: str) -> None:
    """cells.csv and beside it its checksum, recorded as written (every reader then names a hand edit)."""
    _mark(run_dir)
    write_atomic(Path(run_dir) / CELLS_SHA, text_checksum(text) + "\n")  # first: a kill between the two
    write_atomic(Path(run_dir) / CELLS, text)  # leaves a mismatch, which a resume rewrites


_SIGNED = re.compile(rb'"' + CHECKSUM.encode() + rb'"\s*:')


def cells_problem(run_dir: Path) -> str | None:
    """Why cells.csv is not what its run wrote, or None: it differs from cells.sha256, or that file is
    gone from a directory that writes it (directories from before checksums have none)."""
    run_dir = Path(run_dir)
    try:
        actual = text_checksum((run_dir / CELLS).read_bytes().decode("utf-8", "replace"))
    except OSError:
        return None  # read_cells_csv names an unreadable file
    try:
        expected = (run_dir / CELLS_SHA).read_text().strip()
    except FileNotFoundError:
        if read_marker(run_dir) is not None:
            return f"has no {CELLS_SHA} beside it, though this directory writes one ({MARKER})"
        try:
            signed = bool(_SIGNED.search((run_dir / EXAMPLES).read_bytes()))
        except OSError:
            signed = False
        if signed:
            return f"has no {CELLS_SHA} beside it, though its run's rows carry checksums (so it wrote one)"
        why = run_written_after_checksums(run_dir)
        return f"has no {CELLS_SHA} beside it, {why}" if why else None
    except (OSError, UnicodeDecodeError):
        return f"cannot be checked: {CELLS_SHA} is unreadable"
    if expected != actual:
        return f"was edited after the run wrote it (it no longer matches {CELLS_SHA})"
    return None


def read_examples(run_dir: Path) -> list[dict]:
    """The rows of a run directory (read only: a bad line is an error naming it)."""
    path = Path(run_dir) / EXAMPLES
    return ExampleLog(path).rows if path.exists() else []


class RunLock:
    """An exclusive ``flock`` on ``DIR/.specbench.lock`` for as long as a run writes ``DIR``; the
    kernel releases it when the process ends, however it ends."""

    def __init__(self, directory: Path):
        self.path = Path(directory) / LOCK
        self.handle = open(self.path, "a+")
        try:
            fcntl.flock(self.handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.handle.seek(0)
            holder = self.handle.read().strip() or "unknown"
            self.handle.close()
            raise SpecbenchError(
                str(directory),
                f"another specbench run (pid {holder}) is writing here",
                "wait for it to finish (or stop it), or choose another --output-dir",
            ) from None
        self.handle.seek(0)
        self.handle.truncate()
        self.handle.write(f"{os.getpid()}\n")
        self.handle.flush()

    def release(self) -> None:
        if not self.handle.closed:
            fcntl.flock(self.handle, fcntl.LOCK_UN)
            self.handle.close()


def check_format(directory: Path) -> None:
    """Refuse a results directory written in another layout than this version's."""
    path = Path(directory) / ENVIRONMENT
    if not path.is_file():
        return
    try:
        found = json.loads(path.read_text()).get("results_format", 1)
    except (OSError, ValueError, AttributeError):
        raise SpecbenchError(
            str(path), "is not a JSON object", "restore it, or delete it (the next run writes it anew)"
        ) from None
    if found != RESULTS_FORMAT:
        raise SpecbenchError(
            str(directory),
            f"holds results in format {found}; this specbench writes format {RESULTS_FORMAT}",
            "run into a new --output-dir, or use the specbench version that wrote it",
        )


def read_environment(directory: Path) -> dict:
    """A run directory's environment.json, or {} when it has none or it is unreadable (reports name
    what they cannot tell; a run rewrites the file)."""
    try:
        data = json.loads((Path(directory) / ENVIRONMENT).read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def machines_of(environment: dict) -> dict[str, Machine]:
    """Every machine that wrote rows into a directory, by id, the directory's own (first) machine
    first."""
    found = {}
    home = recorded_machine(environment)
    if home is not None:
        found[home.id] = home
    for session in environment.get("sessions") or []:
        machine = session_machine(session, environment) if isinstance(session, dict) else None
        if machine is not None and session.get("rows"):
            found.setdefault(machine.id, machine)
    return found


def measured_on(directory: Path, label: str | None = None) -> str:
    """``label: measured on <machine>; smollm2 bfloat16 (auto: this CPU has AMX), eager``: what a
    run's times belong to, from its environment.json (every machine, where rows came from several)."""
    environment = read_environment(directory)
    machines = machines_of(environment)
    where = (
        " and ".join(f"{m.describe()} (machine {key})" for key, m in machines.items())
        if len(machines) > 1
        else next(iter(machines.values())).describe()
        if machines
        else "an unrecorded machine"
    )
    models = []
    for name, model in (environment.get("models") or {}).items():
        if isinstance(model, dict) and model.get("dtype"):
            dtype = str(model["dtype"]).removeprefix("torch.")
            reason = str(model.get("dtype_reason") or "")
            # why dtype: auto chose it, or that a pinned bfloat16 ran without the CPU's bf16 units
            why = f" ({reason})" if reason.startswith("auto") or NO_BF16_UNITS in reason else ""
            models.append(f"{name} {dtype}{why}, {model.get('engine') or 'eager'}")
    return f"{label or directory.name}: measured on {where}" + (f"; {'; '.join(models)}" if models else "")


# the columns every cells.csv has had since the first release; later ones are optional
REQUIRED = ("dataset", "cell")


def read_cells_csv(path: Path) -> pd.DataFrame:
    """One cells.csv, or a one-line error when it is not one (torn, binary, hand-edited)."""
    import pandas as pd

    fix = (
        f"recompute it: `specbench run RECIPE -o {path.parent} --resume` rewrites {CELLS} from examples.jsonl"
    )
    try:
        frame = pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, ValueError) as error:
        first = " ".join(str(error).split())[:100] or type(error).__name__
        raise SpecbenchError(str(path), f"is not a readable CSV ({first})", fix) from None
    missing = [column for column in REQUIRED if column not in frame.columns]
    if missing:
        raise SpecbenchError(str(path), f"has no column {missing[0]!r}: not a specbench {CELLS}", fix)
    problem = cells_problem(path.parent)
    if problem is not None:
        raise SpecbenchError(str(path), problem, fix)
    return frame
