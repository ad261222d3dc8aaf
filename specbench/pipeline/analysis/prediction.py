"""Predicted walltime, tokens/s and speedup for every cell of a run, beside the measured ones.

Two ways (``specbench.pipeline.analysis.cost_model`` has the pass costs):

- **held out, on the machine that measured the run** (:func:`cross_validated`, the ``*_predicted``
  columns of ``cells.csv``): the examples are split in two halves by id; each model's pass cost is
  fitted (:func:`~specbench.pipeline.analysis.cost_model.fit_linear`) to one half's rows of every cell,
  and each cell's loop overhead per step to the same half; the other half's rows are predicted from their
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
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from specbench.errors import SpecbenchError
from specbench.methods import BASELINE
from specbench.pipeline.analysis import cost_model, profiles
from specbench.pipeline.records.results import RESOLVED_RECIPE

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
    ar = table[table["method"] == BASELINE].set_index(["dataset", "target", "machine"])
    for column in ("tokens_per_s", "tokens_per_s_predicted"):
        reference = [ar[column].get((r.dataset, r.target, r.machine), math.nan) for r in table.itertuples()]
        name = "speedup" if column == "tokens_per_s" else "speedup_predicted"
        table[name] = table[column] / np.array(reference, dtype=float)
    table["speedup_error"] = table["speedup_predicted"] / table["speedup"] - 1
    table["walltime_error"] = table["walltime_predicted_s"] / table["walltime_s"] - 1
    return table


HELD_OUT_COLUMNS = ("tokens_per_s_predicted", "speedup_predicted", "speedup_prediction_error")


def held_out_columns(
    rows: Sequence[dict], machine_of: Callable[[dict], str], predicted: dict[str, float] | None = None
) -> pd.DataFrame:
    """cells.csv's prediction columns (HELD_OUT_COLUMNS) by (dataset, cell, machine): tokens/s and
    speedup predicted held out (``predicted``, else :func:`cross_validated`), and the speedup's error."""
    if predicted is None:
        predicted = cross_validated(rows, machine_of)
    table = cell_predictions(rows, predicted, machine_of)
    if table.empty:
        return pd.DataFrame(columns=["dataset", "cell", "machine", *HELD_OUT_COLUMNS])
    table = table.rename(columns={"speedup_error": "speedup_prediction_error"})
    return table[["dataset", "cell", "machine", *HELD_OUT_COLUMNS]]


# a row whose walltime is more than this many times its held-out prediction, or less than its
# reciprocal, is one the counts do not explain: something outside the decoding loop took its time
MISSED_BY = 2.0


def extrapolated(rows: Sequence[dict], machine_of: Callable[[dict], str]) -> set[str]:
    """Keys of the rows whose held-out prediction extrapolates: a prompt more than MISSED_BY times the
    longest (or less than 1 / MISSED_BY the shortest) that the other half of the same machine's examples
    holds. A fit to short prompts says little about a long prompt's prefill, so such a row missing its
    prediction tells nothing about the row's walltime."""
    by_machine: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        if timed(row) and isinstance(row.get("prompt_tokens"), int | float):
            by_machine[machine_of(row)].append(row)
    outside = set()
    for group in by_machine.values():
        for fold in range(FOLDS):
            seen = [r["prompt_tokens"] for r in group if _fold(r) != fold]
            if not seen:
                continue
            low, high = min(seen) / MISSED_BY, max(seen) * MISSED_BY
            outside |= {r["key"] for r in group if _fold(r) == fold and not low <= r["prompt_tokens"] <= high}
    return outside


def missed_rows(
    rows: Sequence[dict],
    predicted: dict[str, float],
    machine_of: Callable[[dict], str],
    skip: set[str] = frozenset(),
) -> dict[tuple[str, str, str], int]:
    """(dataset, cell, machine) -> its rows whose walltime misses their held-out prediction by more
    than a factor MISSED_BY either way; rows keyed in ``skip`` (see :func:`extrapolated`) are not
    counted."""
    missed: dict[tuple[str, str, str], int] = defaultdict(int)
    for row in rows:
        forecast = predicted.get(row.get("key"))
        if not forecast or not timed(row) or not forecast > 0 or row.get("key") in skip:
            continue
        ratio = row["walltime"] / forecast
        if ratio > MISSED_BY or ratio < 1 / MISSED_BY:
            missed[(row["dataset"], row["cell"], machine_of(row))] += 1
    return dict(missed)


def median_abs_error(table: pd.DataFrame, column: str = "speedup_error") -> float:
    """The median |error| over the cells that are not AR (whose speedup is 1 by definition)."""
    errors = table.loc[table["method"] != BASELINE, column].abs().dropna()
    return float(errors.median()) if len(errors) else math.nan


@dataclass(frozen=True)
class Priced:
    """A run model's pass cost under a profile, and the configuration that cost is of."""

    cost: object  # cost_model.SizeTable (probed) or cost_model.Roofline
    dtype: str | None
    engine: str | None  # None: a roofline, which has no engine


def run_models(run_dir, environment: dict) -> list[profiles.ModelConfig]:
    """The run's neural models (those with parameters) as environment.json records them, with their
    weights as resolved_recipe.yaml names them."""
    specs = _resolved(run_dir).get("models") or {}
    found = []
    for name, model in (environment.get("models") or {}).items():
        if isinstance(model, dict) and model.get("parameters"):
            spec = specs.get(name)
            identity = profiles.weights_identity(spec) if isinstance(spec, dict) else None
            dtype = str(model["dtype"]).removeprefix("torch.") if model.get("dtype") else None
            found.append(profiles.ModelConfig(name, model.get("source"), identity, dtype, engine_of(model)))
    return found


def _resolved(run_dir) -> dict:
    try:
        data = yaml.safe_load((Path(run_dir) / RESOLVED_RECIPE).read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return {}
    return data if isinstance(data, dict) else {}


def run_costs(
    run_dir, environment: dict, profile: dict, dtype: str | None = None, roofline: bool = False
) -> dict[str, Priced | None]:
    """Each model of a run -> its pass cost under ``profile`` (None: a statistical drafter): a probe's
    entry for it (:func:`profiles.entries_for`), or with ``roofline`` (or a device's profile) the
    roofline of the profile's device (a named device's public figures, or the bandwidth and peak that
    ``probe --roofline`` measured) at ``dtype`` (default: the model's). A probe without an entry for a
    model of the run is a profile of other models: refused, as is ``dtype`` with a probe's entries."""
    profiles.check_profile(profile)
    where = profiles.named(profile)
    figures = profile if profile["kind"] == "roofline" else profile.get("roofline")
    if roofline and figures is None:
        raise SpecbenchError(
            "--roofline", f"{where} holds no roofline figures", "probe again with --roofline"
        )
    probed = profile["kind"] == "probe" and not roofline
    if probed and dtype is not None:
        raise SpecbenchError(
            "--dtype",
            f"prices models by a roofline, and {where} prices each model as it was probed "
            f"({profile.get('dtype')}): --dtype would change nothing",
            "drop --dtype, or add --roofline to price every model by the profile's measured roofline",
        )
    models = run_models(run_dir, environment)
    entries = profiles.entries_for(profile, models) if probed else {}
    missing = [m for m in models if m.name not in entries] if probed else []
    if missing:
        model = missing[0]
        raise SpecbenchError(
            f"{where}: models",
            f"has no entry for the run's model {model.name!r} ({model.source}, {model.setup()}; it has "
            f"{', '.join(sorted(profile['models'])) or 'none'}): a profile of other models",
            "probe the run's recipe (specbench probe RECIPE --out FILE)"
            + (", or add --roofline to price every model by the profile's roofline" if figures else ""),
        )
    costs: dict[str, Priced | None] = dict.fromkeys(environment.get("models") or {})
    for model in models:
        entry = entries.get(model.name)
        if entry is not None:
            costs[model.name] = Priced(profiles.probed_cost(entry), entry.get("dtype"), engine_of(entry))
            continue
        model_dtype = dtype or model.dtype or "float32"
        fact = _facts(run_dir, model.name, model_dtype)
        parameters = fact.params or environment["models"][model.name]["parameters"]
        cost = profiles.roofline_cost(
            figures, fact.weight_bytes, parameters, fact.kv_bytes_per_token, model_dtype
        )
        costs[model.name] = Priced(cost, model_dtype, None)
    return costs


def _facts(run_dir, name: str, dtype: str):
    """The run's model ``name`` as ``plan`` sees it: weights, parameters and KV bytes per token."""
    from specbench import sources
    from specbench.recipe import ModelSpec

    specs = _resolved(run_dir).get("models") or {}
    if name not in specs:
        raise SpecbenchError(
            f"{Path(run_dir) / RESOLVED_RECIPE}: models.{name}",
            "is missing: a roofline prices a model by its size, which the run's recipe names",
            "name a run directory that specbench run wrote",
        )
    models = {n: ModelSpec(**{k: v for k, v in spec.items() if v is not None}) for n, spec in specs.items()}
    return sources.model_facts(name, models, dtype)


def predict_run(
    run_dir, profile: dict, dtype: str | None = None, loop: bool | None = None, roofline: bool = False
) -> pd.DataFrame:
    """Every cell of the run at ``run_dir`` predicted under ``profile``: each row's models' passes costed
    by the profile, plus its loop overhead as measured (``loop``; default: with a probe's profile, not
    with a roofline, which predicts what the device bounds: a host's Python is not the device's)."""
    from specbench.pipeline.records.results import read_environment, read_examples

    run_dir = Path(run_dir)
    environment = read_environment(run_dir)
    costs = run_costs(run_dir, environment, profile, dtype, roofline)
    rows = [r for r in read_examples(run_dir) if timed(r)]
    machine = (environment.get("machine") or {}).get("id", "")
    if loop is None:
        loop = profile["kind"] == "probe" and not roofline
    if "compiled" in str(profile.get("engine", "")):  # HF generate's cells run eagerly on any engine
        rows = [r for r in rows if _runs_engine(r["method"])]
    cost_of = lambda model: getattr(costs.get(model), "cost", None)  # noqa: E731
    predicted = {r["key"]: predicted_walltime(r, cost_of, overhead(r) if loop else 0.0) for r in rows}
    table = cell_predictions(rows, predicted, lambda r: r.get("machine") or machine)
    for cell in table.itertuples() if not table.empty else ():
        if not cell.walltime_predicted_s > 0:  # NaN too
            raise SpecbenchError(
                f"{run_dir}: cell {cell.cell} ({cell.dataset})",
                f"is predicted to take {cell.walltime_predicted_s:.3g} s, which no walltime is: the "
                "profile prices its passes at nothing, or its rows' loop overhead (walltime less the "
                "models' seconds) is negative",
                "check the run's rows (specbench check), or predict passes only (--loop none)",
            )
    return table


def _runs_engine(method: str) -> bool:
    from specbench.methods import METHODS

    return method not in METHODS or METHODS[method].runs_engine


# -- what --against may be: the same experiment, measured in the profile's configuration --------------

# the fields of a recipe that change no count: a run's name and prose, how it is scheduled and warmed,
# and the configuration a profile carries a run to (engine, linear layers, device, threads)
NOT_COUNTS = ("name", "description", "warmup", "lossless_check", "replay_check", "schedule", "repeats")
CONFIGURATION = ("engine", "linear", "threads", "load")


def experiment_differences(run_dir, other_dir) -> list[str]:
    """The fields in which the experiments of two run directories differ (empty: the same): their
    recorded recipe digests when equal, else their resolved recipes less what changes no count and
    the models' configuration (dtype, engine, device, linear layers), each model by its weights.
    Fields one side's specbench did not know yet (absent from its resolved recipe) are not compared."""
    from specbench.pipeline.records.results import read_environment

    digests = [read_environment(d).get("recipe_identity") for d in (run_dir, other_dir)]
    if digests[0] is not None and digests[0] == digests[1]:
        return []
    recipes = [_resolved(d) for d in (run_dir, other_dir)]
    if not all(recipes):
        return [f"{RESOLVED_RECIPE} (one has none that specbench reads: nothing says its experiment)"]
    (a, b), found = recipes, []
    for key in sorted((set(a) & set(b)) - set(NOT_COUNTS) - set(CONFIGURATION) - {"models"}):
        _differences(a[key], b[key], key, found)
    models = [a.get("models") or {}, b.get("models") or {}]
    if set(models[0]) != set(models[1]):
        found.append(f"models ({', '.join(sorted(models[0]))} against {', '.join(sorted(models[1]))})")
    for name in sorted(set(models[0]) & set(models[1])):
        weights = [m[name] if isinstance(m[name], dict) else {"source": m[name]} for m in models]
        if profiles.weights_identity(weights[0]) != profiles.weights_identity(weights[1]):
            found.append(f"models.{name}")
    return found


def _differences(a, b, path: str, found: list[str]) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) & set(b)):
            if key == "data_files" and a[key] and b[key]:  # by name: a checkout elsewhere has another path
                a, b = {**a, key: Path(a[key]).name}, {**b, key: Path(b[key]).name}
            _differences(a[key], b[key], f"{path}.{key}", found)
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _differences(x, y, f"{path}[{i}]", found)
    elif a != b:
        found.append(path)


def against_problem(run_dir, against, profile: dict, dtype: str | None, roofline: bool) -> None:
    """``--against``: a run of the same experiment as ``run_dir``, measured on one machine, the
    profile's (for a probe), in the configuration the profile prices each model in; a one-line error
    naming what differs otherwise."""
    from specbench.models.machine import Machine, recorded_machine
    from specbench.pipeline.records.results import EXAMPLES, read_environment, read_examples

    if not (Path(against) / EXAMPLES).is_file():
        raise SpecbenchError("--against", f"{against} is no run directory (no {EXAMPLES})", "name a run's")
    differ = experiment_differences(run_dir, against)
    if differ:
        raise SpecbenchError(
            "--against",
            f"{against} measured another experiment than {run_dir}: {', '.join(differ)} differ",
            "name a run of the same recipe, which may differ only in the models' dtype, engine or device",
        )
    machines = sorted({r["machine"] for r in read_examples(Path(against)) if timed(r) and r.get("machine")})
    if len(machines) > 1:
        raise SpecbenchError(
            "--against",
            f"{against} holds rows of {len(machines)} machines ({', '.join(machines)}): its speedups "
            "mix them",
            "name a run measured on one machine",
        )
    there = read_environment(against)
    if profile["kind"] == "probe" and isinstance(profile.get("machine"), dict):
        probed, measured = Machine.from_json(profile["machine"]), recorded_machine(there)
        if measured is not None and measured.id != probed.id:
            raise SpecbenchError(
                "--against",
                f"{against} was measured on {measured.describe()}, the profile {profiles.named(profile)} "
                f"on {probed.describe()}",
                "name a run measured where the profile was probed",
            )
    measured_models = {m.name: m for m in run_models(against, there)}
    for name, priced in run_costs(run_dir, read_environment(run_dir), profile, dtype, roofline).items():
        model = measured_models.get(name)
        if priced is None or model is None:
            continue
        if priced.dtype != model.dtype or priced.engine not in (None, model.engine):
            setup = f"{priced.dtype} {priced.engine or '(a roofline)'}"
            raise SpecbenchError(
                "--against",
                f"{against} measured {name} in {model.setup()}, and the profile prices it in {setup}",
                "name a run measured in the profile's configuration, or probe the recipe of that run"
                + (
                    f" (a roofline prices the dtype --dtype names: --dtype {model.dtype})"
                    if priced.engine is None
                    else ""
                ),
            )
