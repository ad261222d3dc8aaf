"""MMLU (Hendrycks et al. 2021) with CS Drafting's zero-shot chain-of-thought prompt; accuracy on the chosen letter."""

from __future__ import annotations

import re

from specbench.tasks.base import Example, Task

TEMPLATE = "Question: {question}\n(A) {a} (B) {b} (C) {c} (D) {d}\n Answer: \n Let's think step by step. "
LETTERS = "ABCD"
# explicit statements of a choice, strongest first: "answer is (B)", "Answer: B", then a bare "(B)"
_EXPLICIT = [
    re.compile(r"answer\s*(?:is|:)?\s*:?\s*\(?([ABCD])\)?(?![A-Za-z])", re.IGNORECASE),
    re.compile(r"\(([ABCD])\)"),
]


def chosen_letter(text: str) -> str | None:
    """The last explicitly stated choice, or None when the output names none."""
    for pattern in _EXPLICIT:
        found = pattern.findall(text)
        if found:
            return found[-1].upper()
    return None


def _grade(example: Example, output_text: str) -> float:
    return float(chosen_letter(output_text) == example.reference)


def _build(row: dict, fallback_id: str) -> Example:
    a, b, c, d = row["choices"]
    prompt = TEMPLATE.format(question=row["question"], a=a, b=b, c=c, d=d)
    return Example(fallback_id, prompt, LETTERS[int(row["answer"])])


MMLU = Task(
    "mmlu",
    "cais/mmlu",
    "all",
    "test",
    TEMPLATE,
    "accuracy",
    ("question", "choices", "answer"),
    _build,
    _grade,
)
