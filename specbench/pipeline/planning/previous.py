"""What an earlier run in ``specbench plan --output-dir`` tells the plan: its rows, the identity of
its models (so that a model renamed in the recipe is still the same model), the seconds a pass of each
took and the draft acceptance rate its cells measured."""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass
from pathlib import Path

import yaml

from specbench.pipeline.records.results import CELLS, EXAMPLES, RESOLVED_RECIPE, read_examples


@dataclass
class Previous:
    """What an earlier run in ``--output-dir`` tells the plan."""

    rows: list[dict]
    cells: list[dict]
    models: dict[str, str]  # that run's model name -> identity (source, dtype, revision, options)

    def identity(self, name: str | None) -> str | None:
        """What makes the model that run called ``name`` the same model (its name, without records)."""
        return None if name is None else self.models.get(name, name)


def identity(spec: dict) -> str:
    """A recipe model's identity across runs: the same weights, dtype and loader options."""
    keys = ("source", "dtype", "revision", "options")
    return json.dumps({key: spec.get(key) for key in keys}, sort_keys=True, default=str)


def read_previous(output_dir: Path | None) -> Previous | None:
    if output_dir is None or not (Path(output_dir) / EXAMPLES).is_file():
        return None
    rows = read_examples(output_dir)
    cells = []
    if (Path(output_dir) / CELLS).is_file():
        with open(Path(output_dir) / CELLS, newline="") as handle:
            cells = list(csv.DictReader(handle))
    models = {}
    resolved = Path(output_dir) / RESOLVED_RECIPE
    if resolved.is_file():
        specs = (yaml.safe_load(resolved.read_text()) or {}).get("models") or {}
        models = {name: identity(spec) for name, spec in specs.items()}
    return Previous(rows, cells, models)


def identities(recipe, previous: Previous) -> dict[str, str]:
    """This recipe's model name -> identity, or the name itself when the earlier run left no record."""
    if not previous.models:
        return {name: name for name in recipe.models}
    return {name: identity(spec.model_dump(mode="json")) for name, spec in recipe.models.items()}


def previous_pass_ms(recipe, previous: Previous | None) -> dict[str, float]:
    if previous is None:
        return {}
    seconds: dict[str, float] = {}
    passes: dict[str, int] = {}
    ours = identities(recipe, previous)
    for row in previous.rows:
        if row.get("replayed"):
            continue
        for old_name, counts in (row.get("forwards") or {}).items():
            if not math.isfinite(counts.get("seconds", math.nan)):
                continue
            for name in (n for n, same in ours.items() if same == previous.identity(old_name)):
                seconds[name] = seconds.get(name, 0.0) + counts["seconds"]
                passes[name] = passes.get(name, 0) + counts.get("forward_passes", 0)
    return {name: seconds[name] / passes[name] * 1000 for name in seconds if passes[name]}


def previous_alpha(recipe, cell, dataset: str, previous: Previous | None) -> float | None:
    """The draft acceptance rate a previous run measured for the same target and drafter models."""
    if previous is None:
        return None
    ours = identities(recipe, previous)
    drafter = cell.drafter or (cell.drafters[0] if cell.drafters else None)
    want = (ours[cell.target], ours[drafter] if drafter else None)
    same, other = [], []
    for record in previous.cells:
        rate = _number(record.get("draft_acceptance_rate"))
        pair = (previous.identity(record.get("target")), previous.identity(record.get("drafter") or None))
        if rate is None or pair != want:
            continue
        (same if (record.get("cell"), record.get("dataset")) == (cell.id, dataset) else other).append(rate)
    rates = same or other
    return sum(rates) / len(rates) if rates else None


def _number(value) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None
