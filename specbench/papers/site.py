"""``specbench site RESULTS -o DIR``: every committed run as a static site that opens from disk.

``index.html`` lists one row per run (the paper it reproduces, its models, its machine, its best speedup
over AR with the interval, its lossless tally) and links each to the run's own page
(:mod:`specbench.pipeline.views.run_page`, with the sections the papers add); ``claims.html`` renders the
claims ledger (``CLAIMS.md`` at the top of RESULTS) with each run directory it cites linked to its page;
``papers.html`` holds each paper view (``report --paper``) over the runs of that paper's folder. It lives
among the papers because it gathers what every paper adds. A run whose page cannot be built gets one line
in the index saying why, never a broken site.
"""

from __future__ import annotations

import re
from html import escape
from pathlib import Path

from specbench.errors import SpecbenchError
from specbench.methods import BASELINE
from specbench.pipeline.records.results import CELLS, read_environment
from specbench.pipeline.views import html
from specbench.pipeline.views.html import Cell, Row, Section
from specbench.pipeline.views.report import format_interval, load_cells

CLAIMS = "CLAIMS.md"
RUNS = "runs"


def check_site_folder(out: Path) -> None:
    """The site goes in a folder of its own: a new one, or one a previous site was written to (its
    index.html); never the current folder or one above it, a file, or a folder of other files."""
    out = Path(out)
    here = Path.cwd().resolve()
    if out.resolve() in (here, *here.parents):
        raise SpecbenchError(
            "--output-dir", f"{out} is the current folder or one above it", "name a new folder"
        )
    if out.exists() and not out.is_dir():
        raise SpecbenchError("--output-dir", f"{out} is a file", "name a folder for the site, e.g. -o site")
    if out.is_dir() and any(out.iterdir()) and not (out / "index.html").is_file():
        raise SpecbenchError(
            "--output-dir",
            f"{out} holds other files and no site: the pages would mix with them",
            "name a new folder",
        )


def run_directories(results: Path) -> list[Path]:
    """Every run below ``results``: the folders holding a cells.csv or a load sweep's load.csv."""
    from specbench.engines.load import LOAD_CSV

    results = Path(results)
    found = sorted({path.parent for name in (CELLS, LOAD_CSV) for path in results.rglob(name)})
    if not found:
        raise SpecbenchError(
            str(results),
            f"holds no run directory ({CELLS} or {LOAD_CSV})",
            "name a folder of runs, e.g. results",
        )
    return found


def page_name(run: Path, results: Path) -> str:
    """The run's page inside the site: its path below RESULTS, folders joined by "__"."""
    relative = run.relative_to(results).as_posix()
    return f"{RUNS}/{relative.replace('/', '__') or 'run'}.html"


def build_site(results: Path, out: Path, progress=None) -> list[Path]:
    """Write the site of every run below ``results`` into ``out``; the files written."""
    from specbench.papers.registry import paper_sections
    from specbench.pipeline.views.run_page import render_run

    results, out = Path(results), Path(out)
    runs = run_directories(results)
    written, index_rows, problems = [], [], {}
    for run in runs:
        name = page_name(run, results)
        try:
            page, twin = render_run(run, paper_sections(run))
        except SpecbenchError as error:
            problems[run] = str(error)
        else:
            html.write(out / name, page.replace("<nav>", '<nav><a href="../index.html">all runs</a> ·', 1))
            html.write(out / name.replace(".html", ".json"), twin)
            written += [out / name, out / name.replace(".html", ".json")]
        index_rows.append(_index_row(run, results, None if run in problems else name, problems.get(run)))
        if progress is not None:
            progress()
    sections = [Section("Runs", _index_table(index_rows), [r.attributes for r in index_rows])]
    pages = {"index.html": ("specbench results", f"{len(runs)} runs under {results}", sections)}
    claims = results / CLAIMS
    if claims.is_file():
        body = _linked(render_markdown(claims.read_text()), results, runs)
        pages["claims.html"] = ("Claims ledger", str(claims), [Section("Claims", body)])
    paper_views = papers_section(results, runs)
    if paper_views is not None:
        pages["papers.html"] = ("The papers' tables", "report --paper over each paper's runs", [paper_views])
    links = "".join(f'<a href="{escape(n)}">{escape(t)}</a>' for n, (t, _, _) in pages.items())
    for name, (title, subtitle, parts) in pages.items():
        text = html.page(title, subtitle, parts).replace("<nav>", f"<nav>{links} ·", 1)
        html.write(out / name, text)
        written.append(out / name)
    return written


def _index_row(run: Path, results: Path, page: str | None, problem: str | None) -> Row:
    environment = read_environment(run)
    relative = run.relative_to(results).as_posix()
    paper = relative.split("/")[0]
    models = environment.get("models") or {}
    sources = ", ".join(sorted({str(m.get("source")) for m in models.values() if isinstance(m, dict)}))
    machine = (environment.get("machine") or {}).get("described", "")
    best, text, cell, lossless = None, problem or "", "", ""
    if problem is None and (run / CELLS).is_file():
        best, text, cell, lossless = _headline(load_cells(run))
    link = f'<a href="{escape(page)}">{escape(relative)}</a>' if page else escape(relative)
    cells_row = [
        Cell(link, markup=True),
        Cell(paper),
        Cell(text, best, "speedup_vs_ar"),
        Cell(lossless),
        Cell(machine),
        Cell(cell),
        Cell(sources),
    ]
    return Row(cells_row, {"run": relative, "speedup": "" if best is None else repr(best)})


def _headline(cells) -> tuple[float | None, str, str, str]:
    """A run's best drafting cell by speedup over AR (value, "1.71x [1.61, 1.83]", the cell) and its
    lossless tally ("identical/checked" over every cell)."""
    best, text, cell, lossless = None, "", "", ""
    if "speedup_vs_ar" in cells.columns:
        drafting = cells[(cells["method"] != BASELINE) & cells["speedup_vs_ar"].notna()]
        if len(drafting):
            record = drafting.loc[drafting["speedup_vs_ar"].idxmax()].to_dict()
            best = float(record["speedup_vs_ar"])
            text = format_interval(record, "speedup_vs_ar", "x")
            cell = record["cell"]
    if "lossless_checked" in cells.columns:
        checked = int(cells["lossless_checked"].fillna(0).sum())
        if checked:
            lossless = f"{int(cells['lossless_identical'].fillna(0).sum())}/{checked}"
    return best, text, cell, lossless


def _index_table(rows: list[Row]) -> str:
    header = ["run", "paper", "best speedup over AR", "lossless", "machine", "its cell", "models"]
    return html.table(header, rows, left=("run", "paper", "models", "machine", "lossless", "its cell"))


def render_markdown(text: str) -> str:
    """Markdown (CommonMark with tables) as HTML, by markdown-it-py; raw HTML in the text is escaped."""
    from markdown_it import MarkdownIt

    return MarkdownIt("commonmark", {"html": False}).enable("table").render(text)


def _linked(body: str, results: Path, runs: list[Path]) -> str:
    """Each ``results/...`` path the text cites, linked to the page of the run it names (or the first
    run below it, where it names a folder of runs)."""
    pages = {run.relative_to(results).as_posix(): page_name(run, results) for run in runs}
    prefix = results.name

    def link(match: re.Match) -> str:
        cited = match.group(1).strip("/")
        relative = cited.removeprefix(prefix + "/") if cited.startswith(prefix + "/") else cited
        target = pages.get(relative) or next(
            (p for r, p in pages.items() if r.startswith(relative + "/")), None
        )
        code = f"<code>{match.group(1)}</code>"
        return f'<a href="{escape(target)}">{code}</a>' if target else code

    return re.sub(r"<code>([\w./-]+)</code>", link, body)


def papers_section(results: Path, runs: list[Path]) -> Section | None:
    """Each paper view over the runs in its folder whose cells it can read (markdown, as report
    --paper -f markdown prints it)."""
    from specbench.papers.registry import PAPERS, render_paper

    parts, data = [], []
    for view in PAPERS.values():
        for run in runs:
            relative = run.relative_to(results).as_posix()
            if not _folder_of(view.name, relative):
                continue
            try:
                text = render_paper(run, view.name, "markdown")
            except SpecbenchError:
                continue
            parts.append(f"<h3>{escape(view.name)} · {escape(relative)}</h3>" + render_markdown(text or ""))
            data.append({"paper": view.name, "run": relative})
    if not parts:
        return None
    return Section("Paper tables", "\n".join(parts), data)


def _folder_of(view: str, relative: str) -> bool:
    """Whether a run (by its path below RESULTS) is in the folder of the paper a view belongs to:
    cs-drafting-table3 -> cs_drafting/..."""
    folder = relative.split("/")[0]
    return bool(folder) and view.replace("-", "_").startswith(folder)
