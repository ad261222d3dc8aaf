"""WMT14 English→German (newstest), speculative cascades' translation task; BLEU with sacreBLEU.

Prompt: T5's task prefix ``translate English to German: {en}``, the format of the paper's fine-tuned
T5 cascades (its Gemma runs use unstated few-shot prompts). The hub dataset ``wmt/wmt14`` (de-en)
stores pairs as ``translation: {de, en}``; offline, ``$SPECBENCH_DATA_DIR/wmt14_de_en/test.jsonl``
(80 newstest sentences) in the same schema. The paper samples 3000 validation pairs
(newstest2013): use ``split: validation`` online.

Metric ``bleu`` (0-100, sacreBLEU defaults: 13a tokenizer, exp smoothing): a row holds the sentence
BLEU of its output and the sufficient statistics from which the summary computes corpus BLEU, the
number papers report (see specbench.tasks.metrics). The output's first line is the translation.

``wmt14_en_de_fewshot``: the same data and metric with a five-shot prompt for decoder-only models
(the paper's Gemma cascades use few-shot prompts without printing them): an instruction, then
``English: ...\nGerman: ...`` blocks separated by blank lines, ending in ``German:``. The exemplars
are hand-written news-style sentences, so the prompt never depends on a train split.
"""

from __future__ import annotations

from specbench.tasks.base import Example, Task
from specbench.tasks.metrics import bleu_statistics, first_line, sentence_bleu

TEMPLATE = "translate English to German: {en}"


def _pair(row: dict) -> dict:
    pair = row["translation"]
    if (
        not isinstance(pair, dict)
        or not isinstance(pair.get("en"), str)
        or not isinstance(pair.get("de"), str)
    ):
        raise ValueError("field 'translation' must be an object with strings 'en' and 'de'")
    return pair


def _build(row: dict, fallback_id: str) -> Example:
    pair = _pair(row)
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


FEWSHOT_INSTRUCTION = "Translate English to German."
FEWSHOT_EXEMPLARS = (
    ("The museum is closed on Mondays.", "Das Museum ist montags geschlossen."),
    ("The weather will be warm and sunny on Sunday.", "Am Sonntag wird das Wetter warm und sonnig."),
    (
        "Police are still searching for the driver of the car.",
        "Die Polizei sucht noch immer nach dem Fahrer des Autos.",
    ),
    (
        "The government announced new measures to support small businesses.",
        "Die Regierung kündigte neue Maßnahmen zur Unterstützung kleiner Unternehmen an.",
    ),
    (
        "More than half of the voters did not take part in the election.",
        "Mehr als die Hälfte der Wähler nahm nicht an der Wahl teil.",
    ),
)


def fewshot_prompt(english: str) -> str:
    blocks = [f"English: {en}\nGerman: {de}" for en, de in FEWSHOT_EXEMPLARS]
    return f"{FEWSHOT_INSTRUCTION}\n\n" + "\n\n".join([*blocks, f"English: {english}\nGerman:"])


def _build_fewshot(row: dict, fallback_id: str) -> Example:
    pair = _pair(row)
    return Example(fallback_id, fewshot_prompt(pair["en"]), pair["de"])


WMT14_EN_DE_FEWSHOT = Task(
    name="wmt14_en_de_fewshot",
    hub_id="wmt/wmt14",
    hub_config="de-en",
    default_split="test",
    template=fewshot_prompt("{en}"),
    metric="bleu",
    fields=("translation",),
    build=_build_fewshot,
    grade=WMT14_EN_DE.grade,
    local_dirs=("wmt14_en_de_fewshot", "wmt14_en_de", "wmt14_de_en"),
    statistics=WMT14_EN_DE.statistics,
)

TASKS = (WMT14_EN_DE, WMT14_EN_DE_FEWSHOT)
