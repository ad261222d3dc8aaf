"""Checksums of result files, and the record that a directory writes them (``checksums.json``).

Rows carry their own checksum (``row_sha``): a JSON row a field, a CSV row a last column; a file written
whole has one beside it (cells.csv: cells.sha256). Readers name a row or file that differs from its
checksum. Deleting the checksums does not switch the check off, because two records say a directory
writes them:

- ``checksums.json``, written with the directory's first checksum (which files carry one, and the rows
  from before checksums by their checksums);
- the sessions in ``environment.json``. Every run and sweep since 2026-11-24 records each of its
  sessions with its start time, and the files began to carry checksums at a known time
  (:data:`RUN_CHECKSUMS_SINCE`, :data:`LOAD_CHECKSUMS_SINCE`). A file without checksums, in a directory
  one of whose sessions wrote it after that time, had them deleted. (A sweep's session is marked
  ``command: load``, so it does not date a run's rows; a resume of a directory from before checksums
  writes checksums.json before its session.)

A directory reads as written before checksums only when neither record says otherwise. The committed
ones under results/ from before checksums have no checksums.json, and every session they record began
before checksums existed (or, in the two oldest, environment.json predates sessions). Time was chosen
over the recorded git commit because every committed run records its sessions' times, while commits
of a dirty tree or an installed copy are not comparable. To pass the check after deleting the
checksums, one must also rewrite environment.json's session history: a forgery, not a deletion.
These are checksums, not signatures: anyone can compute them again.

This sits at the bottom (beside the cache's atomic writer) because the run directory's readers
(pipeline) and the load sweep's (engines) both use it.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
from pathlib import Path

from specbench.errors import SpecbenchError
from specbench.models.cache import write_atomic

CHECKSUM = "row_sha"  # a row's own field (JSON) or last column (CSV): row_checksum of the rest
MARKER = "checksums.json"
ENVIRONMENT = "environment.json"  # written by pipeline.run.environment; read here for its sessions
# when rows (examples.jsonl) and cells.csv began to carry checksums: commit ba86a00
RUN_CHECKSUMS_SINCE = "2026-11-25T12:56:22+00:00"
# when a load sweep's load.csv, load_summary.csv and request lines began to (issue 58); a sweep that an
# older checkout writes after this reads as altered
LOAD_CHECKSUMS_SINCE = "2026-11-28T16:30:00+00:00"
RESTORE = "restore the files (e.g. git checkout -- DIR), or measure again into a new --output-dir"


def row_checksum(row: dict) -> str:
    """The sha256 (first 16 hex digits) of a row's content without its checksum."""
    content = {key: value for key, value in row.items() if key != CHECKSUM}
    canonical = json.dumps(content, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def text_checksum(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def read_marker(directory: Path) -> dict | None:
    """The directory's checksums.json (that it writes checksums), or None where it has none."""
    path = Path(directory) / MARKER
    if not path.exists():
        return None
    try:
        marker = json.loads(path.read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        marker = None
    if not isinstance(marker, dict) or not isinstance(marker.get("rows_before_checksums", {}), dict):
        raise SpecbenchError(
            str(path),
            "is not the checksum record specbench writes (a JSON object)",
            "restore it (e.g. git checkout -- PATH), or run the recipe again into a new --output-dir",
        )
    return marker


def mark(directory: Path, wanted: dict) -> None:
    """Record ``wanted`` (which files carry checksums) in the directory's checksums.json; once
    recorded, never taken back."""
    marker = read_marker(directory) or {}
    if any(marker.get(key) != value for key, value in wanted.items()):
        write_atomic(Path(directory) / MARKER, json.dumps(marker | wanted, indent=1, sort_keys=True) + "\n")


def _sessions_after(directory: Path, since: str, counts) -> str | None:
    """Why environment.json says the directory was written after ``since`` (a session begun then that
    ``counts``), or None where it says nothing of the kind (or there is none: the caller decides); an
    unreadable one is a one-line error naming it."""
    path = Path(directory) / ENVIRONMENT
    if not path.is_file():
        return None
    try:
        environment = json.loads(path.read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        environment = None
    if not isinstance(environment, dict):  # it alone tells whether files without checksums predate them
        raise SpecbenchError(
            str(path),
            "is not readable JSON (corrupted or edited); it records when the directory's files were written",
            "restore it (e.g. git checkout -- PATH), or measure again into a new --output-dir",
        )
    sessions = environment.get("sessions")
    if sessions is None and "results_format" not in environment:
        return None  # environment.json from before sessions were recorded (2026-11-24): older still
    if not isinstance(sessions, list) or not sessions:
        return f"and its {ENVIRONMENT} has lost its sessions"
    if not all(isinstance(session, dict) for session in sessions):
        return f"and its {ENVIRONMENT} is not the record specbench writes"
    later = sorted(
        str(session.get("started"))
        for session in sessions
        if str(session.get("started") or "9999") >= since and counts(session)
    )
    if later:
        return f"though {ENVIRONMENT} records a session of {later[0][:16]}, after they carried checksums"
    return None


def run_written_after_checksums(directory: Path) -> str | None:
    """Why rows and cells.csv without checksums cannot be from before checksums (a session of `run`
    since then: one not marked as a sweep's), or None. A directory with a resolved_recipe.yaml but no
    environment.json lost it: `run` writes both before its first row. (A resume of a directory from
    before checksums records its rows' checksums in checksums.json before its session.)"""
    directory = Path(directory)
    if not (directory / ENVIRONMENT).is_file() and (directory / "resolved_recipe.yaml").is_file():
        return f"though `run` wrote {ENVIRONMENT} before its first row, and it is gone"
    return _sessions_after(directory, RUN_CHECKSUMS_SINCE, lambda session: session.get("command") != "load")


def load_written_after_checksums(directory: Path, columns: list[str]) -> str | None:
    """Why a sweep's files without checksums cannot be from before checksums (any session since
    then), or None. A load.csv with a ``complete`` column (``columns``) was written by a sweep that
    also wrote environment.json. (A resume of a sweep from before checksums writes them before its
    session.)"""
    directory = Path(directory)
    if not (directory / ENVIRONMENT).is_file() and "complete" in columns:
        return f"though the sweep that wrote it (its columns say) also wrote {ENVIRONMENT}, and it is gone"
    return _sessions_after(directory, LOAD_CHECKSUMS_SINCE, lambda session: True)


# -- CSV rows that carry their checksum --------------------------------------------------------------


def _csv_row_checksum(header: list[str], fields: list[str]) -> str:
    """A CSV row's checksum over its header and fields as written (so a reordered column counts)."""
    text = "\x1e".join(["\x1f".join(header), "\x1f".join(fields)])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def sign_csv(text: str) -> str:
    """``text`` (a CSV with a header) with a last column ``row_sha``: each row's checksum."""
    rows = list(csv.reader(io.StringIO(text)))
    if not rows:
        return text
    header, out = rows[0], io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([*header, CHECKSUM])
    for fields in rows[1:]:
        writer.writerow([*fields, _csv_row_checksum(header, fields)])
    return out.getvalue()


def write_signed_csv(path: Path, text: str, marker_key: str) -> None:
    """``text`` with each row's checksum, written atomically, after recording (``marker_key``) that the
    directory's such files carry checksums."""
    mark(Path(path).parent, {marker_key: True})
    write_atomic(path, sign_csv(text))


def verified_csv(path: Path, marker_key: str, written_after) -> str:
    """The text of a CSV written by :func:`write_signed_csv`, without its checksum column, or a
    one-line error naming the row edited since it was written; a CSV without the column must be one
    from before checksums: the directory's checksums.json (``marker_key``) and ``written_after`` (its
    environment.json, given the file's columns) must not say otherwise."""
    path = Path(path)
    text = path.read_bytes().decode("utf-8", "replace")
    try:
        rows = list(csv.reader(io.StringIO(text)))
    except csv.Error as error:  # a NUL byte, a field past the size limit: not a file a sweep wrote
        raise SpecbenchError(str(path), f"is not a readable CSV ({error})", RESTORE) from None
    if not rows:
        return text
    header = rows[0]
    if not header or header[-1] != CHECKSUM:
        why = None
        if (read_marker(path.parent) or {}).get(marker_key):
            why = f"though this directory writes one into every row ({MARKER})"
        why = why or written_after(path.parent, header)
        if why:
            raise SpecbenchError(
                str(path),
                f"has no checksum column ({CHECKSUM}), {why}: it was edited after it was written",
                RESTORE,
            )
        return text
    header = header[:-1]
    for number, fields in enumerate(rows[1:], start=2):
        if not fields:
            continue
        if len(fields) != len(header) + 1 or fields[-1] != _csv_row_checksum(header, fields[:-1]):
            raise SpecbenchError(
                f"{path}: line {number}", "was edited after it was written (its checksum differs)", RESTORE
            )
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    for fields in [header, *(fields[:-1] for fields in rows[1:] if fields)]:
        writer.writerow(fields)
    return out.getvalue()
