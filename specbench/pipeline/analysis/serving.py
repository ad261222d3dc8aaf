"""What serving engineers read from a load sweep, as numbers (issue 54, part 5); the tables, figures and
the schedule file are :mod:`specbench.pipeline.views.serving_view`. Every figure starts from the
sweep's levels pooled over their repeats (:func:`~specbench.pipeline.analysis.load_figures.sweep_summary`).

- **Pareto points**: each (cell, level) as tokens/s per user against tokens/s per core (per GPU on a
  GPU box). Per user is the median request's decode speed, 1 / TPOT p50 (how InferenceMAX and vLLM's
  ``bench serve`` speak of interactivity); per core is the level's output throughput over the cores the
  engine had (the machine card's ``cores``, or its GPU count). Intervals are the TPOT p50's and the
  throughput's 95% intervals carried through (1 / x turns an interval over). A point is on the
  **frontier** when no point of the same target is at least as good on both axes and better on one.
- **k schedule**: at each level, the k of the speculative cells of one family (one target, engine and
  speculative setting that differ only in k; the AR cell of the target is k = 0) with the most goodput,
  ties going to throughput and then the smaller k; the one with the most throughput beside it. The
  winner is *separable* when its interval's low end clears the runner-up's high end.
- **Acceptance**: pooled (the level's counts summed: tokens / (tokens - accepted) from the server's
  counters) beside per request (the same ratio of each request's own counts, where the server sends
  them: :mod:`specbench.engines.request_counts`), whose spread the pooled one hides.
- **Time split**: what of drafting, verifying and the rest each engine's records expose.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

from specbench.errors import SpecbenchError
from specbench.methods import BASELINE
from specbench.pipeline.analysis.statistics import percentiles

K_KEYS = ("num_speculative_tokens", "n_max")  # vLLM's speculative_config, llama.cpp's setting
NO_LOAD_FIX = "run `specbench load RECIPE -o DIR` first, then point at DIR"


@dataclass(frozen=True)
class Units:
    """What throughput is divided by: ``count`` cores or GPUs, and where the count was read."""

    count: int
    name: str  # "core" or "GPU"
    source: str


def load_rows(directory: Path) -> list[dict]:
    """load.csv's rows, or a one-line error for a directory without a load sweep."""
    from specbench.engines.load import LOAD_CSV, read_load

    directory = Path(directory)
    if not directory.is_dir():
        raise SpecbenchError(str(directory), "is not a directory", NO_LOAD_FIX)
    rows = read_load(directory)
    if not rows:
        raise SpecbenchError(str(directory), f"holds no {LOAD_CSV} rows: not a load sweep", NO_LOAD_FIX)
    return rows


@dataclass(frozen=True)
class Sweep:
    """A load sweep read back: load.csv's rows, its levels pooled (each with its cell's
    ``speculative_config``), the requests of its complete rows by key, and the serving units."""

    directory: Path
    rows: list[dict]
    summary: list[dict]
    requests: dict[str, list[dict]]
    units: Units


def read_sweep(directory: Path, resamples: int | None = None) -> Sweep:
    """The sweep in ``directory``, or a one-line error where it holds none."""
    from specbench.engines.load import read_requests
    from specbench.pipeline.analysis.load_figures import level_summary, reference_cells
    from specbench.pipeline.analysis.statistics import BOOTSTRAP_RESAMPLES
    from specbench.pipeline.records.results import read_environment

    rows = load_rows(directory)
    requests = read_requests(directory, {r["key"] for r in rows if r["complete"]})
    summary = level_summary(rows, requests, reference_cells(rows), resamples or BOOTSTRAP_RESAMPLES)
    settings = {r["cell"]: r.get("speculative_config") for r in rows}
    for row in summary:
        row["speculative_config"] = settings.get(row["cell"])
    units = serving_units(read_environment(directory), rows)
    return Sweep(Path(directory), rows, summary, requests, units)


def serving_units(environment: dict, rows: list[dict]) -> Units:
    """GPUs where the machine card lists any, else its cores; from environment.json, else from the
    load.csv rows' machine description (``GPU, GPU · CPU · 2 threads / 2 cores · torch``)."""
    machine = environment.get("machine") or {}
    if machine.get("gpus"):
        return Units(len(machine["gpus"]), "GPU", "environment.json machine.gpus")
    if machine.get("cores"):
        return Units(int(machine["cores"]), "core", "environment.json machine.cores")
    for described in sorted({str(r.get("machine_described") or "") for r in rows}):
        parts = described.split(" · ")
        if len(parts) == 4:  # GPUs first
            return Units(len(parts[0].split(", ")), "GPU", "load.csv machine_described")
        found = re.search(r"(\d+) threads / (\d+) cores", described)
        if found:
            return Units(int(found.group(2)), "core", "load.csv machine_described")
    raise SpecbenchError(
        "environment.json",
        "names no cores or GPUs, and load.csv no machine_described",
        "restore the sweep's environment.json (specbench load writes it)",
    )


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def _inverse(value) -> float:
    return 1.0 / value if _finite(value) and value > 0 else math.nan


def _level_order(row: dict) -> tuple:
    rate = row.get("request_rate")
    if _finite(rate):
        return 1, float(rate)
    return 0, float(row["concurrency"])


def pareto_points(summary: list[dict], units: Units) -> list[dict]:
    """One point per (cell, level) of ``summary``, with ``frontier`` marked per target."""
    points = []
    for row in sorted(summary, key=lambda r: (str(r["cell"]), _level_order(r))):
        throughput = row.get("throughput_tok_s", math.nan)
        points.append(
            {
                "cell": row["cell"],
                "target": row.get("target"),
                "method": row.get("method"),
                "level": row["level"],
                "kind": "rate" if _level_order(row)[0] else "concurrency",
                "level_value": _level_order(row)[1],
                "per_user_tok_s": _inverse(row.get("tpot_p50_s")),
                "per_user_low": _inverse(row.get("tpot_p50_s_high")),
                "per_user_high": _inverse(row.get("tpot_p50_s_low")),
                f"per_{units.name.lower()}_tok_s": throughput / units.count,
                "per_unit_tok_s": throughput / units.count,
                "per_unit_low": row.get("throughput_tok_s_low", math.nan) / units.count,
                "per_unit_high": row.get("throughput_tok_s_high", math.nan) / units.count,
                "units": units.count,
                "unit": units.name,
            }
        )
    for target in {p["target"] for p in points}:
        mine = [p for p in points if p["target"] == target]
        on = frontier([(p["per_unit_tok_s"], p["per_user_tok_s"]) for p in mine])
        for index, point in enumerate(mine):
            point["frontier"] = index in on
    return points


def frontier(points: list[tuple[float, float]]) -> set[int]:
    """The indices of the points (x, y) no other point dominates (>= on both, > on one; higher is
    better on both axes); points with a NaN are never on it."""
    order = sorted(
        (i for i, (x, y) in enumerate(points) if _finite(x) and _finite(y)),
        key=lambda i: (-points[i][0], -points[i][1]),
    )
    best, out = -math.inf, set()
    for i in order:
        if points[i][1] > best:
            out.add(i)
            best = points[i][1]
    return out


# -- the k schedule ----------------------------------------------------------------------------------


def speculation(row: dict) -> tuple[int | None, dict]:
    """(k, the setting less k) of a row: 0 and {} for AR, (None, setting) where no k is named."""
    if row.get("method") == BASELINE:
        return 0, {}
    config = row.get("speculative_config")
    if isinstance(config, str):
        try:
            config = json.loads(config)
        except ValueError:
            config = None
    config = dict(config) if isinstance(config, dict) else {}
    for key in K_KEYS:
        if key in config:
            return int(config.pop(key)), config
    return None, config


def k_schedule(summary: list[dict]) -> list[dict]:
    """One entry per speculative family: its levels, each with the k of most goodput and of most
    throughput (AR as k = 0), the winners' figures with intervals, and whether they are separable."""
    families: dict[str, dict] = {}
    ar: dict[tuple, dict] = {}
    for row in summary:
        k, setting = speculation(row)
        if k == 0:
            ar[(row.get("target"), row["level"])] = row
        elif k is not None:
            name = json.dumps(
                {"target": row.get("target"), "engine": row.get("engine"), **setting}, sort_keys=True
            )
            family = families.setdefault(
                name, {"target": row.get("target"), "engine": row.get("engine"), "setting": setting}
            )
            family.setdefault("rows", []).append((k, row))
    out = []
    for family in families.values():
        levels = sorted({row["level"] for _, row in family["rows"]}, key=lambda lv: _label_order(lv))
        entries = []
        for level in levels:
            candidates = [(k, row) for k, row in family["rows"] if row["level"] == level]
            base = ar.get((family["target"], level))
            if base is not None:
                candidates.append((0, base))
            entries.append(_choose(level, candidates))
        out.append(
            {
                "target": family["target"],
                "engine": family["engine"],
                "setting": family["setting"],
                "ks": sorted({k for k, _ in family["rows"]}),
                "levels": entries,
            }
        )
    return sorted(out, key=lambda f: json.dumps(f["setting"], sort_keys=True))


def _label_order(label: str) -> tuple:
    """x4 before x8 before every @r req/s (closed-loop levels first, as the tables list them)."""
    if label.startswith("x"):
        return 0, float(label[1:])
    return 1, float(label[1:].split()[0])


def _choose(level: str, candidates: list[tuple[int, dict]]) -> dict:
    def value(row: dict, name: str) -> float:
        number = row.get(name)
        return float(number) if _finite(number) else -math.inf

    entry = {"level": level}
    first = candidates[0][1]
    entry["concurrency"] = first.get("concurrency") if _level_order(first)[0] == 0 else None
    entry["request_rate"] = first.get("request_rate") if _level_order(first)[0] == 1 else None
    for objective, tie in (("goodput_req_s", "throughput_tok_s"), ("throughput_tok_s", "goodput_req_s")):
        ranked = sorted(candidates, key=lambda c: (-value(c[1], objective), -value(c[1], tie), c[0]))
        (k, best), runner = ranked[0], (ranked[1] if len(ranked) > 1 else None)
        short = "goodput" if objective == "goodput_req_s" else "throughput"
        low, high = best.get(f"{objective}_low"), best.get(f"{objective}_high")
        separable = None
        if runner is not None and _finite(low) and _finite(runner[1].get(f"{objective}_high")):
            separable = bool(low > runner[1][f"{objective}_high"])
        entry.update(
            {
                f"k_{short}": k,
                f"cell_{short}": best["cell"],
                f"{short}": best.get(objective, math.nan),
                f"{short}_low": low if _finite(low) else math.nan,
                f"{short}_high": high if _finite(high) else math.nan,
                f"runner_up_k_{short}": runner[0] if runner else None,
                f"separable_{short}": separable,
            }
        )
    return entry


def vllm_batch_schedule(levels: list[dict], key: str = "k_goodput") -> list[list[int]]:
    """vLLM 0.32's ``num_speculative_tokens_per_batch_size`` from the closed-loop levels: inclusive
    [start, end, k] ranges, the first from batch size 1, each to the batch size before the next level,
    the last ending at its own level (vLLM carries its k on to ``max_num_seqs``)."""
    closed = sorted((e for e in levels if e.get("concurrency") is not None), key=lambda e: e["concurrency"])
    ranges = []
    for index, entry in enumerate(closed):
        start = 1 if index == 0 else int(entry["concurrency"])
        end = (
            int(closed[index + 1]["concurrency"]) - 1
            if index + 1 < len(closed)
            else int(entry["concurrency"])
        )
        ranges.append([start, end, int(entry[key])])
    return ranges


# -- acceptance, pooled and per request -------------------------------------------------------------


def per_request_acceptance(records: list[dict]) -> list[float]:
    """Each completed request's tokens per verification step, tokens / (tokens - accepted), from its
    own counts; requests without counts are left out."""
    out = []
    for record in records:
        spec = record.get("spec")
        tokens = record.get("tokens") or 0
        if record.get("error") is None and isinstance(spec, dict) and tokens > spec.get("accepted", 0):
            out.append(tokens / (tokens - spec["accepted"]))
    return out


def acceptance_side_by_side(
    summary: list[dict], rows: list[dict], requests: dict[str, list[dict]]
) -> list[dict]:
    """Per speculative (cell, level): the pooled tokens per step (and vLLM's own mean acceptance length)
    beside the per-request mean, p10, p50 and p90 over the requests of its complete repeats."""
    from specbench.engines.load import level_of

    out = []
    for row in sorted(summary, key=lambda r: (str(r["cell"]), _level_order(r))):
        if row.get("method") == BASELINE:
            continue
        keys = [
            r["key"]
            for r in rows
            if r["cell"] == row["cell"] and r["complete"] and level_of(r).label() == row["level"]
        ]
        ratios = per_request_acceptance([q for key in keys for q in requests.get(key, [])])
        spread = percentiles(ratios, (10, 50, 90))
        out.append(
            {
                "cell": row["cell"],
                "engine": row.get("engine"),
                "level": row["level"],
                "pooled_tokens_per_step": row.get("tokens_per_step_est", math.nan),
                "server_mean_acceptance_length": row.get("vllm_mean_acceptance_length", math.nan),
                "per_request_n": len(ratios),
                "per_request_mean": sum(ratios) / len(ratios) if ratios else math.nan,
                **{f"per_request_{name}": value for name, value in spread.items()},
            }
        )
    return out


# -- the draft / verify / overhead split -------------------------------------------------------------

SPLIT_EXPOSED = {
    "vllm": (
        "not exposed: vLLM 0.32's /metrics counts drafts, draft tokens and accepted tokens (also per "
        "position) but times no phase of a step"
    ),
    "llama.cpp": (
        "not exposed: llama-server's timings give prompt_ms and predicted_ms, drafting and verifying "
        "together, beside draft_n and draft_n_accepted"
    ),
}


def time_split(summary: list[dict]) -> list[dict]:
    """Per speculative cell: its engine and what that engine's records say of the split."""
    seen, out = set(), []
    for row in sorted(summary, key=lambda r: str(r["cell"])):
        if row.get("method") == BASELINE or row["cell"] in seen:
            continue
        seen.add(row["cell"])
        engine = str(row.get("engine") or "")
        out.append(
            {
                "cell": row["cell"],
                "engine": engine,
                "split": SPLIT_EXPOSED.get(
                    engine, f"not exposed: specbench reads no phase times from {engine}"
                ),
            }
        )
    return out
