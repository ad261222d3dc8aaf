"""``specbench report RUN --engines [--roofline PROFILE]``: issue 59's table of one run whose cells ran
in several engines (:mod:`specbench.pipeline.analysis.engine_table`), one table per dataset, the goals
below each. The bandwidth is ``--roofline`` (a ``specbench probe --roofline`` profile of the run's
machine, or a device named in devices.yaml), else the run folder's ``profile.json`` where there is one."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
from rich.console import Console

from specbench.errors import SpecbenchError
from specbench.pipeline.analysis import engine_table as engines
from specbench.pipeline.analysis.profiles import read_profile
from specbench.pipeline.analysis.statistics import BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED
from specbench.pipeline.records.results import EXAMPLES, read_environment, read_examples
from specbench.pipeline.views.report import emit, format_interval, format_num, load_cells

MISSING = "—"
RUN_PROFILE = "profile.json"  # where the recipes' headers have probe write the run's roofline


def _run(results: Path) -> Path:
    results = Path(results)
    if not (results / EXAMPLES).is_file():
        raise SpecbenchError(
            str(results), f"holds no {EXAMPLES}: --engines reads one run", "name one run directory"
        )
    return results


def bandwidth(run: Path, roofline: str | None, environment: dict) -> tuple[float | None, str]:
    """(bytes/s or None, where it came from)."""
    if roofline is None and not (run / RUN_PROFILE).is_file():
        return None, ""
    value = roofline if roofline is not None else str(run / RUN_PROFILE)
    profile = read_profile(value)
    return engines.bandwidth_of(profile, environment), profile.get("file") or f"device {value}"


def _pct(value: float) -> str:
    return MISSING if value != value else f"{100 * value:+.1f}%"


def _shown(group: pd.DataFrame) -> pd.DataFrame:
    records = group.to_dict("records")

    def num(column, digits=2, unit=""):
        return [
            f"{format_num(r[column], digits)}{unit}" if format_num(r[column]) else MISSING for r in records
        ]

    return pd.DataFrame(
        {
            "cell": group["cell"],
            "setup": group["setup"],
            "k": [MISSING if r["k"] is None or r["k"] != r["k"] else str(int(r["k"])) for r in records],
            "tok/s": num("tokens_per_s", 1),
            "vs own AR": [format_interval(r, "speedup", "x") or MISSING for r in records],
            "tokens/pass": num("tokens_per_pass"),
            "vs ours": [_pct(r["tokens_per_pass_vs_ours"]) for r in records],
            "accepted": num("draft_acceptance_rate"),
            "engine's acc. len": num("engine_acceptance_length"),
            "AR ms/token": num("ar_ms_per_token", 1),
            "limit ms": num("limit_ms_per_token", 1),
            "x limit": num("times_limit", 2, "x"),
            "GB/s": num("achieved_gb_s", 1),
            "n": group["n"].astype(int),
        }
    )


def _on_same_output(rows: list[dict], dataset: str, cell: str, ours: str) -> str:
    """The gap past the prefill pass again on the prompts whose output both cells wrote alike, where
    some prompts' outputs part (empty when none or all do)."""
    same, both = engines.same_output(rows, dataset, cell, ours)
    if not same or len(same) == both:
        return ""
    theirs, mine = (engines.past_prefill(rows, dataset, c, same) for c in (cell, ours))
    if not (mine == mine and mine and theirs == theirs):
        return ""
    gap = theirs / mine - 1
    return (
        f"; on the {len(same)} of {both} prompts whose output equals ours, past the prefill pass "
        f"{theirs:.2f} against {mine:.2f}: {_pct(gap)}, "
        f"{'within' if abs(gap) <= engines.ACCEPTANCE_GOAL else 'still outside'} "
        f"{engines.ACCEPTANCE_GOAL:.0%}"
    )


def goal_lines(frame: pd.DataFrame, rows: list[dict], dataset: str, bandwidth: float | None) -> list[str]:
    """The issue's goals on ``dataset``, a line each (what the run cannot tell is said so)."""
    lines = []
    ratios = [engines.ar_ratio(frame, rows, dataset, cell) for cell in engines.goal_ar_cells(frame, dataset)]
    ratios = [ratio for ratio in ratios if ratio is not None]
    if not ratios:
        lines.append(
            "AR goal: not measured (it needs a compiled or oneDNN AR cell and a llama.cpp BF16 AR cell)"
        )
    for ratio in ratios:
        verdict = "met" if ratio.met else "missed"
        lines.append(
            f"AR goal (<= {engines.AR_GOAL}x): {ratio.ours} / {ratio.theirs} time per token "
            f"{ratio.ratio:.2f}x [{format_num(ratio.low)}, {format_num(ratio.high)}] over {ratio.n} "
            f"examples: {verdict}"
        )
    here = frame[frame["dataset"] == dataset]
    achieved = here["achieved_gb_s"].dropna()
    if bandwidth and len(achieved):
        best = here.loc[achieved.idxmax()]
        verdict = "met" if bandwidth / 1e9 >= best["achieved_gb_s"] else "missed"
        lines.append(
            f"bandwidth goal: the probe measured {bandwidth / 1e9:.1f} GB/s, the AR reading fastest "
            f"({best['cell']}) {best['achieved_gb_s']:.1f} GB/s: {verdict}"
        )
    compared = here.dropna(subset=["tokens_per_pass_vs_ours"])
    for r in compared.to_dict("records"):
        within = abs(r["tokens_per_pass_vs_ours"]) <= engines.ACCEPTANCE_GOAL
        verdict = "met" if within else "missed"
        if not within:
            theirs, ours = (engines.past_prefill(rows, dataset, c) for c in (r["cell"], r["ours_cell"]))
            gap = theirs / ours - 1 if ours == ours and ours else math.nan
            if gap == gap:
                verdict += (
                    f"; past the prefill pass {theirs:.2f} against {ours:.2f}: {_pct(gap)}, "
                    f"{'within' if abs(gap) <= engines.ACCEPTANCE_GOAL else 'still outside'} "
                    f"{engines.ACCEPTANCE_GOAL:.0%}"
                )
                if abs(gap) > engines.ACCEPTANCE_GOAL:
                    verdict += _on_same_output(rows, dataset, r["cell"], r["ours_cell"])
            verdict += f" (rule that differs: {engines.rule(r['engine'], r['drafter_source'])})"
        lines.append(
            f"acceptance goal (within {engines.ACCEPTANCE_GOAL:.0%}): {r['cell']} {r['tokens_per_pass']:.2f} "
            f"tokens/pass against {r['ours_cell']}'s: {_pct(r['tokens_per_pass_vs_ours'])}, {verdict}"
        )
    for drafting, what in ((False, "AR"), (True, "SD")):
        top = engines.fastest(frame, dataset, drafting)
        if top is not None:
            cell, margin = top
            by = f", {margin:.2f}x the next setup's best" if not math.isnan(margin) else ""
            lines.append(
                f"fastest at {what}: {cell['cell']} ({cell['setup']}) {cell['tokens_per_s']:.1f} tok/s{by}"
            )
    return lines


def render_engines(
    results: Path, fmt: str = "table", roofline: str | None = None, console: Console | None = None
) -> str | None:
    run = _run(results)
    environment = read_environment(run)
    rate, origin = bandwidth(run, roofline, environment)
    frame = engines.table(load_cells(run), environment, rate)
    if frame.empty:
        raise SpecbenchError(
            str(run),
            "environment.json names none of its cells' targets",
            "name a run that specbench run wrote",
        )
    rows = read_examples(run)
    tables, lines = [], []
    for dataset, group in frame.groupby("dataset", sort=False):
        tables.append((f"{run.name} · {dataset}", _shown(group)))
        lines += [f"{dataset}: {line}" for line in goal_lines(frame, rows, dataset, rate)]
    limit = (
        f"limit: the bytes a pass reads (the GGUF file; else parameters x dtype bytes) over {rate / 1e9:.1f} "
        f"GB/s from {origin}"
        if rate
        else f"limit: no bandwidth (give --roofline PROFILE, or write {RUN_PROFILE} into the run with "
        "specbench probe RECIPE --roofline --out RUN/profile.json)"
    )
    note = "\n".join(
        [
            *lines,
            "vs own AR: tokens/s over the same setup's AR cell, 95% paired bootstrap interval over the "
            f"examples both ran (B={BOOTSTRAP_RESAMPLES}, seed {BOOTSTRAP_SEED}). tokens/pass: committed "
            "tokens per target pass (the prefill's included); vs ours: over specbench's eager cell of the "
            "same method, drafter and k. accepted: drafted tokens accepted; engine's acc. len: the "
            "engine's own 1 + accepted / drafts over the passes that drafted. AR ms/token: time per output "
            "token after the first (TPOT); GB/s: the bytes a pass reads over it.",
            limit,
        ]
    )
    return emit(frame, tables, fmt, note, console)
