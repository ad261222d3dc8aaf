"""Spec-Bench (Xia et al., "Unlocking Efficiency in Large Language Model Inference: A Comprehensive
Survey of Speculative Decoding", Findings of ACL 2024): 480 questions in six categories, the field's
standard speed prompt set.

Each example keeps its first user message as ``prompt``, the later ones as ``turns`` (MT-Bench's 80
questions have a second turn, asked after the model's own first answer: see
:func:`specbench.tasks.base.render_turn`) and the data file's category label as ``category``. The 13
labels of ``question.jsonl`` fall into Spec-Bench's six headline categories (:data:`HEADLINE_CATEGORY`,
the names of the authors' ``evaluation/speed.py``). There is no reference answer, so the task measures
speed and acceptance only. Spec-Bench is published on GitHub, not on the Hugging Face Hub: point
``data_files`` or ``SPECBENCH_DATA_DIR/spec_bench/question.jsonl`` at its ``question.jsonl``.
"""

from __future__ import annotations

from specbench.errors import SpecbenchError
from specbench.tasks.base import Example, Task

# MT-Bench's eight categories (10 questions each) make up "multi-turn conversation"
MT_BENCH_CATEGORIES = (
    "writing",
    "roleplay",
    "reasoning",
    "math",
    "coding",
    "extraction",
    "stem",
    "humanities",
)
# raw category label of question.jsonl -> Spec-Bench's headline category
HEADLINE_CATEGORY: dict[str, str] = {
    **{raw: "mt_bench" for raw in MT_BENCH_CATEGORIES},
    "translation": "translation",
    "summarization": "summarization",
    "qa": "qa",
    "math_reasoning": "math_reasoning",
    "rag": "rag",
}
# the headline categories in the leaderboard's order, with its column names
HEADLINES: dict[str, str] = {
    "mt_bench": "MT-Bench",
    "translation": "Translation",
    "summarization": "Summarization",
    "qa": "QA",
    "math_reasoning": "Math",
    "rag": "RAG",
}


def headline_category(raw: str) -> str:
    """Spec-Bench's headline category of a raw label: ``"writing"`` -> ``"mt_bench"``, ``"qa"``
    -> ``"qa"``; an unknown label is a one-line error."""
    if raw not in HEADLINE_CATEGORY:
        raise SpecbenchError(
            f"Spec-Bench category {raw!r}",
            "is not one of the 13 labels of Spec-Bench's question.jsonl",
            f"use one of {', '.join(HEADLINE_CATEGORY)}",
        )
    return HEADLINE_CATEGORY[raw]


def _build(row: dict, fallback_id: str) -> Example:
    first, *later = row["turns"]
    return Example(
        f"spec_bench/{row['question_id']}", first, "", category=row["category"], turns=tuple(later)
    )


SPEC_BENCH = Task(
    name="spec_bench",
    hub_id=None,
    hub_config=None,
    default_split="question",
    template="{turns[0]}",
    metric=None,
    fields=("question_id", "category", "turns"),
    build=_build,
    grade=lambda example, text: float("nan"),
)

TASKS = (SPEC_BENCH,)
