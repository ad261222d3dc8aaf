"""CNN/DailyMail 3.0.0 (Hermann et al. 2015; See et al. 2017), summarization; ROUGE-2.

Prompt: T5's task prefix ``summarize: {article}`` (the paper's fine-tuned T5 cascades), the article
cut to its first 1500 words, about the paper's 2048-token input limit. Hub
``abisee/cnn_dailymail`` 3.0.0 (id, article, highlights); offline,
``$SPECBENCH_DATA_DIR/cnn_dailymail/test.jsonl`` (Spec-Bench's 80 summarization items).
Metric ``rouge2``: ROUGE-2 F-measure with Porter stemming (rouge-score), 0-100, the highlights'
lines scored as one reference text; mean over rows.

``cnn_dailymail_fewshot``: the same data and metric with a one-shot prompt for decoder-only models
(the paper's Gemma cascades use few-shot prompts without printing them): an instruction, a short
hand-written article with its highlights, then ``Article: {article}\nSummary:``. A few-shot model
may go on to write the next ``Article:`` itself; the summary is the output before it.
"""

from __future__ import annotations

import functools
import re

from specbench.tasks.base import Example, Task
from specbench.tasks.metrics import first_words, rouge2

TEMPLATE = "summarize: {article}"
MAX_WORDS = 1500  # ~2048 T5 tokens, the paper's maximum input length for CNN/DM


def _zero_shot(article: str) -> str:
    return TEMPLATE.format(article=article)


def _build(row: dict, fallback_id: str, render=_zero_shot) -> Example:
    prompt = render(first_words(row["article"], MAX_WORDS))
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


FEWSHOT_INSTRUCTION = "Summarize each news article in a few short sentences."
FEWSHOT_ARTICLE = (
    "A small town has opened a library that lends out tools instead of books. The Toolbox "
    "Library lets members borrow drills, ladders and sewing machines for a small yearly "
    "fee. Organisers said more than 300 people signed up in the first week. 'Most people use a drill for "
    "a few minutes in its whole life,' said volunteer Sarah Collins. 'It makes more sense to share one.' "
    "The library is run by volunteers and was paid for by a local crowdfunding campaign that raised "
    "12,000 pounds."
)
FEWSHOT_SUMMARY = (
    "The Toolbox Library lends drills, ladders and sewing machines.\n"
    "More than 300 people signed up in its first week.\n"
    "It is run by volunteers and was funded by a 12,000-pound crowdfunding campaign."
)
_NEXT_ARTICLE = re.compile(r"\n\s*Article:")


def fewshot_prompt(article: str) -> str:
    shot = f"Article: {FEWSHOT_ARTICLE}\nSummary: {FEWSHOT_SUMMARY}"
    return f"{FEWSHOT_INSTRUCTION}\n\n{shot}\n\nArticle: {article}\nSummary:"


def fewshot_summary(output_text: str) -> str:
    """The summary of a few-shot output: the text before the next ``Article:`` it writes."""
    return _NEXT_ARTICLE.split(output_text, maxsplit=1)[0].strip()


CNN_DAILYMAIL_FEWSHOT = Task(
    name="cnn_dailymail_fewshot",
    hub_id="abisee/cnn_dailymail",
    hub_config="3.0.0",
    default_split="test",
    template=fewshot_prompt("{article}"),
    metric="rouge2",
    fields=("article", "highlights"),
    build=functools.partial(_build, render=fewshot_prompt),
    grade=lambda example, text: rouge2(fewshot_summary(text), example.reference),
    local_dirs=("cnn_dailymail_fewshot", "cnn_dailymail"),
)

TASKS = (CNN_DAILYMAIL, CNN_DAILYMAIL_FEWSHOT)
