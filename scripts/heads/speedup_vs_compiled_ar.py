"""Every cell of a run against one baseline cell of the same run (default ``ar-compiled``: the same
weights on the compiled engine), with a 95% bootstrap interval over whole examples; the report's own
speedups compare each cell with the AR cell of its target. Another baseline, e.g. a chain drafter's
cell, puts the tree head to head with it.

    RUN=results/heads/smollm2_eagle_onednn/<machine>
    python -m scripts.heads.speedup_vs_compiled_ar $RUN > $RUN/vs_compiled_ar.txt
    python -m scripts.heads.speedup_vs_compiled_ar $RUN sd-lookup   # every cell against prompt lookup

The speedup is the cell's tokens/s over the baseline's, each summed over the examples; for a lossless
cell, whose examples yield the baseline's tokens, that is the baseline's walltime over the cell's. In
bfloat16 the outputs of two cells may part at near-ties (the report's `lossless` column counts those
ties apart from mismatches), and the line says how many outputs differ from the baseline's.
"""

import json
import sys
from pathlib import Path

from specbench.pipeline.statistics import paired_bootstrap_ratio


def main(run: Path, baseline: str = "ar-compiled") -> None:
    rows: dict[str, dict[str, dict]] = {}
    for line in (run / "examples.jsonl").read_text().splitlines():
        row = json.loads(line)
        rows.setdefault(row["cell"], {})[row["example_id"]] = row
    examples = sorted(rows[baseline])
    base = [rows[baseline][e] for e in examples]
    print(f"# {run}: every cell against {baseline} (tokens/s ratio, 95% paired bootstrap over examples)")
    for cell, by_example in rows.items():
        mine = [by_example[e] for e in examples]
        differ = sum(r["output_ids"] != b["output_ids"] for r, b in zip(mine, base, strict=True))
        tokens, seconds = [r["n_tokens"] for r in mine], [r["walltime"] for r in mine]
        base_tokens, base_seconds = [r["n_tokens"] for r in base], [r["walltime"] for r in base]
        low, high = paired_bootstrap_ratio(tokens, seconds, base_tokens, base_seconds)
        rate = sum(tokens) / sum(seconds)
        speedup = rate / (sum(base_tokens) / sum(base_seconds))
        note = f" ({differ} of {len(examples)} outputs differ)" if differ else ""
        print(f"{cell}: {speedup:.2f}x [{low:.2f}, {high:.2f}], {rate:.1f} tokens/s{note}")


if __name__ == "__main__":
    main(Path(sys.argv[1]), *sys.argv[2:3])
