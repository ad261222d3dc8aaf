"""WMT14 English→German (newstest), speculative cascades' translation task; BLEU with sacreBLEU.

Prompt: T5's task prefix ``translate English to German: {en}``, the format of the paper's fine-tuned
T5 cascades (its Gemma runs use unstated few-shot prompts). The hub dataset ``wmt/wmt14`` (de-en)
stores pairs as ``translation: {de, en}``; offline, ``$SPECBENCH_DATA_DIR/wmt14_de_en/test.jsonl``
(80 newstest sentences) in the same schema. The paper samples 3000 validation pairs
(newstest2013): use ``split: validation`` online.

Metric ``bleu`` (0-100, sacreBLEU defaults: 13a tokenizer, exp smoothing): a row holds the sentence
BLEU of its output and the sufficient statistics from which the summary computes corpus BLEU, the
number papers report (see specbench.tasks.metrics). The output's first line is the translation.
"""

from __future__ import annotations

from specbench.tasks.base import Example, Task
from specbench.tasks.metrics import bleu_statistics, first_line, sentence_bleu

TEMPLATE = "translate English to German: {en}"


def _build(row: dict, fallback_id: str) -> Example:
    pair = row["translation"]
    return Example(fallback_id, TEMPLATE.format(en=pair["en"]), pair["de"])


WMT14_EN_DE = Task(
    name="wmt14_en_de",
    hub_id="wmt/wmt14",
    hub_config="de-en",
    default_split="test",
    template=TEMPLATE,
    metric="bleu",
    fields=("translation",),
    build=_build,
    grade=lambda example, text: sentence_bleu(first_line(text), example.reference),
    local_dirs=("wmt14_en_de", "wmt14_de_en"),
    statistics=lambda example, text: {"bleu": bleu_statistics(first_line(text), example.reference)},
)
