"""``specbench predict``: predicted beside measured, one table per dataset, and what each side is."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from specbench.errors import SpecbenchError
from specbench.methods import BASELINE
from specbench.models.machine import recorded_machine
from specbench.pipeline.analysis import prediction
from specbench.pipeline.records.results import read_examples

COLUMNS = [
    "dataset",
    "cell",
    "rows",
    "tokens_per_s",
    "tokens_per_s_predicted",
    "speedup",
    "speedup_predicted",
]


def render(
    run_dir: Path, profile_name, against: Path | None, dtype, loop, format: str, roofline: bool = False
) -> str:
    from specbench.pipeline.analysis import profiles

    run_dir = Path(run_dir)
    environment = _environment(run_dir)
    if profile_name is None:
        if against is not None:
            raise SpecbenchError("--against", "needs --profile", "name the profile of the other machine")
        for flag, given in (("--dtype", dtype is not None), ("--roofline", roofline)):
            if given:  # held out, the run's own rows price every pass
                raise SpecbenchError(flag, "prices by a profile's roofline: needs --profile", f"drop {flag}")
        rows = read_examples(run_dir)
        machine = (environment.get("machine") or {}).get("id", "")
        machine_of = lambda r: r.get("machine") or machine  # noqa: E731
        table = prediction.cell_predictions(rows, prediction.cross_validated(rows, machine_of), machine_of)
        where = (
            "held out: each half of the examples predicted from a cost fitted to the other half, "
            f"on {_named(environment)}"
        )
    else:
        profile = profiles.read_profile(profile_name)
        table = prediction.predict_run(run_dir, profile, dtype, loop, roofline)
        used = loop if loop is not None else profile["kind"] == "probe" and not roofline
        named = _profile_named(profile) + (" (its measured roofline)" if roofline else "")
        where = f"measured on {_named(environment)}; predicted with {named}; " + (
            "each row's measured loop overhead added" if used else "passes only (no loop overhead)"
        )
    if table.empty:
        raise SpecbenchError(str(run_dir), "no timed rows to predict", "run the recipe first")
    table = table[COLUMNS + ["method", "walltime_error", "speedup_error"]].copy()
    if against is not None:
        prediction.against_problem(run_dir, Path(against), profile, dtype, roofline)
        rows_there = [r for r in read_examples(Path(against)) if prediction.timed(r)]
        measured = {r["key"]: r["walltime"] for r in rows_there}  # "predicted" = measured: its speedups
        there = prediction.cell_predictions(rows_there, measured, lambda r: "").set_index(["dataset", "cell"])
        table["speedup_there"] = [
            there["speedup"].get((r.dataset, r.cell), math.nan) for r in table.itertuples()
        ]
        table["tokens_per_s_there"] = [
            there["tokens_per_s"].get((r.dataset, r.cell), math.nan) for r in table.itertuples()
        ]
        table["speedup_error"] = table["speedup_predicted"] / table["speedup_there"] - 1
        table["walltime_error"] = table["tokens_per_s_there"] / table["tokens_per_s_predicted"] - 1
        where += f"; measured there: {against} on {_named(_environment(Path(against)))}"
    median = prediction.median_abs_error(table)
    caption = (
        f"{where}. error: predicted / measured - 1 (speedup; AR: tokens/s). Median |speedup error| over "
        f"the cells that are not AR: {100 * median:.1f}%."
    )
    if format == "csv":
        return table.drop(columns="method").to_csv(index=False)
    if format == "markdown":
        return _markdown(table) + "\n\n" + caption
    return _rich(table, caption, against is not None)


def _environment(run_dir: Path) -> dict:
    path = run_dir / "environment.json"
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise SpecbenchError(str(path), f"unreadable ({error})", "name a run directory") from None


# the linear layers' library of a model where it is not the engine's default (specbench.models.linear)
LINEAR_LABELS = {"onednn": " oneDNN", "inductor": " inductor"}


def model_setups(environment: dict) -> str:
    """The run's models as "dtype engine" pairs, those with weights and a recorded dtype (the heads of
    older runs recorded none); "eager oneDNN" where the linear layers ran on oneDNN, "compiled inductor"
    where they were frozen into inductor's GEMM templates (models/linear.py)."""
    models = environment.get("models") or {}
    setups = {
        f"{str(m.get('dtype')).removeprefix('torch.')} {m.get('engine') or 'eager'}"
        + LINEAR_LABELS.get(m.get("linear"), "")
        for m in models.values()
        if m.get("parameters") and m.get("dtype")
    }
    return ", ".join(sorted(setups))


def _named(environment: dict) -> str:
    machine = recorded_machine(environment)
    return f"{machine.describe() if machine else 'an unrecorded machine'} ({model_setups(environment)})"


def _profile_named(profile: dict) -> str:
    if profile["kind"] == "roofline":
        return f"the roofline of {profile.get('described', profile['device'])}"
    machine = profile.get("machine", {})
    described = machine.get("described", machine.get("cpu", "?"))
    return f"a probe of {described} ({profile.get('dtype')} {profile.get('engine')})"


def _fmt(value, digits=2, percent=False) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "—"
    return f"{100 * value:+.1f}%" if percent else f"{value:.{digits}f}"


def _rich(table: pd.DataFrame, caption: str, there: bool) -> str:
    buffer = io.StringIO()
    console = Console(file=buffer, width=160, force_terminal=False)
    for dataset, group in table.groupby("dataset", sort=False):
        view = Table(title=str(dataset))
        headers = ["cell", "rows", "tok/s", "tok/s pred.", "speedup", "speedup pred."]
        if there:
            headers[2:2] = []
            headers += ["tok/s there", "speedup there"]
        headers += ["error"]
        for header in headers:
            view.add_column(header, justify="left" if header == "cell" else "right")
        for row in group.itertuples():
            cells = [
                escape(str(row.cell)),
                str(row.rows),
                _fmt(row.tokens_per_s, 1),
                _fmt(row.tokens_per_s_predicted, 1),
                _fmt(row.speedup),
                _fmt(row.speedup_predicted),
            ]
            if there:
                cells += [_fmt(row.tokens_per_s_there, 1), _fmt(row.speedup_there)]
            error = (
                -row.walltime_error / (1 + row.walltime_error)
                if row.method == BASELINE
                else row.speedup_error
            )
            cells.append(_fmt(error, percent=True))
            view.add_row(*cells)
        console.print(view)
    console.print(caption, highlight=False)
    return buffer.getvalue()


def _markdown(table: pd.DataFrame) -> str:
    columns = [c for c in table.columns if c != "method"]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in table[columns].itertuples(index=False):
        lines.append("| " + " | ".join(_fmt(v, 3) if isinstance(v, float) else str(v) for v in row) + " |")
    return "\n".join(lines)
