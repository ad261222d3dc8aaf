"""The acceptance length of each cell of the second head against the same cell of the first, paired by
prompt within each dataset of the run: the report's "acc. len" (generated tokens / target steps, a
ratio of sums over the prompts) and a 95% percentile bootstrap interval of the difference (prompts
resampled together, B = 2000, seed 0). A cell of the first head (its recipe name FIRST, e.g.
``eagle-tree``) is paired with the cell whose name has SECOND in place of FIRST
(``eagle-unroll3-tree``).

    python -m scripts.heads.paired_acceptance RUN FIRST SECOND
"""

import json
import random
import sys
from pathlib import Path


def per_prompt(rows, cell):
    return {r["example_id"]: (r["n_tokens"], len(r["steps"])) for r in rows if r["cell"] == cell}


def differences(rows, first, second):
    """One line per cell of the first head: both lengths and the paired bootstrap interval."""
    for cell in sorted({r["cell"] for r in rows if r["drafter"] == first}):
        a, b = per_prompt(rows, cell), per_prompt(rows, cell.replace(first, second, 1))
        prompts = sorted(a)
        rng, diffs = random.Random(0), []
        for _ in range(2000):
            sample = [rng.choice(prompts) for _ in prompts]
            diffs.append(length(b, sample) - length(a, sample))
        diffs.sort()
        low, high = diffs[49], diffs[1950]
        gain = length(b, prompts) - length(a, prompts)
        interval = f"[{low:+.3f}, {high:+.3f}]"
        yield f"{cell:22} {length(a, prompts):10.2f} {length(b, prompts):14.2f} {gain:+10.3f} {interval}"


def length(by_prompt, prompts):
    return sum(by_prompt[p][0] for p in prompts) / sum(by_prompt[p][1] for p in prompts)


def main() -> None:
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    run, first, second = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    rows = [json.loads(line) for line in (run / "examples.jsonl").open()]
    print(f"# python -m scripts.heads.paired_acceptance {' '.join(sys.argv[1:])}")
    datasets = list(dict.fromkeys(r["dataset"] for r in rows))
    for dataset in datasets:
        if len(datasets) > 1:
            print(f"## {dataset}")
        print(f"{'cell':22} {first:>10} {second:>14} {'difference [95%]':>26}")
        for line in differences([r for r in rows if r["dataset"] == dataset], first, second):
            print(line)


if __name__ == "__main__":
    main()
