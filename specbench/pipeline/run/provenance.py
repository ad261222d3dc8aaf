"""Whether a result directory still is what today's code measures (``specbench check``).

A committed run goes stale silently when the code under it changes: a method's revision or a default
changes the cells' fingerprints, a recipe key stops validating, a drafter is retrained. This module
re-reads a directory's ``resolved_recipe.yaml`` under today's code and asks, after checking its files
as every reader does (each row against its checksum, cells.csv against cells.sha256: an altered
directory is never accepted, whatever it declares), four things:

* does the recipe still validate;
* does it still key every recorded row as the row is keyed (``Runner.stale_rows``: the same check a
  resume makes), and which of its rows were never measured;
* were its trained models (distilled drafters, heads) trained as today's are: environment.json
  records each one's training digest (``sources.identity``, of ``Source.trained_in``), compared with
  the local copy where there is one (a machine without the drafters cannot tell, and says so).
* are its published heads (``eagle3:``, ``eagle1:``, ``medusa-heads:``) the files now at their source:
  environment.json records each one's digest (:mod:`specbench.pipeline.run.head_identity`).

A directory kept on purpose although stale says so in ``PROVENANCE.md``: the commit that made it and
why it stays. Only the directory's files are read; nothing is measured or written.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch
from rich.console import Console

from specbench import sources
from specbench.engines.load import (
    LOAD_CSV,
    LOAD_SUMMARY,
    read_load,
    read_references,
    read_requests,
    read_verified,
)
from specbench.errors import SpecbenchError
from specbench.pipeline.records.results import CELLS, EXAMPLES, RESOLVED_RECIPE, ExampleLog, read_cells_csv
from specbench.pipeline.run.head_identity import head_changes
from specbench.recipe import load_recipe

PROVENANCE = "PROVENANCE.md"
COMMIT = re.compile(r"\b[0-9a-f]{7,40}\b")


@dataclass
class Finding:
    directory: Path
    problems: list[str] = field(default_factory=list)  # why today's code would not produce it
    notes: list[str] = field(default_factory=list)  # what is incomplete, or could not be checked here
    declared: str = ""  # PROVENANCE.md's first line: which commit made it, and why it is kept
    altered: list[str] = field(default_factory=list)  # what readers refuse: an edit, a deleted checksum

    @property
    def stale(self) -> bool:
        """Stale by today's code, or declared stale (a change the check cannot see, e.g. a drafter
        retrained before runs recorded their drafters' training)."""
        return bool(self.altered or self.problems or self.declared)

    @property
    def accepted(self) -> bool:
        """Current, or stale with a declaration that names the commit that made it (never altered)."""
        return not self.altered and (not self.stale or bool(COMMIT.search(self.declared)))


def result_directories(results: Path) -> list[Path]:
    """Every result directory below ``results`` (or ``results`` itself): those holding examples.jsonl
    (a run) or load.csv (a load sweep)."""
    results = Path(results)
    if (results / EXAMPLES).is_file() or (results / LOAD_CSV).is_file():
        return [results]
    found = sorted({path.parent for name in (EXAMPLES, LOAD_CSV) for path in results.rglob(name)})
    if not found:
        raise SpecbenchError(
            str(results), f"holds no run directory ({EXAMPLES} or {LOAD_CSV})", "name a run's directory"
        )
    return found


def check_run(directory: Path) -> Finding:
    from specbench.pipeline.run.runner import Runner, name_cells

    directory = Path(directory)
    finding = Finding(directory)
    declaration = directory / PROVENANCE
    if declaration.is_file():
        lines = [line.strip() for line in declaration.read_text().splitlines() if line.strip()]
        finding.declared = lines[0].lstrip("# ") if lines else ""
    finding.altered = _altered(directory)
    if finding.altered:  # its rows cannot be read as rows: nothing more to ask of them
        _check_models(directory, finding)
        return finding
    if not (directory / EXAMPLES).is_file():  # a load sweep alone: its files are what can be checked
        finding.notes.append(f"a load sweep ({LOAD_CSV}): its files are checked, its rows not keyed again")
        return finding
    recipe_path = directory / RESOLVED_RECIPE
    if not recipe_path.is_file():
        finding.problems.append(f"has no {RESOLVED_RECIPE}: nothing says how its rows were made")
        return finding
    threads = torch.get_num_threads()  # a runner takes the recipe's threads: reading must not
    try:
        recipe = load_recipe(recipe_path)
        recipe.pin_auto_dtypes(_recorded_dtypes(directory))
        runner = Runner(recipe, directory, resume=True, console=Console(stderr=True, quiet=True))
        stray, missing = runner.stale_rows()
    except SpecbenchError as error:
        finding.problems.append(f"its recipe does not run under today's code: {error}")
    else:
        if stray:
            finding.problems.append(
                f"{len(stray)} row(s) are keyed otherwise under today's code ({name_cells(stray)}): "
                "a method's revision, a default or a model entry changed since they were measured"
            )
        if missing:
            finding.notes.append(f"{missing} row(s) of its recipe were never measured (a --limit run?)")
    finally:
        torch.set_num_threads(threads)
    _check_models(directory, finding)
    return finding


def _altered(directory: Path) -> list[str]:
    """What ``report``, ``plot`` and a resume would refuse in the directory's files: a row, cells.csv
    or a sweep's file edited since it was written, a checksum of a directory that writes them deleted
    (or a torn line)."""
    found = []
    readers = [lambda: ExampleLog(directory / EXAMPLES)]
    if (directory / CELLS).is_file():
        readers.append(lambda: read_cells_csv(directory / CELLS))
    if (directory / LOAD_CSV).is_file():  # a sweep's rows, then their request lines (as plot reads them)
        readers.append(lambda: read_requests(directory, {str(row["key"]) for row in read_load(directory)}))
    if (directory / LOAD_SUMMARY).is_file():
        readers.append(lambda: read_verified(directory / LOAD_SUMMARY))
    readers.append(lambda: read_references(directory))  # load_reference.jsonl, where there is one
    for read in readers:
        try:
            read()
        except SpecbenchError as error:
            found.append(f"{error.where}: {error.problem}")
    return found


def _recorded_dtypes(directory: Path) -> dict[str, str]:
    """Model -> the dtype it ran in, as environment.json records it ("torch.bfloat16" -> "bfloat16")."""
    try:
        models = json.loads((directory / "environment.json").read_text()).get("models") or {}
    except (OSError, ValueError):
        return {}
    return {
        name: str(info["dtype"]).removeprefix("torch.")
        for name, info in models.items()
        if isinstance(info, dict) and info.get("dtype")
    }


def _check_models(directory: Path, finding: Finding) -> None:
    try:
        models = json.loads((directory / "environment.json").read_text()).get("models") or {}
    except (OSError, ValueError):
        finding.notes.append("no readable environment.json: its models' training is not checked")
        return
    changed, unknown = head_changes(models)
    finding.problems += [f"{head.describe()}: its rows predate the head there now" for head in changed]
    finding.notes += unknown
    for name, info in models.items():
        source = str(info.get("source") or "")
        try:
            trained = sources.source_of(source).trained_in is not None
            today = sources.identity(source)
        except SpecbenchError:
            continue
        if not trained:
            continue
        recorded = info.get("identity")
        if recorded is None:
            finding.notes.append(f"model {name} ({source}): its training was not recorded (an older run)")
        elif today is None:
            finding.notes.append(f"model {name} ({source}): no local copy to compare its training with")
        elif recorded != today:
            finding.problems.append(
                f"model {name} ({source}) was trained otherwise than the local copy (training digest "
                f"{recorded}, today {today}): its rows predate the current drafter"
            )
