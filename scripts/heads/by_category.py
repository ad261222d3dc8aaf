"""Spec-Bench's mean accepted tokens per step (#MAT: accepted drafts + 1, over the target's steps) of a
run's cells by headline category, beside the speedup over AR: what ``specbench report RUN --by
category`` computes (specbench.pipeline.views.categories), whose leaderboard shows #MAT overall only.

    python -m scripts.heads.by_category RUN > RUN/by_category.txt
"""

import sys
from pathlib import Path

from specbench.pipeline.records.results import read_examples
from specbench.pipeline.views.categories import OVERALL, category_speedups


def main() -> None:
    run = Path(sys.argv[1])
    frame = category_speedups(read_examples(run))
    categories = [c for c in dict.fromkeys(frame["category"]) if c != OVERALL] + [OVERALL]
    print(f"# python -m scripts.heads.by_category {run}: #MAT, speedup over AR (questions)")
    print(f"{'cell':16}" + "".join(f"{c:>24}" for c in categories))
    for cell, rows in frame.groupby("cell", sort=False):
        by = rows.set_index("category")
        print(
            f"{cell:16}"
            + "".join(
                f"{by.at[c, 'accepted_per_step_mean']:>10.2f} {by.at[c, 'speedup']:6.2f}x ({by.at[c, 'n']})"
                if c in by.index
                else f"{'-':>24}"
                for c in categories
            )
        )


if __name__ == "__main__":
    main()
