"""Natural Questions, open-domain version (Kwiatkowski et al. 2019; Lee et al. 2019): closed-book QA.

Hub ``google-research-datasets/nq_open`` (question, answer: list), split ``validation`` (3610
questions; NQ-open has no public test answers). Five-shot prompt and exact match / F1 as in
specbench.tasks.qa; no offline copy in ../shared/data.
"""

from __future__ import annotations

from specbench.tasks.base import Example, Task
from specbench.tasks.qa import few_shot, grade_short_answer, required_golds

INSTRUCTION = "Answer these questions with a short answer."
SHOTS = (
    ("who wrote the novel pride and prejudice", "Jane Austen"),
    ("when did the first man land on the moon", "20 July 1969"),
    ("what is the largest planet in the solar system", "Jupiter"),
    ("who painted the mona lisa", "Leonardo da Vinci"),
    ("how many players are on a soccer team on the field", "11"),
)
TEMPLATE = few_shot(INSTRUCTION, SHOTS, "{question}")


def _build(row: dict, fallback_id: str) -> Example:
    answers = required_golds(row["answer"], "answer")
    return Example(fallback_id, few_shot(INSTRUCTION, SHOTS, row["question"]), answers[0], answers)


NATURAL_QUESTIONS = Task(
    name="natural_questions",
    hub_id="google-research-datasets/nq_open",
    hub_config=None,
    default_split="validation",
    template=TEMPLATE,
    metric="exact_match",
    fields=("question", "answer"),
    build=_build,
    grade=grade_short_answer,
    metrics=("exact_match", "f1"),
)

TASKS = (NATURAL_QUESTIONS,)
