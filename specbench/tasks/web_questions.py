"""WebQuestions (Berant et al. 2013): closed-book QA over Freebase questions.

Hub ``stanfordnlp/web_questions`` (url, question, answers: list), split ``test`` (2032 questions).
Five-shot prompt and exact match / F1 as in specbench.tasks.qa; no offline copy in ../shared/data.
"""

from __future__ import annotations

from specbench.tasks.base import Example, Task
from specbench.tasks.qa import few_shot, grade_short_answer, required_golds

INSTRUCTION = "Answer these questions with a short answer."
SHOTS = (
    ("what is the capital city of australia?", "Canberra"),
    ("what language do they speak in brazil?", "Portuguese"),
    ("who was the first president of the united states?", "George Washington"),
    ("what currency is used in japan?", "Japanese yen"),
    ("where was albert einstein born?", "Ulm"),
)
TEMPLATE = few_shot(INSTRUCTION, SHOTS, "{question}")


def _build(row: dict, fallback_id: str) -> Example:
    answers = required_golds(row["answers"], "answers")
    return Example(fallback_id, few_shot(INSTRUCTION, SHOTS, row["question"]), answers[0], answers)


WEB_QUESTIONS = Task(
    name="web_questions",
    hub_id="stanfordnlp/web_questions",
    hub_config=None,
    default_split="test",
    template=TEMPLATE,
    metric="exact_match",
    fields=("question", "answers"),
    build=_build,
    grade=grade_short_answer,
    metrics=("exact_match", "f1"),
)

TASKS = (WEB_QUESTIONS,)
