"""Tables from a run directory's cells.csv: Rich on the terminal, or CSV / Markdown / LaTeX."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.table import Table

from specbench.errors import SpecbenchError
from specbench.pipeline.results import CELLS

FORMATS = ("table", "csv", "markdown", "latex")


def load_cells(results: Path) -> pd.DataFrame:
    """cells.csv of one run directory, or of every run directory below ``results``."""
    results = Path(results)
    files = [results / CELLS] if (results / CELLS).is_file() else sorted(results.glob(f"*/{CELLS}"))
    if not files:
        raise SpecbenchError(
            str(results),
            f"no {CELLS} found here or one level below",
            "run `specbench run RECIPE --output-dir DIR` first, then report DIR",
        )
    frames = []
    for path in files:
        frame = pd.read_csv(path)
        frame.insert(0, "run", path.parent.name)
        frames.append(frame)
    return pd.concat(frames, ignore_index=True)


def display_frame(cells: pd.DataFrame) -> pd.DataFrame:
    """The report's columns: one row per cell, formatted for reading."""
    quality = [c for c in cells.columns if c.startswith("quality_")]
    rows = []
    for r in cells.to_dict("records"):
        row = {
            "run": r["run"],
            "dataset": r["dataset"],
            "method": _method_label(r["method_name"], r["cell"]),
            "drafters": r.get("drafter") if isinstance(r.get("drafter"), str) else "",
            # CS Drafting's budget matrix K stands in the k column, compact: [[2,4],[0,3]]
            "k": _int(r.get("k")) or (r["K"].replace(" ", "") if isinstance(r.get("K"), str) else ""),
            "SWI MS": _num(r["swi_ms"]),
            "SWI PW": _num(r["swi_pw"]),
            "tok/s": _num(r["tokens_per_s"], 1),
            "speedup": _num(r.get("speedup_vs_ar")),
            "acc. len": _num(r["acceptance_length"]),
            "draft acc.": _num(r["draft_acceptance_rate"]),
            "drafter cost": _num(r.get("drafter_cost", math.nan), 3),
        }
        for column in quality:
            row[column.removeprefix("quality_")] = _num(r[column], 3)
        checked = int(r.get("lossless_checked", 0) or 0)
        row["lossless"] = f"{int(r['lossless_identical'])}/{checked}" if checked else ""
        row["n"] = int(r["n"])
        rows.append(row)
    return pd.DataFrame(rows)


def _method_label(name: str, cell: str) -> str:
    """The method entry's name plus the grid values the k column does not show: ``sc[alpha=0.2,rule=opt]``."""
    inner = cell[len(name) + 1 : -1] if cell.startswith(name + "[") and cell.endswith("]") else ""
    # split at commas that start a new "key=" (K's value [[2,4],[0,3]] has commas of its own)
    parts = re.split(r",(?=[A-Za-z_]\w*=)", inner) if inner else []
    rest = [part for part in parts if not part.startswith(("k=", "K="))]
    return f"{name}[{','.join(rest)}]" if rest else name


def render(results: Path, fmt: str = "table", console: Console | None = None) -> str | None:
    if fmt not in FORMATS:
        raise SpecbenchError("--format", f"unknown format {fmt!r}", f"use one of {', '.join(FORMATS)}")
    frame = display_frame(load_cells(results))
    if fmt == "csv":
        return frame.to_csv(index=False)
    if fmt == "markdown":
        return "\n\n".join(f"### {name}\n\n{_markdown(group)}" for name, group in _by_dataset(frame))
    if fmt == "latex":
        return "\n\n".join(_latex(name, group) for name, group in _by_dataset(frame))
    if console is None:
        console = Console()
        if not console.is_terminal:  # piped or captured: do not squeeze the table into 80 columns
            console = Console(width=220)
    for name, group in _by_dataset(frame):
        table = Table(title=name, title_justify="left")
        for column in group.columns:
            table.add_column(column, justify="left" if column in ("method", "drafters", "run") else "right")
        for record in group.itertuples(index=False):
            table.add_row(*(str(v) for v in record))
        console.print(table)
    console.print(
        "SWI = generated tokens x c_target / sum of forward passes x c_model (ratio of sums); MS: cost by "
        "parameter count; PW: prior-work table. speedup: tokens/s over the AR cell of the same run.",
        style="dim",
    )
    return None


def _by_dataset(frame: pd.DataFrame):
    for (run, dataset), group in frame.groupby(["run", "dataset"], sort=False):
        yield f"{run} · {dataset}", group.drop(columns=["run", "dataset"])


def _markdown(frame: pd.DataFrame) -> str:
    header = "| " + " | ".join(frame.columns) + " |"
    rule = "|" + "|".join("---" for _ in frame.columns) + "|"
    body = ["| " + " | ".join(str(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join([header, rule, *body])


def _latex(title: str, frame: pd.DataFrame) -> str:
    escape = lambda s: str(s).replace("_", r"\_").replace("%", r"\%").replace("&", r"\&")  # noqa: E731
    lines = [
        r"\begin{tabular}{" + "l" * 2 + "r" * (len(frame.columns) - 2) + "}",
        r"\toprule",
        " & ".join(escape(c) for c in frame.columns) + r" \\",
        r"\midrule",
    ]
    lines += [" & ".join(escape(v) for v in row) + r" \\" for row in frame.itertuples(index=False)]
    lines += [r"\bottomrule", r"\end{tabular}"]
    return f"% {escape(title)}\n" + "\n".join(lines)


def _num(value, digits: int = 2) -> str:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return ""
    return "" if math.isnan(value) else f"{value:.{digits}f}"


def _int(value) -> str:
    try:
        return "" if value is None or math.isnan(float(value)) else str(int(float(value)))
    except (TypeError, ValueError):
        return ""
