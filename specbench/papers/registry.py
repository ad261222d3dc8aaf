"""The ``--paper`` names of ``specbench report`` and the ``--figure`` names of ``specbench plot``.

Each paper folder lists its :class:`~specbench.papers.base.Paper` views in its ``PAPERS``, its
figures in its ``FIGURES`` (the generic figures are :data:`specbench.pipeline.views.plots.FIGURES`) and
the sections it adds to a run's HTML page in its ``SECTIONS``; the registries here collect them, so
:mod:`specbench.papers.base` never imports a paper.
"""

from __future__ import annotations

import pkgutil
from pathlib import Path

from rich.console import Console

from specbench.errors import SpecbenchError
from specbench.papers.base import Paper, render
from specbench.pipeline.views.html import PageSection, Section
from specbench.pipeline.views.plots import Figure
from specbench.registry import Registry


def _paper_folder(module: pkgutil.ModuleInfo) -> bool:
    return module.ispkg


PAPERS: Registry[Paper] = Registry("paper view", "specbench.papers", "PAPERS", modules=_paper_folder)
# the generic figures first, then the papers'; ``--figure all`` writes them in this order
FIGURES: Registry[Figure] = Registry(
    "figure", "specbench.papers", "FIGURES", modules=_paper_folder, also=("specbench.pipeline.views.plots",)
)
ALL_FIGURES = "all"
SECTIONS: Registry[PageSection] = Registry(
    "page section", "specbench.papers", "SECTIONS", modules=_paper_folder
)


def paper_sections(run_dir: Path) -> list[Section]:
    """The sections the papers add to ``run_dir``'s HTML page, where the run holds what they show."""
    return [section for entry in SECTIONS.values() if (section := entry.build(run_dir)) is not None]


def check_paper(paper: str) -> Paper:
    """The paper view named ``paper``; a one-line error naming the others when there is none."""
    if paper not in PAPERS:
        raise SpecbenchError("--paper", f"unknown paper table {paper!r}", f"use one of {', '.join(PAPERS)}")
    return PAPERS[paper]


def render_paper(results: Path, paper: str, fmt: str = "table", console: Console | None = None) -> str | None:
    """Print (fmt ``table``) or return (``markdown``, ``csv``) a paper's table beside a run's cells."""
    return render(results, check_paper(paper), fmt, console)


def chosen_figures(figure: str) -> list[Figure]:
    """The figures ``--figure`` names: one, or every one for ``all``; a one-line error naming the
    choices when there is none."""
    if figure == ALL_FIGURES:
        return list(FIGURES.values())
    if figure not in FIGURES:
        choices = ", ".join([*FIGURES, ALL_FIGURES])
        raise SpecbenchError("--figure", f"unknown figure {figure!r}", f"use one of {choices}")
    return [FIGURES[figure]]


def figure_help() -> str:
    """The ``--figure`` option's help: each figure's name and what it writes."""
    lines = [f"{figure.name}: {figure.help}" for figure in FIGURES.values()]
    return "; ".join([*lines, f"{ALL_FIGURES}: every one that applies."])
