"""The HTML page's load section: speedup against load with its paired 95% intervals (one pair of charts
per kind of level), the Pareto chart of per-user speed against throughput per core or GPU with its
frontier, the k schedule, acceptance pooled and per request, and the time split, each as
:mod:`specbench.pipeline.views.serving_view` shows it in the terminal."""

from __future__ import annotations

import math
from pathlib import Path

from specbench.errors import SpecbenchError
from specbench.methods import BASELINE
from specbench.pipeline.analysis.serving import (
    acceptance_side_by_side,
    pareto_points,
    read_sweep,
    time_split,
)
from specbench.pipeline.views import html, svg
from specbench.pipeline.views.html import Cell, Row, Section

KINDS = {"concurrency": "concurrent requests", "rate": "requests per second (open loop)"}


def load_section(run_dir: Path, alone: bool = False) -> Section:
    """The section; where the sweep cannot be read, a paragraph saying why on a run's page, or with
    ``alone`` (the page is the sweep's own) that one-line error, as every other reader of it gives."""
    from specbench.engines.load import LOAD_CSV
    from specbench.pipeline.views.serving_view import schedule_document

    try:
        sweep = read_sweep(run_dir)
    except SpecbenchError as error:
        if alone:
            raise
        if (Path(run_dir) / LOAD_CSV).is_file():
            return Section("Load", html.paragraph(str(error)), [])
        return Section("Load", html.paragraph(f"no {LOAD_CSV} here (specbench load writes one)"), [])
    figures = _speedup_charts(sweep.summary)
    points = pareto_points(sweep.summary, sweep.units)
    figures.append(_pareto_chart(points, sweep.units.name))
    document = schedule_document(sweep)
    acceptance = acceptance_side_by_side(sweep.summary, sweep.rows, sweep.requests)
    split = time_split(sweep.summary)
    parts = [
        '<div class="figures">' + "".join(f"<figure>{f}</figure>" for f in figures) + "</div>",
        html.paragraph(
            f"Per user: 1 / TPOT p50, the median request's decode speed; per {sweep.units.name}: output "
            f"throughput / {sweep.units.count} ({sweep.units.source}). Dashed: the frontier, the points "
            "no other point of the target beats on both axes. Bars: 95% intervals."
        ),
        _schedule_table(document),
        _acceptance_table(acceptance),
        html.table(
            ["cell", "engine", "draft / verify / overhead"],
            [Row([Cell(str(e["cell"])), Cell(e["engine"]), Cell(e["split"])]) for e in split],
            left=("cell", "engine", "draft / verify / overhead"),
            wrap=("draft / verify / overhead",),
        ),
    ]
    data = {
        "levels": sweep.summary,
        "pareto": points,
        "k_schedule": document,
        "acceptance": acceptance,
        "time_split": split,
    }
    return Section("Load", "".join(parts), data)


def _kind(row: dict) -> str:
    rate = row.get("request_rate")
    return "rate" if isinstance(rate, (int, float)) and math.isfinite(rate) else "concurrency"


def _speedup_charts(summary: list[dict]) -> list[str]:
    rows = [r for r in summary if r.get("method") != BASELINE]
    charts = []
    for kind, xlabel in KINDS.items():
        mine = [r for r in rows if _kind(r) == kind]
        if not mine:
            continue
        x_of = "request_rate" if kind == "rate" else "concurrency"
        for column, what in (
            ("speedup_throughput", "throughput"),
            ("speedup_per_request", "per-request speed"),
        ):
            series = []
            for cell in sorted({r["cell"] for r in mine}):
                curve = sorted((r for r in mine if r["cell"] == cell), key=lambda r: float(r[x_of]))
                series.append(
                    svg.Series(
                        cell,
                        [(float(r[x_of]), r[column]) for r in curve],
                        [
                            (r.get(f"{column}_low", math.nan), r.get(f"{column}_high", math.nan))
                            for r in curve
                        ],
                    )
                )
            charts.append(
                svg.line_chart(
                    f"{what} over the same engine's AR, 95% intervals",
                    series,
                    xlabel,
                    f"{what} / AR",
                    reference=1.0,
                    log2_x=True,
                )
            )
    return charts


def _pareto_chart(points: list[dict], unit: str) -> str:
    series = []
    for key in sorted({(p["cell"], p["kind"]) for p in points}):
        curve = sorted((p for p in points if (p["cell"], p["kind"]) == key), key=lambda p: p["level_value"])
        label = key[0] + (" (req/s)" if key[1] == "rate" else "")
        series.append(
            svg.Series(
                label,
                [(p["per_unit_tok_s"], p["per_user_tok_s"]) for p in curve],
                [(p["per_user_low"], p["per_user_high"]) for p in curve],
            )
        )
    for target in sorted({str(p["target"]) for p in points}):
        best = sorted(
            (p for p in points if p["frontier"] and str(p["target"]) == target),
            key=lambda p: p["per_unit_tok_s"],
        )
        series.append(
            svg.Series(
                f"frontier {target}", [(p["per_unit_tok_s"], p["per_user_tok_s"]) for p in best], dashed=True
            )
        )
    return svg.line_chart(
        "per-user speed against throughput (Pareto)",
        series,
        f"tokens/s per {unit}",
        "tokens/s per user (1 / TPOT p50)",
    )


def _schedule_table(document: dict) -> str:
    from specbench.pipeline.views.serving_view import family_name

    header = ["family", "level", "k (goodput)", "goodput/s", "separable", "k (throughput)", "tok/s"]
    rows = []
    for family in document["families"]:
        name = family_name(family)
        for e in family["levels"]:
            rows.append(
                Row(
                    [
                        Cell(name),
                        Cell(e["level"]),
                        Cell(str(e["k_goodput"]), e["k_goodput"], "k_goodput"),
                        Cell(_fmt(e["goodput"], "{:.2f}"), e["goodput"], "goodput_req_s"),
                        Cell({True: "yes", False: "no", None: "—"}[e["separable_goodput"]]),
                        Cell(str(e["k_throughput"]), e["k_throughput"], "k_throughput"),
                        Cell(_fmt(e["throughput"], "{:.1f}"), e["throughput"], "throughput_tok_s"),
                    ]
                )
            )
    notes = "".join(html.paragraph(f"{family_name(f)}: {f['note']}") for f in document["families"])
    return html.table(header, rows, left=("family", "level")) + notes


def _acceptance_table(entries: list[dict]) -> str:
    header = ["cell", "level", "pooled tok/step", "server AL", "per request: mean", "p10 / p50 / p90", "n"]
    rows = []
    for e in entries:
        mine = e["per_request_n"] > 0
        rows.append(
            Row(
                [
                    Cell(str(e["cell"])),
                    Cell(e["level"]),
                    Cell(_fmt(e["pooled_tokens_per_step"], "{:.2f}"), e["pooled_tokens_per_step"], "pooled"),
                    Cell(_fmt(e["server_mean_acceptance_length"], "{:.2f}")),
                    Cell(_fmt(e["per_request_mean"], "{:.2f}") if mine else "per level only"),
                    Cell(
                        " / ".join(_fmt(e[f"per_request_p{q}"], "{:.2f}") for q in (10, 50, 90))
                        if mine
                        else "per level only"
                    ),
                    Cell(str(e["per_request_n"])),
                ]
            )
        )
    return html.table(header, rows, left=("cell", "level"))


def _fmt(value, fmt: str) -> str:
    return fmt.format(value) if isinstance(value, (int, float)) and math.isfinite(value) else "—"
