"""Tables from a run directory's cells.csv: Rich on the terminal, or CSV / Markdown / LaTeX."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.table import Table
from rich.text import Text

from specbench.errors import SpecbenchError
from specbench.methods import BASELINE
from specbench.pipeline.records.results import (
    CELLS,
    measured_on,
    read_cells_csv,
    read_environment,
    read_examples,
)
from specbench.pipeline.views.head_alarms import head_mismatch_note, misconfigured_note
from specbench.pipeline.views.notes import (
    contended,
    cpu_share,
    disturbed_note,
    engines_note,
    fault_note,
    has_engines,
    loaded_note,
    sampling_note,
)

FORMATS = ("table", "csv", "markdown", "latex")


def run_directories(results: Path) -> list[Path]:
    """``results`` when it is a run directory, else the run directories one level below it."""
    results = Path(results)
    files = [results / CELLS] if (results / CELLS).is_file() else sorted(results.glob(f"*/{CELLS}"))
    if not files:
        from specbench.engines.load import LOAD_CSV

        if (results / LOAD_CSV).is_file():
            raise SpecbenchError(
                str(results),
                f"holds a load sweep ({LOAD_CSV}) and no {CELLS}: it has no run tables",
                f"read it with `specbench serving {results}`, or `specbench report {results} --html FILE`",
            )
        raise SpecbenchError(
            str(results),
            f"no {CELLS} found here or one level below",
            "run `specbench run RECIPE --output-dir DIR` first, then report DIR",
        )
    return [path.parent for path in files]


def load_cells(results: Path) -> pd.DataFrame:
    """cells.csv of one run directory, or of every run directory below ``results`` (a load sweep
    beside a run's cells is checked as its readers check it: a directory with an edited file is refused
    whichever file a command shows)."""
    from specbench.engines.load import read_load

    frames = []
    for path in (directory / CELLS for directory in run_directories(results)):
        read_load(path.parent)
        frame = _with_derived(read_cells_csv(path), path.parent)
        frame.insert(0, "run", path.parent.name)
        frames.append(frame)
    return pd.concat(frames, ignore_index=True)


# columns cells.csv gained after runs were committed, by the column that marks each group: a report
# computes a group from the rows when its marker is missing (theory_passes came with the cascades' theory)
_THEORY = ("swi_ms_theory", "swi_pw_theory", "theory_tokens_per_step", "theory_passes")
DERIVED = {
    "speedup_predicted": ("tokens_per_s_predicted", "speedup_predicted", "speedup_prediction_error"),
    "theory_passes": tuple(f"{name}{suffix}" for suffix in ("", "_iid") for name in _THEORY),
    # SWI's bootstrap intervals are counts only, so a report can give them to a run of any machine
    "swi_ms_low": ("swi_ms_low", "swi_ms_high", "swi_pw_low", "swi_pw_high"),
}


def _with_derived(frame: pd.DataFrame, run_dir: Path) -> pd.DataFrame:
    """A cells.csv written before it carried predictions and theory gets them from the run's rows
    (nothing is written: the run's files stay as they were)."""
    stale = [column for marker, group in DERIVED.items() if marker not in frame.columns for column in group]
    if not stale or not (run_dir / "examples.jsonl").is_file():
        return frame
    from specbench.pipeline.analysis.summary import summarise

    machine = (read_environment(run_dir).get("machine") or {}).get("id", "")
    derived = summarise(read_examples(run_dir), machine)
    columns = [c for c in stale if c in derived.columns]
    frame = frame.drop(columns=[c for c in columns if c in frame.columns])
    derived = derived[["dataset", "cell", "machine", *columns]]
    if "machine" not in frame.columns:  # files from before rows named a machine: one machine
        derived = derived.drop(columns="machine").drop_duplicates(["dataset", "cell"])
        return frame.merge(derived, on=["dataset", "cell"], how="left")
    frame = frame.assign(machine=frame["machine"].fillna("").astype(str))
    return frame.merge(derived, on=["dataset", "cell", "machine"], how="left")


# the columns the default table reads (the paper views check their own)
TABLE_COLUMNS = (
    "method_name",
    "swi_ms",
    "swi_pw",
    "tokens_per_s",
    "acceptance_length",
    "draft_acceptance_rate",
)


def display_frame(cells: pd.DataFrame) -> pd.DataFrame:
    """The report's columns: one row per cell, formatted for reading."""
    missing = [c for c in TABLE_COLUMNS if c not in cells.columns]
    if missing:
        runs = ", ".join(sorted(set(cells["run"]))) if "run" in cells.columns else "?"
        raise SpecbenchError(
            f"{CELLS} of run {runs}",
            f"has no column {missing[0]!r}: not a specbench {CELLS}",
            f"recompute it: `specbench run RECIPE -o DIR --resume` rewrites {CELLS} from examples.jsonl",
        )
    quality = [c for c in cells.columns if c.startswith("quality_")]
    several_machines = _several_machines(cells)
    engines = has_engines(cells)
    rows = []
    for r in cells.to_dict("records"):
        row = {
            "run": r["run"],
            "dataset": r["dataset"],
            "method": format_method_label(r["method_name"], r["cell"]),
            "drafters": r.get("drafter") if isinstance(r.get("drafter"), str) else "",
            # CS Drafting's budget matrix K stands in the k column, compact: [[2,4],[0,3]]
            "k": format_int(r.get("k")) or (r["K"].replace(" ", "") if isinstance(r.get("K"), str) else ""),
            "SWI MS": format_interval(r, "swi_ms"),
            "SWI PW": format_interval(r, "swi_pw"),
            "tok/s": format_num(r["tokens_per_s"], 1) + _spread(r),
            "speedup": format_interval(r, "speedup_vs_ar", "x"),
            # a serving engine's (or the compiled loop's) cell over specbench's eager AR, same prompts
            **(
                {"vs eager AR": (format_num(r.get("speedup_vs_eager_ar", math.nan)) + "x").lstrip("x")}
                if engines
                else {}
            ),
            # from the counts and a pass cost fitted to the other half of the examples (prediction.py)
            "pred.": format_num(r.get("speedup_predicted", math.nan)),
            "acc. len": format_num(r["acceptance_length"]),
            "draft acc.": format_num(r["draft_acceptance_rate"]),
            "drafter cost": format_num(r.get("drafter_cost", math.nan), 3),
        }
        for column in quality:
            row[column.removeprefix("quality_")] = format_num(r[column], 3)
        row["lossless"] = format_lossless(r)
        if "others_cpu" in cells.columns:  # other processes' share of the CPU during the cell
            row["others' CPU"] = cpu_share(r.get("others_cpu")) + (" !" if contended(r) else "")
        row["engine"] = _engine(r)
        if "compile_s" in cells.columns:  # seconds compiling before the timed rows, never in tok/s
            row["compile s"] = format_num(r.get("compile_s", math.nan), 0)
            if isinstance(r.get("compile_cache"), str):  # what inductor's on-disk cache gave
                row["compile s"] += f" ({r['compile_cache']})"
        row["n"] = int(r["n"])
        if several_machines:
            row["machine"] = r["machine"]
        rows.append(row)
    return pd.DataFrame(rows)


def _spread(record: dict) -> str:
    """`` ± 0.2 (3 repeats)``: with ``repeats``, the sample std of the cell's tokens/s over its repeats
    (run-to-run noise, which the bootstrap over prompts does not see)."""
    std = format_num(record.get("tokens_per_s_repeat_std"), 1)
    return f" ± {std} ({int(record['repeats'])} repeats)" if std else ""


def _engine(record: dict) -> str:
    """A cell's engine; cells.csv files from before the column: compiled where compile time was charged."""
    if isinstance(record.get("engine"), str):
        return record["engine"]
    compile_s = record.get("compile_s")
    return "compiled" if isinstance(compile_s, float | int) and compile_s == compile_s else "eager"


def _several_machines(cells: pd.DataFrame) -> bool:
    """Whether some run of ``cells`` holds rows of more than one machine (run --allow-other-machine)."""
    if "machine" not in cells.columns:
        return False
    return bool((cells.groupby("run")["machine"].nunique() > 1).any())


def format_lossless(record: dict) -> str:
    """``7/8 (1 tie)``: rows identical to the AR output of those checked, and the divergences by class
    (numerics.py). cells.csv files from before the classes, and their unclassified rows, show no class."""
    checked = int(format_int(record.get("lossless_checked")) or 0)
    if not checked:
        return ""
    classes = []
    for column, one, many in (
        ("lossless_ties", "tie", "ties"),
        ("lossless_mismatches", "mismatch", "mismatches"),
    ):
        count = int(format_int(record.get(column)) or 0)
        if count:
            classes.append(f"{count} {one if count == 1 else many}")
    text = f"{int(record['lossless_identical'])}/{checked}"
    return f"{text} ({', '.join(classes)})" if classes else text


def format_interval(record: dict, column: str, unit: str = "") -> str:
    """``1.42x [1.35, 1.50]``: the value and its bootstrap interval (cells.csv's ``<column>_low`` and
    ``_high``), or the value alone where the interval is missing (files from before it) or NaN."""
    value = format_num(record.get(column))
    if not value:
        return ""
    low, high = format_num(record.get(f"{column}_low")), format_num(record.get(f"{column}_high"))
    return f"{value}{unit} [{low}, {high}]" if low and high else f"{value}{unit}"


def format_method_label(name: str, cell: str) -> str:
    """The method entry's name plus the grid values the k column does not show: ``sc[alpha=0.2,rule=opt]``."""
    inner = cell[len(name) + 1 : -1] if cell.startswith(name + "[") and cell.endswith("]") else ""
    # split at commas that start a new "key=" (K's value [[2,4],[0,3]] has commas of its own)
    parts = re.split(r",(?=[A-Za-z_]\w*=)", inner) if inner else []
    rest = [part for part in parts if not part.startswith(("k=", "K="))]
    return f"{name}[{','.join(rest)}]" if rest else name


def render(results: Path, fmt: str = "table", console: Console | None = None) -> str | None:
    check_format_name(fmt)
    cells, frame, lines = report_parts(results)
    return emit(frame, list(by_dataset(frame)), fmt, "\n".join(lines), console, captions(cells))


def report_parts(results: Path) -> tuple[pd.DataFrame, pd.DataFrame, list[str]]:
    """What a report shows: the cells, their display frame (row i is cell i) and the lines under the
    tables (each run's machine, contention, engines' acceptance, how to read the columns)."""
    cells = load_cells(results)
    frame = display_frame(cells)
    note = (
        "SWI = generated tokens x c_target / sum of forward passes x c_model (ratio of sums); MS: cost by "
        "parameter count; PW: prior-work table. speedup: tokens/s over the AR cell of the same run; "
        "pred.: the speedup predicted from the cell's forward counts and pass shapes by a pass cost fitted "
        "to the other half of the examples (specbench predict RUN shows its error)." + _bootstrap_note(cells)
    )
    directories = run_directories(results)
    lines = [measured_on(directory) for directory in directories]
    notes = (loaded_note(cells), disturbed_note(cells), misconfigured_note(cells, directories))
    notes += (
        head_mismatch_note(directories),
        engines_note(cells),
        sampling_note(cells),
        fault_note(cells),
        note,
    )
    lines += [line for line in notes if line]
    return cells, frame, lines


def captions(cells: pd.DataFrame) -> dict[str, str]:
    """One line under each table that says why speculative decoding gained or lost there: it saves
    target passes only where steps commit more than one token, and each step costs a verification pass
    over k + 1 tokens plus the drafting. Read from the fastest and slowest drafting cells (by speedup
    over AR) and their tokens per target pass; tables without both stay uncaptioned."""
    if "speedup_vs_ar" not in cells.columns:
        return {}
    out = {}
    several = _several_machines(cells)
    keys = ["run", "dataset"] + (["machine"] if several else [])
    for values, group in cells.groupby(keys, sort=False):
        drafting = group[(group["acceptance_length"] > 1) | (group["draft_acceptance_rate"].notna())]
        drafting = drafting[drafting["speedup_vs_ar"].notna() & (drafting["method"] != BASELINE)]
        if drafting.empty:
            continue
        best = drafting.loc[drafting["speedup_vs_ar"].idxmax()].to_dict()
        worst = drafting.loc[drafting["speedup_vs_ar"].idxmin()].to_dict()
        text = f"why: {_gain(best)}"
        if worst["cell"] != best["cell"]:
            text += f"; {_gain(worst)}"
        title = " · ".join(values[:2]) + (f" · machine {values[2]}" if several else "")
        out[title] = (
            text + " (a step costs one target pass over k + 1 tokens plus drafting: it pays only where "
            "drafts are accepted)"
        )
    return out


def _gain(record: dict) -> str:
    speedup = record["speedup_vs_ar"]
    low, high = record.get("speedup_vs_ar_low", math.nan), record.get("speedup_vs_ar_high", math.nan)
    if not (math.isnan(low) or math.isnan(high)) and (low > 1 or high < 1):
        verdict = "faster than AR" if low > 1 else "slower than AR"
    elif math.isnan(low) or math.isnan(high):
        verdict = "faster than AR" if speedup > 1 else "slower than AR"
    else:
        verdict = "no different from AR beyond noise"
    return (
        f"{record['cell']} commits {record['acceptance_length']:.2f} tokens per target pass and runs "
        f"{speedup:.2f}x, {verdict}"
    )


def check_format_name(fmt: str) -> None:
    if fmt not in FORMATS:
        raise SpecbenchError("--format", f"unknown format {fmt!r}", f"use one of {', '.join(FORMATS)}")


LEFT_COLUMNS = ("method", "drafters", "run", "dataset", "cell")


def emit(
    flat: pd.DataFrame,
    tables: list[tuple[str, pd.DataFrame]],
    fmt: str,
    note: str = "",
    console: Console | None = None,
    captions: dict[str, str] | None = None,
) -> str | None:
    """``flat`` as CSV, or the titled ``tables`` as Markdown sections, LaTeX tabulars or Rich tables
    (printed, each with its line of ``captions`` and ``note`` below them all; None is returned)."""
    captions = captions or {}
    check_format_name(fmt)
    if fmt == "csv":
        return flat.to_csv(index=False)
    if fmt == "markdown":
        return "\n\n".join(
            f"### {name}\n\n{_markdown(group)}" + (f"\n\n*{captions[name]}*" if name in captions else "")
            for name, group in tables
        )
    if fmt == "latex":
        return "\n\n".join(_latex(name, group) for name, group in tables)
    if console is None:
        console = Console()
        if not console.is_terminal:  # piped or captured: do not squeeze the table into 80 columns
            console = Console(width=220)
    for name, group in tables:
        for title, part in fitted(name, group, console):
            console.print(rich_table(title, part))
        if name in captions:
            console.print(captions[name], markup=False)
    if note:
        console.print(note, style="dim", markup=False)  # "[low, high]" is text, not a Rich style tag
    return None


def rich_table(title: str, frame: pd.DataFrame) -> Table:
    table = Table(title=title, title_justify="left")
    for column in frame.columns:
        table.add_column(column, justify="left" if column in LEFT_COLUMNS else "right")
    for record in frame.itertuples(index=False):
        table.add_row(*(Text(str(v)) for v in record))  # Text: "medusa[depth=4]" is no markup
    return table


KEY_COLUMNS = ("method", "k")  # repeated in each part of a table split to fit the terminal


def fitted(title: str, frame: pd.DataFrame, console: Console) -> list[tuple[str, pd.DataFrame]]:
    """``frame`` as tables that fit ``console``'s width: whole where it fits, else its columns dealt
    in order over several tables ("title (1/2)", ...), each starting with the method and k, so that no
    value is squeezed, wrapped or cut."""
    unbounded = console.options.update_width(10_000)  # the natural width, not clipped to the console's

    def width(part: pd.DataFrame) -> int:
        return console.measure(rich_table(title, part), options=unbounded).maximum

    if width(frame) <= console.width:
        return [(title, frame)]
    keys = [c for c in KEY_COLUMNS if c in frame.columns]
    parts: list[list[str]] = [[]]
    for column in (c for c in frame.columns if c not in keys):
        if parts[-1] and width(frame[keys + parts[-1] + [column]]) > console.width:
            parts.append([])
        parts[-1].append(column)
    return [(f"{title} ({i}/{len(parts)})", frame[keys + part]) for i, part in enumerate(parts, start=1)]


def _bootstrap_note(cells: pd.DataFrame) -> str:
    """How the intervals were made, from the columns that record it (absent in older cells.csv)."""
    if "bootstrap_resamples" not in cells:
        return ""
    settings = cells[["bootstrap_resamples", "bootstrap_seed"]].dropna().drop_duplicates()
    if settings.empty:
        return ""
    described = "; ".join(f"B={int(b)}, seed {int(s)}" for b, s in settings.itertuples(index=False))
    return (
        f" [low, high]: 95% percentile bootstrap interval over examples ({described}); for speedup the "
        "cell's and the AR cell's rows of each prompt are resampled together."
    )


def by_dataset(frame: pd.DataFrame):
    """One table per run and dataset, and per machine where a run holds several."""
    keys = ["run", "dataset"] + (["machine"] if "machine" in frame.columns else [])
    for values, group in frame.groupby(keys, sort=False):
        title = " · ".join(values[:2]) + (f" · machine {values[2]}" if len(values) > 2 else "")
        yield title, group.drop(columns=keys)


def _markdown(frame: pd.DataFrame) -> str:
    header = "| " + " | ".join(frame.columns) + " |"
    rule = "|" + "|".join("---" for _ in frame.columns) + "|"
    body = ["| " + " | ".join(str(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join([header, rule, *body])


def _latex(title: str, frame: pd.DataFrame) -> str:
    def escape(text) -> str:  # the characters LaTeX reads as commands in a table's text
        for char in "_%&#$":
            text = str(text).replace(char, "\\" + char)
        return text

    lines = [
        r"\begin{tabular}{" + "l" * 2 + "r" * (len(frame.columns) - 2) + "}",
        r"\toprule",
        " & ".join(escape(c) for c in frame.columns) + r" \\",
        r"\midrule",
    ]
    lines += [" & ".join(escape(v) for v in row) + r" \\" for row in frame.itertuples(index=False)]
    lines += [r"\bottomrule", r"\end{tabular}"]
    return f"% {escape(title)}\n" + "\n".join(lines)


def format_num(value, digits: int = 2) -> str:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return ""
    return "" if math.isnan(value) else f"{value:.{digits}f}"


def format_int(value) -> str:
    try:
        return "" if value is None or math.isnan(float(value)) else str(int(float(value)))
    except (TypeError, ValueError):
        return ""
