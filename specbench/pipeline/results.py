"""Result files of a run directory, written so that a killed run loses and duplicates nothing.

    examples.jsonl         one JSON line per (cell, example), keyed by a content hash
    cells.csv              one tidy row per (dataset, cell), recomputed from examples.jsonl
    resolved_recipe.yaml   the recipe with every default filled in
    environment.json       versions, git hash, device, dtypes, threads, model origins

Each example row is appended with a single ``write`` of a complete line followed by ``fsync``;
a line cut short by a kill is dropped (and trimmed from the file) when the run resumes.
Whole files (CSV, YAML, JSON) are written to a temporary name and renamed into place.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

EXAMPLES = "examples.jsonl"
CELLS = "cells.csv"
RESOLVED_RECIPE = "resolved_recipe.yaml"
ENVIRONMENT = "environment.json"


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


class ExampleLog:
    """Append-only JSONL of example rows, resumable by the rows' ``key``."""

    def __init__(self, path: Path):
        self.path = path
        self.rows: list[dict] = []
        self.by_key: dict[str, dict] = {}
        if path.exists():
            self._load_and_trim()

    def _load_and_trim(self) -> None:
        data = self.path.read_bytes()
        complete = data[: data.rfind(b"\n") + 1]
        if len(complete) != len(data):  # a partial last line from a killed run
            with open(self.path, "r+b") as handle:
                handle.truncate(len(complete))
        for line in complete.decode().splitlines():
            if line.strip():
                self._remember(json.loads(line))

    def _remember(self, row: dict) -> None:
        self.rows.append(row)
        self.by_key[row["key"]] = row

    @property
    def done(self) -> set[str]:
        return set(self.by_key)

    def append(self, row: dict) -> None:
        line = (json.dumps(row, separators=(",", ":")) + "\n").encode()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)
        self._remember(row)


def read_examples(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / EXAMPLES
    return ExampleLog(path).rows if path.exists() else []
