"""The embedded default prompt set: 40 short arithmetic word problems written for specbench.

It needs neither the Hub nor ../shared, so ``make demo`` runs anywhere; prompts and scoring
follow GSM8K's.
"""

from __future__ import annotations

from specbench.tasks.base import Example, Task
from specbench.tasks.gsm8k import TEMPLATE, grade_number


def _build(row: dict, fallback_id: str) -> Example:
    return Example(row.get("id", fallback_id), TEMPLATE.format(question=row["question"]), str(row["answer"]))


ARITHMETIC = Task(
    "arithmetic",
    None,
    None,
    "test",
    TEMPLATE,
    "accuracy",
    ("question", "answer"),
    _build,
    grade_number,
    embedded="arithmetic.jsonl",
)
