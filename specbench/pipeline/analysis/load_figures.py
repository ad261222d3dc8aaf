"""Figures of load levels from their requests (pure numpy): one repeat's load.csv row, a level's figures
pooled over its repeats with 95% intervals, and speculation's speedup over the same engine's AR cell,
paired by level, repeat and request.

What each figure is (vLLM's ``benchmarks/serve.py`` defines them alike): a request **completed** when
it ended without an error after a first chunk; **throughput** is the completed requests' output tokens
over the level's elapsed time (its first send to its last end); **per-request speed** the mean of
tokens / end-to-end time over completed requests; **TTFT**, **TPOT** ((end-to-end - TTFT) / (tokens -
1), over requests of two tokens or more) and **end-to-end latency** at p50 / p90 / p99 by
:func:`~specbench.pipeline.analysis.statistics.percentiles`, the one percentile function; **goodput**
the completed requests that met both objectives (TTFT <= ``slo_ttft_s`` and TPOT <= ``slo_tpot_s``; a
one-token request has no TPOT and misses only on TTFT) over the elapsed time.

A level measured several times (``load.repeats``) pools its repeats: sums over repeats (tokens, good
requests, elapsed time), the percentiles and the per-request mean over every request of every repeat.
Its **intervals** are two-stage percentile bootstraps, the resampling of hierarchical data in Davison
& Hinkley, *Bootstrap Methods and their Application* (Cambridge University Press, 1997): each of B =
2000 resamples (seed 0) draws the repeats with replacement, then within each drawn repeat its requests
with replacement, and recomputes the figure; the interval is the 2.5th and 97.5th percentiles of the B
figures, NaN where a resample leaves a figure undefined or the level holds fewer than two requests. A
**speedup**'s resample draws the same repeats for both cells (repeat r of each ran in the same round)
and within a repeat the same request indices (request i sent the same prompt, at the same scheduled
arrival, to both), so what the two cells share cancels.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from specbench.methods import BASELINE
from specbench.pipeline.analysis.load_equivalence import pooled as pooled_equivalence
from specbench.pipeline.analysis.statistics import BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED, percentiles

LATENCIES = ("ttft", "tpot", "e2e")
QUANTILES = (50, 90, 99)
FIGURES = (
    "throughput_tok_s",
    "request_throughput",
    "per_request_tok_s",
    *(f"{name}_p{q}_s" for name in LATENCIES for q in QUANTILES),
    "goodput_req_s",
)
SPEEDUPS = {"speedup_throughput": "throughput_tok_s", "speedup_per_request": "per_request_tok_s"}


@dataclass(frozen=True)
class Repeat:
    """One repeat of a level: its requests as arrays (index i: request i) and its elapsed seconds."""

    tokens: np.ndarray  # output tokens of each completed request, 0 for the others
    ttft: np.ndarray  # NaN unless completed
    tpot: np.ndarray  # NaN unless completed with two tokens or more
    e2e: np.ndarray  # NaN unless completed
    good: np.ndarray  # completed within both objectives
    elapsed: float

    @classmethod
    def of(cls, records: list[dict], elapsed: float, slo_ttft: float, slo_tpot: float) -> Repeat:
        done = np.array([_completed(r) for r in records], dtype=bool)

        def column(name: str, otherwise: float) -> np.ndarray:
            values = [r[name] if d else otherwise for r, d in zip(records, done, strict=True)]
            return np.array(values, dtype=float)

        tokens, ttft, e2e = column("tokens", 0.0), column("ttft_s", math.nan), column("e2e_s", math.nan)
        with np.errstate(divide="ignore", invalid="ignore"):
            tpot = np.where(done & (tokens >= 2), (e2e - ttft) / (tokens - 1), math.nan)
        good = done & (ttft <= slo_ttft) & (np.isnan(tpot) | (tpot <= slo_tpot))
        return cls(tokens, ttft, tpot, e2e, good, float(elapsed))

    def __len__(self) -> int:
        return len(self.tokens)


def _completed(record: dict) -> bool:
    return record.get("error") is None and record.get("ttft_s") is not None


def figures(parts: Iterable[tuple[Repeat, np.ndarray | None]], names: Iterable[str] = FIGURES) -> dict:
    """``names`` of the pooled requests of ``parts`` (a repeat and the indices of its requests drawn,
    None for all of them)."""
    parts, names = list(parts), list(names)

    def pooled(field: str) -> np.ndarray:
        arrays = [getattr(r, field) if i is None else getattr(r, field)[i] for r, i in parts]
        return np.concatenate(arrays) if arrays else np.array([])

    elapsed = sum(r.elapsed for r, _ in parts)
    tokens, e2e = pooled("tokens"), pooled("e2e")
    done = ~np.isnan(e2e)

    def per_second(count: float) -> float:
        return count / elapsed if elapsed > 0 else math.nan

    out = {
        "throughput_tok_s": per_second(float(tokens[done].sum())),
        "request_throughput": per_second(float(done.sum())),
        "goodput_req_s": per_second(float(pooled("good").sum())),
    }
    with np.errstate(divide="ignore", invalid="ignore"):
        speeds = tokens[done] / e2e[done]
    out["per_request_tok_s"] = float(speeds.mean()) if done.any() else math.nan
    for name in LATENCIES:
        if not any(f"{name}_p{q}_s" in names for q in QUANTILES):
            continue
        values = pooled(name)
        values = values[~np.isnan(values)]
        for quantile, value in percentiles(values, QUANTILES).items():
            out[f"{name}_{quantile}_s"] = value
    return {name: out.get(name, math.nan) for name in names}


def summarize(level_fields: dict, records: list[dict], elapsed: float, grown: dict, slo: tuple) -> dict:
    """One load.csv row: ``level_fields`` (cell, level, repeat), then the counts, every figure, the
    most requests in flight at once, and acceptance from the engine's counters (``grown``)."""
    repeat = Repeat.of(records, elapsed, *slo)
    done = ~np.isnan(repeat.e2e)
    row = dict(level_fields)
    row.update(
        requests=len(records),
        completed=int(done.sum()),
        errors=int(len(records) - done.sum()),
        timeouts=sum(1 for r in records if r.get("timed_out")),
        elapsed_s=elapsed,
        output_tokens=int(repeat.tokens.sum()),
    )
    row.update(figures([(repeat, None)]))
    row["max_in_flight"] = max_in_flight(records)
    drafts, accepted = grown.get("drafts", 0.0), grown.get("accepted", 0.0)
    row["drafts"], row["draft_tokens"], row["accepted"] = drafts, grown.get("draft_tokens", 0.0), accepted
    row.update(acceptance(row["output_tokens"], drafts, accepted))
    row["request_counts"] = request_counts(records)
    return row


def request_counts(records: list[dict]) -> int:
    """How many completed requests carried their own speculative counts: the per-request acceptance's
    source (0: acceptance is only the server's /metrics counters, per level)."""
    return sum(1 for r in records if _completed(r) and isinstance(r.get("spec"), dict))


def acceptance(tokens: float, drafts: float, accepted: float) -> dict:
    """vLLM's own ``1 + accepted / drafts`` (over drafting steps only), and tokens per verification
    step estimated as tokens / (tokens - accepted): exact when no request's last step was cut at a stop
    token."""
    return {
        "vllm_mean_acceptance_length": 1 + accepted / drafts if drafts else math.nan,
        "tokens_per_step_est": tokens / (tokens - accepted) if tokens > accepted else math.nan,
    }


def max_in_flight(records: list[dict]) -> int:
    """The most requests between their send and their end at one moment (what an open-loop level's
    rate became in concurrency)."""
    events = sorted(
        event
        for r in records
        if r.get("sent_s") is not None and r.get("e2e_s") is not None
        for event in ((r["sent_s"], 1), (r["sent_s"] + r["e2e_s"], -1))
    )  # at a tie an end (-1) sorts before a send: a request that ended did not overlap the next
    most = now = 0
    for _, change in events:
        now += change
        most = max(most, now)
    return most


def speedups(rows: list[dict], reference: dict[str, str], level: Callable[[dict], object]) -> list[dict]:
    """Each row with the speedup of its throughput and per-request speed over the same engine's AR cell
    at the same level and repeat (``reference``: cell -> its AR cell; ``level``: a row's level)."""
    by = {(r["cell"], level(r), r.get("repeat", 0)): r for r in rows}
    out = []
    for row in rows:
        base = by.get((reference.get(row["cell"], ""), level(row), row.get("repeat", 0))) or {}
        row = dict(row)
        for speedup, figure in SPEEDUPS.items():
            row[speedup] = ratio(row[figure], base.get(figure))
        out.append(row)
    return out


def ratio(value: float, base: float | None) -> float:
    """value / base; NaN without a base, or where the base level delivered nothing (every request
    failed or timed out: 0 tok/s or NaN), which no speedup can be measured against."""
    if base is None or not base > 0 or math.isnan(value):
        return math.nan
    return value / base


# -- intervals -------------------------------------------------------------------------------------


def bootstrap(
    cells: list[list[Repeat]],
    statistic: Callable[[list[list[tuple[Repeat, np.ndarray]]]], dict[str, float]],
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> dict[str, tuple[float, float]]:
    """The 95% two-stage bootstrap interval of each figure ``statistic`` returns, over the repeats of
    ``cells`` (one list of repeats per cell, repeat j of every cell measured in the same round)."""
    rng = np.random.default_rng(seed)
    count = len(cells[0])
    if count == 0 or sum(len(r) for r in cells[0]) < 2:
        return {}
    samples: dict[str, list[float]] = {}
    for _ in range(resamples):
        chosen = rng.integers(0, count, count)
        parts: list[list[tuple[Repeat, np.ndarray]]] = [[] for _ in cells]
        for j in chosen:
            sizes = [len(cell[j]) for cell in cells]
            shared = _indices(rng, sizes[0])
            for c, cell in enumerate(cells):
                parts[c].append((cell[j], shared if sizes[c] == sizes[0] else _indices(rng, sizes[c])))
        for name, value in statistic(parts).items():
            samples.setdefault(name, []).append(value)
    out = {}
    for name, values in samples.items():
        bounds = percentiles(values, (2.5, 97.5))
        out[name] = (bounds["p2.5"], bounds["p97.5"])
    return out


def _indices(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.integers(0, n, n) if n else np.zeros(0, dtype=int)


def level_figures(repeats: list[Repeat], resamples: int = BOOTSTRAP_RESAMPLES) -> dict:
    """A level's figures pooled over its repeats, each with ``_low`` / ``_high``: its 95% interval."""
    point = figures((r, None) for r in repeats)
    intervals = bootstrap([repeats], lambda parts: figures(parts[0]), resamples)
    out = {}
    for name in FIGURES:
        low, high = intervals.get(name, (math.nan, math.nan))
        out.update({name: point[name], f"{name}_low": low, f"{name}_high": high})
    return out


def paired_speedups(cell: list[Repeat], base: list[Repeat], resamples: int = BOOTSTRAP_RESAMPLES) -> dict:
    """Each speedup of ``cell`` over ``base`` (the same level's repeats, paired by position) pooled,
    with its paired 95% interval."""
    names = list(SPEEDUPS.values())

    def ratios(ours: dict, theirs: dict) -> dict:
        return {speedup: ratio(ours[figure], theirs[figure]) for speedup, figure in SPEEDUPS.items()}

    point = ratios(figures(((r, None) for r in cell), names), figures(((r, None) for r in base), names))
    intervals = bootstrap(
        [cell, base], lambda parts: ratios(figures(parts[0], names), figures(parts[1], names)), resamples
    )
    out = {}
    for name in SPEEDUPS:
        low, high = intervals.get(name, (math.nan, math.nan))
        out.update({name: point[name], f"{name}_low": low, f"{name}_high": high})
    return out


# -- a sweep's levels ------------------------------------------------------------------------------

SUMMARY_FIELDS = ("cell", "target", "method", "engine", "machine", "machine_described")


def level_summary(
    rows: list[dict],
    requests: dict[str, list[dict]],
    reference: dict[str, str],
    resamples: int = BOOTSTRAP_RESAMPLES,
) -> list[dict]:
    """One row per (cell, level) of a sweep's load.csv ``rows``: its repeats pooled, every figure with
    its 95% interval and the speedups over ``reference[cell]`` (the same engine's AR cell) with their
    paired intervals, from ``requests`` (row key -> its requests). A level with a row from before
    load_requests.jsonl existed keeps the mean of its rows' figures, without intervals; rows marked
    incomplete are counted, not pooled. The outputs' equivalence counts are summed over the repeats
    (:mod:`specbench.pipeline.analysis.load_equivalence`)."""
    from specbench.engines.load import level_of

    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault((row["cell"], level_of(row)), []).append(row)
    repeats: dict[tuple, dict[int, Repeat] | None] = {}
    for group, members in groups.items():
        done = [r for r in members if r["complete"]]
        if done and all(r["key"] in requests for r in done):
            repeats[group] = {
                int(r["repeat"]): Repeat.of(
                    requests[r["key"]],
                    r["elapsed_s"],
                    r.get("slo_ttft_s", math.inf),
                    r.get("slo_tpot_s", math.inf),
                )
                for r in done
            }
        else:
            repeats[group] = None
    out = []
    for (cell, level), members in sorted(
        groups.items(), key=lambda g: (g[0][0], g[0][1].kind, g[0][1].value)
    ):
        done = sorted((r for r in members if r["complete"]), key=lambda r: r["repeat"])
        summary = {field: members[0].get(field) for field in SUMMARY_FIELDS}
        summary.update(
            level=level.label(),
            concurrency=level.concurrency,
            request_rate=level.rate,
            repeats=len(done),
            incomplete=len(members) - len(done),
        )
        for count in ("requests", "completed", "errors", "timeouts"):
            summary[count] = int(sum(r.get(count, 0) or 0 for r in done))
        summary.update(pooled_equivalence(done))
        summary["server_figures"] = members[0].get("server_figures")
        drafts, accepted = (sum(float(r.get(c) or 0) for r in done) for c in ("drafts", "accepted"))
        summary.update(drafts=drafts, accepted=accepted)
        counted = [r.get("request_counts") for r in done]  # NaN or absent: a row from before the column
        summary["request_counts"] = sum(int(n) for n in counted if n is not None and math.isfinite(float(n)))
        summary.update(acceptance(sum(float(r.get("output_tokens") or 0) for r in done), drafts, accepted))
        mine = repeats[(cell, level)]
        if mine:
            summary.update(level_figures(list(mine.values()), resamples))
        else:
            for name in FIGURES:
                values = [float(r[name]) for r in done if name in r]
                summary[name] = float(np.mean(values)) if values else math.nan
                summary[f"{name}_low"] = summary[f"{name}_high"] = math.nan
        base_group = (reference.get(cell, ""), level)
        base = repeats.get(base_group)
        if mine and base:
            common = sorted(set(mine) & set(base))
            summary.update(paired_speedups([mine[r] for r in common], [base[r] for r in common], resamples))
        else:
            base_rows = [r for r in groups.get(base_group, []) if r["complete"]]
            for speedup, figure in SPEEDUPS.items():
                theirs = float(np.mean([r[figure] for r in base_rows])) if base_rows else None
                summary[speedup] = ratio(summary[figure], theirs)
                summary[f"{speedup}_low"] = summary[f"{speedup}_high"] = math.nan
        out.append(summary)
    return out


def reference_cells(rows: list[dict]) -> dict[str, str]:
    """Cell -> the AR cell of the same target in a sweep's rows, or of the server its
    ``speedup_over`` names (engine_options.baseline; its load baseline; '' without one)."""
    ar = {r["target"]: r["cell"] for r in rows if r.get("method") == BASELINE}
    over = {r["cell"]: r.get("speedup_over") for r in rows}
    return {
        r["cell"]: ar.get(over[r["cell"]] if isinstance(over[r["cell"]], str) else r.get("target"), "")
        for r in rows
    }


def sweep_summary(directory: Path, resamples: int = BOOTSTRAP_RESAMPLES) -> list[dict]:
    """:func:`level_summary` of a sweep directory's load.csv and load_requests.jsonl."""
    from specbench.engines.load import read_load, read_requests

    rows = read_load(directory)
    requests = read_requests(directory, {r["key"] for r in rows if r["complete"]})
    return level_summary(rows, requests, reference_cells(rows), resamples)
