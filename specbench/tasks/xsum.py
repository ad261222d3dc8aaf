"""XSum (Narayan et al. 2018), speculative cascades' extreme summarization task; ROUGE-2.

Prompt: T5's task prefix ``summarize: {document}`` (the paper's fine-tuned T5 cascades), the
document cut to its first 750 words, about the paper's 1024-token input limit. Hub
``EdinburghNLP/xsum`` (id, document, summary); there is no offline copy in ../shared/data.
Metric ``rouge2``: ROUGE-2 F-measure with Porter stemming (rouge-score), 0-100, mean over rows.
"""

from __future__ import annotations

from specbench.tasks.base import Example, Task
from specbench.tasks.metrics import first_words, rouge2

TEMPLATE = "summarize: {document}"
MAX_WORDS = 750  # ~1024 T5 tokens, the paper's maximum input length for XSum


def _build(row: dict, fallback_id: str) -> Example:
    prompt = TEMPLATE.format(document=first_words(row["document"], MAX_WORDS))
    return Example(f"xsum/{row['id']}" if row.get("id") else fallback_id, prompt, row["summary"])


XSUM = Task(
    name="xsum",
    hub_id="EdinburghNLP/xsum",
    hub_config=None,
    default_split="test",
    template=TEMPLATE,
    metric="rouge2",
    fields=("document", "summary"),
    build=_build,
    grade=lambda example, text: rouge2(text.strip(), example.reference),
)

TASKS = (XSUM,)
