"""The embedded default prompt set: 40 short arithmetic word problems written for specbench.

It needs neither the Hub nor ../shared, so ``make demo`` runs anywhere; prompts and scoring
follow GSM8K's.
"""

from __future__ import annotations

from specbench.tasks.base import Example, Task
from specbench.tasks.gsm8k import TEMPLATE, grade_number


def _build(row: dict, fallback_id: str) -> Example:
    prompt = TEMPLATE.format(question=row["question"])
    return Example(row.get("id") or fallback_id, prompt, str(row["answer"]))


ARITHMETIC = Task(
    name="arithmetic",
    hub_id=None,
    hub_config=None,
    default_split="test",
    template=TEMPLATE,
    metric="accuracy",
    fields=("question", "answer"),
    build=_build,
    grade=grade_number,
    embedded="arithmetic.jsonl",
)

TASKS = (ARITHMETIC,)
