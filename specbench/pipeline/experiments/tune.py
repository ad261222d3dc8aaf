"""Successive halving over a recipe's grids: the search behind CS Drafting's k11, k12, k22 and l.

For every method with a grid and every dataset, independently: evaluate each grid cell on the
first ``start`` examples, keep the better half by SWI (ratio of sums under one cost table), double
the examples and repeat, until one cell is left or every example was used (or ``rounds`` ran out);
the best cell of the last round wins. Greedy lossless cells replay the target
(:mod:`specbench.models.replay`), so the whole search costs one autoregressive run of the target on
the examples it used, plus drafter passes and the ``replay_check`` examples each cell runs live.

The :class:`~specbench.pipeline.run.runner.Runner` evaluates. A cell's rows on 4 examples are the first of its
rows on 8 (rows are keyed by content), so each round runs only the new examples, and the output
directory is an ordinary resumable run directory, with ``tune.csv`` and ``best.yaml`` beside
``cells.csv``. tune.csv has one row per evaluation: dataset, method, cell, params (the grid point),
round, examples, swi_ms, swi_pw, acceptance_length, replayed, kept (goes on to the next round, or
wins the last). best.yaml maps method -> dataset -> the winner's params (the method's own params
plus the grid point: what to write as its ``params:``), cell, SWI, acceptance length and examples.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import yaml
from rich.console import Console
from rich.table import Table
from rich.text import Text

from specbench.errors import SpecbenchError
from specbench.methods import BASELINE
from specbench.pipeline.analysis.summary import summarise_cell, write_cells_csv
from specbench.pipeline.records.results import write_atomic
from specbench.pipeline.run.datasets import DatasetRun
from specbench.pipeline.run.runner import Runner
from specbench.recipe import Cell, MethodSpec, Recipe, replay_problem

TUNE_CSV = "tune.csv"
BEST_YAML = "best.yaml"
TABLES = ("ms", "pw")


@dataclass
class Search:
    """The halving of one method's grid on one dataset."""

    spec: MethodSpec
    dataset: DatasetRun
    survivors: list[Cell]
    best: dict | None = None  # the winner's evaluation (a tune.csv row), once decided
    winner: Cell | None = None


def prepare(recipe: Recipe) -> Recipe:
    """The recipe a tune runs: an autoregressive method for every tuned target that lacks one (greedy
    cells replay its output) and no warm-up (a tune compares counts, never time)."""
    methods = list(recipe.methods)
    names = {spec.name for spec in methods}
    if recipe.generation.temperature == 0:
        for target in dict.fromkeys(spec.target for spec in recipe.methods if spec.grid):
            if not any(s.method == BASELINE and s.target == target for s in methods):
                name = "ar" if "ar" not in names else f"ar-{target}"
                names.add(name)
                methods.append(MethodSpec(name=name, method=BASELINE, target=target))
    return recipe.model_copy(update={"methods": methods, "warmup": 0})


def grid_cells(recipe: Recipe, spec: MethodSpec) -> list[Cell]:
    """The cells of ``spec``'s grid, each replaying the target where that is exact."""
    cells = [cell for cell in recipe.cells() if cell.method_name == spec.name]
    return [
        dataclasses.replace(cell, replay=True) if replay_problem(recipe, spec, cell.params) is None else cell
        for cell in cells
    ]


def tune(
    recipe: Recipe,
    output_dir: Path,
    *,
    table: str = "ms",
    rounds: int | None = None,
    start: int = 4,
    resume: bool = False,
    console: Console | None = None,
) -> tuple[pd.DataFrame, dict]:
    """Halve every grid of ``recipe`` on every dataset; write tune.csv and best.yaml to ``output_dir``.

    Returns (every evaluation, as in tune.csv; the winners, as in best.yaml)."""
    if table not in TABLES:
        raise SpecbenchError(
            "--table", f"unknown cost table {table!r}", "use ms (model size) or pw (prior work)"
        )
    tuned = [spec for spec in recipe.methods if spec.grid]
    if not tuned:
        raise SpecbenchError(
            f"{recipe.path}: methods",
            "no method has a grid, so there is nothing to tune",
            "give a method a grid, e.g. grid: {K: [[[2, 4], [0, 1]], [[5, 9], [0, 1]]], lenience: [1, 3]}",
        )
    console = console or Console(stderr=True)
    recipe = prepare(recipe)
    runner = Runner(recipe, output_dir, resume=resume, console=console, schedule="by-cell")
    references = [cell for cell in recipe.cells() if cell.method == BASELINE]
    searches = [
        Search(spec, dataset, grid_cells(recipe, spec))
        for dataset in runner.datasets()
        if dataset.examples
        for spec in tuned
    ]
    metric = f"swi_{table}"
    records: list[dict] = []
    evaluated: dict[tuple[str, str], tuple[DatasetRun, Cell]] = {}  # (dataset, cell id) -> its last run
    round_ = 0
    while active := [search for search in searches if search.best is None]:
        subsets = {
            s.dataset.label: dataclasses.replace(s.dataset, examples=s.dataset.examples[: start * 2**round_])
            for s in active
        }
        plan = _plan(active, subsets, references)
        cells = sum(len(s.survivors) for s in active)
        console.print(
            f"[bold]tune round {round_ + 1}[/bold]: {cells} cells on "
            + ", ".join(f"{len(subset.examples)} examples of {label}" for label, subset in subsets.items())
        )
        runner.run(plan)
        for search in active:
            subset = subsets[search.dataset.label]
            scored = []
            for cell in search.survivors:
                evaluated[subset.label, cell.id] = subset, cell
                scored.append(_record(search, cell, runner.rows(subset, cell), round_ + 1))
            ranked = sorted(scored, key=lambda r: -r[metric] if not math.isnan(r[metric]) else math.inf)
            last = len(subset.examples) == len(search.dataset.examples) or round_ + 1 == rounds
            keep = 1 if last else math.ceil(len(ranked) / 2)
            for position, record in enumerate(ranked):
                record["kept"] = position < keep
            survivors = {r["cell"] for r in ranked[:keep]}
            search.survivors = [cell for cell in search.survivors if cell.id in survivors]
            if keep == 1:
                search.best, search.winner = ranked[0], search.survivors[0]
            records.extend(scored)
        _print_round(console, [r for r in records if r["round"] == round_ + 1], metric)
        round_ += 1

    frame = pd.DataFrame(records)
    output_dir = Path(output_dir)
    write_atomic(output_dir / TUNE_CSV, frame.to_csv(index=False))
    best = _best(searches)
    write_atomic(output_dir / BEST_YAML, best_yaml(best, recipe, table))
    # cells.csv: every evaluated cell on the most examples it ran on, after the AR cells on as many
    runs: dict[str, DatasetRun] = {}
    for subset, _ in evaluated.values():  # per dataset, the most examples any cell ran on
        if len(subset.examples) >= len(runs.get(subset.label, subset).examples):
            runs[subset.label] = subset
    rows = [row for label, subset in runs.items() for cell in references for row in runner.rows(subset, cell)]
    rows += [row for subset, cell in evaluated.values() for row in runner.rows(subset, cell)]
    write_cells_csv(output_dir, rows)
    return frame, best


def _plan(active: list[Search], subsets: dict[str, DatasetRun], references: list[Cell]):
    """One round for the Runner: per dataset, the AR cells that replayed cells need, then the survivors."""
    by_dataset: dict[str, list[Cell]] = defaultdict(list)
    for search in active:
        by_dataset[search.dataset.label] += search.survivors
    plan = []
    for label, cells in by_dataset.items():
        replayed = {cell.target for cell in cells if cell.replay}
        needed = [cell for cell in references if cell.target in replayed]
        plan.append((subsets[label], needed + cells))
    return plan


def _record(search: Search, cell: Cell, rows: list[dict], round_: int) -> dict:
    summary = summarise_cell(rows)
    return {
        "dataset": search.dataset.label,
        "method": search.spec.name,
        "cell": cell.id,
        "params": json.dumps({key: cell.params[key] for key in cell.grid_keys}, separators=(",", ":")),
        "round": round_,
        "examples": len(rows),
        "swi_ms": summary["swi_ms"],
        "swi_pw": summary["swi_pw"],
        "acceptance_length": summary["acceptance_length"],
        "replayed": cell.replay,
        "kept": False,
    }


def _best(searches: list[Search]) -> dict:
    """{method: {dataset: {params, cell, swi_ms, swi_pw, acceptance_length, examples, rounds}}}."""
    best: dict[str, dict] = defaultdict(dict)
    for search in searches:
        winner, cell = search.best, search.winner
        # what to paste as the method's params: its own params plus the winning grid point
        params = {key: cell.params[key] for key in (*search.spec.params, *cell.grid_keys)}
        best[search.spec.name][search.dataset.label] = {
            "params": params,
            "cell": winner["cell"],
            "swi_ms": round(float(winner["swi_ms"]), 4),
            "swi_pw": round(float(winner["swi_pw"]), 4),
            "acceptance_length": round(float(winner["acceptance_length"]), 4),
            "examples": winner["examples"],
            "rounds": winner["round"],
        }
    return dict(best)


class _Flow(dict):
    """A mapping written on one line (params: {K: [[2, 4], [0, 1]], lenience: 3.0})."""


class _Dumper(yaml.SafeDumper):
    pass


_Dumper.add_representer(
    _Flow, lambda dumper, data: dumper.represent_mapping("tag:yaml.org,2002:map", data, True)
)


def best_yaml(best: dict, recipe: Recipe, table: str) -> str:
    data = {
        method: {label: {**entry, "params": _Flow(entry["params"])} for label, entry in datasets.items()}
        for method, datasets in best.items()
    }
    header = (
        f"# specbench tune {recipe.path}: the best cell of each method's grid per dataset by SWI\n"
        f"# ({table}), found by successive halving. To run one, set the method's params: to its params\n"
        "# and drop its grid:.\n"
    )
    return header + yaml.dump(data, Dumper=_Dumper, sort_keys=False, default_flow_style=False)


def _print_round(console: Console, records: list[dict], metric: str) -> None:
    """One table per dataset: the round's cells, best first, and which go on."""
    for dataset in dict.fromkeys(r["dataset"] for r in records):
        table = Table(title=f"{dataset}, round {records[0]['round']}", title_justify="left")
        for column in ("cell", "n", "SWI MS", "SWI PW", "acc. len", "replayed", "kept"):
            table.add_column(column, justify="left" if column == "cell" else "right")
        mine = [r for r in records if r["dataset"] == dataset]
        for r in sorted(mine, key=lambda r: (r["method"], not r["kept"], -r[metric])):
            table.add_row(
                Text(r["cell"]),  # plain text: "sd[k=4]" is no markup
                str(r["examples"]),
                f"{r['swi_ms']:.3f}",
                f"{r['swi_pw']:.3f}",
                f"{r['acceptance_length']:.2f}",
                "yes" if r["replayed"] else "no",
                "kept" if r["kept"] else "",
            )
        console.print(table)
