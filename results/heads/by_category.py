"""Tokens per target pass of a Spec-Bench run's cells by the question's category (Spec-Bench's six:
writing and the other MT-bench ones, translation, summarization, QA, math reasoning, RAG), from its
examples.jsonl and the Spec-Bench questions under $SPECBENCH_DATA_DIR (spec_bench/question.jsonl),
which name each question's category.

    SPECBENCH_DATA_DIR=../shared/data python results/heads/by_category.py RUN > RUN/by_category.txt
"""

import json
import os
import sys
from collections import defaultdict
from pathlib import Path


def main() -> None:
    run = Path(sys.argv[1])
    questions = Path(os.environ["SPECBENCH_DATA_DIR"]) / "spec_bench" / "question.jsonl"
    category = {}
    for line in questions.read_text().splitlines():
        question = json.loads(line)
        category[question["question_id"]] = question["category"]
    totals: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0, 0]))
    target = None
    for line in (run / "examples.jsonl").read_text().splitlines():
        row = json.loads(line)
        if not row["example_id"].startswith("spec_bench/"):
            continue
        target = target or row["target"]
        kind = category[int(row["example_id"].split("/")[1])]
        counts = totals[row["cell"]][kind]
        counts[0] += row["n_tokens"]
        counts[1] += row["forwards"][row["target"]]["forward_passes"]
        counts[2] += 1
    kinds = sorted({kind for cell in totals.values() for kind in cell})
    print(f"# python results/heads/by_category.py {run}: tokens per target pass ({target}), questions")
    print(f"{'cell':28}" + "".join(f"{kind:>18}" for kind in kinds))
    for cell, by_kind in totals.items():
        values = [by_kind.get(kind) for kind in kinds]
        print(f"{cell:28}" + "".join(f"{v[0] / v[1]:>13.2f} ({v[2]})" if v else f"{'-':>18}" for v in values))


if __name__ == "__main__":
    main()
