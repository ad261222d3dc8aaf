"""Shared by the question-answering tasks: the few-shot prompt and exact match / F1 grading.

Prompt (the speculative cascades paper uses few-shot prompts without printing them): GPT-3's
closed-book format, ``Q: <question>\\nA: <answer>`` blocks separated by blank lines, after a
one-line instruction, with five fixed exemplars embedded in each task module. The exemplars are
hand-written in the style of each dataset rather than drawn from its train split, so a prompt never
depends on which train split is at hand (offline there is none) and stays byte-identical across
runs. The paper generates at most 5 tokens for QA: set the dataset's ``max_new_tokens: 5``.

Grading: the output's first non-empty line is the answer; exact match and F1 use the official
SQuAD normalisation (lowercase, no punctuation, no a/an/the, single spaces), each the maximum over
the gold answers.
"""

from __future__ import annotations

from specbench.tasks.base import Example
from specbench.tasks.metrics import first_line, squad_scores


def few_shot(instruction: str, shots: tuple[tuple[str, str], ...], question: str) -> str:
    blocks = [f"Q: {q}\nA: {a}" for q, a in shots]
    return f"{instruction}\n\n" + "\n\n".join([*blocks, f"Q: {question}\nA:"])


def golds(answers) -> tuple[str, ...]:
    """Distinct non-empty gold answers, first-seen order (one string counts as one answer, never as
    its characters)."""
    if isinstance(answers, str):
        answers = [answers]
    return tuple(dict.fromkeys(a.strip() for a in answers if a and a.strip()))


def required_golds(answers, field: str) -> tuple[str, ...]:
    """:func:`golds` of a closed-book question, which must have one (the loader reports the row)."""
    found = golds(answers)
    if not found:
        raise ValueError(f"field {field!r} holds no non-empty answer")
    return found


def grade_short_answer(example: Example, output_text: str) -> dict[str, float]:
    return squad_scores(first_line(output_text), example.answers)
