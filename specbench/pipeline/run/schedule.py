"""In what order a run measures its (dataset, cell, example) rows.

``by-cell`` runs each cell over all its examples before the next cell: cheapest to reason about,
but any drift of the machine over a long run (clocks, temperature, other tenants) lands between the
AR baseline, measured first, and the cells measured hours later. ``interleaved`` runs, for each
example, every cell back to back, so drift hits all cells alike: the autoregressive cells first (the
others need their row: lossless check, replay), then the rest in an order shuffled per example with
a seed from the recipe's seed, the dataset and the example id, so a resumed run keeps the order.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Sequence

from specbench.methods import BASELINE

SCHEDULES = ("interleaved", "by-cell")


def work_order(
    plan: Sequence[tuple[object, Sequence[object]]],
    pending: Callable[[object, object, object], bool],
    schedule: str,
    seed: int,
) -> list[tuple[object, object, object]]:
    """(dataset, cell, example) triples still ``pending(dataset, cell, example)``, in ``schedule``
    order. ``plan``: (dataset, its cells) pairs; a dataset has ``.label`` and ``.examples``, an
    example ``.id``, a cell ``.method`` and ``.id``."""
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}")
    order = []
    for dataset, cells in plan:
        first = [c for c in cells if c.method == BASELINE]
        rest = [c for c in cells if c.method != BASELINE]
        if schedule == "by-cell":
            order += [
                (dataset, c, e) for c in first + rest for e in dataset.examples if pending(dataset, c, e)
            ]
            continue
        for example in dataset.examples:
            shuffled = list(rest)
            random.Random(_seed(seed, dataset.label, example.id)).shuffle(shuffled)
            order += [(dataset, c, example) for c in first + shuffled if pending(dataset, c, example)]
    return order


def _seed(*parts) -> int:
    return int.from_bytes(hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()[:8], "big")
