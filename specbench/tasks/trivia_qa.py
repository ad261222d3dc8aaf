"""TriviaQA (Joshi et al. 2017), the ``rc.nocontext`` configuration: closed-book trivia questions.

Hub ``mandarjoshi/trivia_qa`` rc.nocontext (question_id, question, answer: {value, aliases, ...}),
split ``validation`` (17944 questions; the test split has no answers). The gold answers are the
answer's value and all its aliases. Five-shot prompt and exact match / F1 as in
specbench.tasks.qa; no offline copy in ../shared/data.
"""

from __future__ import annotations

from specbench.tasks.base import Example, Task
from specbench.tasks.qa import few_shot, grade_short_answer, required_golds

INSTRUCTION = "Answer these trivia questions with a short answer."
SHOTS = (
    ("Which planet in our solar system is known as the Red Planet?", "Mars"),
    ("Who composed the opera The Magic Flute?", "Wolfgang Amadeus Mozart"),
    ("What is the chemical symbol for gold?", "Au"),
    ("In which city is the Colosseum?", "Rome"),
    ("Which sea creature has three hearts?", "Octopus"),
)
TEMPLATE = few_shot(INSTRUCTION, SHOTS, "{question}")


def _build(row: dict, fallback_id: str) -> Example:
    answer = row["answer"]
    if not isinstance(answer, dict):
        raise ValueError("field 'answer' must be an object {value, aliases, ...}")
    answers = required_golds([answer.get("value"), *(answer.get("aliases") or [])], "answer")
    example_id = f"trivia_qa/{row['question_id']}" if row.get("question_id") else fallback_id
    return Example(example_id, few_shot(INSTRUCTION, SHOTS, row["question"]), answers[0], answers)


TRIVIA_QA = Task(
    name="trivia_qa",
    hub_id="mandarjoshi/trivia_qa",
    hub_config="rc.nocontext",
    default_split="validation",
    template=TEMPLATE,
    metric="exact_match",
    fields=("question", "answer"),
    build=_build,
    grade=grade_short_answer,
    metrics=("exact_match", "f1"),
)

TASKS = (TRIVIA_QA,)
