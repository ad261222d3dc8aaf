"""The embedded prompt set where drafting pays: 12 short passages written for specbench, each with an
instruction to edit, rewrite, copy from or answer about it (correct the spelling, change a name, turn
it into a list, answer with one of its sentences, summarise it).

Most of an answer repeats the passage, so a drafter that copies from the prompt (prompt lookup)
proposes long runs the target accepts. It needs neither the Hub nor ../shared. Metric ``rouge2``:
ROUGE-2 F-measure (rouge-score, Porter stemming, 0-100) against a reference answer written with the
passage.
"""

from __future__ import annotations

from specbench.tasks.base import Example, Task
from specbench.tasks.metrics import rouge2

TEMPLATE = "{instruction}\n\nPassage: {passage}"


def _build(row: dict, fallback_id: str) -> Example:
    prompt = TEMPLATE.format(instruction=row["instruction"], passage=row["passage"])
    return Example(row.get("id") or fallback_id, prompt, row["reference"])


PASSAGES = Task(
    name="passages",
    hub_id=None,
    hub_config=None,
    default_split="test",
    template=TEMPLATE,
    metric="rouge2",
    fields=("instruction", "passage", "reference"),
    build=_build,
    grade=lambda example, text: rouge2(text.strip(), example.reference),
    embedded="passages.jsonl",
)

TASKS = (PASSAGES,)
