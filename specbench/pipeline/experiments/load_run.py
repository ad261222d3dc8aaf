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

At temperature 0, before the first round, each target's outputs alone are measured as the reference
of the outputs under load (:mod:`specbench.pipeline.experiments.load_reference`), and every level's
outputs are classified against it and against specbench's AR where a run holds it
(:mod:`specbench.pipeline.analysis.load_equivalence`). A model with ``engine: openai`` is a server
specbench did not start: each round attaches to it instead
(:mod:`specbench.pipeline.experiments.load_servers`).

Each level's requests are appended to ``DIR/load_requests.jsonl`` and its row written to
``DIR/load.csv`` as soon as it ends, so an interrupted sweep resumes where it stopped; a server that
dies during a level leaves that row marked incomplete, and ``--resume`` measures it again. At the end
``DIR/load_summary.csv`` holds every level's figures pooled over its repeats with 95% intervals
(:mod:`specbench.pipeline.analysis.load_figures`).
"""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from specbench.engines import BACKENDS, ENGINE_NAMES, EngineModel
from specbench.engines.load import (
    LOAD_CSV,
    LOAD_SUMMARY,
    SIGNED,
    adopt,
    append_requests,
    level_of,
    read_load,
    read_references,
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
from specbench.pipeline.analysis import load_equivalence
from specbench.pipeline.analysis.load_figures import speedups, summarize, sweep_summary
from specbench.pipeline.experiments import load_servers
from specbench.pipeline.experiments.load_reference import auditors, prompts_of, why_unchecked
from specbench.pipeline.experiments.load_servers import Served, serve
from specbench.pipeline.experiments.load_sizing import (
    Plan,
    check_open_files,
    duration,
    level_seconds,
    size_line,
)
from specbench.pipeline.records.results import EXAMPLES, read_environment
from specbench.pipeline.run.environment import now, write_environment
from specbench.pipeline.run.measure import Measurer
from specbench.recipe import Cell, Recipe

LOAD_SETTINGS = "load_settings"  # environment.json's record of the load: settings (less the levels)
LEVEL_SETTINGS = {"concurrency", "request_rate", "repeats"}  # what a resume may grow


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


def run_load(
    recipe: Recipe, out: Path, console: Console, resume: bool = False, reference: Path | None = None
) -> Path:
    """The sweep into ``out``; ``reference``: a ``specbench run`` directory of the recipe whose AR rows
    check the outputs under load (default: ``out`` itself where a run shares it)."""
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
    read_references(out)  # an edited reference line stops a resume before any work
    if rows and not resume:
        raise SpecbenchError(str(out), "already holds a load sweep", "pass --resume, or choose another -o")
    if reference is not None and not (Path(reference) / EXAMPLES).is_file():
        raise SpecbenchError(
            str(reference),
            f"holds no {EXAMPLES}: not a specbench run directory",
            "name the -o of a specbench run of this recipe, or leave --reference out",
        )
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
    check_open_files(recipe, plan)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise SpecbenchError(
            str(out), f"cannot be written ({error.strerror or error})", "choose a writable -o"
        ) from None
    session = now()
    adopt(out, done)  # checksums, before the session's record; lines without a complete row go
    _write_environment(out, recipe, measurer, session, ended=False)  # before the first server
    cells, prompts = list({cell.id: cell for _, cell, _ in plan}.values()), {}
    for cell in cells:  # every model loaded and checked before the first server starts
        measurer.check_cell(cell)
        if cell.target not in prompts:
            prompts[cell.target] = prompts_of(measurer, recipe, measurer.model(cell.target))
    if reference is None and (out / EXAMPLES).is_file():
        reference = out
    audit = auditors(recipe, measurer, out, cells, prompts, reference, console)
    for repeat, cell, todo in plan:
        target: EngineModel = measurer.model(cell.target)
        spec = measurer.engine_spec(cell, target)
        drafter = measurer.model(cell.drafter) if cell.drafter else None
        where = f"{recipe.path}: models.{cell.target}.engine"
        with serve(where, cell.id, target, spec, drafter, console) as served:
            server = served.server
            if BACKENDS[target.engine].attach is None:
                rounds_note = (
                    f" (round {repeat + 1} of {recipe.load.repeats})" if recipe.load.repeats > 1 else ""
                )
                console.print(f"{cell.id}: server ready in {served.started:.0f} s{rounds_note}")
            mine = prompts[cell.target]
            send = Requests(
                server.endpoint,
                target.directory,
                mine.ids,
                mine.budget,
                mine.stop,
                recipe.load.timeout_s,
                served.body | sampling(recipe),
            )
            _warm_up(recipe, cell, send, todo, console)
            for level in todo:
                at = (cell, level, repeat)
                row = _measure(recipe, measurer, out, served, send, at, audit.get(cell.target), console)
                rows = [r for r in rows if r["key"] != row["key"]] + [row]
                write_load(out, speedups(rows, _ar_cells(recipe), level_of))
                if not row["complete"]:
                    what, why, read = server.death()
                    raise SpecbenchError(
                        where,
                        f"the engine's server {what} during {cell.id} {_name(level, repeat, recipe)}: {why}",
                        f"its row is kept in {LOAD_CSV}, marked incomplete; {read}, fix the cause and run "
                        "again with --resume to measure it again",
                    )
    _write_environment(out, recipe, measurer, session, ended=True)
    write_summary(out)
    return out


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
        low, high = level_seconds(recipe, level, warm.e2e)
        fastest, slowest = fastest + low, slowest + high
    console.print(
        f"{cell.id}: warm-up request {warm.e2e:.2f} s; its {len(todo)} level(s) take about "
        f"{duration(fastest)} (requests side by side at one request's speed) to {duration(slowest)} "
        "(one at a time)"
    )


def _measure(
    recipe, measurer, out, served: Served, send: Requests, at: tuple, audit, console: Console
) -> dict:
    """One level of one round (``at``: cell, level, repeat): its requests appended to
    load_requests.jsonl (each with its outputs' classes against the references, ``audit``'s), and its
    load.csv row, marked incomplete when the server died during it."""
    cell, level, repeat = at
    server = served.server
    load = recipe.load
    count = load.request_count(level.concurrency, level.rate)
    size = f"{count} requests" if count is not None else f"{load.duration_s:g} s"
    with console.status(f"{cell.id}: {_name(level, repeat, recipe)}, {size}"):
        before = load_servers.counters(server, served.counters)
        if level.kind == CLOSED_LOOP:
            duration = load.duration_s if count is None else None
            run: LevelRun = asyncio.run(closed_loop(send, level.concurrency, count, duration))
        else:
            seed = arrival_seed(recipe.seed, level.rate, repeat)
            run = asyncio.run(open_loop(send, arrival_times(level.rate, count, load.burstiness, seed)))
        after = load_servers.counters(server, served.counters)
    died = load_servers.died(server, after)
    grown, down = load_servers.grown(served, before, after)
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
        speedup_over=recipe.speedup_over(cell.target),
        method=cell.method,
        engine=target.engine,
        machine=measurer.machine.id,
        machine_described=measurer.machine.describe(),
        engine_version=None if died else server.version(),
        speculative_config=served.speculative_config,
        server_start_s=served.started,
        server_figures=served.figures,
        server_verify_steps=grown.get("verify_steps"),
        token_ids=sum(1 for r in records if r["output_ids"] is not None),
    )
    why = why_unchecked(recipe) or (None if audit else "not checked: no reference")
    row.update(load_equivalence.unchecked(why) if why else {"eq_note": None, **audit.audit(records)})
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
    if down:
        console.print(
            f"[yellow]warning: {escape(cell.id)} {_name(level, repeat, recipe)}: the server's counter "
            f"{escape(down[0])} went down during the level (a restarted server, or another replica "
            "answered): its drafts and acceptance are unknown (NaN), the rest of the row stands[/yellow]"
        )
    completed = [r for r in records if r["error"] is None]
    if completed and not any(r["ids_sent"] for r in completed) and not why:
        console.print(
            f"{cell.id}: the server returned no token ids: tokens counted from its usage, outputs not checked"
        )
    flag = load_equivalence.flag(row, f"{cell.id} {_name(level, repeat, recipe)}")
    if flag:
        console.print(f"[red]{escape(flag)}[/red]")
    return row


def sampling(recipe: Recipe) -> dict:
    """The recipe's sampling in the OpenAI body where it is not greedy (the body asks temperature 0)."""
    generation = recipe.generation
    if generation.temperature == 0:
        return {}
    top_k = {"top_k": generation.top_k} if generation.top_k else {}
    return {"temperature": generation.temperature, "top_p": generation.top_p, **top_k}


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


def _ar_cells(recipe: Recipe) -> dict[str, str]:
    """Engine cell -> the engine AR cell of the same target, or of the server its engine_options.baseline
    names (its load baseline)."""
    cells = engine_cells(recipe)
    ar = {c.target: c.id for c in cells if c.method == BASELINE}
    return {c.id: ar.get(recipe.speedup_over(c.target), "") for c in cells}
