"""Cost coefficients and the standardized walltime improvement (SWI).

SWI (CS Drafting, Sec. 5; arXiv v1 defines it in words) is the speedup a method would have if each
model's forward pass took a fixed time c_m relative to the target's:

    SWI = generated tokens * c_target / sum over models m of (forward passes_m * c_m)

Two cost tables: MS (model size) sets c_m = parameters_m / parameters_target, computed from the
loaded models; PW (prior work) takes c_m from a published table (specbench/data/cost_tables.yaml)
or a number in the recipe. Statistical drafters cost 0 in both. Encoder passes of
encoder-decoder models are not counted (one per prompt per model, as in the papers' SWI).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from importlib import resources

import yaml

from specbench.errors import SpecbenchError


@functools.lru_cache(maxsize=1)
def cost_tables() -> dict:
    return yaml.safe_load(resources.files("specbench.data").joinpath("cost_tables.yaml").read_text())


def pw_cost(value, where: str) -> float:
    """A recipe's ``cost.pw``: a number, or ``{table: NAME, entry: NAME}`` looked up in the PW tables."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    tables = cost_tables()
    table = tables.get(value.get("table"))
    if table is None:
        raise SpecbenchError(
            where, f"unknown cost table {value.get('table')!r}", f"use one of {sorted(tables)}"
        )
    entry = table["entries"].get(value.get("entry"))
    if entry is None:
        raise SpecbenchError(
            where,
            f"cost table {value['table']!r} has no entry {value.get('entry')!r}",
            f"use one of {sorted(table['entries'])}",
        )
    return float(entry)


def weighted_passes(forwards: dict[str, float], costs: dict[str, float | None]) -> float:
    """SWI's denominator: sum over models of forward passes x c_model; NaN when a model that ran has no
    cost in this table."""
    spent = 0.0
    for model, passes in forwards.items():
        cost = costs.get(model)
        if passes and cost is None:
            return math.nan
        spent += passes * (cost or 0.0)
    return spent


def swi(tokens: float, forwards: dict[str, float], costs: dict[str, float | None], target: str) -> float:
    """SWI for one cost table; NaN when a model that ran has no cost in this table."""
    spent = weighted_passes(forwards, costs)
    target_cost = costs.get(target)
    if math.isnan(spent) or not spent or target_cost is None:
        return math.nan
    return tokens * target_cost / spent


def iid_acceptance(steps: Sequence[Sequence[int]]) -> float:
    """The maximum-likelihood alpha of i.i.d. acceptances from (drafted, accepted) steps: each step's
    accepted drafts are successes, and its first rejection (where it had one) the one failure."""
    accepted = sum(a for _, a in steps)
    rejected = sum(1 for d, a in steps if a < d)
    return accepted / (accepted + rejected) if accepted + rejected else math.nan


def cell_costs(recipe, cell, target, drafters: dict) -> dict:
    """Per-model cost coefficients of a cell under MS and PW, relative to its target (= 1): MS from
    parameter counts, PW from the recipe's ``cost: {pw: ...}`` (0 for a statistical drafter)."""
    ms = {cell.target: 1.0}
    pw = {cell.target: _pw_of(recipe, cell.target, True)}
    for name, drafter in drafters.items():
        ms[name] = drafter.num_parameters / target.num_parameters
        pw[name] = 0.0 if drafter.num_parameters == 0 else _pw_of(recipe, name, False)
    return {"ms": ms, "pw": pw}


def _pw_of(recipe, name: str, role_target: bool) -> float | None:
    cost = recipe.models[name].cost
    value = getattr(cost, "pw", None) if cost is not None else None
    if value is None:
        return 1.0 if role_target else None
    if hasattr(value, "model_dump"):
        value = value.model_dump()
    return pw_cost(value, f"{recipe.path}: models.{name}.cost.pw")
