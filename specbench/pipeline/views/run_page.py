"""One run as one HTML page (``specbench report RUN --html FILE``) and its JSON twin (``--json``).

The page holds what the terminal spreads over several commands and files: the machine card, every
table of ``report`` with its intervals and "why" lines, acceptance by draft position (marginal and
conditional), the histogram of tokens committed per step, the lossless tally with the examples that
diverged, predicted against measured speedup, the load curves where ``specbench load`` wrote them, and
sections a paper adds (the cascades' quality-latency frontier). A section whose data the run lacks
says so in one line.
"""

from __future__ import annotations

from collections import defaultdict
from html import escape
from pathlib import Path

import pandas as pd

from specbench.decoding.steps import accepted_histogram
from specbench.errors import SpecbenchError
from specbench.methods import BASELINE
from specbench.pipeline.records.results import CELLS, read_environment, read_examples
from specbench.pipeline.views import html, svg
from specbench.pipeline.views.html import Cell, Row, Section
from specbench.pipeline.views.report import LEFT_COLUMNS, by_dataset, captions, report_parts

# the report's column -> the cells.csv column whose value it shows
RAW = {
    "k": "k",
    "SWI MS": "swi_ms",
    "SWI PW": "swi_pw",
    "tok/s": "tokens_per_s",
    "speedup": "speedup_vs_ar",
    "vs eager AR": "speedup_vs_eager_ar",
    "pred.": "speedup_predicted",
    "acc. len": "acceptance_length",
    "draft acc.": "draft_acceptance_rate",
    "drafter cost": "drafter_cost",
    "others' CPU": "others_cpu",
    "compile s": "compile_s",
    "n": "n",
}
DIVERGENCES_SHOWN = 30


def run_directory(results: Path) -> Path:
    """``results`` as one run directory (its cells.csv, or the load.csv of `specbench load`), or a
    one-line error (a folder of runs is the site's job)."""
    from specbench.engines.load import LOAD_CSV

    results = Path(results)
    if not ((results / CELLS).is_file() or (results / LOAD_CSV).is_file()):
        below = sorted(p.parent.name for p in results.glob(f"*/{CELLS}")) if results.is_dir() else []
        hint = (
            f"name one of its runs (e.g. {results / below[0]}), or build pages for all with specbench site"
            if below
            else "run `specbench run RECIPE -o DIR` first, then report DIR --html FILE"
        )
        raise SpecbenchError(str(results), f"holds no {CELLS} of its own: not one run directory", hint)
    return results


def sweep_alone(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a `specbench load` sweep and no run's cells.csv: its page is the sweep's
    serving views."""
    from specbench.engines.load import LOAD_CSV

    return (Path(run_dir) / LOAD_CSV).is_file() and not (Path(run_dir) / CELLS).is_file()


def run_sections(run_dir: Path) -> list[Section]:
    run_dir = run_directory(run_dir)
    if sweep_alone(run_dir):  # a sweep that cannot be read is the page's error, not a paragraph on it
        return [machine_section(run_dir), load_section(run_dir, alone=True)]
    cells, frame, notes = report_parts(run_dir)
    rows = read_examples(run_dir)
    return [
        machine_section(run_dir),
        tables_section(cells, frame, notes),
        acceptance_section(run_dir, rows),
        steps_section(rows),
        lossless_section(cells, rows),
        prediction_section(cells),
        load_section(run_dir),
    ]


def render_run(run_dir: Path, extra: list[Section] = ()) -> tuple[str, str]:
    """(HTML page, JSON twin) of one run; ``extra``: sections a paper adds (after the run's own)."""
    run_dir = run_directory(run_dir)
    sections = run_sections(run_dir) + [s for s in extra if s is not None]
    environment = read_environment(run_dir)
    recipe = environment.get("recipe") or ""
    title = f"specbench {'load sweep' if sweep_alone(run_dir) else 'run'} {run_dir.name}"
    subtitle = f"{run_dir}" + (f" · recipe {recipe}" if recipe else "")
    about = {"run": str(run_dir), "recipe": recipe, "git": environment.get("git")}
    return html.page(title, subtitle, sections), html.twin(sections, about)


def machine_section(run_dir: Path) -> Section:
    environment = read_environment(run_dir)
    machine = environment.get("machine") or {}
    if not environment:
        return Section("Machine", html.paragraph(f"{run_dir} has no readable environment.json"), {})
    flags = machine.get("cpu_flags") or []
    units = ", ".join(flag for flag in flags if "bf16" in flag or "amx" in flag) or "none"
    entries = [
        ("machine", f"{machine.get('described', '')} (id {machine.get('id', '?')})"),
        ("CPU", machine.get("cpu", "")),
        ("bf16 / AMX units", units),
        ("threads / cores", f"{environment.get('threads', '?')} / {environment.get('cpu_count', '?')}"),
        ("GPUs", ", ".join(str(g) for g in machine.get("gpus") or []) or "none"),
        ("torch", environment.get("torch", "")),
        ("transformers", environment.get("transformers", "")),
        ("python", environment.get("python", "")),
        ("specbench", f"{environment.get('specbench', '')} (git {str(environment.get('git', ''))[:10]})"),
        ("recipe", f"{environment.get('recipe', '')} (identity {environment.get('recipe_identity', '')})"),
        ("seed", str(environment.get("seed", ""))),
    ]
    models = environment.get("models") or {}
    header = ["model", "source", "origin", "parameters", "dtype", "device", "engine"]
    model_rows = [
        Row(
            [
                Cell(name),
                Cell(str(m.get("source", ""))),
                Cell(str(m.get("origin", ""))),
                Cell(f"{m.get('parameters') or 0:,}", html.number(m.get("parameters")), "parameters"),
                Cell(str(m.get("dtype") or "")),
                Cell(str(m.get("device") or "")),
                Cell(str(m.get("engine") or "")),
            ]
        )
        for name, m in models.items()
    ]
    sessions = environment.get("sessions") or []
    session_rows = []
    for s in sessions:
        load = s.get("load") or {}
        others = html.number(load.get("others_cpu"))
        start = load.get("loadavg_at_start") or []
        session_rows.append(
            Row(
                [
                    Cell(str(s.get("started", ""))),
                    Cell(str(s.get("ended") or "")),
                    Cell(str(s.get("rows", "")), html.number(s.get("rows")), "rows"),
                    Cell("" if others is None else f"{100 * others:.0f}%", others, "others_cpu"),
                    Cell(" ".join(str(v) for v in start)),
                    Cell(str((s.get("machine") or {}).get("id", ""))),
                    Cell(str(s.get("git", ""))[:10]),
                ]
            )
        )
    body = html.card(entries)
    body += "<h3>Models</h3>" + html.table(header, model_rows, left=("model", "source", "origin"))
    if session_rows:
        body += "<h3>Sessions</h3>" + html.table(
            ["started", "ended", "rows", "others' CPU", "load average at start", "machine", "git"],
            session_rows,
            left=("started", "ended", "machine", "git"),
        )
    data = {"entries": dict(entries), "models": models, "sessions": len(sessions)}
    return Section("Machine", body, data)


def tables_section(cells: pd.DataFrame, frame: pd.DataFrame, notes: list[str]) -> Section:
    """The report's tables, one per dataset, each cell's unrounded value beside its text."""
    why = captions(cells)
    parts = []
    for title, group in by_dataset(frame):
        header = list(group.columns)
        rows = []
        for index, shown in zip(group.index, group.itertuples(index=False), strict=True):
            record = cells.loc[index]
            row = []
            for name, text in zip(header, shown, strict=True):
                column = RAW.get(name) or (f"quality_{name}" if f"quality_{name}" in cells.columns else None)
                value = html.number(record.get(column)) if column else None
                row.append(Cell(str(text), value, column))
            rows.append(Row(row, {"dataset": record["dataset"], "cell": record["cell"]}))
        parts.append(f"<h3>{escape(title)}</h3>" + html.table(header, rows, left=LEFT_COLUMNS))
        if title in why:
            parts.append(html.paragraph(why[title], "caption"))
    parts += [html.paragraph(line) for line in notes]
    data = cells.to_dict("records")
    return Section("Cells", "\n".join(parts), data)


def _drafting(rows: list[dict]) -> dict[tuple[str, str], list]:
    """The steps of each drafting cell, by (dataset, cell), in the rows' order."""
    steps: dict[tuple[str, str], list] = defaultdict(list)
    for row in rows:
        if row.get("method") != BASELINE and row.get("steps"):
            steps[(row["dataset"], row["cell"])].extend(row["steps"])
    return {key: value for key, value in steps.items() if any(drafted for drafted, _ in value)}


NO_ROWS = "no examples.jsonl here: this figure is drawn from the run's rows"


def acceptance_section(run_dir: Path, rows: list[dict]) -> Section:
    if not _drafting(rows):
        why = "no drafting cell in this run" if rows else NO_ROWS
        return Section("Acceptance by position", html.paragraph(why), [])
    from specbench.pipeline.views.plots import acceptance_by_position

    table = acceptance_by_position(run_dir)
    table = table[table["proposed"] > 0]
    figures = []
    for dataset, group in table.groupby("dataset", sort=False):
        for column, what in (("acceptance_rate", "marginal"), ("conditional_rate", "conditional")):
            series = [
                svg.Series(cell, list(zip(part["position"], part[column], strict=True)))
                for cell, part in group.groupby("cell", sort=False)
            ]
            figures.append(
                svg.line_chart(
                    f"{dataset}: acceptance, {what}",
                    series,
                    "draft position",
                    "P(accept)" if what == "marginal" else "P(accept i | 1..i-1 accepted)",
                    y_range=(0.0, 1.0),
                )
            )
    body = _figures(figures) + html.paragraph(
        "marginal: drafts accepted at position i / drafts proposed there (CS Drafting's Figure 2, Chen et "
        "al., NeurIPS 2024); conditional: accepted at i / steps that reviewed i after accepting 1..i-1 "
        "(flat where acceptance is i.i.d., as Leviathan et al.'s α assumes)."
    )
    return Section("Acceptance by position", body, table.to_dict("records"))


def steps_section(rows: list[dict]) -> Section:
    """Per dataset, each drafting cell's share of steps that committed 1, 2, ... tokens."""
    drafting = _drafting(rows)
    if not drafting:
        why = "no drafting cell in this run" if rows else NO_ROWS
        return Section("Tokens per step", html.paragraph(why), [])
    figures, data = [], []
    for dataset in dict.fromkeys(d for d, _ in drafting):
        histograms = {
            cell: accepted_histogram(steps) for (d, cell), steps in drafting.items() if d == dataset
        }
        longest = max(len(h) for h in histograms.values())
        series = []
        for cell, counts in histograms.items():
            total = sum(counts)
            shares = [(i, count / total) for i, count in enumerate(counts)]
            series.append(svg.Series(cell, shares))
            data += [
                {"dataset": dataset, "cell": cell, "tokens": i + 1, "steps": c, "share": c / total}
                for i, c in enumerate(counts)
            ]
        categories = [str(i + 1) for i in range(longest)]
        figures.append(
            svg.bar_chart(
                f"{dataset}: tokens committed per step",
                categories,
                series,
                "tokens committed (accepted drafts + 1)",
                "share of steps",
            )
        )
    return Section("Tokens per step", _figures(figures), data)


def lossless_section(cells: pd.DataFrame, rows: list[dict]) -> Section:
    """The tally per cell and the examples whose output left the AR output's, with both texts."""
    checked = [r for r in cells.to_dict("records") if html.number(r.get("lossless_checked"))]
    if not checked:
        return Section("Lossless", html.paragraph("no cell of this run was checked against AR output"), {})
    header = ["dataset", "cell", "checked", "identical", "ties", "mismatches"]
    table_rows = [
        Row(
            [Cell(r["dataset"]), Cell(r["cell"])]
            + [
                Cell(str(int(html.number(r.get(c)) or 0)), html.number(r.get(c)) or 0.0, c)
                for c in ("lossless_checked", "lossless_identical", "lossless_ties", "lossless_mismatches")
            ],
            {"dataset": r["dataset"], "cell": r["cell"]},
        )
        for r in checked
    ]
    reference = {
        (r["dataset"], r["example_id"], str(r.get("target"))): r for r in rows if r.get("method") == BASELINE
    }
    diverged = [r for r in rows if (r.get("first_divergence") or -1) >= 0]
    parts = [html.table(header, table_rows, left=("dataset", "cell"))]
    listed = []
    for r in diverged[:DIVERGENCES_SHOWN]:
        ar = reference.get((r["dataset"], r["example_id"], str(r.get("target"))), {})
        where = f"token {r['first_divergence']}"
        kind = r.get("divergence_class") or "unclassified"
        parts.append(
            f"<details><summary>{escape(r['dataset'])} · {escape(r['cell'])} · example "
            f"{escape(str(r['example_id']))}: parts from AR at {where} ({escape(kind)})</summary>"
            f"<pre>{escape(str(r.get('output_text', '')))}</pre><p class=note>AR:</p>"
            f"<pre>{escape(str(ar.get('output_text', '(no AR row)')))}</pre></details>"
        )
        listed.append(
            {
                "dataset": r["dataset"],
                "cell": r["cell"],
                "example_id": r["example_id"],
                "first_divergence": r["first_divergence"],
                "class": kind,
            }
        )
    if len(diverged) > DIVERGENCES_SHOWN:
        parts.append(html.paragraph(f"... and {len(diverged) - DIVERGENCES_SHOWN} more in examples.jsonl"))
    if not diverged:
        parts.append(html.paragraph("every checked output is identical to the AR output"))
    parts.append(
        html.paragraph(
            "tie: the outputs part where the target's top two tokens are within numerical noise of each "
            "other (batched and single-row kernels round differently); mismatch: a real divergence."
        )
    )
    tally = [
        {"dataset": r["dataset"], "cell": r["cell"], **{c: r.get(f"lossless_{c}") for c in header[2:]}}
        for r in checked
    ]
    data = {"cells": tally, "divergences": listed}
    return Section("Lossless", "\n".join(parts), data)


def prediction_section(cells: pd.DataFrame) -> Section:
    columns = {"speedup_vs_ar", "speedup_predicted"}
    if not columns <= set(cells.columns):
        return Section("Predicted speedup", html.paragraph("this run's cells carry no prediction"), [])
    both = cells.dropna(subset=list(columns))
    both = both[both["method"] != BASELINE]
    if both.empty:
        return Section("Predicted speedup", html.paragraph("no timed drafting cell with a prediction"), [])
    series = [
        svg.Series(dataset, list(zip(group["speedup_vs_ar"], group["speedup_predicted"], strict=True)))
        for dataset, group in both.groupby("dataset", sort=False)
    ]
    error = (both["speedup_predicted"] / both["speedup_vs_ar"] - 1).abs().median()
    chart = svg.line_chart(
        "predicted against measured speedup",
        series,
        "measured speedup over AR",
        "predicted speedup",
        diagonal=True,
        lines=False,
    )
    text = html.paragraph(
        f"Each point a cell; on the dashed line the prediction is exact. Median |predicted / measured - 1| "
        f"= {100 * error:.1f}%. The prediction prices the cell's forward counts with a pass cost fitted to "
        "the other half of the examples (`specbench predict RUN` gives the table)."
    )
    data = both[["dataset", "cell", "speedup_vs_ar", "speedup_predicted"]].to_dict("records")
    return Section("Predicted speedup", _figures([chart]) + text, data)


def load_section(run_dir: Path, alone: bool = False) -> Section:
    """The load sweep's views (:mod:`specbench.pipeline.views.serving_page`)."""
    from specbench.pipeline.views.serving_page import load_section as serving_section

    return serving_section(run_dir, alone)


def _figures(figures: list[str]) -> str:
    return '<div class="figures">' + "".join(f"<figure>{f}</figure>" for f in figures) + "</div>"
