"""The target's top logits where a committed row first parts from AR's output, to read a divergence the
lossless check classed a mismatch: the same two computations as ``specbench.pipeline.analysis.numerics``
(the prompt and AR's prefix in one pass, and a token a pass as AR decodes), its top ``--top`` each.

    SPECBENCH_DATA_DIR=../shared/data python -m scripts.numerics.divergence_logits \
        RECIPE RUN DATASET EXAMPLE CELL

It loads the recipe's target as ``specbench run`` does and writes nothing but what it prints.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from specbench.pipeline.analysis.numerics import next_token_logits
from specbench.pipeline.run.runner import Runner
from specbench.recipe import load_recipe
from specbench.tasks import TASKS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name in ("recipe", "run", "dataset", "example", "cell"):
        parser.add_argument(name)
    parser.add_argument("--top", type=int, default=5)
    args = parser.parse_args()
    rows = [json.loads(line) for line in (Path(args.run) / "examples.jsonl").read_text().splitlines()]
    mine = [r for r in rows if r["dataset"] == args.dataset and r["example_id"] == args.example]
    row = next(r for r in mine if r["cell"] == args.cell)
    reference = next(r for r in mine if r["method"] == "autoregressive" and r["target"] == row["target"])
    at = row["first_divergence"]
    recipe = load_recipe(Path(args.recipe), known_tasks=set(TASKS))
    runner = Runner(recipe, Path(args.run), resume=True)
    dataset = next(d for d in runner.datasets() if d.label == args.dataset)
    example = next(e for e in dataset.examples if e.id == args.example)
    target = runner.model(row["target"])
    request = runner.request(target, dataset, example)
    prefix = torch.as_tensor(reference["output_ids"][:at], dtype=torch.long, device=target.device)
    print(f"{args.dataset} {args.example} {args.cell}: first divergence at token {at}")
    print(f"AR took {reference['output_ids'][at]}, the cell took {row['output_ids'][at]}")
    for name, logits in next_token_logits(target, request.prompt_ids, prefix).items():
        top = logits.double().topk(args.top)
        pairs = ", ".join(f"{int(t)}: {float(v):.4f}" for v, t in zip(top.values, top.indices, strict=True))
        print(f"{name}: {pairs}")


if __name__ == "__main__":
    main()
