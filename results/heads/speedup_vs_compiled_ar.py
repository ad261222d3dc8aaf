"""Every cell of a run against the AR cell of another engine in the same run (``ar-compiled``: the same
weights on the compiled engine), with a 95% bootstrap interval over whole examples; the report's own
speedups compare each cell with the AR cell of its target.

    RUN=results/heads/smollm2_eagle_onednn/<machine>
    python results/heads/speedup_vs_compiled_ar.py $RUN > $RUN/vs_compiled_ar.txt

Every cell here is lossless, so a cell's example yields the same tokens as AR's and the speedup is AR's
walltime over the cell's, summed over the examples.
"""

import json
import sys
from pathlib import Path

from specbench.pipeline.statistics import bootstrap_ratio

BASELINE = "ar-compiled"


def main(run: Path) -> None:
    rows: dict[str, dict[str, dict]] = {}
    for line in (run / "examples.jsonl").read_text().splitlines():
        row = json.loads(line)
        rows.setdefault(row["cell"], {})[row["example_id"]] = row
    examples = sorted(rows[BASELINE])
    base = [rows[BASELINE][e] for e in examples]
    print(f"# {run}: every cell against {BASELINE} (walltime ratio, 95% bootstrap over examples)")
    for cell, by_example in rows.items():
        mine = [by_example[e] for e in examples]
        if [r["output_ids"] for r in mine] != [r["output_ids"] for r in base]:
            print(f"{cell}: outputs differ from {BASELINE}'s, no speedup")
            continue
        ours, theirs = [r["walltime"] for r in mine], [r["walltime"] for r in base]
        low, high = bootstrap_ratio(theirs, ours)
        tokens = sum(r["n_tokens"] for r in mine)
        speedup = sum(theirs) / sum(ours)
        print(f"{cell}: {speedup:.2f}x [{low:.2f}, {high:.2f}], {tokens / sum(ours):.1f} tokens/s")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
