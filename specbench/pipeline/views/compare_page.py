"""Several runs as one HTML page (``specbench compare RUN... --html FILE``) and its JSON twin: each run's
machine and models, the side-by-side tables of ``compare`` (each number's unrounded value beside its
text), and per dataset a chart of every cell's tokens/s in each run."""

from __future__ import annotations

from html import escape
from pathlib import Path

from specbench.pipeline.records.results import measured_on, read_environment
from specbench.pipeline.views import html, svg
from specbench.pipeline.views.compare import SHOWN, prepare
from specbench.pipeline.views.html import Cell, Row, Section

RAW = {
    "tok/s": "tokens_per_s",
    "speedup": "speedup_vs_ar",
    "SWI MS": "swi_ms",
    "acc. len": "acceptance_length",
}


def render_comparison(paths: list[Path], allow_incomparable: bool = False) -> tuple[str, str]:
    comparison = prepare(paths, allow_incomparable, short=True)
    values = {
        label: {(r["dataset"], r["cell"]): r for r in cells.to_dict("records")}
        for label, _, cells in comparison.runs
    }
    first = comparison.runs[0][0]
    runs_rows = []
    for label, path, _ in comparison.runs:
        environment = read_environment(path)
        models = environment.get("models") or {}
        setup = ", ".join(
            f"{n}: {m.get('dtype') or ''} {m.get('engine') or ''}".strip() for n, m in models.items()
        )
        described = (environment.get("machine") or {}).get("described", "")
        runs_rows.append(Row([Cell(label), Cell(path.name), Cell(str(path)), Cell(described), Cell(setup)]))
    sections = [
        Section(
            "Runs",
            html.table(
                ["label", "run", "path", "machine", "models (dtype, engine)"],
                runs_rows,
                left=("label", "run", "path", "machine", "models (dtype, engine)"),
                sortable=False,
            )
            + "".join(html.paragraph(measured_on(path, label)) for label, path, _ in comparison.runs),
            [{"label": label, "path": str(path)} for label, path, _ in comparison.runs],
        )
    ]
    parts, data = [], []
    for dataset, group in comparison.frame.groupby("dataset", sort=False):
        header = [c for c in group.columns if c not in ("dataset", "cell")]
        rows = []
        for record in group.to_dict("records"):
            key = (dataset, record["cell"])
            row = [Cell(str(record[c]), *_raw(c, key, values, first)) for c in header]
            rows.append(Row(row, {"dataset": dataset, "cell": record["cell"]}))
        parts.append(f"<h3>{escape(dataset)}</h3>" + html.table(header, rows, left=("method",)))
        cells = list(dict.fromkeys(group["cell"]))
        series = [
            svg.Series(
                label,
                [
                    (i, html.number(values[label].get((dataset, c), {}).get("tokens_per_s")))
                    for i, c in enumerate(cells)
                ],
            )
            for label, _, _ in comparison.runs
        ]
        parts.append(svg.bar_chart(f"{dataset}: tokens/s per cell", cells, series, "cell", "tokens/s"))
        data += [
            {
                "dataset": dataset,
                "cell": c,
                "run": label,
                **{RAW[m]: values[label].get((dataset, c), {}).get(RAW[m]) for m, _ in SHOWN},
            }
            for c in cells
            for label, _, _ in comparison.runs
        ]
    parts += [html.paragraph(line) for line in comparison.lines]
    sections.append(Section("Cells", "\n".join(parts), data))
    title = "specbench compare " + " · ".join(label for label, _, _ in comparison.runs)
    about = {"runs": [str(path) for _, path, _ in comparison.runs]}
    return html.page(title, f"{len(comparison.runs)} runs, the first the reference", sections), html.twin(
        sections, about
    )


def _raw(column: str, key: tuple, values: dict, first: str) -> tuple[float | None, str | None]:
    """The unrounded number behind a compare column and what it is (``A:tokens_per_s``: run A's
    cells.csv column; ``B:tokens_per_s/A``: the ratio of B's to A's)."""
    for label in values:
        if column == f"tok/s {label}/{first}":
            mine = html.number(values[label].get(key, {}).get("tokens_per_s"))
            theirs = html.number(values[first].get(key, {}).get("tokens_per_s"))
            return (mine / theirs if mine is not None and theirs else None), f"{label}:tokens_per_s/{first}"
    for label in values:
        for metric, raw in RAW.items():
            if column == f"{label} {metric}":
                return html.number(values[label].get(key, {}).get(raw)), f"{label}:{raw}"
    return None, None
