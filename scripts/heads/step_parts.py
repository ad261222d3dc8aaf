"""Where a speculative step's time goes in a committed run, cell by cell, from its cells.csv: the target's
pass, the drafter's passes and what is left outside any pass (the loop's Python, host syncs, masks),
each in milliseconds per step, and the speedup over the run's AR cell that the target pass alone would
allow (free drafting, no loop: AR's time per token over the target pass per committed token).

    python -m scripts.heads.step_parts RUN > RUN/step_parts.txt

A step is a target pass after the prompt's prefill (one per example), so steps = target passes - n.
"""

import json
import sys
from pathlib import Path

import pandas as pd

from specbench.models.machine import recorded_machine


def main() -> None:
    run = Path(sys.argv[1])
    cells = pd.read_csv(run / "cells.csv")
    machine = recorded_machine(json.loads((run / "environment.json").read_text())).describe()
    ar = cells[cells.method == "autoregressive"].iloc[0]
    ar_ms_per_token = 1000 * ar.walltime_s / ar.generated_tokens
    print(f"# python -m scripts.heads.step_parts {run}; measured on {machine}")
    print(f"# AR ({ar.cell}): {ar_ms_per_token:.2f} ms a token")
    print(
        f"{'cell':40} {'tok/s':>7} {'vs AR':>6} {'tokens/pass':>11} {'ms/step':>8} {'target ms':>9} "
        f"{'drafter passes/step':>19} {'drafter ms/pass':>15} {'outside ms/step':>15} "
        f"{'target-only bound':>17}"
    )
    for _, cell in cells[cells.method != "autoregressive"].iterrows():
        name = cell.cell
        target = json.loads(cell.pass_ms)[cell.target]
        steps = cell.target_forwards - cell.n
        step_ms = 1000 * cell.walltime_s / steps
        drafter_ms = cell.drafter_pass_ms if cell.drafter_forwards else 0.0
        per_step = cell.drafter_forwards / steps
        outside = step_ms - target * cell.target_forwards / steps - drafter_ms * per_step
        bound = ar_ms_per_token / (target / cell.acceptance_length)
        print(
            f"{name:40} {cell.tokens_per_s:7.1f} {cell.speedup_vs_ar:6.2f} {cell.acceptance_length:11.2f} "
            f"{step_ms:8.2f} {target:9.2f} {per_step:19.2f} {drafter_ms:15.3f} {outside:15.2f} {bound:16.2f}x"
        )


if __name__ == "__main__":
    main()
