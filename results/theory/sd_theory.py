"""Speculative decoding's theory beside every committed SD cell's measured SWI (MS costs).

    python results/theory/sd_theory.py   # writes results/theory/sd_theory.md

theory: E[tokens per step] / (1 + k c) from the cell's acceptance by draft position (Leviathan et al.
2023, Theorem 3.8; Chen et al. 2024, Corollary 4.2, without their i.i.d. assumption); i.i.d.: the same
with one alpha fitted to the cell's steps. Computed from the rows as cells.csv now computes them.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from specbench.pipeline.results import read_examples
from specbench.pipeline.summary import summarise

ROOT = Path(__file__).resolve().parents[2]


def main() -> str:
    lines = [
        "| run | dataset | cell | drafter | SWI MS measured | theory (by position) | error "
        "| theory (i.i.d.) | error |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    by_kind: dict[str, list[float]] = {"neural": [], "statistical": []}
    iid: dict[str, list[float]] = {"neural": [], "statistical": []}
    for examples in sorted(ROOT.glob("results/**/examples.jsonl")):
        rows = read_examples(examples.parent)
        cells = summarise(rows)
        if "swi_ms_theory" not in cells.columns:
            continue
        costs = {r["cell"]: r["costs"]["ms"] for r in rows}
        for cell in cells.dropna(subset=["swi_ms_theory"]).itertuples():
            kind = "statistical" if costs[cell.cell].get(cell.drafter) == 0 else "neural"
            error = cell.swi_ms_theory / cell.swi_ms - 1
            error_iid = cell.swi_ms_theory_iid / cell.swi_ms - 1
            by_kind[kind].append(abs(error))
            iid[kind].append(abs(error_iid))
            lines.append(
                f"| `{examples.parent.relative_to(ROOT)}` | {cell.dataset} | `{cell.cell}` | "
                f"{cell.drafter} | "
                f"{cell.swi_ms:.3f} | {cell.swi_ms_theory:.3f} | {100 * error:+.1f}% | "
                f"{cell.swi_ms_theory_iid:.3f} | {100 * error_iid:+.1f}% |"
            )
    head = [
        "| drafter | SD cells | median \\|error\\|, by position | largest "
        "| median \\|error\\|, i.i.d. | largest |",
        "|---|---|---|---|---|---|",
    ]
    for kind in by_kind:
        a, b = pd.Series(by_kind[kind]), pd.Series(iid[kind])
        head.append(
            f"| {kind} | {len(a)} | {100 * a.median():.1f}% | {100 * a.max():.1f}% | "
            f"{100 * b.median():.1f}% | {100 * b.max():.1f}% |"
        )
    return "\n".join(head) + "\n\n" + "\n".join(lines)


if __name__ == "__main__":
    text = main()
    (Path(__file__).resolve().parent / "sd_theory.md").write_text(text + "\n")
    print(text)
