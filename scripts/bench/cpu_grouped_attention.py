"""What reading grouped KV heads in place saves a multi-row pass on the CPU (specbench.models.attention).

SmolLM2-135M-Instruct (float32, 9 query heads on 3 KV heads), eager engine, the linear layers' library
as asked (default onednn): passes of 1 to 17 rows (a tree or chain verification) after a cache of 300
and 600 positions, with transformers' path (each KV head copied 3 times, ``repeat_kv``) and ours
(``enable_gqa``), interleaved pass by pass, and the two passes' logits compared bit for bit.

    python -m scripts.bench.cpu_grouped_attention [aten|onednn] > results/bench/cpu_grouped_attention_<m>.txt
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

from specbench.models import attention
from specbench.models.machine import this_machine
from specbench.models.tree import TokenTree
from specbench.sources import ModelRequest, load

REPEATS = 15


def main() -> None:
    linear = sys.argv[1] if len(sys.argv) > 1 else "onednn"
    model = load(ModelRequest("smollm2", "smollm2-135m-instruct", dtype="float32", linear=linear))
    grouped = attention.takes_grouped_path
    ways = {"copied": lambda *args: False, "grouped": grouped}
    print(f"# {this_machine().describe()}, linear layers: {linear}")
    print(f"# ms per pass (median of {REPEATS}, interleaved); the two ways' logits compared bit for bit")
    print(f"{'context':>8} {'rows':>5} {'copied':>8} {'grouped':>8} {'ratio':>6}  equal")
    empty = torch.tensor([], dtype=torch.long)
    for context in (300, 600):
        model.start(torch.arange(100, 100 + context))
        model.score(empty, 0)  # the prefill
        for rows in (1, 5, 9, 17):
            tree = TokenTree.chain(torch.arange(20, 20 + rows - 1)) if rows > 1 else None
            times = {way: [] for way in ways}
            logits = {}
            for _ in range(REPEATS + 2):
                for way, rule in ways.items():
                    attention.takes_grouped_path = rule
                    started = time.perf_counter()
                    if tree is None:
                        out = model.score(torch.tensor([7]), 0).logits
                        model.rollback(0)
                    else:
                        out = model.score_tree(empty, tree).logits
                        model.keep_path([])
                    times[way].append(time.perf_counter() - started)
                    logits[way] = out
            attention.takes_grouped_path = grouped
            median = {way: 1000 * statistics.median(t[2:]) for way, t in times.items()}
            equal = torch.equal(logits["copied"], logits["grouped"])
            print(
                f"{context:>8} {rows:>5} {median['copied']:>8.2f} {median['grouped']:>8.2f} "
                f"{median['copied'] / median['grouped']:>5.2f}x  {equal}"
            )


if __name__ == "__main__":
    with torch.inference_mode():
        main()
