"""``specbench report RUN --by k``: acceptance length by draft length, the model-card table published
heads come with (a row per dataset, a column per k = 1 .. 7).

Acceptance length is tokens per target pass, as the report's ``acc. len`` (every pass counted, the
prefill included), shown two ways side by side: pooled, the run's total committed tokens over its total
target passes (what throughput follows), and the mean of each request's own ratio (what model cards
usually print). They weigh requests differently (long outputs count more in the pooled one), so the
two can order two heads differently. A cell's k is its draft length ``k``, or the ``depth`` of a chain
drafted by a tree method (``branch: 1``); token trees (branch > 1) have no single k and are left out.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from pathlib import Path

import pandas as pd
from rich.console import Console

from specbench.errors import SpecbenchError
from specbench.methods import BASELINE
from specbench.pipeline.records.results import EXAMPLES, read_examples
from specbench.pipeline.views import html
from specbench.pipeline.views.html import Cell, Row, Section
from specbench.pipeline.views.report import emit

MISSING = "—"
AGGREGATIONS = ("pooled", "mean of requests")


def k_of(params: dict) -> int | None:
    """A cell's draft length: its ``k``, or the depth of a chain (``branch: 1``); None otherwise."""
    k = params.get("k")
    if isinstance(k, int) and not isinstance(k, bool):
        return k
    depth = params.get("depth")
    if params.get("branch") == 1 and isinstance(depth, int) and not isinstance(depth, bool):
        return depth
    return None


def series_label(row: dict) -> str:
    """The cell's name without its k (or chain depth): the cells of one series differ only there."""
    name, cell = row["method_name"], row["cell"]
    inner = cell[len(name) + 1 : -1] if cell.startswith(name + "[") and cell.endswith("]") else ""
    parts = re.split(r",(?=[A-Za-z_]\w*=)", inner) if inner else []
    dropped = ("k=", "depth=") if row["params"].get("branch") == 1 else ("k=",)
    rest = [part for part in parts if not part.startswith(dropped)]
    return f"{name}[{','.join(rest)}]" if rest else name


def _runs(results: Path) -> list[Path]:
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
            "run `specbench run RECIPE --output-dir DIR` first, then report DIR --by k",
        )
    return runs


def acceptance_by_k(results: Path) -> pd.DataFrame:
    """One row per (run, dataset, series, k): the pooled and per-request-mean tokens per target pass
    and the requests behind them; a one-line error when no drafting cell has a k."""
    groups: dict[tuple, list[tuple[int, int]]] = defaultdict(list)
    drafting = 0
    for run in _runs(results):
        for row in read_examples(run):
            if row.get("method") == BASELINE or not row.get("steps"):
                continue
            drafting += 1
            k = k_of(row.get("params") or {})
            if k is None:
                continue
            key = (run.name, row["dataset"], series_label(row), row.get("drafter") or "", k)
            groups[key].append((row["n_tokens"], len(row["steps"])))
    if not drafting:
        raise SpecbenchError(
            str(results),
            "holds no speculative cells (only the AR baseline): there is no acceptance length by k",
            "run a recipe with drafting cells (speculative over a grid of k, or eagle/medusa chains)",
        )
    if not groups:
        raise SpecbenchError(
            str(results),
            "none of its drafting cells has a draft length k (token trees with branch > 1 have none)",
            "grid over k (speculative), or over depth with branch: 1 (eagle, medusa chains)",
        )
    records = []
    for (run, dataset, series, drafter, k), counts in groups.items():
        tokens, passes = sum(t for t, _ in counts), sum(p for _, p in counts)
        ratios = [t / p for t, p in counts if p]
        records.append(
            {
                "run": run,
                "dataset": dataset,
                "series": series,
                "drafter": drafter,
                "k": k,
                "pooled": tokens / passes if passes else math.nan,
                "mean_of_requests": sum(ratios) / len(ratios) if ratios else math.nan,
                "requests": len(counts),
            }
        )
    return pd.DataFrame(records).sort_values(["run", "dataset", "series", "k"], kind="stable")


def wide(tidy: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """The model-card tables: per run and dataset, a row per series and aggregation, a column per k."""
    tables = []
    ks = sorted(set(tidy["k"]))
    for (run, dataset), group in tidy.groupby(["run", "dataset"], sort=False):
        rows = []
        for (series, drafter), cells in group.groupby(["series", "drafter"], sort=False):
            by_k = {r["k"]: r for r in cells.to_dict("records")}
            for aggregation, column in zip(AGGREGATIONS, ("pooled", "mean_of_requests"), strict=True):
                row = {"method": series, "drafters": drafter, "acceptance": aggregation}
                for k in ks:
                    value = by_k[k][column] if k in by_k else math.nan
                    row[f"k={k}"] = MISSING if math.isnan(value) else f"{value:.2f}"
                row["n"] = max(r["requests"] for r in by_k.values())
                rows.append(row)
        tables.append((f"{run} · {dataset}", pd.DataFrame(rows)))
    return tables


NOTE = (
    "acceptance length: tokens per target pass (every pass, the prefill included), as the report's acc. "
    "len; pooled: total committed tokens / total target passes; mean of requests: the mean of each "
    "request's own ratio (model cards' usual figure). The two weigh requests differently and can order "
    "two drafters differently. k: the draft length, or a chain's depth (branch 1); token trees are left "
    "out. n: requests."
)


def render_by_k(results: Path, fmt: str = "table", console: Console | None = None) -> str | None:
    """``specbench report RESULTS --by k``: the tables (or the tidy rows as CSV)."""
    tidy = acceptance_by_k(results)
    tables = wide(tidy)
    return emit(tidy.round(4), tables, fmt, NOTE, console)


def by_k_page(results: Path) -> tuple[str, str]:
    """(HTML page, JSON twin) of ``--by k``: the tables, with the unrounded values behind them."""
    tidy = acceptance_by_k(results)
    parts = []
    for title, frame in wide(tidy):
        header = list(frame.columns)
        rows = [Row([Cell(str(v)) for v in record]) for record in frame.itertuples(index=False)]
        parts.append(f"<h3>{html.escape(title)}</h3>" + html.table(header, rows, left=("method", "drafters")))
    parts.append(html.paragraph(NOTE))
    section = Section("Acceptance length by k", "\n".join(parts), tidy.to_dict("records"), anchor="by-k")
    title = f"specbench report {Path(results).name} --by k"
    about = {"run": str(results), "view": "acceptance length by k"}
    return html.page(title, str(results), [section]), html.twin([section], about)
