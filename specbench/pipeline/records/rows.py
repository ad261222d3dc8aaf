"""One result row: everything measured for one (cell, example), as examples.jsonl stores it."""

from __future__ import annotations

import hashlib
import math


def build_row(
    dataset, cell, example, text: str, request, generation, *, key, first_divergence, costs, replay=None
) -> dict:
    """The row of ``generation`` (one example of one cell); ``text`` is its decoded output."""
    row = {
        "key": key,
        "dataset": dataset.label,
        "cell": cell.id,
        "method_name": cell.method_name,
        "method": cell.method,
        "params": cell.params,
        "target": cell.target,
        "drafter": cell.drafter,
        "example_id": example.id,
        "gold_sha": gold_sha(example),
        "prompt_tokens": int(request.prompt_ids.shape[0]),
        "prompt_sha": prompt_sha(request.prompt_ids.tolist()),
        "output_ids": generation.tokens,
        "output_text": text,
        "n_tokens": len(generation.tokens),
        "stopped_by_eos": generation.stopped_by_eos,
        "walltime": generation.walltime,
        "ttft": generation.ttft,
        "forwards": generation.forwards,
        "steps": [list(s) for s in generation.steps],
        "accepted_by_position": [list(x) for x in generation.accepted_by_position()],
        "quality": dataset.task.score(example, text, execute_code=dataset.execute_code),
        "first_divergence": first_divergence,
        "costs": costs,
    }
    if getattr(example, "category", None) is not None:  # Spec-Bench's question categories
        row["category"] = example.category
    # corpus metrics' sufficient statistics (BLEU), and why a metric is missing (unrun code);
    # only the rows of tasks that have them carry these keys
    statistics = dataset.task.corpus_statistics(example, text)
    if statistics:
        row["quality_statistics"] = statistics
    skipped = dataset.task.skipped(dataset.execute_code)
    if skipped:
        row["quality_skipped"] = skipped
    if cell.drafters:  # cascades only, so the rows of other methods keep their shape
        row["drafters"] = list(cell.drafters)
        row["inner_steps"] = {
            name: [list(s) for s in steps] for name, steps in generation.inner_steps.items()
        }
    if generation.deferrals is not None:  # cascades only
        row["deferrals"] = generation.deferrals
    if generation.expected_rejections is not None:  # speculative cascades: Lemma 5's expectation
        row["expected_rejections"] = generation.expected_rejections
    if generation.rejection_variance is not None:
        row["rejection_variance"] = generation.rejection_variance
    if generation.rule_acceptance is not None:  # sampled speculative decoding: the engines' rules
        row["rule_acceptance"] = generation.rule_acceptance
    if generation.engine_record is not None:  # engine cells only (specbench.engines)
        row["engine_record"] = generation.engine_record
    if replay is not None:  # only replayed rows carry these keys (runner's module docstring)
        row["replayed"] = True
        row["replay_live_passes"] = replay.live_passes
        if replay.live_tie is not None:
            row["replay_live_tie"] = replay.live_tie
        row["walltime_replayed"], row["walltime"] = row["walltime"], math.nan
        row["ttft_replayed"], row["ttft"] = row["ttft"], math.nan
        row["forwards"] = {name: dict(counts) for name, counts in row["forwards"].items()}
        row["forwards"][cell.target]["seconds"] = math.nan
        if "prefill_seconds" in row["forwards"][cell.target]:
            row["forwards"][cell.target]["prefill_seconds"] = math.nan
    return row


def divergence(reference: list[int], tokens: list[int]) -> int:
    """-1 when ``tokens`` equal the AR output ``reference``, else the first index where they differ."""
    for i, (a, b) in enumerate(zip(reference, tokens, strict=False)):
        if a != b:
            return i
    return -1 if len(reference) == len(tokens) else min(len(reference), len(tokens))


def prompt_sha(ids: list[int]) -> str:
    """A hash of the prompt's token ids as the target saw them (compare: the same prompt texts)."""
    return hashlib.sha256(",".join(str(int(i)) for i in ids).encode()).hexdigest()[:16]


def gold_sha(example) -> str:
    """A hash of the gold answers a row was scored against (a resume refuses rows whose gold changed)."""
    text = "\x1f".join([example.reference, *example.answers])
    return hashlib.sha256(text.encode()).hexdigest()[:16]
