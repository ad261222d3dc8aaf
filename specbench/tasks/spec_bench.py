"""Spec-Bench (Xia et al. 2024): 480 questions in six categories, the field's standard speed prompt set.

Only the first turn is used (single-turn generation); there is no reference answer, so the task
measures speed and acceptance only. Spec-Bench is published on GitHub, not on the Hugging Face Hub:
point ``data_files`` or ``SPECBENCH_DATA_DIR/spec_bench/question.jsonl`` at its ``question.jsonl``.
"""

from __future__ import annotations

from specbench.tasks.base import Example, Task


def _build(row: dict, fallback_id: str) -> Example:
    return Example(f"spec_bench/{row['question_id']}", row["turns"][0], "")


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
