"""MMLU (Hendrycks et al. 2021), CS Drafting's zero-shot chain-of-thought prompt; accuracy on the letter."""

from __future__ import annotations

import re

from specbench.tasks.base import Example, Task

TEMPLATE = "Question: {question}\n(A) {a} (B) {b} (C) {c} (D) {d}\n Answer: \n Let's think step by step. "
LETTERS = "ABCD"
# Explicit statements of a choice, strongest first: "answer is (B)" / "Answer: B", then a bare "(B)".
# Only "answer" ignores case: a lowercase "a" in "the answer is a dog" is not choice A.
_EXPLICIT = [
    re.compile(r"(?i:answer)(?:\s+is)?\s*:?\s*\(?([ABCD])\)?(?![A-Za-z0-9])"),
    re.compile(r"\(([ABCD])\)"),
]


def chosen_letter(text: str) -> str | None:
    """The last choice stated by the strongest pattern that matches, or None when the output names none."""
    for pattern in _EXPLICIT:
        found = pattern.findall(text)
        if found:
            return found[-1]
    return None


def _grade(example: Example, output_text: str) -> float:
    return float(chosen_letter(output_text) == example.reference)


def _build(row: dict, fallback_id: str) -> Example:
    a, b, c, d = row["choices"]
    prompt = TEMPLATE.format(question=row["question"], a=a, b=b, c=c, d=d)
    answer = row["answer"]  # the Hub's ClassLabel index 0-3; a letter is accepted too
    return Example(fallback_id, prompt, answer if answer in tuple(LETTERS) else LETTERS[int(answer)])


MMLU = Task(
    name="mmlu",
    hub_id="cais/mmlu",
    hub_config="all",
    default_split="test",
    template=TEMPLATE,
    metric="accuracy",
    fields=("question", "choices", "answer"),
    build=_build,
    grade=_grade,
)

TASKS = (MMLU,)
