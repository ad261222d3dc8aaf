"""Figures from a run directory: acceptance rate by draft position (CS Drafting, Figure 2), marginal and
conditional on the drafts before it accepted (decoding.steps.acceptance_rates), and speculation under load.

A figure that ``specbench plot --figure NAME`` writes is declared as a :class:`Figure` in a module-level
``FIGURES``: here for the generic ones, in a paper folder's ``__init__`` for the paper's own;
:data:`specbench.papers.registry.FIGURES` collects them."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from specbench.decoding.steps import acceptance_rates, position_counts
from specbench.errors import SpecbenchError
from specbench.pipeline.records.results import read_examples, write_atomic
from specbench.pipeline.views.load_view import write_load_plot
from specbench.pipeline.views.serving_view import write_pareto_plot


@dataclass(frozen=True)
class Figure:
    name: str  # what --figure names
    help: str
    # write(run directory) -> the files written; a SpecbenchError when the run holds nothing to draw
    write: Callable[[Path], list[Path]]


ACCEPTANCE_CSV = "acceptance_by_position.csv"
ACCEPTANCE_PNG = "acceptance_by_position.png"


def acceptance_by_position(run_dir: Path) -> pd.DataFrame:
    """One row per (dataset, cell, draft position): drafts proposed there, accepted, the rate, and the
    steps that reviewed the position after accepting every draft before it (``reached``) with the
    conditional rate accepted / reached. Counted from the rows' steps, as ``accepted_by_position``."""
    rows = read_examples(run_dir)
    if not rows:
        raise SpecbenchError(str(run_dir), "no examples.jsonl rows here", "point at a run directory")
    steps: dict[tuple[str, str], list] = defaultdict(list)
    for row in rows:
        steps[(row["dataset"], row["cell"])].extend(row["steps"])
    records = []
    for (dataset, cell), cell_steps in sorted(steps.items()):
        counts = position_counts(cell_steps)
        marginal, conditional = acceptance_rates(counts)
        for position, ((proposed, accepted, reached), rate, given) in enumerate(
            zip(counts.tolist(), marginal, conditional, strict=True), start=1
        ):
            records.append((dataset, cell, position, proposed, accepted, rate, reached, given))
    columns = ["dataset", "cell", "position", "proposed", "accepted", "acceptance_rate"]
    return pd.DataFrame(records, columns=[*columns, "reached", "conditional_rate"])


def dataset_panels(datasets: list[str], width: float = 5, height: float = 3.8, extra: float = 0):
    """(pyplot, figure, row of axes): one panel per dataset, drawn off-screen."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(
        1, len(datasets), figsize=(width * len(datasets) + extra, height), squeeze=False
    )
    return plt, figure, axes[0]


def save_panels(plt, figure, axes, path: Path, legends: bool = True) -> Path:
    """A light grid and (``legends``) each panel's own legend, then the PNG at 120 dpi."""
    for ax in axes:
        ax.grid(alpha=0.3)
        if legends and ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path


def write_acceptance_plot(run_dir: Path) -> tuple[Path, Path]:
    """acceptance_by_position.csv and .png in ``run_dir``; one line per speculative cell and dataset, the
    marginal rate in the top row of panels and the conditional rate below it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    table = acceptance_by_position(run_dir)
    csv_path, png_path = run_dir / ACCEPTANCE_CSV, run_dir / ACCEPTANCE_PNG
    write_atomic(csv_path, table.to_csv(index=False))
    datasets = list(dict.fromkeys(table["dataset"])) or ["(none)"]
    cells = list(dict.fromkeys(table["cell"]))
    colors, markers = plt.get_cmap("tab20").colors, "os^Dv<>PX*"
    # one style per cell across panels, distinct for up to 20 cells; one legend beside the panels
    style = {c: {"color": colors[i % 20], "marker": markers[i % 10]} for i, c in enumerate(cells)}
    figure, axes = plt.subplots(2, len(datasets), figsize=(5 * len(datasets) + 3, 7.2), squeeze=False)
    views = (
        ("acceptance_rate", "acceptance rate", "{dataset}"),
        ("conditional_rate", "P(accept i | 1..i-1 accepted)", "{dataset}: conditional"),
    )
    for row, (column, ylabel, title) in zip(axes, views, strict=True):
        for ax, dataset in zip(row, datasets, strict=False):
            for cell, group in table[table["dataset"] == dataset].groupby("cell", sort=False):
                ax.plot(group["position"], group[column], label=cell, markersize=4, **style[cell])
            ax.set(
                title=title.format(dataset=dataset), xlabel="draft position", ylabel=ylabel, ylim=(0, 1.02)
            )
            ax.grid(alpha=0.3)
    handles = {label: h for ax in axes[0] for h, label in zip(*ax.get_legend_handles_labels(), strict=True)}
    if handles:
        figure.legend(handles.values(), handles.keys(), fontsize=7, loc="center right")
    figure.tight_layout(rect=(0, 0, 1 - 3 / (5 * len(datasets) + 3), 1))
    figure.savefig(png_path, dpi=120)
    plt.close(figure)
    return csv_path, png_path


FIGURES = (
    Figure(
        "acceptance",
        "acceptance rate by draft position (CS Drafting Fig. 2)",
        lambda run_dir: list(write_acceptance_plot(run_dir)),
    ),
    Figure(
        "load",
        "speculation's speedup over the same engine's AR by load level, with 95% intervals, from "
        "`specbench load`'s load.csv",
        write_load_plot,
    ),
    Figure(
        "pareto",
        "tokens/s per user (1 / TPOT p50) against tokens/s per core (per GPU on a GPU box), one curve per "
        "cell through its load levels, 95% intervals, the frontier marked, from `specbench load`'s sweep: "
        "pareto.csv + pareto.png",
        write_pareto_plot,
    ),
)
