"""``specbench load RECIPE -o DIR``: the recipe's engine cells under load (specbench.engines.load).

The sweep runs in rounds, one per repeat (``load.repeats``). In each round every engine cell's server
starts on a free port of 127.0.0.1 with the cell's speculative settings, warms up
(``load.warmup_requests``, not recorded), runs every level of the recipe's ``load:`` once (closed-loop
``concurrency`` levels, then open-loop ``request_rate`` levels) over the recipe's prompts (every
dataset's, rendered as ``specbench run`` renders them), and stops. The cells take turns in the
order AR, speculative on even rounds and the reverse on odd ones, so a drift of the machine over the
sweep reaches both sides of a speedup alike; restarting the servers each round also puts the variance
of a server start inside the repeats' spread. (Keeping every cell's server up to alternate level by
level would hold two engines' memory at once, which a GPU server sized by ``gpu_memory_utilization``
cannot.)

Each level's requests are appended to ``DIR/load_requests.jsonl`` and its row written to
``DIR/load.csv`` as soon as it ends, so an interrupted sweep resumes where it stopped; a server that
dies during a level leaves that row marked incomplete, and ``--resume`` measures it again. At the end
``DIR/load_summary.csv`` holds every level's figures pooled over its repeats with 95% intervals
(:mod:`specbench.pipeline.analysis.load_figures`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import math
import resource
import subprocess
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from specbench.engines import BACKENDS, ENGINE_NAMES, EngineModel
from specbench.engines.load import (
    LOAD_CSV,
    LOAD_SUMMARY,
    SIGNED,
    SPEC_COUNTERS,
    Server,
    adopt,
    append_requests,
    free_port,
    level_of,
    read_load,
    write_load,
)
from specbench.engines.load_client import (
    CLOSED_LOOP,
    OPEN_LOOP,
    Level,
    LevelRun,
    Requests,
    arrival_seed,
    arrival_times,
    closed_loop,
    open_loop,
)
from specbench.errors import SpecbenchError
from specbench.methods import BASELINE
from specbench.models.checksums import write_signed_csv
from specbench.pipeline.analysis.load_figures import speedups, summarize, sweep_summary
from specbench.pipeline.records.results import EXAMPLES, read_environment
from specbench.pipeline.run.environment import now, write_environment
from specbench.pipeline.run.measure import Measurer
from specbench.recipe import Cell, Recipe

LOAD_SETTINGS = "load_settings"  # environment.json's record of the load: settings (less the levels)
LEVEL_SETTINGS = {"concurrency", "request_rate", "repeats"}  # what a resume may grow

# (repeat, cell, the levels of that round the cell still has to measure)
Plan = list[tuple[int, Cell, list[Level]]]


def engine_cells(recipe: Recipe) -> list[Cell]:
    return [c for c in recipe.cells() if recipe.models[c.target].engine in BACKENDS]


def levels(recipe: Recipe) -> list[Level]:
    load = recipe.load
    return [Level(CLOSED_LOOP, c) for c in load.concurrency] + [
        Level(OPEN_LOOP, r) for r in load.request_rate
    ]


def load_key(recipe: Recipe, measurer: Measurer, cell: Cell, level: Level, repeat: int) -> str:
    """What a load.csv row was measured under: the cell, the level, the repeat and the load settings."""
    parts = [cell.fingerprint(recipe), level.token(), str(repeat), repr(sorted(_settings(recipe).items()))]
    return hashlib.sha256("\x1f".join([*parts, measurer.machine.id]).encode()).hexdigest()[:16]


def rounds(cells: list[Cell], repeats: int) -> list[tuple[int, Cell]]:
    """(repeat, cell) in the order servers start: the cells in turn, reversed every other round."""
    return [(r, cell) for r in range(repeats) for cell in (cells if r % 2 == 0 else cells[::-1])]


def run_load(recipe: Recipe, out: Path, console: Console, resume: bool = False) -> Path:
    if recipe.load is None:
        raise SpecbenchError(
            f"{recipe.path}: load",
            "the recipe has no load: section",
            "add load: {concurrency: [1, 2, 4, 8, 16]} or load: {request_rate: [0.5, 1, 2]}",
        )
    cells = engine_cells(recipe)
    if not cells:
        raise SpecbenchError(
            f"{recipe.path}: methods",
            "no method runs on a serving engine",
            f"give a target engine: {' or '.join(ENGINE_NAMES)}",
        )
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise SpecbenchError(str(out), "is a file, not a directory", "name a folder for load.csv with -o")
    rows = read_load(out)
    if rows and not resume:
        raise SpecbenchError(str(out), "already holds a load sweep", "pass --resume, or choose another -o")
    measurer = Measurer(recipe, console)
    _check_bound(recipe, out, rows, measurer)
    done = {row["key"] for row in rows if row["complete"]}

    def key(cell: Cell, level: Level, repeat: int) -> str:
        return load_key(recipe, measurer, cell, level, repeat)

    plan = [
        (repeat, cell, [lv for lv in levels(recipe) if key(cell, lv, repeat) not in done])
        for repeat, cell in rounds(cells, recipe.load.repeats)
    ]
    plan = [entry for entry in plan if entry[2]]
    _check_levels_free(out, rows, plan, key)
    if not plan:  # a resume with nothing left measures nothing
        if rows:
            adopt(out, done)  # its checksums first (a sweep from before them), then the summary's
            write_summary(out)
        return out
    console.print(size_line(recipe, plan))
    _check_open_files(recipe, plan)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise SpecbenchError(
            str(out), f"cannot be written ({error.strerror or error})", "choose a writable -o"
        ) from None
    session = now()
    adopt(out, done)  # checksums, before the session's record; lines without a complete row go
    _write_environment(out, recipe, measurer, session, ended=False)  # before the first server
    prompts: dict[str, tuple] = {}
    for repeat, cell, todo in plan:
        measurer.check_cell(cell)
        target: EngineModel = measurer.model(cell.target)
        if cell.target not in prompts:
            prompts[cell.target] = _prompts(measurer, recipe, target)
        with _serve(recipe, measurer, cell, target, repeat, console) as served:
            server = served.server
            send = Requests(server.port, target.directory, *prompts[cell.target], recipe.load.timeout_s)
            _warm_up(recipe, cell, send, todo, console)
            for level in todo:
                row = _measure(recipe, measurer, out, served, send, (cell, level, repeat), console)
                rows = [r for r in rows if r["key"] != row["key"]] + [row]
                write_load(out, speedups(rows, _ar_cells(recipe), level_of))
                if not row["complete"]:
                    raise SpecbenchError(
                        f"{recipe.path}: models.{cell.target}.engine",
                        f"the engine's server exited (code {server.process.returncode}) during {cell.id} "
                        f"{_name(level, repeat, recipe)}: {server.last_error()}",
                        f"its row is kept in {LOAD_CSV}, marked incomplete; read {server.log_path}, fix the "
                        "cause and run again with --resume to measure it again",
                    )
    _write_environment(out, recipe, measurer, session, ended=True)
    write_summary(out)
    return out


@dataclass(frozen=True)
class Served:
    server: Server
    started: float  # seconds until it answered
    speculative_config: str  # the cell's settings as the engine took them (JSON)
    counters: dict  # spec-decode counter -> the engine's metric name (Backend.load_counters, else vLLM's)


@contextlib.contextmanager
def _serve(recipe: Recipe, measurer: Measurer, cell: Cell, target, repeat: int, console: Console):
    """The cell's server for one round: started, waited for, and always stopped."""
    where = f"{recipe.path}: models.{cell.target}.engine"
    backend = BACKENDS[target.engine]
    if backend.serve is None:
        raise SpecbenchError(where, "has no server", "drop load:")
    spec = measurer.engine_spec(cell, target)
    drafter = measurer.model(cell.drafter) if cell.drafter else None
    port = free_port()
    command, env = backend.serve(target, spec, drafter, port)
    with Server(command, port, where, f"serve-{cell.target}", env) as server:
        with console.status(f"starting {target.engine} serve for {cell.id} on port {port}"):
            started = server.wait_ready(target.options.get("start_timeout_s", 1800.0))
        repeats = recipe.load.repeats
        console.print(
            f"{cell.id}: server ready in {started:.0f} s"
            + (f" (round {repeat + 1} of {repeats})" if repeats > 1 else "")
        )
        counters = backend.load_counters or SPEC_COUNTERS
        yield Served(server, started, json.dumps(target.speculative_config(spec, drafter)), counters)


def _warm_up(recipe: Recipe, cell: Cell, send: Requests, todo: list[Level], console: Console) -> None:
    """``warmup_requests`` requests side by side, unrecorded, then how long the round should take at
    the first one's pace."""
    count = recipe.load.warmup_requests
    if not count:
        return
    warm = asyncio.run(closed_loop(send, count, count, None)).results[0]
    if warm.error is not None or warm.first is None:
        failed = f"warning: {cell.id}: its warm-up request failed ({warm.error or 'no answer'})"
        console.print(f"[yellow]{escape(failed)}[/yellow]")
        return
    fastest = slowest = 0.0
    for level in todo:
        low, high = _level_seconds(recipe, level, warm.e2e)
        fastest, slowest = fastest + low, slowest + high
    console.print(
        f"{cell.id}: warm-up request {warm.e2e:.2f} s; its {len(todo)} level(s) take about "
        f"{_duration(fastest)} (requests side by side at one request's speed) to {_duration(slowest)} "
        "(one at a time)"
    )


def _level_seconds(recipe: Recipe, level: Level, took: float) -> tuple[float, float]:
    count = recipe.load.request_count(level.concurrency, level.rate)
    if count is None:  # a closed-loop level of duration_s
        return recipe.load.duration_s, recipe.load.duration_s + took
    if level.kind == CLOSED_LOOP:
        return math.ceil(count / level.concurrency) * took, count * took
    return count / level.rate + took, max(count / level.rate, count * took)


def _measure(recipe, measurer, out, served: Served, send: Requests, at: tuple, console: Console) -> dict:
    """One level of one round (``at``: cell, level, repeat): its requests appended to
    load_requests.jsonl, and its load.csv row, marked incomplete when the server died during it."""
    cell, level, repeat = at
    server = served.server
    load = recipe.load
    count = load.request_count(level.concurrency, level.rate)
    size = f"{count} requests" if count is not None else f"{load.duration_s:g} s"
    with console.status(f"{cell.id}: {_name(level, repeat, recipe)}, {size}"):
        before = _counters(server, served.counters)
        if level.kind == CLOSED_LOOP:
            duration = load.duration_s if count is None else None
            run: LevelRun = asyncio.run(closed_loop(send, level.concurrency, count, duration))
        else:
            seed = arrival_seed(recipe.seed, level.rate, repeat)
            run = asyncio.run(open_loop(send, arrival_times(level.rate, count, load.burstiness, seed)))
        after = _counters(server, served.counters)
    # a server that stopped answering may be exiting: its sockets close a moment before it is reaped
    died = not server.alive() or (after is None and _exits(server, EXIT_GRACE_S))
    names = served.counters
    grown = {name: math.nan for name in names}  # unknown where the server stopped answering
    if before is not None and after is not None:  # a counter that went down: the engine restarted
        grown = {n: after[m] - before[m] if after[m] >= before[m] else math.nan for n, m in names.items()}
    records = run.records()
    level_fields = {
        "cell": cell.id,
        "concurrency": level.concurrency,
        "request_rate": level.rate,
        "repeat": repeat,
    }
    row = summarize(level_fields, records, run.elapsed, grown, (load.slo_ttft_s, load.slo_tpot_s))
    key = load_key(recipe, measurer, cell, level, repeat)
    target = measurer.model(cell.target)
    row.update(
        key=key,
        complete=not died,
        burstiness=load.burstiness if level.kind == OPEN_LOOP else None,
        slo_ttft_s=load.slo_ttft_s,
        slo_tpot_s=load.slo_tpot_s,
        target=cell.target,
        method=cell.method,
        engine=target.engine,
        machine=measurer.machine.id,
        machine_described=measurer.machine.describe(),
        engine_version=None if died else server.version(),
        speculative_config=served.speculative_config,
        server_start_s=served.started,
    )
    meta = {"cell": cell.id, "level": level.label(), "repeat": repeat}
    append_requests(out, key, [{**meta, **record} for record in records])
    timeouts = f", {row['timeouts']} timed out" if row["timeouts"] else ""
    console.print(
        f"{cell.id} {_name(level, repeat, recipe)}: {row['throughput_tok_s']:.1f} tok/s, "
        f"TTFT p50 {row['ttft_p50_s']:.3f} s, {row['errors']} errors{timeouts}"
    )
    warning = failed_level(row, records, _name(level, repeat, recipe))
    if warning:
        console.print(f"[yellow]warning: {escape(warning)}[/yellow]")
    return row


EXIT_GRACE_S = 10.0


def _exits(server: Server, grace: float) -> bool:
    """Whether the server's process exits within ``grace`` seconds."""
    try:
        server.process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        return False
    return True


def _counters(server: Server, names: dict) -> dict[str, float] | None:
    """The server's spec-decode counters (``names``: counter -> metric), None where it no longer answers."""
    try:
        counters = server.counters()
    except (OSError, ValueError):
        return None
    return {metric: counters.get(metric, 0.0) for metric in names.values()}


def _name(level: Level, repeat: int, recipe: Recipe) -> str:
    return level.label() + (f" (repeat {repeat + 1})" if recipe.load.repeats > 1 else "")


def failed_level(row: dict, records: list[dict], name: str) -> str | None:
    """What to warn of a level (its load.csv row and its requests) where no request completed: a
    server that crashed, requests that all timed out; None where some did."""
    if row["completed"]:
        return None
    error = next((r["error"] for r in records if r["error"]), "no answer")
    return (
        f"{row['cell']} {name}: none of its {row['requests']} requests completed (first: {error}); its "
        "throughput is 0 and the speedups against it are NaN (—)"
    )


def write_summary(out: Path) -> Path:
    """load_summary.csv: every (cell, level) pooled over its repeats, with 95% intervals."""
    import pandas as pd

    path = Path(out) / LOAD_SUMMARY
    write_signed_csv(path, pd.DataFrame(sweep_summary(out)).to_csv(index=False), SIGNED)
    return path


def _settings(recipe: Recipe) -> dict:
    """The load: settings a sweep's rows were measured under; its levels and repeats may grow on a
    resume."""
    return recipe.load.model_dump(mode="json", exclude=LEVEL_SETTINGS)


def _write_environment(out: Path, recipe: Recipe, measurer: Measurer, started: str, ended: bool) -> None:
    """environment.json, as `run` writes it (versions, machine, models), bound to the recipe's digest
    and the load: settings: what a resume must match."""
    rows = 0  # a sweep writes no rows into examples.jsonl
    write_environment(
        *(out, recipe, measurer.models, started, rows, ended, measurer.gpu_samples),
        recipe_identity=recipe.identity(),
        extra={LOAD_SETTINGS: _settings(recipe)},
        command="load",
    )


def _check_bound(recipe: Recipe, out: Path, rows: list[dict], measurer: Measurer) -> None:
    """A sweep's directory belongs to the recipe, the load: settings and the machine that measured it,
    as a run's does (runner.py): a resume with another is refused, never mixed into load.csv."""
    environment = read_environment(out)
    holds_run = (out / EXAMPLES).is_file() and (out / EXAMPLES).stat().st_size > 0
    recorded = environment.get("recipe_identity")
    fix = "resume with the recipe that measured it, or measure this one into another -o"
    if (rows or holds_run) and recorded is not None and recorded != recipe.identity():
        raise SpecbenchError(
            str(out),
            f"belongs to another recipe than {recipe.path} (recipe digest {recorded}, this one "
            f"{recipe.identity()}; the directory's environment.json names its recipe)",
            fix,
        )
    settings, wanted = environment.get(LOAD_SETTINGS), _settings(recipe)
    if rows and isinstance(settings, dict) and settings != wanted:
        changed = sorted(k for k in settings.keys() | wanted.keys() if settings.get(k) != wanted.get(k))
        differences = "; ".join(f"{k} {settings.get(k)} there, {wanted.get(k)} here" for k in changed)
        raise SpecbenchError(
            f"{recipe.path}: load",
            f"{out} was measured with other load: settings ({differences})",
            "resume with the same settings (only the levels and repeats may grow), or measure into "
            "another -o",
        )
    here = measurer.machine
    others = sorted({str(r["machine"]) for r in rows if isinstance(r.get("machine"), str)} - {here.id})
    if others:
        described = next(
            (r.get("machine_described") for r in rows if r.get("machine") == others[0]), others[0]
        )
        raise SpecbenchError(
            str(out),
            f"was measured on {described}; this is {here.describe()}: resuming would mix their throughputs",
            "measure this machine's sweep into another -o",
        )


def _check_levels_free(out: Path, rows: list[dict], plan: Plan, key) -> None:
    """A level to measure must not be in load.csv already under another key (a directory from before
    environment.json bound sweeps, or one whose environment.json is gone): its speedups would be
    taken against the wrong row."""
    held = {(str(r["cell"]), level_of(r), int(r["repeat"])): r["key"] for r in rows}
    for repeat, cell, todo in plan:
        for level in todo:
            there = held.get((cell.id, level, repeat))
            if there is not None and there != key(cell, level, repeat):
                which = f" repeat {repeat + 1}" if repeat else ""
                raise SpecbenchError(
                    str(out / LOAD_CSV),
                    f"holds {cell.id} at {level.describe()}{which} measured otherwise (another recipe, "
                    "load: settings or machine: its key differs)",
                    "resume with the recipe that measured it, or measure this one into another -o",
                )


def _budget(recipe: Recipe) -> int:
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
    budget = _budget(recipe)
    repeats = f" over {load.repeats} repeats" if load.repeats > 1 else ""
    timed_part = f" and {timed} level(s) of {load.duration_s:g} s" if timed else ""
    return (
        f"load: {len({cell.id for _, cell, _ in plan})} cell(s), {len(todo)} level(s) ({'; '.join(kinds)})"
        f"{repeats}: {requests:,} requests of up to {budget:,} new tokens ({requests * budget:,} tokens at "
        f"most){timed_part}, {len(plan)} server start(s)"
    )


# files this process holds besides a level's connections (Python, torch, the server's log)
FILES_BESIDE = 64


def _check_open_files(recipe: Recipe, plan: Plan) -> None:
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


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def _ar_cells(recipe: Recipe) -> dict[str, str]:
    """Engine cell -> the engine AR cell of the same target (its load baseline)."""
    cells = engine_cells(recipe)
    ar = {c.target: c.id for c in cells if c.method == BASELINE}
    return {c.id: ar.get(c.target, "") for c in cells}


def _prompts(measurer: Measurer, recipe: Recipe, target) -> tuple[list[list[int]], int, list[int]]:
    """Every dataset's prompts as token ids, the output budget (the largest), and the stop ids."""
    prompts, budget = [], 0
    for dataset in _datasets(recipe, measurer):
        for example in dataset.examples:
            request = measurer._request(target, dataset, example)
            prompts.append(request.prompt_ids.tolist())
            budget = max(budget, request.max_new_tokens)
    return prompts, budget, target.eos_token_ids()


def _datasets(recipe: Recipe, measurer: Measurer):
    from specbench.pipeline.run.datasets import load_datasets

    return load_datasets(recipe, None, measurer._blame)
