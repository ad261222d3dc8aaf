"""The ``--paper`` names of ``specbench report``: the paper folders' views, by name.

Each paper folder lists its :class:`~specbench.papers.base.Paper` views in its ``PAPERS``; this
module imports the folders and collects them, so :mod:`specbench.papers.base` never imports a paper.
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from specbench.errors import SpecbenchError
from specbench.papers import cs_drafting, spec_cascades, specdecpp
from specbench.papers.base import Paper, render

PAPERS: dict[str, Paper] = {
    paper.name: paper for folder in (cs_drafting, spec_cascades, specdecpp) for paper in folder.PAPERS
}


def check_paper(paper: str) -> Paper:
    """The paper view named ``paper``; a one-line error naming the others when there is none."""
    if paper not in PAPERS:
        raise SpecbenchError("--paper", f"unknown paper table {paper!r}", f"use one of {', '.join(PAPERS)}")
    return PAPERS[paper]


def render_paper(results: Path, paper: str, fmt: str = "table", console: Console | None = None) -> str | None:
    """Print (fmt ``table``) or return (``markdown``, ``csv``) a paper's table beside a run's cells."""
    return render(results, check_paper(paper), fmt, console)
