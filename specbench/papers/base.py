"""What every paper view shares (``specbench report RUN --paper NAME``): runs, views, the caption.

A paper (:class:`Paper`) names itself, loads its transcribed reference numbers, turns the runs read
from result files into views (tables of display rows with notes) and tidy rows (the csv format),
and names the models it used, for the caption. This module renders any paper's views as a Rich
table, markdown or csv; it never imports a paper (the ``--paper`` names are in
:mod:`specbench.papers.registry`). For each paper row "ours" is usually the best of the run's
matching cells (:func:`best`), with :data:`MISSING` where the run has no such cell.

Like the rest of the report this reads only result files, never models or the decoding code.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import yaml
from rich.console import Console
from rich.table import Table
from rich.text import Text

from specbench.errors import SpecbenchError
from specbench.pipeline.analysis.statistics import paired_bootstrap_ratio
from specbench.pipeline.analysis.summary import swi_terms
from specbench.pipeline.records.results import CELLS, read_examples
from specbench.pipeline.views.report import load_cells

FORMATS = ("table", "markdown", "csv")
MISSING = "—"
# columns the table format aligns left (names and settings); every other column holds numbers
TEXT_COLUMNS = ("Dataset", "Algorithm", "{M_di}", "K00", "Run", "Method", "Setting", "paper row")


# -- the run -----------------------------------------------------------------------------------


@dataclass
class Run:
    name: str
    directory: Path
    cells: pd.DataFrame
    sources: dict[str, str] = field(default_factory=dict)  # recipe model name -> source
    environment: dict[str, dict] = field(default_factory=dict)  # environment.json "models"

    def source(self, name: str) -> str:
        """A recipe model's source: the resolved recipe's, else environment.json's, else ""."""
        return self.sources.get(name) or self.environment.get(name, {}).get("source") or ""

    def target_source(self) -> str:
        targets = self.cells["target"].dropna().unique() if "target" in self.cells else []
        return ", ".join(self.source(t) or t for t in targets)


def load_runs(results: Path) -> list[Run]:
    """Every run below ``results`` (one run directory, or a folder of them) with its model sources."""
    results = Path(results)
    cells = load_cells(results)
    runs = []
    for name, frame in cells.groupby("run", sort=False):
        directory = results if (results / CELLS).is_file() else results / str(name)
        run = Run(str(name), directory, frame.reset_index(drop=True))
        recipe = directory / "resolved_recipe.yaml"
        fix = "restore it (e.g. git checkout), or delete it: a run resumed there writes it again"
        if recipe.is_file():
            try:
                models = (yaml.safe_load(recipe.read_text()) or {}).get("models") or {}
                run.sources = {m: str(spec.get("source", "")) for m, spec in models.items()}
            except (yaml.YAMLError, UnicodeDecodeError, AttributeError):
                raise SpecbenchError(str(recipe), "is not a readable resolved recipe", fix) from None
        environment = directory / "environment.json"
        if environment.is_file():
            try:
                run.environment = json.loads(environment.read_text()).get("models") or {}
            except (ValueError, UnicodeDecodeError, AttributeError):
                raise SpecbenchError(
                    str(environment), "is not readable JSON (corrupted or edited)", fix
                ) from None
        runs.append(run)
    return runs


# -- views and papers ----------------------------------------------------------------------------


@dataclass
class View:
    title: str
    rows: list[dict]  # display rows: column -> text
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Paper:
    """One ``--paper NAME`` view: what a paper folder implements (see :mod:`specbench.papers`)."""

    name: str  # the --paper name
    build: Callable[[list[Run]], tuple[list[View], list[dict]]]  # runs -> (views, tidy rows)
    reference: Callable[[], dict]  # the paper's transcribed numbers (its reference.yaml)
    target: str  # the paper's target model, as captions name it
    target_names: tuple[str, ...]  # a run's target counts as the paper's if its name starts so
    help: str  # what the view shows, as --paper's help lists it

    def is_target(self, sources: str) -> bool:
        """Whether every target of a run (comma-separated sources) is the paper's model."""
        names = [s.strip().rstrip("/").rsplit("/", 1)[-1].lower() for s in sources.split(",") if s.strip()]
        return bool(names) and all(name.startswith(self.target_names) for name in names)

    def caption(self, run: Run) -> list[str]:
        """Which models this run used, and a warning when they are not the paper's."""
        if run.environment:
            models = [
                f"{name} = {info.get('source')} ({_size(info.get('parameters'))}"
                + "".join(f", {info[key]}" for key in ("dtype", "device") if info.get(key))
                + ")"
                for name, info in run.environment.items()
            ]
        elif run.sources:
            models = [f"{name} = {source}" for name, source in run.sources.items()]
        else:
            models = [f"unknown (no environment.json or resolved_recipe.yaml in {run.directory})"]
        lines = [f"Run {run.name} used: " + "; ".join(models) + "."]
        target = run.target_source()
        if not self.is_target(target):
            lines.append(
                f"Not the paper's models (its target is {self.target}, this run's {target or 'unknown'}): "
                "compare the shape of the table, not its numbers."
            )
        return lines


def paired_interval(runs: list[Run], a: dict, b: dict, measure: str) -> tuple[float, float]:
    """The paired bootstrap interval (95%) of measure(a) / measure(b), two cells of ``cells.csv``, over
    the prompts both ran (their example rows, paired by example id); ``measure``: an SWI cost table
    ("ms", "pw") or "tokens_per_s"; (NaN, NaN) with fewer than two prompts."""
    directories = {run.name: run.directory for run in runs}
    first, second = (_terms(directories[c["run"]], c["dataset"], c["cell"], measure) for c in (a, b))
    shared = [example for example in first if example in second]
    if len(shared) < 2:
        return math.nan, math.nan
    num_a, den_a = zip(*(first[e] for e in shared), strict=True)
    num_b, den_b = zip(*(second[e] for e in shared), strict=True)
    return paired_bootstrap_ratio(num_a, den_a, num_b, den_b)


def _terms(directory: Path, dataset: str, cell: str, measure: str) -> dict[str, tuple[float, float]]:
    """example id -> (numerator, denominator) of one cell's ``measure``, from the run's example rows."""
    rows = [r for r in _examples(directory) if r.get("dataset") == dataset and r.get("cell") == cell]
    if measure == "tokens_per_s":
        return {r["example_id"]: (r["n_tokens"], r["walltime"]) for r in rows if not r.get("replayed")}
    return {r["example_id"]: swi_terms(r, measure) for r in rows if r.get("costs")}


@functools.lru_cache(maxsize=8)
def _examples(directory: Path) -> list[dict]:
    return read_examples(directory)


def best(frame: pd.DataFrame, metric: str) -> dict | None:
    """The row with the highest ``metric`` (NaN ignored), or None."""
    if frame.empty or metric not in frame:
        return None
    values = pd.to_numeric(frame[metric], errors="coerce")
    if values.isna().all():
        return None
    return frame.loc[values.idxmax()].to_dict()


# -- rendering -----------------------------------------------------------------------------------


def render(results: Path, paper: Paper, fmt: str = "table", console: Console | None = None) -> str | None:
    """Print (fmt ``table``) or return (``markdown``, ``csv``) a paper's table beside a run's cells."""
    if fmt not in FORMATS:
        raise SpecbenchError(
            "--format", f"the paper view has no format {fmt!r}", f"use one of {', '.join(FORMATS)}"
        )
    runs = load_runs(results)
    views, tidy = paper.build(runs)
    captions = [line for run in runs for line in paper.caption(run)]
    if fmt == "csv":
        return pd.DataFrame(tidy).to_csv(index=False)
    if fmt == "markdown":
        blocks = [f"### {view.title}\n\n{markdown(view.rows)}\n\n" + "\n".join(view.notes) for view in views]
        return "\n\n".join(blocks) + "\n\n" + "\n".join(f"**{line}**" for line in captions)
    if console is None:
        console = Console()
        if not console.is_terminal:  # piped or captured: do not squeeze the table into 80 columns
            console = Console(width=220)
    for view in views:
        if not view.rows:  # a view with nothing to show here still says why (its notes)
            console.print(view.title, style="bold", markup=False, highlight=False)
        table = Table(title=view.title, title_justify="left")
        for column in view.rows[0] if view.rows else []:
            text = column in TEXT_COLUMNS or "setting" in column
            table.add_column(column, justify="left" if text else "right")
        for row in view.rows:
            table.add_row(*(Text(value) for value in row.values()))  # Text: no markup in [[2,10],...]
        if view.rows:
            console.print(table)
        for note in view.notes:
            console.print(note, style="dim", markup=False, highlight=False)
    for line in captions:
        console.print(line, style="bold", markup=False, highlight=False)
    return None


# -- formatting ----------------------------------------------------------------------------------


def markdown(rows: list[dict]) -> str:
    """Display rows as a markdown table (the columns of the first row); "(no rows)" for none."""
    if not rows:
        return "(no rows)"
    columns = list(rows[0])
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    lines += ["| " + " | ".join(str(row[c]) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


def num(value, digits: int = 2, unit: str = "") -> str:
    """A number with ``digits`` decimals and ``unit`` after it; :data:`MISSING` for NaN or no number."""
    try:
        value = float(value)
    except (TypeError, ValueError):
        return MISSING
    return MISSING if math.isnan(value) else f"{value:.{digits}f}{unit}"


def pass_ms(cell: dict | None, model: str) -> float:
    """A model's mean pass time in milliseconds in a cells.csv row (its ``pass_ms`` JSON); NaN where
    the row has none."""
    if cell is None or not isinstance(cell.get("pass_ms"), str):
        return math.nan
    return float(json.loads(cell["pass_ms"]).get(model, math.nan))


def decode_pass_ms(cell: dict | None, model: str) -> float:
    """A model's mean pass time in milliseconds without the prompts' prefill (``decode_pass_ms``);
    NaN where the row has none (runs from before the prefill was timed apart)."""
    if cell is None or not isinstance(cell.get("decode_pass_ms"), str):
        return math.nan
    return float(json.loads(cell["decode_pass_ms"]).get(model, math.nan))


def num_interval(record: dict | None, column: str) -> str:
    """``0.65 [0.60, 0.70]``: a cell's value and its bootstrap interval (``cells.csv``'s
    ``<column>_low`` and ``_high``); the value alone where the interval is missing."""
    if not record:
        return MISSING
    value, low, high = (num(record.get(f"{column}{end}")) for end in ("", "_low", "_high"))
    return f"{value} [{low}, {high}]" if MISSING not in (value, low, high) else value


def _size(parameters) -> str:
    if not parameters:
        return "statistical" if parameters == 0 else "? parameters"
    for scale, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if parameters >= scale:
            value = parameters / scale
            return f"{value:.1f}{unit}" if value < 10 else f"{value:.0f}{unit}"
    return str(parameters)
