"""The quality-latency section of a cascades run's HTML page (Narasimhan et al., "Faster Cascades via
Speculative Decoding", ICLR 2025, Figure 2 and Table 2): per dataset each curve's Pareto frontier over
α against latency relative to the large model, with the large model's quality as the dashed line, and
Table 2's two numbers read off each frontier (:mod:`specbench.papers.spec_cascades.curves`)."""

from __future__ import annotations

import math
from html import escape
from pathlib import Path

from specbench.errors import SpecbenchError
from specbench.papers.spec_cascades.curves import AXES, pareto_frontier, run_points, table2_metrics
from specbench.pipeline.views import html, svg
from specbench.pipeline.views.html import Cell, Row, Section

TABLE2_SHOWN = (
    ("latency reduction (wall-clock)", "latency_reduction_walltime", "x"),
    ("best quality (wall-clock)", "best_quality_walltime", ""),
    ("latency reduction (MS cost)", "latency_reduction_swi", "x"),
    ("best quality (MS cost)", "best_quality_swi", ""),
)


def frontier_section(run_dir: Path) -> Section | None:
    """None where the run has no curve: no method swept over α (or lenience) with a quality metric and
    its large model's AR (a single point per method, as an SD run's, is no frontier)."""
    try:
        points = run_points(run_dir)
    except SpecbenchError:
        return None
    methods = points[points["role"] == "method"]
    if not (methods.groupby(["dataset", "curve"]).size() > 1).any():
        return None
    figures = []
    for dataset, group in methods.groupby("dataset", sort=False):
        large = points[(points["dataset"] == dataset) & (points["role"] == "large")]["quality"]
        for axis in ("walltime", "swi"):
            column, label = AXES[axis]
            series = []
            for curve, part in group.groupby("curve", sort=False):
                front = part.iloc[pareto_frontier(part[column], part["quality"])]
                series.append(svg.Series(curve, list(zip(front[column], front["quality"], strict=True))))
            metric = next((m for m in group["metric"] if isinstance(m, str) and m), "quality")
            reference = float(large.iloc[0]) if len(large) and not math.isnan(large.iloc[0]) else None
            figures.append(
                svg.line_chart(
                    f"{dataset}: Pareto frontier over α", series, label, metric, reference=reference
                )
            )
    table2 = table2_metrics(points)
    header = ["dataset", "curve", "large quality", *(name for name, _, _ in TABLE2_SHOWN)]
    rows = []
    for record in table2.to_dict("records"):
        cells = [Cell(record["dataset"]), Cell(record["curve"])]
        cells.append(
            Cell(_num(record["large_quality"]), html.number(record["large_quality"]), "large_quality")
        )
        cells += [Cell(_num(record[c], unit), html.number(record[c]), c) for _, c, unit in TABLE2_SHOWN]
        rows.append(Row(cells, {"dataset": record["dataset"], "curve": record["curve"]}))
    body = (
        '<div class="figures">'
        + "".join(f"<figure>{f}</figure>" for f in figures)
        + "</div>"
        + f"<h3>{escape('Table 2 read off each frontier')}</h3>"
        + html.table(header, rows, left=("dataset", "curve"))
        + html.paragraph(
            "Dashed: the large model's quality. Latency reduction: the large model's latency over the "
            "frontier's where it first reaches that quality (none where it never does); best quality: the "
            "frontier's quality at the large model's latency."
        )
    )
    data = {"points": points.to_dict("records"), "table2": table2.to_dict("records")}
    return Section("Quality against latency", body, data)


def _num(value, unit: str = "") -> str:
    number = html.number(value)
    return "" if number is None else f"{number:.3g}{unit}"
