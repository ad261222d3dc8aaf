"""GSM8K (Cobbe et al. 2021), CS Drafting's zero-shot chain-of-thought prompt; accuracy on the answer."""

from __future__ import annotations

import re

from specbench.tasks.base import Example, Task

TEMPLATE = "Reason the math question below step by step. Question: {question}.\n Answer: "
# "1,234" only with proper thousands groups, so a list such as "1,2,3" reads as three numbers;
# the lookbehind keeps the "-" of a range like "10-20" from making -20.
_NUMBER = re.compile(r"(?<![\d.])-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|(?<!\d)-?\.\d+")


def parse_number(text: str) -> float | None:
    try:
        return float(text.replace(",", "").rstrip("."))
    except ValueError:
        return None


def last_number(text: str) -> float | None:
    """The last number in a model's output (thousands commas, signs and decimals handled), or None."""
    matches = _NUMBER.findall(text)
    return parse_number(matches[-1]) if matches else None


def reference_answer(answer_field: str) -> str:
    """GSM8K's gold answer: the number after '####', commas removed."""
    return answer_field.split("####")[-1].strip().replace(",", "")


def grade_number(example: Example, output_text: str) -> float:
    """1.0 when the output's last number equals the reference numerically (3.50 == 3.5), else 0.0."""
    predicted, gold = last_number(output_text), parse_number(example.reference)
    return float(predicted is not None and gold is not None and abs(predicted - gold) < 1e-6)


def _build(row: dict, fallback_id: str) -> Example:
    return Example(fallback_id, TEMPLATE.format(question=row["question"]), reference_answer(row["answer"]))


GSM8K = Task(
    name="gsm8k",
    hub_id="openai/gsm8k",
    hub_config="main",
    default_split="test",
    template=TEMPLATE,
    metric="accuracy",
    fields=("question", "answer"),
    build=_build,
    grade=grade_number,
)
