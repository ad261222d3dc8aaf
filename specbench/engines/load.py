"""Engine cells under load: each cell's engine served on 127.0.0.1 (``vllm serve``, ``llama-server``)
and driven by the load client (:mod:`specbench.engines.load_client`) at each level of the recipe's
``load:``; what a sweep directory holds, and how it is read back.

- ``load.csv``: one row per (cell, level, repeat): the level's throughput, latency percentiles, goodput
  and the engine's ``/metrics`` counters differenced around it, written as soon as the level ends, so
  a level already there is not measured again (``--resume``). A row whose server died during its level
  is kept with ``complete`` false; ``--resume`` measures it again.
- ``load_requests.jsonl``: every request of those rows, failed ones included, one JSON line each
  (:func:`~specbench.engines.load_client.request_record`): what the intervals are drawn from, and the
  scheduled arrivals that replay an open-loop level. Lines are appended before their row is written;
  lines without a complete row (a level interrupted between the two) are dropped on reading and
  pruned when a sweep resumes, so a level is never counted twice.

Every row of load.csv and load_summary.csv carries its checksum (a last column ``row_sha``), and so does
every request line (a field), as a run's rows do (:mod:`specbench.models.checksums`): a reader names a
row edited since it was written, and a file whose checksums were deleted, by line.

The server is started, waited for and always stopped (an error, Ctrl-C or SIGTERM included):
:mod:`specbench.engines.process`.
"""

from __future__ import annotations

import functools
import json
import math
import os
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

from specbench.engines.load_client import CLOSED_LOOP, OPEN_LOOP, Endpoint, Level
from specbench.engines.process import EngineProcess
from specbench.errors import SpecbenchError
from specbench.models.cache import write_atomic
from specbench.models.checksums import (
    CHECKSUM,
    MARKER,
    RESTORE,
    load_written_after_checksums,
    mark,
    read_marker,
    row_checksum,
    sign_csv,
    verified_csv,
    write_signed_csv,
)

LOAD_CSV = "load.csv"
LOAD_REQUESTS = "load_requests.jsonl"
LOAD_SUMMARY = "load_summary.csv"
LOAD_PNG = "load.png"
SIGNED = "load_sha"  # checksums.json's record that this directory's sweep files carry checksums
SPEC_COUNTERS = {  # vLLM's; another backend names its own (Backend.load_counters)
    "drafts": "vllm:spec_decode_num_drafts_total",
    "draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
    "accepted": "vllm:spec_decode_num_accepted_tokens_total",
}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Server(EngineProcess):
    """An engine's HTTP server on 127.0.0.1; ready once ``/health`` answers 200."""

    def __init__(self, command: list[str], port: int, where: str, label: str, env: dict | None = None):
        super().__init__(command, where, label, env)
        self.port = port

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    @property
    def endpoint(self) -> Endpoint:
        return Endpoint.local(self.port)

    def gone_within(self, grace: float) -> bool:
        """Whether the server's process exits within ``grace`` seconds (a server that stopped
        answering may be exiting: its sockets close a moment before it is reaped)."""
        try:
            self.process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            return False
        return True

    def death(self) -> tuple[str, str, str]:
        """(what happened to it, its last error, where to read more) for the line that stops a sweep."""
        return f"exited (code {self.process.returncode})", self.last_error(), f"read {self.log_path}"

    def wait_ready(self, timeout: float) -> float:
        """Seconds until the server answered; a one-line error if it exits or never opens the port."""
        started = time.perf_counter()
        while time.perf_counter() - started < timeout:
            if not self.alive():
                error = self.last_error()
                self.stop()
                raise SpecbenchError(
                    self.where,
                    f"the engine's server exited (code {self.process.returncode}) before it opened port "
                    f"{self.port}: {error}",
                    f"read {self.log_path}; fix the cause and run again with --resume",
                )
            try:
                with urllib.request.urlopen(self.url("/health"), timeout=2) as answer:
                    if answer.status == 200:
                        return time.perf_counter() - started
            except OSError:
                pass
            time.sleep(0.5)
        self.stop()
        raise SpecbenchError(
            self.where,
            f"the engine's server did not open port {self.port} in {timeout:.0f} s",
            f"read {self.log_path}; raise engine_options.start_timeout_s, or check the port is free",
        )

    def version(self) -> str | None:
        """The engine's version from its ``/version`` endpoint (None when it has none)."""
        try:
            with urllib.request.urlopen(self.url("/version"), timeout=10) as answer:
                return json.loads(answer.read()).get("version")
        except (OSError, ValueError):
            return None

    def counters(self) -> dict[str, float]:
        """The server's Prometheus counters, summed over label sets."""
        return parse_prometheus(scrape(self.url("/metrics")))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def scrape(url: str, headers: tuple[tuple[str, str], ...] = (), timeout: float = 30) -> str:
    """The text a server's ``/metrics`` answers (an OSError where it answers none or not 200)."""
    request = urllib.request.Request(url, headers=dict(headers))
    with urllib.request.urlopen(request, timeout=timeout) as answer:
        return answer.read().decode(errors="replace")


def parse_prometheus(text: str) -> dict[str, float]:
    """name -> value summed over label sets, from Prometheus' text format."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_labels, _, value = line.rpartition(" ")
        name = name_labels.split("{", 1)[0]
        try:
            out[name] = out.get(name, 0.0) + float(value)
        except ValueError:
            continue
    return out


def read_load(directory: Path) -> list[dict]:
    """The rows of ``DIR/load.csv`` ([] where there is none), or a one-line error naming the file (or
    the row edited since the sweep wrote it)."""
    import io

    import pandas as pd

    path = Path(directory) / LOAD_CSV
    if not path.is_file():
        return []
    fix = "restore it, or measure the sweep again into a new -o"
    try:
        text = read_verified(path)
        frame = pd.read_csv(io.StringIO(text), dtype={"key": str, "machine": str, "cell": str})  # "1e5"
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, ValueError) as error:
        first = " ".join(str(error).split())[:100] or type(error).__name__
        raise SpecbenchError(str(path), f"is not a readable CSV ({first})", fix) from None
    missing = [column for column in ("key", "cell", "concurrency") if column not in frame.columns]
    if missing:
        raise SpecbenchError(str(path), f"has no column {missing[0]!r}: not a specbench {LOAD_CSV}", fix)
    rows = frame.to_dict("records")
    for row in rows:  # a sweep from before repeats and open-loop levels: each level once, complete
        for column, value in (("repeat", 0), ("request_rate", math.nan), ("complete", True)):
            if column not in row or row[column] is None:
                row[column] = value
        row["repeat"] = int(row["repeat"])
        row["complete"] = row["complete"] in (True, "True", "true", 1)
    return rows


def read_verified(path: Path) -> str:
    """A sweep's CSV (load.csv, load_summary.csv) as written, its checksums checked and taken off."""
    try:
        return verified_csv(path, SIGNED, load_written_after_checksums)
    except OSError as error:
        raise SpecbenchError(str(path), f"cannot be read ({error.strerror or error})", RESTORE) from None


def level_of(row: dict) -> Level:
    """The level a load.csv row measured."""
    rate = row.get("request_rate")
    if isinstance(rate, (int, float)) and math.isfinite(rate):
        return Level(OPEN_LOOP, float(rate))
    return Level(CLOSED_LOOP, int(row["concurrency"]))


def write_load(directory: Path, rows: list[dict]) -> Path:
    """load.csv, each row with its checksum, replaced atomically (a killed run never leaves half a
    file)."""
    import pandas as pd

    path = Path(directory) / LOAD_CSV
    write_signed_csv(path, pd.DataFrame(rows).to_csv(index=False), SIGNED)
    return path


def _line(key: str, record: dict) -> str:
    line = {"key": key, **{name: value for name, value in record.items() if name != CHECKSUM}}
    return json.dumps({**line, CHECKSUM: row_checksum(line)}) + "\n"


def append_requests(directory: Path, key: str, records: list[dict]) -> None:
    """A level's request lines, each with its checksum, appended and synced before its load.csv row is
    written."""
    path = Path(directory) / LOAD_REQUESTS
    try:
        with path.open("a") as handle:
            handle.writelines(_line(key, record) for record in records)
            handle.flush()
            os.fsync(handle.fileno())
    except OSError as error:
        raise SpecbenchError(
            str(path), f"cannot be written ({error.strerror or error})", "free space or choose another -o"
        ) from None


def read_requests(directory: Path, keys: set[str]) -> dict[str, list[dict]]:
    """key -> its requests in the order they were sent, for the rows ``keys`` names; a line of another
    key (a level interrupted before its row), or one cut short by a kill, is left out. A line of those
    rows edited since it was written, or without its checksum where the sweep writes them, is a
    one-line error naming it."""
    path = Path(directory) / LOAD_REQUESTS
    out: dict[str, dict[int, dict]] = {}
    if not path.is_file():
        return {}
    unsigned = functools.cache(lambda: _unsigned_why(Path(directory)))  # asked once
    with path.open(errors="replace") as handle:
        for number, line in enumerate(handle, start=1):
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if not isinstance(record, dict) or record.get("key") not in keys:
                continue
            signed, written = CHECKSUM in record, record.pop(CHECKSUM, None)
            if signed and written != row_checksum(record):
                edited = "was edited after it was written (its checksum differs)"
                raise SpecbenchError(f"{path}: line {number}", edited, RESTORE)
            if not signed and unsigned():
                raise SpecbenchError(
                    f"{path}: line {number}",
                    f"has no checksum ({CHECKSUM}), {unsigned()}: it was edited after it was written",
                    RESTORE,
                )
            out.setdefault(record["key"], {})[int(record["index"])] = record  # the last one counts
    return {key: [by[i] for i in sorted(by)] for key, by in out.items()}


def _unsigned_why(directory: Path) -> str | None:
    """Why request lines without checksums cannot be from before checksums, or None."""
    if (read_marker(directory) or {}).get(SIGNED):
        return f"though this directory writes one into every line ({MARKER})"
    return load_written_after_checksums(directory, _columns(directory))


def _columns(directory: Path) -> list[str]:
    """load.csv's header ([] where there is none)."""
    try:
        with (Path(directory) / LOAD_CSV).open(errors="replace") as handle:
            return handle.readline().strip().split(",")
    except OSError:
        return []


def prune_requests(directory: Path, keys: set[str]) -> None:
    """Rewrite load_requests.jsonl with the lines of ``keys`` only (before a resume measures again),
    each with its checksum."""
    path = Path(directory) / LOAD_REQUESTS
    if not path.is_file():
        return
    kept = read_requests(directory, keys)
    write_atomic(path, "".join(_line(key, record) for key in kept for record in kept[key]))


def adopt(directory: Path, keys: set[str]) -> None:
    """Before a sweep's session is recorded (environment.json): the request lines of ``keys`` and
    load.csv written again with their checksums (a sweep from before them is adopted as it reads),
    then checksums.json records that the directory's sweep files carry them. In this order a kill
    at any point leaves files every reader still accepts."""
    directory = Path(directory)
    prune_requests(directory, keys)
    path = directory / LOAD_CSV
    if path.is_file():
        write_atomic(path, sign_csv(read_verified(path)))
    mark(directory, {SIGNED: True})


REFERENCE_FILE = "load_reference.jsonl"  # the engine's batch-1 outputs (pipeline.experiments.load_reference)


def read_references(out: Path) -> dict[str, dict[int, dict]]:
    """target -> prompt index -> its reference line (the last of each), from load_reference.jsonl. Every
    line carries its checksum (the file is younger than checksums): one edited, or stripped of it, is a
    one-line error naming it, since a changed reference would re-class every output checked against it."""
    path = Path(out) / REFERENCE_FILE
    found: dict[str, dict[int, dict]] = {}
    if not path.is_file():
        return found
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), start=1):
        try:
            record = json.loads(line)
            target, prompt = str(record["target"]), int(record["prompt"])
        except (ValueError, KeyError, TypeError):
            continue  # a line cut short by a kill
        written = record.pop(CHECKSUM, None)
        if written != row_checksum(record):
            why = (
                "has no checksum"
                if written is None
                else "was edited after it was written (its checksum differs)"
            )
            raise SpecbenchError(f"{path}: line {number}", why, RESTORE)
        found.setdefault(target, {})[prompt] = record
    return found
