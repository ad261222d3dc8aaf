"""Two readings of a run beyond its table: every cell against one chosen cell of the run, and where each
cell's step time goes.

* :func:`against_cell` (``specbench report RUN --baseline CELL``): a cell's tokens/s over the chosen
  cell's on the same examples (each summed over the examples both ran), with a 95% paired percentile
  bootstrap interval over those examples, how many of their outputs differ from the chosen cell's, and
  for each quality metric that is a mean over examples (accuracy, pass rate, ROUGE-2; not corpus BLEU)
  the difference of the two cells' means with its paired interval: the noise rule of a quality claim.
  The report's own speedups compare each cell with the AR cell of its target; another baseline (AR on
  the compiled engine, a chain drafter) puts two cells head to head.
* :func:`step_parts` (``specbench report RUN --by step``): a speculative step's walltime split into the
  target's pass, the drafters' passes and what is left outside any pass (the loop's Python, host
  syncs, masks), and the speedup over AR the target pass alone would allow (free drafting, no loop: AR's
  time a token over the target pass's time per committed token). A step is a target pass after the
  prompt's prefill, so steps = target passes - examples.
"""

from __future__ import annotations

import json
import math

import pandas as pd

from specbench.methods import BASELINE
from specbench.pipeline.analysis.statistics import paired_bootstrap_difference, paired_bootstrap_ratio
from specbench.tasks.metrics import CORPUS_METRICS


def against_cell(rows: list[dict], baseline: str) -> pd.DataFrame:
    """One row per (dataset, cell) of a dataset that has the cell ``baseline``: speedup, low, high,
    tokens_per_s, outputs_differ, n (the examples both ran) and, per mean quality metric that every
    one of those rows graded, ``<metric>_diff`` (the cell's mean less the baseline's) with
    ``<metric>_diff_low`` and ``_high``. A cell with a replayed row (no walltime) has no speedup (NaN)."""
    by_cell: dict[tuple[str, str], dict[str, dict]] = {}
    datasets: dict[str, int] = {}  # datasets and method entries in the order the rows first name them
    entries: dict[str, int] = {}
    for row in rows:
        by_cell.setdefault((row["dataset"], row["cell"]), {})[row["example_id"]] = row
        datasets.setdefault(row["dataset"], len(datasets))
        entries.setdefault(row.get("method_name", row["cell"]), len(entries))

    def place(key: tuple[str, str]) -> tuple[int, int, str]:
        """A dataset's cells by method entry, then by name (an interleaved run logs a grid shuffled)."""
        entry = next(iter(by_cell[key].values())).get("method_name", key[1])
        return datasets[key[0]], entries[entry], key[1]

    out = []
    for dataset, cell in sorted(by_cell, key=place):
        mine = by_cell[(dataset, cell)]
        base = by_cell.get((dataset, baseline))
        if base is None:
            continue
        shared = sorted(set(mine) & set(base))
        a, b = [mine[e] for e in shared], [base[e] for e in shared]
        tokens, seconds = [r["n_tokens"] for r in a], [r["walltime"] for r in a]
        base_tokens, base_seconds = [r["n_tokens"] for r in b], [r["walltime"] for r in b]
        timed = shared and not any(math.isnan(s) for s in seconds + base_seconds)
        rate = sum(tokens) / sum(seconds) if timed else math.nan
        speedup = rate / (sum(base_tokens) / sum(base_seconds)) if timed else math.nan
        low, high = (
            paired_bootstrap_ratio(tokens, seconds, base_tokens, base_seconds) if timed else (math.nan,) * 2
        )
        out.append(
            {
                "dataset": dataset,
                "cell": cell,
                "speedup": speedup,
                "speedup_low": low,
                "speedup_high": high,
                "tokens_per_s": rate,
                "outputs_differ": sum(r["output_ids"] != s["output_ids"] for r, s in zip(a, b, strict=True)),
                "n": len(shared),
                **_quality_differences(a, b),
            }
        )
    return pd.DataFrame(out)


def _quality_differences(rows: list[dict], base: list[dict]) -> dict[str, float]:
    """``<metric>_diff`` (mean of rows less mean of base, paired by position) and its interval, for
    each mean metric graded on every row of both."""
    graded = [(r.get("quality") or {}) for r in rows + base]
    metrics = sorted(set.intersection(*(set(q) for q in graded))) if graded else []
    out = {}
    for metric in metrics:
        if metric in CORPUS_METRICS or not all(isinstance(q[metric], (int, float)) for q in graded):
            continue
        mine = [float(r["quality"][metric]) for r in rows]
        theirs = [float(r["quality"][metric]) for r in base]
        low, high = paired_bootstrap_difference(mine, theirs)
        out |= {
            f"{metric}_diff": (sum(mine) - sum(theirs)) / len(mine),
            f"{metric}_diff_low": low,
            f"{metric}_diff_high": high,
        }
    return out


def step_parts(cells: pd.DataFrame) -> pd.DataFrame:
    """One row per drafting cell of a cells.csv frame with an AR cell on its dataset and target: ms a
    step in all, of the target's pass, of the drafters' passes, outside any pass, and the
    target-only bound (see the module docstring)."""
    out = []
    for _, cell in cells.iterrows():
        ar = cells[(cells["method"] == BASELINE) & (cells["dataset"] == cell["dataset"])]
        ar = ar[ar["target"] == cell["target"]]
        steps = cell["target_forwards"] - cell["n"]
        if cell["method"] == BASELINE or ar.empty or steps <= 0 or not cell["walltime_s"] > 0:
            continue
        ar_ms_per_token = 1000 * ar.iloc[0]["walltime_s"] / ar.iloc[0]["generated_tokens"]
        target_ms = json.loads(cell["pass_ms"])[cell["target"]]
        step_ms = 1000 * cell["walltime_s"] / steps
        drafter_passes = cell["drafter_forwards"] / steps
        drafter_ms = cell["drafter_pass_ms"] if cell["drafter_forwards"] else 0.0
        out.append(
            {
                "dataset": cell["dataset"],
                "cell": cell["cell"],
                "tokens_per_s": cell["tokens_per_s"],
                "speedup_vs_ar": cell["speedup_vs_ar"],
                "tokens_per_pass": cell["acceptance_length"],
                "step_ms": step_ms,
                "target_ms": target_ms,
                "drafter_passes_per_step": drafter_passes,
                "drafter_ms_per_pass": drafter_ms,
                "outside_ms_per_step": step_ms
                - target_ms * cell["target_forwards"] / steps
                - drafter_ms * drafter_passes,
                "target_only_bound": ar_ms_per_token / (target_ms / cell["acceptance_length"]),
            }
        )
    return pd.DataFrame(out)
