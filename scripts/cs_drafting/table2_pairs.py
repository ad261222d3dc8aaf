"""Every pair of CS Drafting Table 2 rows, with the paired 95% interval of our SWI ratio.

    python -m scripts.cs_drafting.table2_pairs   # writes results/cs_drafting/table2_pairs.md

`specbench report RUN --paper cs-drafting-table2` prints the interval only for the pairs whose order
reverses the paper's; the claims ledger also needs it for the pairs that keep it. The cells compared
are the view's (the best cell of each row and column) and the interval is the view's (paired by
prompt, `specbench.papers.base.paired_interval`).
"""

from __future__ import annotations

import itertools
from pathlib import Path

from specbench.papers.base import load_runs, paired_interval
from specbench.papers.cs_drafting.tables import table2

ROOT = Path(__file__).resolve().parents[2]
RUNS = (
    "table2_smollm2_paper_ratios",
    "table2_smollm2_offline",
    "qwen_table2_offline/amd-epyc-family25-avx512-bf16",
)


def pairs(run_directory: Path, label: str) -> list[str]:
    runs = load_runs(run_directory)
    _, tidy = table2(runs)
    rows = [r for r in tidy if r["table"] == "2" and r["algorithm"] != "Autoregressive" and r["cell"]]
    lines = []
    groups: dict[tuple[str, str], list[dict]] = {}
    for row in rows:
        groups.setdefault((row["dataset"], row["metric"]), []).append(row)
    for (dataset, metric), group in groups.items():
        for a, b in itertools.combinations(group, 2):
            cells = [_cell(runs, r) for r in (a, b)]
            low, high = paired_interval(runs, *cells, metric.removeprefix("swi_"))
            noise = "within noise" if low <= 1.0 <= high else "resolved"
            lines.append(
                f"| `{label}` | {dataset} | {metric.removeprefix('swi_').upper()} | "
                f"{_row(a)} / {_row(b)} | {a['paper']:.2f} / {b['paper']:.2f} | "
                f"{a['ours']:.3f} / {b['ours']:.3f} | {low:.3f}-{high:.3f} | {noise} |"
            )
    return lines


def _cell(runs, row: dict) -> dict:
    """The view's cell of ``row`` (its run, cell name and dataset, e.g. GSM8K -> gsm8k/test)."""
    cells = next(run for run in runs if run.name == row["run"]).cells
    dataset = cells["dataset"].str.split("/").str[0] == row["dataset"].lower()
    return cells[(cells["cell"] == row["cell"]) & dataset].iloc[0].to_dict()


def _row(row: dict) -> str:
    return f"{row['algorithm']} {row['drafters']}"


def main() -> str:
    head = [
        "CS Drafting Table 2 (Chen et al., NeurIPS 2024), every pair of rows: the view's best cell of each "
        "row and SWI column, and the paired 95% bootstrap interval (over the prompts) of the first row's "
        "SWI over the second's; resolved: the interval excludes 1. "
        "Written by python -m scripts.cs_drafting.table2_pairs.",
        "",
        "| run | dataset | SWI | rows (first / second) | paper | ours "
        "| paired 95% CI of ours, first / second | order |",
        "|---|---|---|---|---|---|---|---|",
    ]
    lines = [line for run in RUNS for line in pairs(ROOT / "results" / "cs_drafting" / run, run)]
    return "\n".join(head + lines)


if __name__ == "__main__":
    text = main()
    (ROOT / "results" / "cs_drafting" / "table2_pairs.md").write_text(text + "\n")
    print(text)
