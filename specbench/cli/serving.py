"""``specbench serving``: the views serving engineers read from a ``specbench load`` sweep."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from specbench.cli.common import err, help_from, user_errors


def view_help() -> str:
    """``--view``'s help: every view and what it shows or writes."""
    from specbench.pipeline.views.serving_view import ALL_VIEWS, VIEWS

    return "; ".join([*(f"{name}: {text}" for name, text in VIEWS.items()), f"{ALL_VIEWS}: every one."])


SERVING_COMMAND = help_from(view=view_help)


@user_errors
def serving(
    sweep: Path = typer.Argument(..., help="A `specbench load` output directory (holding load.csv)."),
    # its help: view_help(), read when --help is shown
    view: str = typer.Option("all", "--view"),
):
    """A load sweep as serving engineers read it: per-user speed against throughput per core or GPU
    (Pareto, frontier marked), speedup against load with paired 95% intervals, the k that maximises
    goodput and throughput at each level (written as k_schedule.json, in vLLM's
    num_speculative_tokens_per_batch_size for vLLM cells), acceptance pooled beside per request, and the
    draft / verify / overhead split where the engine exposes it (see --view)."""
    from specbench.pipeline.views.serving_view import show_views

    console = Console()
    if not console.is_terminal:  # piped or captured: do not squeeze the tables into 80 columns
        console = Console(width=240)
    for path in show_views(sweep, view, console, err):
        err.print(f"wrote {path}", highlight=False, soft_wrap=True)
