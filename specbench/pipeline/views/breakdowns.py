"""``specbench report RUN --baseline CELL`` and ``specbench report RUN --by step``: the two readings of
:mod:`specbench.pipeline.analysis.breakdowns`, one table per run and dataset."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from rich.console import Console

from specbench.errors import SpecbenchError
from specbench.pipeline.analysis.breakdowns import against_cell, step_parts
from specbench.pipeline.analysis.statistics import BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED
from specbench.pipeline.views.categories import MISSING, load_rows
from specbench.pipeline.views.report import emit, format_interval, format_num, load_cells


def render_against(
    results: Path, baseline: str, fmt: str = "table", console: Console | None = None
) -> str | None:
    frames, tables = [], []
    cells = set()
    for run, rows in load_rows(results):
        cells |= {row["cell"] for row in rows}
        tidy = against_cell(rows, baseline)
        for dataset, group in tidy.groupby("dataset", sort=False) if not tidy.empty else ():
            shown = pd.DataFrame(
                {
                    "cell": group["cell"],
                    f"vs {baseline}": [
                        format_interval(r, "speedup", "x") or MISSING for r in group.to_dict("records")
                    ],
                    "tokens/s": [format_num(v, 1) or MISSING for v in group["tokens_per_s"]],
                    "outputs differ": group["outputs_differ"].astype(int),
                    **_quality_columns(group, baseline),
                    "n": group["n"].astype(int),
                }
            )
            tables.append((f"{run} · {dataset}", shown))
            frames.append(group.assign(run=run, baseline=baseline))
    if not frames:
        raise SpecbenchError(
            "--baseline",
            f"no dataset of {results} has a cell {baseline!r}",
            f"name one of its cells: {', '.join(sorted(cells)) or 'none'}",
        )
    flat = pd.concat(frames, ignore_index=True)
    flat = flat[
        [
            "run",
            "dataset",
            "cell",
            "baseline",
            *[c for c in flat.columns if c not in ("run", "dataset", "cell", "baseline")],
        ]
    ]
    note = (
        f"vs {baseline}: the cell's tokens/s over {baseline}'s, each summed over the examples both "
        "ran (n); [low, high]: 95% paired percentile bootstrap interval over those examples "
        f"(B={BOOTSTRAP_RESAMPLES}, seed {BOOTSTRAP_SEED}). outputs differ: examples whose output is not "
        f"{baseline}'s (in low precision a near-tie can part two lossless cells; the report's lossless "
        f"column tells ties from mismatches). Δ metric: the cell's mean less {baseline}'s on those "
        f"examples, with its paired interval (an order is resolved when it excludes 0). {MISSING}: no "
        "time (a replayed cell)."
    )
    return emit(flat, tables, fmt, note, console)


def _quality_columns(group: pd.DataFrame, baseline: str) -> dict[str, list[str]]:
    """``Δ accuracy`` etc.: each mean quality metric's difference from the baseline with its interval."""
    columns = {}
    for name in (c[: -len("_diff")] for c in group.columns if c.endswith("_diff")):
        columns[f"Δ {name}"] = [
            MISSING if pd.isna(r[f"{name}_diff"]) else _signed(r, f"{name}_diff")
            for r in group.to_dict("records")
        ]
    return columns


def _signed(record: dict, column: str) -> str:
    low, high = record[f"{column}_low"], record[f"{column}_high"]
    interval = "" if pd.isna(low) else f" [{low:+.3f}, {high:+.3f}]"
    return f"{record[column]:+.3f}{interval}"


def render_steps(results: Path, fmt: str = "table", console: Console | None = None) -> str | None:
    frame = load_cells(results)
    frames, tables = [], []
    for (run, dataset), group in frame.groupby(["run", "dataset"], sort=False):
        parts = step_parts(group)
        if parts.empty:
            continue
        shown = pd.DataFrame(
            {
                "cell": parts["cell"],
                "tok/s": [format_num(v, 1) for v in parts["tokens_per_s"]],
                "vs AR": [format_num(v) for v in parts["speedup_vs_ar"]],
                "tokens/pass": [format_num(v) for v in parts["tokens_per_pass"]],
                "ms/step": [format_num(v) for v in parts["step_ms"]],
                "target ms": [format_num(v) for v in parts["target_ms"]],
                "drafter passes/step": [format_num(v) for v in parts["drafter_passes_per_step"]],
                "drafter ms/pass": [format_num(v, 3) for v in parts["drafter_ms_per_pass"]],
                "outside ms/step": [format_num(v) for v in parts["outside_ms_per_step"]],
                "target-only bound": [f"{format_num(v)}x" for v in parts["target_only_bound"]],
            }
        )
        tables.append((f"{run} · {dataset}", shown))
        frames.append(parts.assign(run=run))
    if not frames:
        raise SpecbenchError(
            str(results),
            "has no drafting cell with a time beside an AR cell of its target, so no step to break down",
            "run a recipe with an autoregressive cell and a drafting cell (not replayed), then "
            "report --by step",
        )
    flat = pd.concat(frames, ignore_index=True)
    flat = flat[["run", *[c for c in flat.columns if c != "run"]]]
    note = (
        "A step: a target pass after the prompt's prefill (steps = target passes - examples). ms/step: "
        "walltime per step; target ms: one target pass; outside: the step's time in no model's pass (the "
        "loop's Python, host syncs, masks); target-only bound: the speedup over AR if drafting and the loop "
        "were free (AR's ms a token over the target pass's ms per committed token)."
    )
    return emit(flat, tables, fmt, note, console)
