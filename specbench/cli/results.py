"""Reading committed runs: ``report`` (a run's tables, a paper's, Spec-Bench's categories), ``compare``
(several runs side by side) and ``check`` (whether they are still what today's code measures)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

from specbench.cli.common import err, help_from, user_errors, write_text
from specbench.errors import SpecbenchError


def paper_help() -> str:
    """``--paper``'s help: each view of the papers' registry and what it shows (one paper's views are
    alternatives, joined by "or")."""
    from itertools import groupby

    from specbench.papers.registry import PAPERS

    papers = groupby(PAPERS.values(), key=lambda view: view.reference)  # a paper's views share its numbers
    listed = "; ".join(" or ".join(f"{view.name} ({view.help})" for view in views) for _, views in papers)
    return f"Print a paper's table with our best cells beside it: {listed}. Formats: table, markdown, csv."


REPORT_COMMAND = help_from(paper=paper_help)


@user_errors
def report(
    results: Path = typer.Argument(Path("results"), help="A run directory, or a folder of run directories."),
    format: str = typer.Option("table", "--format", "-f", help="table (Rich), csv, markdown or latex."),
    # its help: paper_help(), read when --help is shown
    paper: str = typer.Option(None, "--paper"),
    by: str = typer.Option(
        None,
        "--by",
        help="category: Spec-Bench's leaderboard from examples.jsonl, one row per method cell: speedup "
        "over AR per category (MT-Bench, Translation, Summarization, QA, Math, RAG) and overall, with "
        "paired bootstrap intervals, and #Mean Accepted Tokens. Needs rows that carry a category "
        "(task spec_bench). step: where each drafting cell's step goes (the target's pass, the drafters' "
        "passes, the time outside any pass) and the speedup the target pass alone would allow. k: the "
        "model-card table, acceptance length per draft length k per dataset, pooled over the run and as "
        "the mean of per-request values side by side (--html/--json write it as a page).",
    ),
    baseline: str = typer.Option(
        None,
        "--baseline",
        help="A cell of the run (e.g. ar-compiled, sd-lookup): every cell's tokens/s over that cell's on "
        "the same examples, with a 95% paired bootstrap interval, how many outputs differ from it, and "
        "each mean quality metric's difference from it (Δ accuracy) with its paired interval.",
    ),
    html: Path = typer.Option(
        None,
        "--html",
        help="Also write the run as one self-contained HTML page (opens from disk, fetches nothing): the "
        "machine card, these tables with their intervals and why-lines, acceptance by position, tokens "
        "per step, the lossless tally with the diverging examples, predicted vs measured speedup, the load "
        "curves and the cascades' quality-latency frontier where the run has them. RESULTS must be one "
        "run, or a load sweep's directory alone (load.csv, no cells.csv), whose page is its serving views.",
    ),
    json: Path = typer.Option(
        None, "--json", help="Also write the HTML page's numbers as JSON (for other tools); one run."
    ),
    engines: bool = typer.Option(
        False,
        "--engines",
        help="One run whose cells ran in several engines (issue 59's table): per cell its setup (engine and "
        "weights file), tokens/s, speedup over the same setup's AR with a paired interval, tokens per "
        "target pass against specbench's eager cell, each engine's own acceptance figure, and each AR's "
        "time per token beside the memory-bandwidth limit; below each table the goals (compiled AR within "
        "1.2x of llama.cpp's BF16 AR, tokens per pass within 2%) and the fastest setup at AR and at SD.",
    ),
    roofline: str = typer.Option(
        None,
        "--roofline",
        help="With --engines: the profile whose measured bandwidth gives the limit (specbench probe RECIPE "
        "--roofline --out FILE on the run's machine, or a device of devices.yaml); default: the run "
        "folder's profile.json where there is one.",
    ),
):
    """One table per dataset: method, drafters, k, SWI (MS, PW), tokens/s, speedup, acceptance, quality.

    With --paper, the paper's table instead: each paper row beside the best of our matching cells.
    With --by category, Spec-Bench's leaderboard by category (Xia et al., Findings of ACL 2024); with
    --by step, where each step's time goes; with --by k, acceptance length per draft length (the
    table published heads' model cards give). With --baseline CELL, every cell against that cell.
    With --engines, one run's cells across engines beside the bandwidth limit (issue 59's table).
    """
    flags = (("--by", by), ("--paper", paper), ("--baseline", baseline), ("--engines", engines))
    chosen = [name for name, value in flags if value]
    if roofline is not None and not engines:
        raise SpecbenchError("--roofline", "sets the limit of the --engines table", "add --engines")
    if len(chosen) > 1:
        raise SpecbenchError(chosen[1], f"cannot be combined with {chosen[0]}", "pass one of them")
    page = "--html" if html else "--json" if json else None
    if chosen and page and by != "k":
        raise SpecbenchError(
            page, f"writes the run's page, which {chosen[0]} does not shape", f"drop {chosen[0]} (or {page})"
        )
    if by is not None:
        if by not in ("category", "step", "k"):
            raise SpecbenchError("--by", f"unknown breakdown {by!r}", "use --by category, step or k")
        from specbench.pipeline.views.breakdowns import render_steps
        from specbench.pipeline.views.by_k import render_by_k
        from specbench.pipeline.views.categories import render_categories

        if by == "k":
            _check_page_outputs(html, json)
        views = {"category": render_categories, "step": render_steps, "k": render_by_k}
        text = views[by](results, format)
    elif engines:
        from specbench.pipeline.views.engines_view import render_engines

        text = render_engines(results, format, roofline)
    elif baseline is not None:
        from specbench.pipeline.views.breakdowns import render_against

        text = render_against(results, baseline, format)
    elif paper is not None:
        from specbench.papers.registry import check_paper, render_paper

        check_paper(paper)  # a misspelt name is reported before the results are read
        text = render_paper(results, paper, format)
    else:
        from specbench.pipeline.views.report import render

        alone = False  # a load sweep without a run's cells.csv: no tables, its page is the serving views
        if html or json:  # before the tables: a folder of runs or a bad path is refused first
            from specbench.pipeline.views.run_page import run_directory, sweep_alone

            alone = sweep_alone(run_directory(results))
            _check_page_outputs(html, json)
        text = None if alone else render(results, format)
    write_text(text)
    if (html or json) and by == "k":
        from specbench.pipeline.views.by_k import by_k_page

        page, twin = by_k_page(results)
        _write_page(html, page, json, twin)
    elif html or json:
        from specbench.papers.registry import paper_sections
        from specbench.pipeline.views.run_page import render_run, run_directory, sweep_alone

        page, twin = render_run(results, paper_sections(run_directory(results)))
        _write_page(html, page, json, twin)
        if sweep_alone(results):
            err.print(
                f"{results} holds a load sweep and no cells.csv: no run tables; the page shows the "
                f"sweep's serving views (`specbench serving {results}` prints them)",
                highlight=False,
                soft_wrap=True,
            )


def _check_page_outputs(html: Path | None, json: Path | None) -> None:
    from specbench.pipeline.views.html import check_output_file

    for path, flag in ((html, "--html"), (json, "--json")):
        if path is not None:
            check_output_file(path, flag)


def _write_page(html: Path | None, page: str, json: Path | None, twin: str) -> None:
    from specbench.pipeline.views.html import write

    for path, text in ((html, page), (json, twin)):
        if path is not None:
            write(path, text)
            err.print(f"wrote {path}", highlight=False, soft_wrap=True)


@user_errors
def compare(
    runs: list[Path] = typer.Argument(
        ..., help="Two run directories or more (each holding cells.csv); the first is the reference."
    ),
    format: str = typer.Option("table", "--format", "-f", help="table (Rich), csv, markdown or latex."),
    allow_incomparable: bool = typer.Option(
        False,
        "--allow-incomparable",
        help="Show cells that are another experiment in a later run (other models, generation settings, "
        "method parameters or examples) marked ≠ instead of refusing them.",
    ),
    html: Path = typer.Option(
        None,
        "--html",
        help="Also write the comparison as one self-contained HTML page: each run's machine and models, "
        "these tables (sortable by a click) and a tokens/s chart per dataset.",
    ),
    json: Path = typer.Option(None, "--json", help="Also write the HTML page's numbers as JSON."),
):
    """The same cells of several runs side by side, one table per dataset.

    Cells are matched on dataset and cell id. Per run: tokens/s, speedup over that run's AR cell and
    SWI MS (each with its 95% bootstrap interval where cells.csv has one; older files show the value
    alone), acceptance length; and for each run after the first, its tokens/s over the first run's on
    the same cell (> 1: faster). A cell missing from a run, or a value it did not measure (replayed
    cells have no time), shows "—". The runs may differ in machine, dtype, engine and threads (each
    run's is named above its table); a cell whose models, generation settings, method parameters or
    examples differ is refused unless --allow-incomparable. Example:
    specbench compare results/quickstart results/quickstart-mine
    """
    from specbench.pipeline.views.compare import render_compare

    if html or json:
        _check_page_outputs(html, json)
    text = render_compare(runs, format, allow_incomparable=allow_incomparable)
    write_text(text)
    if html or json:
        from specbench.pipeline.views.compare_page import render_comparison

        page, twin = render_comparison(runs, allow_incomparable)
        _write_page(html, page, json, twin)


@user_errors
def check(
    results: list[Path] = typer.Argument(
        ..., help="Run directories, or folders searched for them (e.g. results/)."
    ),
):
    """Whether committed results still are what today's code measures.

    For each run directory (one holding examples.jsonl; a load sweep's, holding load.csv, has its files
    checked only): its resolved_recipe.yaml must still validate,
    must key every recorded row as the row is keyed (a method revision, a changed default or model
    entry changes the keys), and its trained drafters and heads must have been trained as the local
    copies were (environment.json records a digest of each one's training), and its published heads
    (eagle3:, eagle1:, medusa-heads:) the files now at their source. First its files are
    checked as every reader checks them: a row, cells.csv or a sweep's file edited since it was written
    (or a checksum deleted, even every one) is "altered", whatever PROVENANCE.md says. A directory kept on
    purpose although stale names, in the first line of its PROVENANCE.md, the commit that made it and
    why it stays. Reads only. Exit 1 when a directory is stale without such a declaration, e.g.
    specbench check results/
    """
    from rich.table import Table

    from specbench.pipeline.run.provenance import check_run, result_directories

    table = Table("run", "state", "why")
    failed = False
    for directory in [d for path in results for d in result_directories(path)]:
        finding = check_run(directory)
        if finding.altered:
            state, failed = "altered", True
        elif not finding.stale:
            state = "current"
        elif finding.accepted:
            state = "stale, declared"
        else:
            state, failed = "stale", True
        why = (
            finding.altered
            + finding.problems
            + ([f"PROVENANCE.md: {finding.declared}"] if finding.declared else [])
        )
        text = "\n".join(why + [f"note: {n}" for n in finding.notes])
        table.add_row(escape(str(directory)), state, escape(text))
    Console(width=200).print(table)
    if failed:
        raise typer.Exit(1)


@user_errors
def site(
    results: Path = typer.Argument(Path("results"), help="A folder of run directories (searched below)."),
    out: Path = typer.Option(
        ..., "--output-dir", "-o", help="Where the site goes (index.html and the rest)."
    ),
):
    """Every run below RESULTS as a static site that opens from disk and fetches nothing.

    index.html lists one row per run (paper, models, machine, best speedup over AR with its interval,
    lossless tally), each linked to the run's page (the page of `report RUN --html`, with its JSON
    twin beside it); claims.html renders RESULTS/CLAIMS.md with each cited run linked; papers.html
    holds the papers' tables (report --paper) over each paper's runs. Example:
    specbench site results -o site
    """
    from rich.progress import Progress

    from specbench.papers.site import build_site, check_site_folder, run_directories

    check_site_folder(out)
    with Progress(console=err, transient=True) as progress:
        task = progress.add_task("pages", total=len(run_directories(results)))
        written = build_site(results, out, progress=lambda: progress.advance(task))
    err.print(f"wrote {len(written)} files; open {out / 'index.html'}", highlight=False, soft_wrap=True)
