"""Discard and verification rates and the throughput model of SpecDec++, from result files only.

Huang, Guo and Wang, "SpecDec++: Boosting Speculative Decoding via Adaptive Candidate Lengths"
(2024), Sec. 2. With N the generated tokens, N_discard the candidate tokens thrown away after a
rejection, and N_draft, N_target the forward passes of the draft and target models, the time of a
generation is (Equation 2.1)

    T = t_draft · N_draft + t_target · N_target,

and since every round of Algorithm 1 turns its candidates plus one target pass into accepted tokens
plus one correction/bonus token, N_draft + N_target = N + N_discard, so (Equations 2.2-2.3)

    T / N = t_draft · (1 + r_discard) + (t_target − t_draft) · r_verify,
    r_discard = N_discard / N   (discarded candidates per generated token),
    r_verify  = N_target / N    (target verifications per generated token).

Both rates are per *generated token* (ratios of sums over a cell's examples), not per step; here
N_discard = Σ (drafted − accepted) over the ``steps`` of a row and N_target = the number of steps
(one per target verification), N = n_tokens. The paper plots the two rates against each other
(Figure 4: lower-left is better) and turns them into throughput N / T with measured forward times.

The forward times come, as in Sec. 4.2 / Appendix C.2, from a least-squares fit of Equation 2.1
*without intercept* to the per-example tuples (T = walltime, N_draft, N_target = the models' counted
forward passes), with R² = 1 − SS_res / SS_tot about the mean (so a poor no-intercept fit shows).
The paper fits each setting (SpecDec, SpecDec++, stand-alone) per dataset and then uses one pair of
times for both speculative settings; specbench pools ``speculative`` and ``specdecpp`` rows (per
dataset) for the predicted throughput of every speculative cell, and also reports each method's
own fit and the stand-alone t of each model from its autoregressive cells.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from specbench.errors import SpecbenchError
from specbench.methods import BASELINE
from specbench.pipeline.records.results import read_examples, write_atomic
from specbench.pipeline.views.plots import dataset_panels, save_panels

RATES_CSV = "specdecpp_rates.csv"
REGRESSION_CSV = "specdecpp_regression.csv"
PARETO_PNG = "specdecpp_pareto.png"
POOLED = ("speculative", "specdecpp")  # the settings whose times predict throughput (Sec. 4.2)
ALL = "all"


# -- Equation 2.3 ----------------------------------------------------------------------------------


def discard_verification_rates(steps, n_tokens: int) -> tuple[float, float]:
    """(r_discard, r_verify) of Equation 2.3 for ``steps`` [(drafted, accepted), ...] and N tokens."""
    if not n_tokens:
        return math.nan, math.nan
    discarded = sum(drafted - accepted for drafted, accepted in steps)
    return discarded / n_tokens, len(steps) / n_tokens


def time_per_token(t_draft: float, t_target: float, r_discard: float, r_verify: float) -> float:
    """T / N of Equation 2.3."""
    return t_draft * (1.0 + r_discard) + (t_target - t_draft) * r_verify


# -- the fit of Equation 2.1 -------------------------------------------------------------------------


@dataclass
class Fit:
    t_draft: float  # seconds per forward pass
    t_target: float
    r2: float
    n: int  # examples fitted

    @staticmethod
    def empty() -> Fit:
        return Fit(math.nan, math.nan, math.nan, 0)


def fit_forward_times(walltime, n_draft, n_target) -> Fit:
    """Least squares T ≈ t_draft·N_draft + t_target·N_target through the origin (Equation 2.1).

    NaN times when there are fewer examples than unknowns or the counts are collinear.
    """
    y = np.asarray(walltime, dtype=float)
    X = np.column_stack([np.asarray(n_draft, dtype=float), np.asarray(n_target, dtype=float)])
    if len(y) < 2 or np.linalg.matrix_rank(X) < 2:
        return Fit(math.nan, math.nan, math.nan, len(y))
    coef, *_ = np.linalg.lstsq(X, y, rcond=None)
    return Fit(float(coef[0]), float(coef[1]), _r2(y, X @ coef), len(y))


def fit_one(walltime, passes) -> Fit:
    """Stand-alone T ≈ t·N (one model): t in ``t_target``."""
    y, x = np.asarray(walltime, dtype=float), np.asarray(passes, dtype=float)
    if not len(y) or not (x @ x):
        return Fit.empty()
    t = float(x @ y / (x @ x))
    return Fit(math.nan, t, _r2(y, t * x), len(y))


def _r2(y: np.ndarray, predicted: np.ndarray) -> float:
    total = float(((y - y.mean()) ** 2).sum())
    return 1.0 - float(((y - predicted) ** 2).sum()) / total if total else math.nan


def _timed(rows: list[dict]) -> list[dict]:
    """Rows with a measured walltime (replayed rows have none)."""
    return [r for r in rows if isinstance(r.get("walltime"), int | float) and not math.isnan(r["walltime"])]


def _two_model(row: dict) -> bool:
    """A draft-then-verify row: one drafter and the target, both with forward passes."""
    drafter, forwards = row.get("drafter"), row.get("forwards") or {}
    return (
        bool(drafter)
        and not row.get("drafters")
        and (forwards.get(drafter) or {}).get("forward_passes", 0) > 0
        and (forwards.get(row["target"]) or {}).get("forward_passes", 0) > 0
    )


def _passes(row: dict, model: str) -> int:
    return (row["forwards"].get(model) or {}).get("forward_passes", 0)


def regression_table(rows: list[dict]) -> pd.DataFrame:
    """Fits of Equation 2.1 per setting × dataset (and over all datasets, ``dataset = all``).

    Settings: each draft-then-verify method, ``pooled`` (speculative + specdecpp, the times the
    predicted throughputs use) and ``stand-alone`` (each model's autoregressive cells; its time in
    ``t_target_s`` whether it is the draft or the target model).
    """
    rows = _timed(rows)
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for row in rows:
        datasets = (row["dataset"], ALL)
        if row["method"] == BASELINE:
            for dataset in datasets:
                groups[("stand-alone", row["target"], "", dataset)].append(row)
        elif _two_model(row):
            for dataset in datasets:
                groups[(row["method"], row["target"], row["drafter"], dataset)].append(row)
                if row["method"] in POOLED:
                    groups[("pooled", row["target"], row["drafter"], dataset)].append(row)
    out = []
    for (setting, target, drafter, dataset), group in groups.items():
        walltime = [r["walltime"] for r in group]
        if setting == "stand-alone":
            fit = fit_one(walltime, [_passes(r, target) for r in group])
        else:
            fit = fit_forward_times(
                walltime, [_passes(r, drafter) for r in group], [_passes(r, target) for r in group]
            )
        out.append(
            {
                "setting": setting,
                "target": target,
                "drafter": drafter,
                "dataset": dataset,
                "examples": fit.n,
                "t_draft_s": fit.t_draft,
                "t_target_s": fit.t_target,
                "r2": fit.r2,
            }
        )
    columns = ["setting", "target", "drafter", "dataset", "examples", "t_draft_s", "t_target_s", "r2"]
    return pd.DataFrame(out, columns=columns).sort_values(
        ["setting", "dataset"], kind="stable", ignore_index=True
    )


def measured_times(rows: list[dict]) -> dict[tuple[str, str, str], tuple[float, float]]:
    """(target, drafter, dataset or ``all``) -> (t_draft, t_target): each model's seconds per forward
    pass as the rows timed them, pooled over the speculative and specdecpp rows (the settings whose
    times predict throughput, Sec. 4.2). Where the fit of Equation 2.1 cannot separate the two times
    (collinear counts, or a verification pass that costs more than a one-token pass), these are the
    times Equation 2.3 can still be priced at."""
    sums: dict[tuple, list[float]] = defaultdict(lambda: [0.0, 0, 0.0, 0])
    for row in _timed(rows):
        if row["method"] not in POOLED or not _two_model(row):
            continue
        drafter, target = row["forwards"][row["drafter"]], row["forwards"][row["target"]]
        for dataset in (row["dataset"], ALL):
            total = sums[(row["target"], row["drafter"], dataset)]
            total[0] += drafter.get("seconds", math.nan)
            total[1] += drafter["forward_passes"]
            total[2] += target.get("seconds", math.nan)
            total[3] += target["forward_passes"]
    return {key: (d / nd, t / nt) for key, (d, nd, t, nt) in sums.items()}


# -- per cell --------------------------------------------------------------------------------------


def rates_table(rows: list[dict], regression: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per (dataset, cell): N, N_discard, N_target, both rates, measured and predicted tokens/s.

    ``predicted_tokens_per_s`` is N / T with T from Equation 2.3 and the pooled fit of the cell's
    dataset (else of all datasets); ``predicted_tokens_per_s_counts`` uses Equation 2.1 with the
    counted forward passes instead (the two differ when a method runs passes Algorithm 1 does not,
    e.g. prefill).
    """
    if regression is None:
        regression = regression_table(rows)
    measured = measured_times(rows)
    cells: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for row in rows:
        cells[(row["dataset"], row["cell"])].append(row)
    out = []
    for (dataset, cell), group in cells.items():
        first = group[0]
        tokens = sum(r["n_tokens"] for r in group)
        steps = [s for r in group for s in r["steps"]]
        r_discard, r_verify = discard_verification_rates(steps, tokens)
        timed = _timed(group)
        walltime = sum(r["walltime"] for r in timed)
        record = {
            "dataset": dataset,
            "cell": cell,
            "method_name": first["method_name"],
            "method": first["method"],
            "target": first["target"],
            "drafter": first.get("drafter") or "",
            **{key: value for key, value in first["params"].items() if not isinstance(value, list | dict)},
            "params": json.dumps(first["params"], sort_keys=True),
            "n": len(group),
            "generated_tokens": tokens,
            "discarded_tokens": sum(d - a for d, a in steps),
            "verifications": len(steps),
            "discard_rate": r_discard,
            "verification_rate": r_verify,
            "tokens_per_s": tokens / walltime if walltime and len(timed) == len(group) else math.nan,
            "t_draft_s": math.nan,
            "t_target_s": math.nan,
            "predicted_tokens_per_s": math.nan,
            "predicted_tokens_per_s_counts": math.nan,
            "t_draft_measured_s": math.nan,
            "t_target_measured_s": math.nan,
            "predicted_tokens_per_s_measured": math.nan,
        }
        times = measured.get((first["target"], record["drafter"], dataset))
        if times is not None and _two_model(first) and min(times) > 0:
            record["t_draft_measured_s"], record["t_target_measured_s"] = times
            record["predicted_tokens_per_s_measured"] = 1.0 / time_per_token(*times, r_discard, r_verify)
        fit = _pooled_fit(regression, dataset, first["target"], record["drafter"])
        # Equation 2.1 describes two models that each cost time per pass: a fit with a time <= 0 (a
        # statistical drafter costs nothing, and noise pushes its time below zero) predicts nothing
        if fit is not None and _two_model(first) and min(fit) > 0:
            t_draft, t_target = fit
            record |= {"t_draft_s": t_draft, "t_target_s": t_target}
            record["predicted_tokens_per_s"] = 1.0 / time_per_token(t_draft, t_target, r_discard, r_verify)
            seconds = sum(
                t_draft * _passes(r, first["drafter"]) + t_target * _passes(r, first["target"]) for r in group
            )
            record["predicted_tokens_per_s_counts"] = tokens / seconds if seconds else math.nan
        for suffix in ("", "_measured"):
            record[f"relative_error{suffix}"] = (
                record[f"predicted_tokens_per_s{suffix}"] / record["tokens_per_s"] - 1.0
                if record["tokens_per_s"] and not math.isnan(record["tokens_per_s"])
                else math.nan
            )
        out.append(record)
    return beside_sd_curve(pd.DataFrame(out))


def beside_sd_curve(rates: pd.DataFrame) -> pd.DataFrame:
    """Figure 4's comparison, per cell: ``sd_curve_verification_rate`` is the verification rate of
    fixed-k SD (same dataset, target and drafter) at the cell's discard rate, read off the straight
    lines between SD's cells ordered by discard rate; NaN outside SD's range (no extrapolation), for
    SD's own cells and for AR. ``below_sd_curve`` says whether the cell verifies less than that at
    equal discards (the paper's "lower-left is better"); empty where there is no curve to compare with."""
    curve = pd.Series(math.nan, index=rates.index, dtype=float)
    if len(rates):
        for _, group in rates.groupby(["dataset", "target", "drafter"], sort=False):
            sd = group[(group["method"] == "speculative") & group["discard_rate"].notna()]
            if len(sd) < 2:
                continue
            sd = sd.sort_values("discard_rate", kind="stable")
            x, y = sd["discard_rate"].to_numpy(float), sd["verification_rate"].to_numpy(float)
            others = group[~group["method"].isin(["speculative", BASELINE])]
            at = others["discard_rate"].to_numpy(float)
            inside = (at >= x[0]) & (at <= x[-1])
            curve[others.index] = np.where(inside, np.interp(at, x, y), math.nan)
    rates["sd_curve_verification_rate"] = curve.to_numpy()
    rates["below_sd_curve"] = [
        "" if math.isnan(c) else bool(v < c)
        for v, c in zip(rates.get("verification_rate", []), curve, strict=True)
    ]
    return rates


def _pooled_fit(
    regression: pd.DataFrame, dataset: str, target: str, drafter: str
) -> tuple[float, float] | None:
    pooled = regression[
        (regression["setting"] == "pooled")
        & (regression["target"] == target)
        & (regression["drafter"] == drafter)
    ]
    for name in (dataset, ALL):
        hit = pooled[(pooled["dataset"] == name) & pooled["t_draft_s"].notna()]
        if len(hit):
            return float(hit["t_draft_s"].iloc[0]), float(hit["t_target_s"].iloc[0])
    return None


# -- a run directory -------------------------------------------------------------------------------


def run_rows(run_dir: Path) -> list[dict]:
    rows = read_examples(Path(run_dir))
    if not rows:
        raise SpecbenchError(
            str(run_dir), "no examples.jsonl rows here", "point at a run directory from `specbench run`"
        )
    if not any(_two_model(r) for r in rows):
        raise SpecbenchError(
            str(run_dir),
            "no draft-then-verify cells here (speculative, specdecpp, hf_assisted or oracle_sd, one drafter)",
            "add a specdecpp method (threshold grid) and a speculative method (k grid) to the recipe",
        )
    return rows


def write_efficiency(run_dir: Path) -> list[Path]:
    """specdecpp_rates.csv, specdecpp_regression.csv and the Figure 4 PNG into ``run_dir``."""
    run_dir = Path(run_dir)
    rows = run_rows(run_dir)
    regression = regression_table(rows)
    rates = rates_table(rows, regression)
    paths = [run_dir / RATES_CSV, run_dir / REGRESSION_CSV, run_dir / PARETO_PNG]
    write_atomic(paths[0], rates.to_csv(index=False))
    write_atomic(paths[1], regression.to_csv(index=False))
    write_rates_plot(rates, paths[2])
    return paths


def rates_frontier(discard, verify) -> list[int]:
    """Positions of the points no other point beats on both rates (both lower is better), by discard."""
    pairs = sorted(
        (float(x), float(y), i)
        for i, (x, y) in enumerate(zip(discard, verify, strict=True))
        if not (math.isnan(float(x)) or math.isnan(float(y)))
    )
    frontier, best = [], math.inf
    for _, y, i in pairs:
        if y < best:
            frontier.append(i)
            best = y
    return frontier


def write_rates_plot(rates: pd.DataFrame, path: Path) -> Path:
    """Figure 4: verification rate against discard rate, SpecDec++ (threshold) vs SD (k), per dataset."""
    shown = rates[rates["method"] != BASELINE]
    datasets = list(dict.fromkeys(shown["dataset"])) or ["(none)"]
    plt, figure, axes = dataset_panels(datasets)
    for ax, dataset in zip(axes, datasets, strict=False):
        frame = shown[shown["dataset"] == dataset]
        for name, group in frame.groupby("method_name", sort=False):
            group = group.reset_index(drop=True)
            front = group.iloc[rates_frontier(group["discard_rate"], group["verification_rate"])]
            (line,) = ax.plot(front["discard_rate"], front["verification_rate"], marker="o", label=name)
            ax.scatter(
                group["discard_rate"], group["verification_rate"], s=12, alpha=0.4, color=line.get_color()
            )
            swept = [c for c in ("threshold", "k") if c in group and group[c].notna().any()]
            sweep = swept[0] if swept else None
            for record in group.to_dict("records") if sweep else []:
                value = record.get(sweep)
                if value is not None and not (isinstance(value, float) and math.isnan(value)):
                    ax.annotate(
                        f"{value:g}", (record["discard_rate"], record["verification_rate"]), fontsize=6
                    )
        ax.set(
            title=dataset, xlabel="discard rate (N_discard / N)", ylabel="verification rate (N_target / N)"
        )
    return save_panels(plt, figure, axes, path)
