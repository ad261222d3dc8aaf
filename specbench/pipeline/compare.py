"""Runs side by side (``specbench compare RUN_A RUN_B ...``): the same cells, matched on dataset and
cell id, with each run's tokens/s, speedup over its own AR cell, SWI MS, acceptance length, and its
tokens/s over the first run's.

Everything comes from the runs' cells.csv, read and formatted as ``specbench report`` does: a
speedup or SWI with its bootstrap interval where the file has one (``<column>_low`` / ``_high``,
written since the intervals exist), the value alone in older files. A cell that a run lacks, and a
value a run did not measure (a replayed cell's tokens/s), shows "—".
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import yaml
from rich.console import Console

from specbench.errors import SpecbenchError
from specbench.pipeline.environment import machines_of, read_environment
from specbench.pipeline.report import display_frame, emit, load_cells, measured_on
from specbench.pipeline.results import CELLS, RESOLVED_RECIPE

MISSING = "—"
# (column of the report's display frame, its name here)
SHOWN = (("tok/s", "tok/s"), ("speedup", "speedup"), ("SWI MS", "SWI MS"), ("acc. len", "acc. len"))


def load_run(path: Path) -> pd.DataFrame:
    """cells.csv of one run directory (not a folder of runs), or a one-line error."""
    path = Path(path)
    if not path.is_dir():
        raise SpecbenchError(
            str(path),
            "no such run directory",
            f"pass run directories written by `specbench run` (each holds {CELLS})",
        )
    cells = load_cells(path)
    runs = sorted(set(cells["run"]))
    if len(runs) > 1:
        raise SpecbenchError(
            str(path),
            f"holds {len(runs)} run directories ({', '.join(runs)}), not one run",
            f"name the run directories themselves, e.g. specbench compare {path / runs[0]} {path / runs[1]}",
        )
    return cells


def labels(paths: list[Path]) -> list[str]:
    """Each run's name in the table: its folder's name, or the path as given where names repeat."""
    names = [Path(p).name or str(p) for p in paths]
    return [name if names.count(name) == 1 else str(p) for name, p in zip(names, paths, strict=True)]


def compare_frame(runs: list[tuple[str, pd.DataFrame]]) -> pd.DataFrame:
    """One row per (dataset, cell) of any run, in the first run's order then the others': dataset,
    method, k, then per run its tok/s, speedup, SWI MS and acc. len, and for every run after the first
    ``tok/s <run>/<first>``. ``runs``: (label, cells.csv frame as :func:`load_run` gives it)."""
    _check_count(runs)
    shown, rates = [], []
    for _, cells in runs:
        frame = display_frame(cells).replace("", MISSING)
        keys = list(zip(cells["dataset"], cells["cell"], strict=True))
        shown.append(dict(zip(keys, frame.to_dict("records"), strict=True)))
        rates.append(dict(zip(keys, pd.to_numeric(cells["tokens_per_s"], errors="coerce"), strict=True)))
    first_label = runs[0][0]
    for (label, _), cells in zip(runs[1:], shown[1:], strict=True):
        if not set(cells) & set(shown[0]):
            raise SpecbenchError(
                label,
                f"has no cell in common with {first_label} (cells are matched on dataset and cell id)",
                "compare runs of the same recipe, or of recipes that share datasets and method entries",
            )
    keys = list(dict.fromkeys(key for cells in shown for key in cells))
    rows = []
    for key in keys:
        some = next(cells[key] for cells in shown if key in cells)
        row = {"dataset": key[0], "method": some["method"], "k": some["k"] or MISSING}
        for (label, _), cells in zip(runs, shown, strict=True):
            for column, name in SHOWN:
                row[f"{label} {name}"] = cells[key][column] if key in cells else MISSING
        for (label, _), rate in zip(runs[1:], rates[1:], strict=True):
            row[f"tok/s {label}/{first_label}"] = _ratio(rate.get(key), rates[0].get(key))
        rows.append(row)
    return pd.DataFrame(rows)


def _setup(path: Path) -> dict:
    """What a run's numbers depend on besides its cells: the machines that measured it, each model's
    source, dtype and engine, and the generation settings (budget, temperature), where recorded."""
    environment = read_environment(path)
    models = {n: m for n, m in (environment.get("models") or {}).items() if isinstance(m, dict)}
    try:
        generation = (yaml.safe_load((path / RESOLVED_RECIPE).read_text()) or {}).get("generation")
    except (OSError, yaml.YAMLError, AttributeError):
        generation = None
    return {
        "machine": sorted(machines_of(environment)),
        "models": sorted((n, str(m.get("source"))) for n, m in models.items()),
        "dtypes and engines": sorted(
            (n, str(m.get("dtype")), m.get("engine") or "eager") for n, m in models.items()
        ),
        "generation settings": generation,
    }


def _check_count(runs: list) -> None:
    if len(runs) < 2:
        raise SpecbenchError("specbench compare", "needs two runs or more", "pass RUN_A RUN_B [RUN_C ...]")


def _ratio(value: float | None, reference: float | None) -> str:
    if (
        value is None
        or reference is None
        or not value == value
        or not reference == reference
        or not reference
    ):
        return MISSING
    return f"{value / reference:.2f}x"


def render_compare(paths: list[Path], fmt: str = "table", console: Console | None = None) -> str | None:
    """``specbench compare``: the side-by-side table of ``paths`` (one per dataset), in ``fmt``."""
    _check_count(paths)  # before reading any of them
    runs = [(label, load_run(path)) for label, path in zip(labels(paths), paths, strict=True)]
    frame = compare_frame(runs)
    tables = [
        (dataset, group.drop(columns=["dataset"])) for dataset, group in frame.groupby("dataset", sort=False)
    ]
    first = runs[0][0]
    machines = [measured_on(Path(path), label) for label, path in zip(labels(paths), paths, strict=True)]
    setups = [_setup(Path(path)) for path in paths]
    differ = [
        aspect for aspect in setups[0] if len({json.dumps(s[aspect], sort_keys=True) for s in setups}) > 1
    ]
    if differ:
        machines.append(
            f"The runs differ in {', '.join(differ)}: tok/s X/first compares those too, not only the "
            "methods; each speedup is over its own run's AR cell."
        )
    note = (
        f"Cells matched on dataset and cell id. speedup: tokens/s over the AR cell of the same run; "
        f"[low, high]: its 95% bootstrap interval where the run's {CELLS} has one. tok/s X/{first}: run "
        f"X's tokens/s over {first}'s on the same cell (> 1: X is faster). —: the run has no such cell, "
        "or did not measure the value (replayed cells have no time)."
    )
    return emit(frame, tables, fmt, "\n".join([*machines, note]), console)
