"""A run by category, laid out as Spec-Bench's leaderboard: speedup over AR per category and overall,
and the mean accepted tokens per step (``specbench report RUN --by category``).

Spec-Bench (Xia et al., "Unlocking Efficiency in Large Language Model Inference: A Comprehensive
Survey of Speculative Decoding", Findings of ACL 2024) measures a method's speedup as its authors'
``evaluation/speed.py`` does: per question, tokens over walltime summed over the question's turns;
the speedup of a category is the mean of those tokens/s over the category's questions divided by
the same mean of the autoregressive baseline. That is a ratio of means of per-question rates, not
cells.csv's ``speedup_vs_ar`` (a ratio of total tokens over total time), so the two differ where
questions' lengths and rates vary together. Here the baseline is the AR cell of the same target
and dataset in the same run, and only the questions both cells ran count (paired by
``example_id``; rows of one ``example_id`` in a cell are one question's turns and are summed). The
interval is :func:`~specbench.pipeline.analysis.statistics.paired_bootstrap_ratio` of those means, the
cell's and the AR cell's rates of a question resampled together. "#Mean Accepted Tokens" is
Spec-Bench's too: the mean over all target steps of accepted drafts + 1
(:func:`~specbench.decoding.steps.mean_accepted_per_step`).

Rows carry their example's raw category label as ``category``; Spec-Bench's 13 labels are grouped
into its six headline categories (:data:`specbench.tasks.spec_bench.HEADLINE_CATEGORY`), and any
other label is a column of its own. Replayed cells measured no time: their speedups are "—".
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

import numpy as np
import pandas as pd
import yaml
from rich.console import Console

from specbench.decoding.steps import mean_accepted_per_step
from specbench.errors import SpecbenchError
from specbench.methods import BASELINE
from specbench.pipeline.analysis.statistics import BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED, paired_bootstrap_ratio
from specbench.pipeline.records.results import EXAMPLES, RESOLVED_RECIPE, read_examples
from specbench.pipeline.views.report import emit, format_int, format_interval, format_method_label, format_num
from specbench.tasks.spec_bench import HEADLINE_CATEGORY, HEADLINES

OVERALL = "overall"
MEAN_ACCEPTED = "#Mean Accepted Tokens"
MISSING = "—"


def headline(raw: str) -> str:
    """Spec-Bench's headline category of a raw label; any other label stands for itself."""
    return HEADLINE_CATEGORY.get(raw, raw)


def category_speedups(rows: list[dict]) -> pd.DataFrame:
    """One tidy row per (dataset, cell, category), ``overall`` included: ``n`` (questions paired with
    the AR cell), ``speedup`` with ``speedup_low`` / ``_high``, ``accepted_per_step_mean``.

    Only rows with a ``category`` count; an empty frame when none has one."""
    cells: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for row in rows:
        if row.get("category") is not None:
            cells[(row["dataset"], row["cell"])].append(row)
    baselines: dict[tuple[str, str], dict[str, tuple[float, str]]] = {}
    for (dataset, _), cell_rows in cells.items():
        if cell_rows[0]["method"] == BASELINE:
            baselines.setdefault((dataset, cell_rows[0]["target"]), _questions(cell_rows))
    out = []
    for (dataset, cell), cell_rows in cells.items():
        first = cell_rows[0]
        questions = _questions(cell_rows)
        base = baselines.get((dataset, first["target"]), {})
        replayed = any(r.get("replayed") for r in cell_rows)
        categories = sorted({category for _, category in questions.values()}, key=_column_order)
        for category in (*categories, OVERALL):
            ids = [q for q, (_, c) in questions.items() if category in (c, OVERALL)]
            paired = [q for q in ids if q in base]
            speedup, low, high = _speedup([questions[q][0] for q in paired], [base[q][0] for q in paired])
            if replayed:  # no time was measured: no speedup, whatever the rows' NaNs would give
                speedup = low = high = math.nan
            steps = [
                s for r in cell_rows if category in (headline(r["category"]), OVERALL) for s in r["steps"]
            ]
            out.append(
                {
                    "dataset": dataset,
                    "cell": cell,
                    "method_name": first["method_name"],
                    "method": first["method"],
                    "target": first["target"],
                    "k": _k(first.get("params") or {}),
                    "replayed": replayed,
                    "category": category,
                    "n": len(paired),
                    "speedup": speedup,
                    "speedup_low": low,
                    "speedup_high": high,
                    "accepted_per_step_mean": mean_accepted_per_step(steps),
                }
            )
    return pd.DataFrame(out)


def _questions(rows: list[dict]) -> dict[str, tuple[float, str]]:
    """example_id -> (tokens/s of the question: its rows' tokens over their walltime, headline category)."""
    tokens: dict[str, float] = defaultdict(float)
    seconds: dict[str, float] = defaultdict(float)
    category = {}
    for row in rows:
        key = row["example_id"]
        tokens[key] += row["n_tokens"]
        seconds[key] += float(row["walltime"])
        category[key] = headline(row["category"])
    with np.errstate(divide="ignore", invalid="ignore"):
        return {key: (float(np.float64(tokens[key]) / seconds[key]), category[key]) for key in tokens}


def _speedup(rates: list[float], baseline: list[float]) -> tuple[float, float, float]:
    """(mean rate / mean baseline rate, bootstrap low, high); NaN without a pair or a finite rate."""
    a, b = np.asarray(rates, dtype=float), np.asarray(baseline, dtype=float)
    if not len(a) or not np.isfinite(a).all() or not np.isfinite(b).all() or b.mean() == 0:
        return math.nan, math.nan, math.nan
    ones = np.ones(len(a))
    low, high = paired_bootstrap_ratio(a, ones, b, ones)
    return float(a.mean() / b.mean()), low, high


def _column_order(category: str) -> tuple[int, str]:
    order = list(HEADLINES)
    return (order.index(category), "") if category in order else (len(order), category)


def _k(params: dict) -> str:
    if params.get("k") is not None:
        return format_int(params["k"])
    if params.get("K") is not None:  # CS Drafting's budget matrix, compact as in the report
        return str(params["K"]).replace(" ", "")
    return ""


def leaderboard(tidy: pd.DataFrame) -> pd.DataFrame:
    """Spec-Bench's layout: one row per (dataset, cell); a column per category (speedup and interval),
    then "#Mean Accepted Tokens" and "Overall"; "—" where there is no speedup."""
    present = sorted(set(tidy["category"]) - {OVERALL}, key=_column_order)
    columns = [HEADLINES.get(c, c) for c in present]
    rows = []
    for (dataset, cell), group in tidy.groupby(["dataset", "cell"], sort=False):
        by_category = {r["category"]: r for r in group.to_dict("records")}
        overall = by_category[OVERALL]
        row = {
            "dataset": dataset,
            "method": format_method_label(overall["method_name"], cell),
            "k": overall["k"],
        }
        for category, column in zip(present, columns, strict=True):
            row[column] = _shown(by_category.get(category))
        row[MEAN_ACCEPTED] = format_num(overall["accepted_per_step_mean"]) or MISSING
        row["Overall"] = _shown(overall)
        row["n"] = int(overall["n"])
        rows.append(row)
    return pd.DataFrame(rows)


def _shown(record: dict | None) -> str:
    return (format_interval(record, "speedup", "x") if record else "") or MISSING


def load_rows(results: Path) -> list[tuple[str, list[dict]]]:
    """(run name, example rows) of one run directory, or of every run directory below ``results``."""
    results = Path(results)
    runs = (
        [results]
        if (results / EXAMPLES).is_file()
        else sorted(p.parent for p in results.glob(f"*/{EXAMPLES}"))
    )
    if not runs:
        raise SpecbenchError(
            str(results),
            f"no {EXAMPLES} found here or one level below",
            "run `specbench run RECIPE --output-dir DIR` first, then report DIR --by category",
        )
    return [(run.name, _in_recipe_order(run, read_examples(run))) for run in runs]


def _in_recipe_order(run: Path, rows: list[dict]) -> list[dict]:
    """Rows grouped in the order of the recipe's methods (an interleaved run logs them shuffled)."""
    try:
        methods = [m["name"] for m in yaml.safe_load((run / RESOLVED_RECIPE).read_text())["methods"]]
    except (OSError, yaml.YAMLError, KeyError, TypeError):
        return rows
    rank = {name: i for i, name in enumerate(methods)}
    return sorted(rows, key=lambda row: rank.get(row.get("method_name"), len(rank)))


def render_categories(results: Path, fmt: str = "table", console: Console | None = None) -> str | None:
    """``specbench report RESULTS --by category``: the leaderboard of every run and dataset whose rows
    carry a category; a one-line error when none does."""
    frames, tables = [], []
    for run, rows in load_rows(results):
        tidy = category_speedups(rows)
        for dataset, group in tidy.groupby("dataset", sort=False) if not tidy.empty else ():
            frame = leaderboard(group)  # a dataset's table has the categories its rows have
            tables.append((f"{run} · {dataset}", frame.drop(columns=["dataset"])))
            frame.insert(0, "run", run)
            frames.append(frame)
    if not frames:
        raise SpecbenchError(
            str(results),
            "its example rows carry no category, so there is nothing to break down by category "
            "(only prompt sets with categories record one, such as task spec_bench)",
            "run a recipe with a spec_bench dataset into a new --output-dir with this version "
            "(rows written before categories were recorded have none), then report it with --by category",
        )
    flat = pd.concat(frames, ignore_index=True)
    tail = [MEAN_ACCEPTED, "Overall", "n"]
    flat = flat[[c for c in flat.columns if c not in tail] + tail].fillna(MISSING)  # "—": another dataset's
    note = (
        "speedup: Spec-Bench's, the mean over questions of tokens/s (a question's turns summed) over the "
        "same mean of the AR cell of the same target, on the questions both ran (n); [low, high]: 95% "
        "paired percentile bootstrap interval over questions "
        f"(B={BOOTSTRAP_RESAMPLES}, seed {BOOTSTRAP_SEED}). #Mean Accepted Tokens: mean "
        "over target steps of accepted drafts + 1. —: no speedup (replayed cell, no AR cell, or no question "
        "of the category)."
    )
    return emit(flat, tables, fmt, note, console)
