"""Predicted walltime, tokens/s and speedup for every cell of a run, beside the measured ones.

Two ways (``specbench.pipeline.cost_model`` has the pass costs):

- **held out, on the machine that measured the run** (:func:`cross_validated`, the ``*_predicted``
  columns of ``cells.csv``): the examples are split in two halves by id; each model's pass cost is
  fitted (:func:`~specbench.pipeline.cost_model.fit_linear`) to one half's rows of every cell, and each
  cell's loop overhead per step to the same half; the other half's rows are predicted from their
  counts and shapes alone, and the halves swap. A cell's prediction is over all its rows.
- **carried to another configuration** (:func:`predict_run`, ``specbench predict RUN --profile``):
  every model's pass cost comes from a profile of the other device, dtype or engine (a probe's file or
  a device's roofline), and each row keeps its measured loop overhead.

Either way a cell's predicted speedup is its predicted tokens/s over the predicted tokens/s of the AR
cell of the same dataset, target and machine, so both sides of the ratio come from the same model.
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections import defaultdict
from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd

from specbench.pipeline import cost_model

FOLDS = 2


def model_seconds(row: dict) -> float:
    return sum(counts.get("seconds", 0.0) for counts in row["forwards"].values())


def overhead(row: dict) -> float:
    """The row's walltime outside its models' passes (loop, statistical drafting, sampling)."""
    return row["walltime"] - model_seconds(row)


def timed(row: dict) -> bool:
    """A row with a walltime and what predicting it needs (replayed rows have no time)."""
    return (
        not row.get("replayed")
        and math.isfinite(row.get("walltime", math.nan))
        and all(key in row for key in ("key", "steps", "forwards", "n_tokens"))
    )


def _fold(row: dict) -> int:
    key = str(row.get("example_id"))
    return int(hashlib.sha256(key.encode()).hexdigest(), 16) % FOLDS


def _neural(rows: Sequence[dict]) -> set[tuple[str, str]]:
    """(model, engine) of the models that spent time in passes (statistical drafters never do); a
    model's passes on two engines (HF generate's cells run eagerly in a compiled run) cost apart."""
    return {
        (m, engine_of(r))
        for r in rows
        for m, c in r["forwards"].items()
        if c.get("forward_passes") and c.get("seconds", 0) > 0
    }


def engine_of(row: dict) -> str:
    return row.get("engine") or "eager"


def fitted_costs(rows: Sequence[dict]) -> dict[tuple[str, str], cost_model.Linear]:
    """Each neural (model, engine)'s :class:`Linear` pass cost, fitted to its seconds in ``rows``."""
    costs = {}
    for model, engine in sorted(_neural(rows)):
        samples = [
            (cost_model.row_shapes(r, model)[0], r["forwards"][model]["seconds"])
            for r in rows
            if engine_of(r) == engine and r["forwards"].get(model, {}).get("forward_passes")
        ]
        costs[(model, engine)] = cost_model.fit_linear(samples)
    return costs


def predicted_walltime(row: dict, cost_of: Callable[[str], object | None], loop: float) -> float:
    """``row``'s walltime from its models' shapes under ``cost_of(model)`` (None: costs nothing, a
    statistical drafter), plus ``loop`` seconds of loop overhead."""
    total = loop
    for model, counts in row["forwards"].items():
        cost = cost_of(model)
        if cost is not None and (counts.get("forward_passes") or counts.get("encoder_passes")):
            total += cost.seconds(cost_model.row_shapes(row, model)[0])
    return total


def cross_validated(rows: Sequence[dict], machine_of: Callable[[dict], str]) -> dict[str, float]:
    """Row key -> walltime predicted by a fit to the other half of the examples (same machine);
    rows of a machine whose examples do not split (one example) are fitted and predicted in-sample."""
    by_machine: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        if timed(row):
            by_machine[machine_of(row)].append(row)
    predicted = {}
    for group in by_machine.values():
        folds = {f: [r for r in group if _fold(r) == f] for f in range(FOLDS)}
        for fold, held_out in folds.items():
            train = [r for r in group if _fold(r) != fold] or group
            if not held_out:
                continue
            costs = fitted_costs(train)
            per_step = _overhead_per_step(train)
            for row in held_out:
                loop = per_step.get(row["cell"], 0.0) * len(row["steps"])
                cost_of = functools.partial(_cost_on, costs, engine_of(row))
                predicted[row["key"]] = predicted_walltime(row, cost_of, loop)
    return predicted


def _cost_on(costs: dict, engine: str, model: str):
    return costs.get((model, engine))


def _overhead_per_step(rows: Sequence[dict]) -> dict[str, float]:
    spent: dict[str, float] = defaultdict(float)
    steps: dict[str, int] = defaultdict(int)
    for row in rows:
        spent[row["cell"]] += overhead(row)
        steps[row["cell"]] += len(row["steps"])
    return {cell: spent[cell] / steps[cell] for cell in spent if steps[cell]}


def cell_predictions(
    rows: Sequence[dict], predicted: dict[str, float], machine_of: Callable[[dict], str]
) -> pd.DataFrame:
    """Per (dataset, cell, machine): measured and predicted walltime, tokens/s and speedup over the AR
    cell, on the rows that have a prediction."""
    groups: dict[tuple[str, str, str], list[dict]] = defaultdict(list)
    for row in rows:
        if row["key"] in predicted and timed(row):
            groups[(row["dataset"], row["cell"], machine_of(row))].append(row)
    records = []
    for (dataset, cell, machine), group in groups.items():
        tokens = sum(r["n_tokens"] for r in group)
        measured = sum(r["walltime"] for r in group)
        forecast = sum(predicted[r["key"]] for r in group)
        records.append(
            {
                "dataset": dataset,
                "cell": cell,
                "machine": machine,
                "method": group[0]["method"],
                "target": group[0]["target"],
                "rows": len(group),
                "walltime_s": measured,
                "walltime_predicted_s": forecast,
                "tokens_per_s": tokens / measured if measured else math.nan,
                "tokens_per_s_predicted": tokens / forecast if forecast else math.nan,
            }
        )
    table = pd.DataFrame(records)
    if table.empty:
        return table
    ar = table[table["method"] == "autoregressive"].set_index(["dataset", "target", "machine"])
    for column in ("tokens_per_s", "tokens_per_s_predicted"):
        reference = [ar[column].get((r.dataset, r.target, r.machine), math.nan) for r in table.itertuples()]
        name = "speedup" if column == "tokens_per_s" else "speedup_predicted"
        table[name] = table[column] / np.array(reference, dtype=float)
    table["speedup_error"] = table["speedup_predicted"] / table["speedup"] - 1
    table["walltime_error"] = table["walltime_predicted_s"] / table["walltime_s"] - 1
    return table


HELD_OUT_COLUMNS = ("tokens_per_s_predicted", "speedup_predicted", "speedup_prediction_error")


def held_out_columns(rows: Sequence[dict], machine_of: Callable[[dict], str]) -> pd.DataFrame:
    """cells.csv's prediction columns (HELD_OUT_COLUMNS) by (dataset, cell, machine): tokens/s and
    speedup predicted held out (:func:`cross_validated`), and the speedup's error."""
    table = cell_predictions(rows, cross_validated(rows, machine_of), machine_of)
    if table.empty:
        return pd.DataFrame(columns=["dataset", "cell", "machine", *HELD_OUT_COLUMNS])
    table = table.rename(columns={"speedup_error": "speedup_prediction_error"})
    return table[["dataset", "cell", "machine", *HELD_OUT_COLUMNS]]


def median_abs_error(table: pd.DataFrame, column: str = "speedup_error") -> float:
    """The median |error| over the cells that are not AR (whose speedup is 1 by definition)."""
    errors = table.loc[table["method"] != "autoregressive", column].abs().dropna()
    return float(errors.median()) if len(errors) else math.nan


def run_costs(
    run_dir, environment: dict, profile: dict, dtype: str | None = None, roofline: bool = False
) -> dict[str, object]:
    """Each model of a run -> its pass cost under ``profile`` (None: a statistical drafter): a probed
    model's table, else the roofline of the profile's device (a named device's public figures, or the
    bandwidth and peak that ``probe --roofline`` measured); ``roofline``: the roofline for every model."""
    from specbench.errors import SpecbenchError
    from specbench.pipeline import probe

    figures = profile if profile["kind"] == "roofline" else profile.get("roofline")
    if roofline and figures is None:
        raise SpecbenchError(
            "--roofline", "the profile holds no roofline figures", "probe again with --roofline"
        )
    costs = {}
    for name, model in (environment.get("models") or {}).items():
        if not model.get("parameters"):
            costs[name] = None
            continue
        source = model["source"]
        entry = (profile.get("models") or {}).get(source)
        if entry is not None and not roofline:
            costs[name] = probe.probed_cost(entry)
            continue
        if figures is None:
            raise SpecbenchError(
                f"{run_dir}: models.{name}",
                f"source {source!r} is not in the profile "
                f"(it has {', '.join(sorted(profile['models']))}) and the profile has no roofline",
                "probe a recipe that names it (specbench probe RECIPE --out FILE), or add --roofline there",
            )
        model_dtype = dtype or str(model.get("dtype") or "float32").removeprefix("torch.")
        fact = _facts(run_dir, name, model_dtype)
        parameters = fact.params or model["parameters"]
        costs[name] = probe.roofline_cost(
            figures, fact.weight_bytes, parameters, fact.kv_bytes_per_token, model_dtype
        )
    return costs


def _facts(run_dir, name: str, dtype: str):
    """The run's model ``name`` as ``plan`` sees it: weights, parameters and KV bytes per token."""
    from pathlib import Path

    import yaml

    from specbench import sources
    from specbench.recipe import ModelSpec

    recipe = yaml.safe_load((Path(run_dir) / "resolved_recipe.yaml").read_text())
    models = {
        n: ModelSpec(**{k: v for k, v in spec.items() if v is not None})
        for n, spec in recipe["models"].items()
    }
    return sources.model_facts(name, models, dtype)


def predict_run(
    run_dir, profile: dict, dtype: str | None = None, loop: bool | None = None, roofline: bool = False
) -> pd.DataFrame:
    """Every cell of the run at ``run_dir`` predicted under ``profile``: each row's models' passes costed
    by the profile, plus its loop overhead as measured (``loop``; default: with a probe's profile, not
    with a roofline, which predicts what the device bounds: a host's Python is not the device's)."""
    from pathlib import Path

    from specbench.pipeline.results import read_environment, read_examples

    run_dir = Path(run_dir)
    environment = read_environment(run_dir)
    costs = run_costs(run_dir, environment, profile, dtype, roofline)
    rows = [r for r in read_examples(run_dir) if timed(r)]
    machine = (environment.get("machine") or {}).get("id", "")
    if loop is None:
        loop = profile["kind"] == "probe" and not roofline
    if "compiled" in str(profile.get("engine", "")):  # HF generate's cells run eagerly on any engine
        rows = [r for r in rows if _runs_engine(r["method"])]
    predicted = {r["key"]: predicted_walltime(r, costs.get, overhead(r) if loop else 0.0) for r in rows}
    return cell_predictions(rows, predicted, lambda r: r.get("machine") or machine)


def _runs_engine(method: str) -> bool:
    from specbench.methods import METHODS

    return method not in METHODS or METHODS[method].runs_engine
