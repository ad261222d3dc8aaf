"""How big a load sweep is, said before its first server starts: its levels, requests and tokens
(:func:`size_line`), how long a round should take at the warm-up request's pace, and whether the
process may open a connection for every request in flight."""

from __future__ import annotations

import math
import resource

from specbench.engines.load_client import CLOSED_LOOP, OPEN_LOOP, Level
from specbench.errors import SpecbenchError
from specbench.recipe import Cell, Recipe

# (repeat, cell, the levels of that round the cell still has to measure)
Plan = list[tuple[int, Cell, list[Level]]]


def level_seconds(recipe: Recipe, level: Level, took: float) -> tuple[float, float]:
    count = recipe.load.request_count(level.concurrency, level.rate)
    if count is None:  # a closed-loop level of duration_s
        return recipe.load.duration_s, recipe.load.duration_s + took
    if level.kind == CLOSED_LOOP:
        return math.ceil(count / level.concurrency) * took, count * took
    return count / level.rate + took, max(count / level.rate, count * took)


def budget(recipe: Recipe) -> int:
    """The most new tokens a request may ask for: the largest of the datasets' output budgets."""
    default = recipe.generation.max_new_tokens
    return max(dataset.max_new_tokens or default for dataset in recipe.datasets)


def size_line(recipe: Recipe, plan: Plan) -> str:
    """What a sweep will do, before it starts a server: levels, requests, tokens, server starts."""
    load = recipe.load
    todo = [level for _, _, levels_left in plan for level in levels_left]
    kinds = []
    for kind, name, unit in ((CLOSED_LOOP, "concurrency", ""), (OPEN_LOOP, "rate", " req/s")):
        values = sorted({level.value for level in todo if level.kind == kind})
        if values:
            kinds.append(f"{name} {', '.join(f'{v:g}' for v in values)}{unit}")
    counts = [load.request_count(level.concurrency, level.rate) for level in todo]
    requests = sum(c for c in counts if c is not None)
    timed = sum(1 for c in counts if c is None)
    most = budget(recipe)
    repeats = f" over {load.repeats} repeats" if load.repeats > 1 else ""
    timed_part = f" and {timed} level(s) of {load.duration_s:g} s" if timed else ""
    return (
        f"load: {len({cell.id for _, cell, _ in plan})} cell(s), {len(todo)} level(s) ({'; '.join(kinds)})"
        f"{repeats}: {requests:,} requests of up to {most:,} new tokens ({requests * most:,} tokens at "
        f"most){timed_part}, {len(plan)} server start(s)"
    )


# files this process holds besides a level's connections (Python, torch, the server's log)
FILES_BESIDE = 64


def check_open_files(recipe: Recipe, plan: Plan) -> None:
    """Every request in flight holds a connection, an open file: a closed-loop level (or the warm-up)
    past the process's limit would measure failed connections, not the server."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    widest = max(
        [recipe.load.warmup_requests]
        + [level.concurrency for _, _, todo in plan for level in todo if level.kind == CLOSED_LOOP]
    )
    if soft == resource.RLIM_INFINITY or widest + FILES_BESIDE <= soft:
        return
    raise SpecbenchError(
        f"{recipe.path}: load.concurrency",
        f"{widest} requests at a time need {widest} connections; this process may open {soft} files "
        "(ulimit -n), some already in use",
        f"raise the limit first (ulimit -n {widest + FILES_BESIDE}), or keep concurrency at most "
        f"{max(soft - FILES_BESIDE, 1)}",
    )


def duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
