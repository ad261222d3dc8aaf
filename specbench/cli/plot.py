"""``specbench plot``: a run's figures, the generic ones and the papers', as the figures' registry lists
them (:data:`specbench.papers.registry.FIGURES`)."""

from __future__ import annotations

from pathlib import Path

import typer

from specbench.cli.common import err, help_from, user_errors
from specbench.errors import SpecbenchError


def figure_help() -> str:
    """``--figure``'s help: every figure of the registry and what it writes."""
    from specbench.papers.registry import figure_help

    return figure_help()


PLOT_COMMAND = help_from(figure=figure_help)


@user_errors
def plot(
    results: Path = typer.Argument(..., help="A run directory (holding examples.jsonl)."),
    # its help: figure_help(), read when --help is shown
    figure: str = typer.Option("acceptance", "--figure"),
):
    """Figures of a run, written as CSV + PNG into RESULTS (see --figure)."""
    from specbench.papers.registry import ALL_FIGURES, chosen_figures

    for chosen in chosen_figures(figure):
        try:
            paths = chosen.write(results)
        except SpecbenchError as error:
            if figure != ALL_FIGURES:
                raise
            err.print(f"skipped {chosen.name}: {error}", highlight=False, soft_wrap=True)
            continue
        err.print("wrote " + ", ".join(str(p) for p in paths), highlight=False, soft_wrap=True)
