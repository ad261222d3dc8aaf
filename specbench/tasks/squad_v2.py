"""SQuAD 2.0 (Rajpurkar et al. 2018): reading comprehension with unanswerable questions.

Hub ``rajpurkar/squad_v2`` (id, title, context, question, answers: {text, answer_start}), split
``validation`` (11873 questions; no public test set). No offline copy in ../shared/data.

Prompt: an instruction, two embedded hand-written exemplars (one answerable, one not), then
``Passage: <context>\\nQ: <question>\\nA:`` (the QA format of specbench.tasks.qa with the passage).

Abstaining: an output whose first line normalises (SQuAD normalisation) to the empty string, or to
one of ``unanswerable``, ``no answer``, ``not answerable``, is an abstention and is scored as the
empty answer. As in the official SQuAD 2.0 script, an unanswerable question (no gold answer) scores
exact match = F1 = 1 for an abstention and 0 for anything else; abstaining on an answerable
question scores 0.
"""

from __future__ import annotations

from specbench.tasks.base import Example, Task
from specbench.tasks.metrics import first_line, normalize_answer, squad_scores
from specbench.tasks.qa import golds

ABSTAIN = "unanswerable"
ABSTENTIONS = frozenset({"", "unanswerable", "no answer", "not answerable"})
INSTRUCTION = (
    "Answer each question with a short span copied from its passage. If the passage does not "
    f'contain the answer, answer "{ABSTAIN}".'
)
SHOTS = (
    (
        "The Amazon River flows through Peru, Colombia and Brazil before it reaches the Atlantic "
        "Ocean. It carries more water than any other river in the world.",
        "Which ocean does the Amazon River flow into?",
        "the Atlantic Ocean",
    ),
    (
        "The Eiffel Tower was built for the 1889 World's Fair in Paris. It was designed by the "
        "engineering company of Gustave Eiffel.",
        "How much did it cost to build the Eiffel Tower?",
        ABSTAIN,
    ),
)


def _block(context: str, question: str, answer: str | None = None) -> str:
    return f"Passage: {context}\nQ: {question}\nA:" + (f" {answer}" if answer is not None else "")


def _prompt(context: str, question: str) -> str:
    shots = [_block(*shot) for shot in SHOTS]
    return f"{INSTRUCTION}\n\n" + "\n\n".join([*shots, _block(context, question)])


TEMPLATE = _prompt("{context}", "{question}")


def answer_of(output_text: str) -> str:
    """The output's answer: its first line, or "" when that line is an abstention."""
    answer = first_line(output_text)
    return "" if normalize_answer(answer) in ABSTENTIONS else answer


def _build(row: dict, fallback_id: str) -> Example:
    if not isinstance(row["answers"], dict) or not isinstance(row["answers"].get("text"), list):
        raise ValueError("field 'answers' must be an object {text: [...], answer_start: [...]}")
    answers = golds(row["answers"]["text"])  # () for an unanswerable question
    example_id = f"squad_v2/{row['id']}" if row.get("id") else fallback_id
    reference = answers[0] if answers else ""
    return Example(example_id, _prompt(row["context"], row["question"]), reference, answers)


SQUAD_V2 = Task(
    name="squad_v2",
    hub_id="rajpurkar/squad_v2",
    hub_config=None,
    default_split="validation",
    template=TEMPLATE,
    metric="exact_match",
    fields=("context", "question", "answers"),
    build=_build,
    grade=lambda example, text: squad_scores(answer_of(text), example.answers),
    metrics=("exact_match", "f1"),
)

TASKS = (SQUAD_V2,)
