"""Quality metrics of the cascade papers' tasks: BLEU, ROUGE-2, SQuAD exact match and F1.

BLEU is a corpus metric: corpus BLEU is not the mean of sentence BLEUs. Each row therefore keeps
sacreBLEU's sufficient statistics (lengths and n-gram counts, see :func:`bleu_statistics`), and
:func:`corpus_score` turns their sum over a cell's rows into the corpus BLEU that sacreBLEU's
``corpus_bleu`` gives on the same sentences, exactly. Metrics without an entry in
:data:`CORPUS_METRICS` are averaged over rows.

Scales: ``bleu`` and ``rouge2`` on 0-100 as the papers print them; ``exact_match``, ``f1`` and
``pass@1`` on 0-1 like ``accuracy``.
"""

from __future__ import annotations

import collections
import re
import string
from collections.abc import Callable, Iterable
from functools import lru_cache

# -- BLEU (sacreBLEU defaults: 13a tokenizer, exponential smoothing, 4-grams) -------------------


@lru_cache(maxsize=1)
def _bleu():
    from sacrebleu.metrics import BLEU

    return BLEU()


def sentence_bleu(hypothesis: str, reference: str) -> float:
    """sacreBLEU's sentence BLEU (effective order), 0-100: the per-example number of a row."""
    import sacrebleu

    return sacrebleu.sentence_bleu(hypothesis, [reference]).score


def bleu_statistics(hypothesis: str, reference: str) -> list[float]:
    """[hypothesis length, reference length, 4 matching n-gram counts, 4 hypothesis n-gram counts]."""
    score = _bleu().corpus_score([hypothesis], [[reference]])
    return [score.sys_len, score.ref_len, *score.counts, *score.totals]


def corpus_bleu_from_statistics(statistics: list[float]) -> float:
    """Corpus BLEU (0-100) of summed :func:`bleu_statistics`: sacreBLEU's own formula on the sums."""
    from sacrebleu.metrics import BLEU

    sys_len, ref_len, counts, totals = statistics[0], statistics[1], statistics[2:6], statistics[6:10]
    ints = [int(x) for x in counts], [int(x) for x in totals]
    return BLEU.compute_bleu(*ints, int(sys_len), int(ref_len), smooth_method="exp").score


# metric -> function of the element-wise sum of the rows' statistics
CORPUS_METRICS: dict[str, Callable[[list[float]], float]] = {"bleu": corpus_bleu_from_statistics}


def sum_statistics(rows_statistics: Iterable[list[float]]) -> list[float]:
    return [sum(column) for column in zip(*rows_statistics, strict=True)]


def corpus_score(metric: str, rows_statistics: Iterable[list[float]]) -> float:
    """The cell-level value of a corpus metric from its rows' sufficient statistics."""
    return CORPUS_METRICS[metric](sum_statistics(rows_statistics))


# -- ROUGE-2 ------------------------------------------------------------------------------------


@lru_cache(maxsize=1)
def _rouge2_scorer():
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(["rouge2"], use_stemmer=True)


def rouge2(prediction: str, reference: str) -> float:
    """ROUGE-2 F-measure (0-100) with the Porter stemmer, as the rouge-score library computes it.

    rouge-score's default tokenizer lowercases and keeps [a-z0-9] tokens; a reference with several
    sentences (CNN/DM highlights) is scored as one text, i.e. ROUGE-2, not ROUGE-Lsum."""
    return 100.0 * _rouge2_scorer().score(reference, prediction)["rouge2"].fmeasure


# -- SQuAD exact match and F1 (the official SQuAD v1.1/v2.0 evaluation script's normalisation) ----

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCTUATION = set(string.punctuation)


def normalize_answer(text: str) -> str:
    """Lowercase, drop punctuation, drop the articles a/an/the, collapse whitespace."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def token_f1(prediction: str, gold: str) -> float:
    """Bag-of-tokens F1 after normalisation; an empty side scores 1 only when both are empty."""
    predicted, expected = normalize_answer(prediction).split(), normalize_answer(gold).split()
    if not predicted or not expected:
        return float(predicted == expected)
    common = sum((collections.Counter(predicted) & collections.Counter(expected)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(predicted), common / len(expected)
    return 2 * precision * recall / (precision + recall)


def squad_scores(prediction: str, golds: Iterable[str]) -> dict[str, float]:
    """Exact match and F1, each the maximum over the gold answers (an empty list means [""]:
    SQuAD 2.0's unanswerable questions, where only an empty prediction scores)."""
    golds = [gold for gold in golds if normalize_answer(gold)] or [""]
    return {
        "exact_match": max(exact_match(prediction, gold) for gold in golds),
        "f1": max(token_f1(prediction, gold) for gold in golds),
    }


# -- prompt helpers -----------------------------------------------------------------------------


def first_words(text: str, n: int) -> str:
    """The first ``n`` whitespace-separated words of ``text`` (whitespace collapsed when cut)."""
    words = text.split()
    return text.strip() if len(words) <= n else " ".join(words[:n])


def first_line(text: str) -> str:
    """A short answer: the output's first non-empty line, stripped."""
    return next((line.strip() for line in text.strip().splitlines() if line.strip()), "")
