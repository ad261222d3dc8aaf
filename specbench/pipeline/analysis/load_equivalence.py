"""Output equivalence under load: every load request's output token ids against the same prompt's
reference outputs, classified as the batch-1 lossless audit classifies a row, by the same code
(:func:`specbench.pipeline.records.rows.divergence` finds the first difference,
:func:`specbench.pipeline.analysis.numerics.divergence_fields` tells a numerical tie from a mismatch with
specbench's copy of the weights): **identical**, a **tie** or a **mismatch**; a divergence where specbench
holds no model of the server's weights (llama.cpp's quantized GGUF) stays **unclassified**, and is
flagged as a mismatch is.

Two references, each where it can be had (:mod:`specbench.pipeline.experiments.load_reference`):

- ``engine``: the same engine's output for that prompt sent alone (batch 1), speculation off: the
  target's plain server, once per sweep directory, before any level; for a server specbench does not
  start (``engine: openai``) the server itself alone, whose speculation cannot be turned off, so there
  the check is batch invariance;
- ``ours``: specbench's own autoregressive output of the same weights, from a ``specbench run``
  directory's rows of the recipe's AR cell on them.

A reference sent with the load's own budget covers the whole output; a run row cut by its budget (not
ended by EOS) covers its own length, the load's output compared up to it. A request that failed, whose
server sent no token ids, or whose prompt has no reference is not checked. Nothing is checked at
temperature > 0, where outputs are samples.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from specbench.pipeline.records.rows import divergence

REFERENCES = {"engine": "the engine's batch-1 AR", "ours": "specbench's AR"}
COUNTS = {"checked": None, "identical": "identical", "ties": "tie", "mismatches": "mismatch"}
COUNTS |= {"unclassified": "unclassified"}


def column(kind: str, count: str) -> str:
    """A load.csv column: ``eq_engine_ties``, ``eq_ours_checked``, ..."""
    return f"eq_{kind}_{count}"


COLUMNS = [column(kind, count) for kind in REFERENCES for count in COUNTS]


@dataclass(frozen=True)
class Reference:
    ids: list[int]
    covers_all: bool  # the whole output (the same budget, or ended by EOS); else its own length only


class Auditor:
    """A target's references by kind and prompt index, and the model that classifies a divergence
    (specbench's copy of the weights; None where it has none of the server's weights, ``why`` saying
    so in the level's ``eq_note`` when a divergence stays unclassified)."""

    def __init__(
        self,
        prompts: list[list[int]],
        references: dict[str, dict[int, Reference]],
        scorer=None,
        why: str | None = None,
    ):
        self.prompts, self.references, self.scorer, self.why = prompts, references, scorer, why
        self._classes: dict[tuple, str] = {}  # a divergence's class, by (kind, prompt, where, token)

    def classify(self, kind: str, index: int, output: list[int] | None) -> str | None:
        """The class of request ``index``'s output (it sent prompt ``index`` taken in turn) against the
        ``kind`` reference; None where it is not checked."""
        prompt = index % len(self.prompts)
        reference = self.references.get(kind, {}).get(prompt)
        if reference is None or output is None:
            return None
        compared = list(output) if reference.covers_all else list(output[: len(reference.ids)])
        first = divergence(reference.ids, compared)
        if first == -1:
            return "identical"
        if self.scorer is None:
            return "unclassified"
        token = compared[first] if first < len(compared) else None
        key = (kind, prompt, first, token)
        if key not in self._classes:  # margins depend on the prompt, the reference's prefix, both tokens
            import torch

            from specbench.pipeline.analysis.numerics import divergence_fields

            ids = torch.tensor(self.prompts[prompt], dtype=torch.long, device=self.scorer.device)
            fields = divergence_fields(self.scorer, ids, reference.ids, compared, first, single_turn=True)
            self._classes[key] = fields.get("divergence_class", "unclassified")
        return self._classes[key]

    def audit(self, records: list[dict]) -> dict:
        """Each request's classes (``equivalence``: reference -> class, on its record) and the level's
        counts (:data:`COLUMNS`; NaN for a reference this target has none of)."""
        counts = {name: 0 for name in COLUMNS}
        for record in records:
            classes = {}
            for kind in REFERENCES:
                if record.get("error") is not None:
                    continue
                found = self.classify(kind, int(record["index"]), record.get("output_ids"))
                if found is None:
                    continue
                classes[kind] = found
                counts[column(kind, "checked")] += 1
                counts[column(kind, next(c for c, name in COUNTS.items() if name == found))] += 1
            record["equivalence"] = classes
        for kind in REFERENCES:
            if not self.references.get(kind):
                counts |= {column(kind, count): math.nan for count in COUNTS}
        unclassified = any(counts[column(kind, "unclassified")] > 0 for kind in REFERENCES)  # NaN > 0: False
        counts["eq_note"] = f"unclassified: {self.why}" if unclassified and self.why else None
        return counts


def unchecked(why: str) -> dict:
    """A level's counts where nothing is checked, and why (``eq_note``)."""
    return {**{name: math.nan for name in COLUMNS}, "eq_note": why}


def pooled(rows: list[dict]) -> dict:
    """The counts of a level's repeats summed (NaN where none of them was checked), and the first
    row's note."""
    out = {}
    for name in COLUMNS:
        values = [
            float(r[name]) for r in rows if isinstance(r.get(name), int | float) and not math.isnan(r[name])
        ]
        out[name] = sum(values) if values else math.nan
    notes = [r.get("eq_note") for r in rows if isinstance(r.get("eq_note"), str)]
    out["eq_note"] = notes[0] if notes else None
    return out


def diverged(row: dict, kind: str) -> int:
    """Outputs that differ from the ``kind`` reference beyond a numerical tie (mismatches and
    unclassified divergences)."""
    total = 0
    for count in ("mismatches", "unclassified"):
        value = row.get(column(kind, count))
        if isinstance(value, int | float) and not math.isnan(value):
            total += int(value)
    return total


def flag(row: dict, label: str) -> str | None:
    """The ``!`` line of a level (a load.csv or load_summary.csv row) whose outputs differ from a
    reference beyond a numerical tie; None where none does."""
    parts = []
    for kind, name in REFERENCES.items():
        count = diverged(row, kind)
        if count:
            checked = int(row[column(kind, "checked")])
            parts.append(f"{count} of {checked} differ from {name}")
    if not parts:
        return None
    note = row.get("eq_note")
    why = f"; {note}" if isinstance(note, str) and note.startswith("unclassified") else ""
    return (
        f"! {label}: outputs under load are not the outputs alone: {'; '.join(parts)} (mismatches or "
        f"unclassified divergences; load_requests.jsonl marks each request's class{why})"
    )
