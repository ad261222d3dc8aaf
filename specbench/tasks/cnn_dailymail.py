"""CNN/DailyMail 3.0.0 (Hermann et al. 2015; See et al. 2017), summarization; ROUGE-2.

Prompt: T5's task prefix ``summarize: {article}`` (the paper's fine-tuned T5 cascades), the article
cut to its first 1500 words, about the paper's 2048-token input limit. Hub
``abisee/cnn_dailymail`` 3.0.0 (id, article, highlights); offline,
``$SPECBENCH_DATA_DIR/cnn_dailymail/test.jsonl`` (Spec-Bench's 80 summarization items).
Metric ``rouge2``: ROUGE-2 F-measure with Porter stemming (rouge-score), 0-100, the highlights'
lines scored as one reference text; mean over rows.
"""

from __future__ import annotations

from specbench.tasks.base import Example, Task
from specbench.tasks.metrics import first_words, rouge2

TEMPLATE = "summarize: {article}"
MAX_WORDS = 1500  # ~2048 T5 tokens, the paper's maximum input length for CNN/DM


def _build(row: dict, fallback_id: str) -> Example:
    prompt = TEMPLATE.format(article=first_words(row["article"], MAX_WORDS))
    example_id = f"cnn_dailymail/{row['id']}" if row.get("id") else fallback_id
    return Example(example_id, prompt, row["highlights"])


CNN_DAILYMAIL = Task(
    name="cnn_dailymail",
    hub_id="abisee/cnn_dailymail",
    hub_config="3.0.0",
    default_split="test",
    template=TEMPLATE,
    metric="rouge2",
    fields=("article", "highlights"),
    build=_build,
    grade=lambda example, text: rouge2(text.strip(), example.reference),
)
