"""The papers' theory beside every committed speculative-decoding, speculative-cascade and CS Drafting
cell (MS costs).

    python -m scripts.theory.cell_theory   # writes results/theory/cell_theory.md

theory: E[tokens per target step] / E[cost per step] from the cell's measured acceptance by draft
position (specbench.decoding.theory: Leviathan et al. 2023, Theorem 3.8; Chen et al. 2024,
Corollary 4.2 and Theorems 4.3/4.5 for the K-matrix rule, without their i.i.d. assumption); i.i.d.:
the same with one alpha per reviewer fitted to its steps. Computed from the rows as cells.csv now
computes them. "Cut rounds counted" compares the theory with the measured SWI scaled by the tokens the
rounds committed over the tokens the outputs kept (an output's last round is cut at EOS or the budget,
an edge the theory ignores; ``specbench.decoding.theory.committed_over_kept``).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from specbench.decoding.theory import committed_over_kept_by_cell
from specbench.pipeline.analysis.summary import summarise
from specbench.pipeline.records.results import read_examples

ROOT = Path(__file__).resolve().parents[2]
KINDS = ("SD, neural drafter", "SD, statistical drafter", "CS Drafting", "Speculative cascade")


def kind(method: str, drafter_cost: float | None) -> str:
    if method == "cs_drafting":
        return KINDS[2]
    if method == "spec_cascade":
        return KINDS[3]
    return KINDS[1] if drafter_cost == 0 else KINDS[0]


def main() -> str:
    lines = [
        "| run | dataset | cell | drafters | SWI MS measured | theory (by position) | error "
        "| tokens committed / kept | error, cut rounds counted | theory (i.i.d.) "
        "| error, cut rounds counted |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    by_kind: dict[str, list[float]] = {k: [] for k in KINDS}
    by_kind_cut: dict[str, list[float]] = {k: [] for k in KINDS}
    iid: dict[str, list[float]] = {k: [] for k in KINDS}
    for examples in sorted(ROOT.glob("results/**/examples.jsonl")):
        rows = read_examples(examples.parent)
        cells = summarise(rows)
        if "swi_ms_theory" not in cells.columns:
            continue
        costs = {r["cell"]: r["costs"]["ms"] for r in rows}
        cuts = committed_over_kept_by_cell(rows)
        for cell in cells.dropna(subset=["swi_ms_theory"]).itertuples():
            group = kind(cell.method, costs[cell.cell].get(cell.drafter))
            cut = cuts[cell.dataset, cell.cell]
            error = cell.swi_ms_theory / cell.swi_ms - 1
            error_cut = cell.swi_ms_theory / (cell.swi_ms * cut) - 1
            error_iid = cell.swi_ms_theory_iid / (cell.swi_ms * cut) - 1
            by_kind[group].append(abs(error))
            by_kind_cut[group].append(abs(error_cut))
            iid[group].append(abs(error_iid))
            lines.append(
                f"| `{examples.parent.relative_to(ROOT)}` | {cell.dataset} | `{cell.cell}` | "
                f"{cell.drafter} | "
                f"{cell.swi_ms:.3f} | {cell.swi_ms_theory:.3f} | {100 * error:+.1f}% | {cut:.3f} | "
                f"{100 * error_cut:+.1f}% | {cell.swi_ms_theory_iid:.3f} | {100 * error_iid:+.1f}% |"
            )
    head = [
        "| cells | n | median \\|error\\|, by position | largest | the same, cut rounds counted | largest "
        "| median \\|error\\|, i.i.d., cut rounds counted | largest |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for group in KINDS:
        a, c, b = pd.Series(by_kind[group]), pd.Series(by_kind_cut[group]), pd.Series(iid[group])
        head.append(
            f"| {group} | {len(a)} | {100 * a.median():.1f}% | {100 * a.max():.1f}% | "
            f"{100 * c.median():.1f}% | {100 * c.max():.1f}% | "
            f"{100 * b.median():.1f}% | {100 * b.max():.1f}% |"
        )
    return "\n".join(head) + "\n\n" + "\n".join(lines)


if __name__ == "__main__":
    text = main()
    (ROOT / "results" / "theory" / "cell_theory.md").write_text(text + "\n")
    print(text)
