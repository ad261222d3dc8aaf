"""CS Drafting's command: ``specbench theory table1``, Table 1's expected walltime improvement (Section 4)."""

from __future__ import annotations

import typer
from rich.console import Console

from specbench.errors import SpecbenchError
from specbench.papers.commands import THEORY, Command


def table1(
    costs: str = typer.Option("params", help="params: parameter-count ratios (MS); leviathan: Table 4 (PW)."),
    temperature: int = typer.Option(0, help="Acceptance rates of Leviathan et al. Table 3 at t=0 or t=1."),
    steps: int = typer.Option(200_000, min=1000, help="Monte-Carlo steps of the simulator per row."),
):
    """CS Drafting Table 1: simulated EWIF of SD and the horizontal cascade, ours beside the paper's.

    Inputs are the T5-XXL acceptance rates of Leviathan et al. 2023 (Table 3) and per-pass costs. The
    paper's numbers reproduce with parameter-count costs (FLAN-T5 77M/248M over 11.1B), not Table 4's.
    """
    from rich.table import Table

    from specbench.papers.cs_drafting.theory import LEVIATHAN_COSTS, PARAM_COSTS, table1_rows

    tables = {"params": PARAM_COSTS, "leviathan": LEVIATHAN_COSTS}
    if costs not in tables:
        raise SpecbenchError("--costs", f"unknown cost table {costs!r}", "use params or leviathan")
    if temperature not in (0, 1):
        raise SpecbenchError("--temperature", f"no acceptance rates for t={temperature}", "use 0 or 1")
    table = Table(title=f"CS Drafting Table 1 (costs: {costs}, t={temperature})", title_justify="left")
    for column in ("dataset", "Md1", "Md2", "k1", "k2", "paper EWIF", "ours", "simulated", "best k"):
        table.add_column(column, justify="left" if column in ("dataset", "Md1", "Md2") else "right")
    for row in table1_rows(tables[costs], temperature_index=temperature, steps=steps):
        best = f"{row['best_k1']}" + (f", {row['best_k2']}" if row["best_k2"] is not None else "")
        table.add_row(
            row["dataset"],
            row["md1"],
            row["md2"] or "",
            str(row["k1"]),
            str(row["k2"] or ""),
            f"{row['paper_ewif']:.2f}",
            f"{row['ewif']:.3f}",
            f"{row['ewif_sim']:.3f}",
            best,
        )
    Console().print(table)


COMMANDS = (
    Command(THEORY, "table1", table1, "CS Drafting's expected walltime improvement (Section 4, table1)"),
)
