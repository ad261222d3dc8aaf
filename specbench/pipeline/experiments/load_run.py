"""``specbench load RECIPE -o DIR``: the recipe's engine cells under load (specbench.engines.load).

For each engine cell (a method whose target runs on a serving engine), its engine's server starts on a
free port of 127.0.0.1 with the cell's speculative settings, and each concurrency level of the recipe's
``load:`` runs the recipe's prompts (every dataset's, rendered as ``specbench run`` renders them) through
it. Each level's row is written to ``DIR/load.csv`` as soon as it is measured, so an interrupted sweep
resumes where it stopped; the server is stopped after its cell, and on any error or signal.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import resource
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from specbench.engines import BACKENDS, ENGINE_NAMES, EngineModel
from specbench.engines.load import (
    LOAD_CSV,
    SPEC_COUNTERS,
    Result,
    Server,
    failed_level,
    free_port,
    read_load,
    run_level,
    speedups,
    summarize,
    write_load,
)
from specbench.errors import SpecbenchError
from specbench.methods import BASELINE
from specbench.pipeline.records.results import EXAMPLES, read_environment
from specbench.pipeline.run.environment import now, write_environment
from specbench.pipeline.run.measure import Measurer
from specbench.recipe import Cell, Recipe

LOAD_SETTINGS = "load_settings"  # environment.json's record of the load: settings (less concurrency)


def engine_cells(recipe: Recipe) -> list[Cell]:
    return [c for c in recipe.cells() if recipe.models[c.target].engine in BACKENDS]


def load_key(recipe: Recipe, measurer: Measurer, cell: Cell, concurrency: int) -> str:
    """What a load.csv row was measured under: the cell, the level and the load settings."""
    spec = recipe.load.model_dump(mode="json", exclude={"concurrency"})
    parts = [cell.fingerprint(recipe), str(concurrency), repr(sorted(spec.items())), measurer.machine.id]
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:16]


def run_load(recipe: Recipe, out: Path, console: Console, resume: bool = False) -> Path:
    if recipe.load is None:
        raise SpecbenchError(
            f"{recipe.path}: load",
            "the recipe has no load: section",
            "add load: {concurrency: [1, 2, 4, 8, 16]}",
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
    done = {row["key"] for row in rows}
    plan = [
        (cell, [c for c in recipe.load.concurrency if load_key(recipe, measurer, cell, c) not in done])
        for cell in cells
    ]
    plan = [(cell, levels) for cell, levels in plan if levels]
    _check_levels_free(out, rows, plan)
    if not plan:  # a resume with nothing left writes nothing
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
    _write_environment(out, recipe, measurer, session, ended=False)  # before the first server
    for cell, levels in plan:
        measurer.check_cell(cell)
        target: EngineModel = measurer.model(cell.target)
        backend = BACKENDS[target.engine]
        if backend.serve is None:
            raise SpecbenchError(f"{recipe.path}: models.{cell.target}.engine", "has no server", "drop load:")
        prompts, budget, stop = _prompts(measurer, recipe, target)
        spec = measurer.engine_spec(cell, target)
        drafter = measurer.model(cell.drafter) if cell.drafter else None
        port = free_port()
        command, env = backend.serve(target, spec, drafter, port)
        with Server(
            command, port, f"{recipe.path}: models.{cell.target}.engine", f"serve-{cell.target}", env
        ) as server:
            with console.status(f"starting {target.engine} serve for {cell.id} on port {port}"):
                started = server.wait_ready(target.options.get("start_timeout_s", 1800.0))
            console.print(f"{cell.id}: server ready in {started:.0f} s")
            # one unrecorded request warms the server up, as `run` warms each cell up
            warm, took = asyncio.run(
                run_level(port, target.directory, prompts, 1, 1, budget, stop, recipe.load.timeout_s)
            )
            console.print(_estimate(recipe, cell, levels, warm[0], took))
            for concurrency in levels:
                requests = _requests(recipe, concurrency)
                with console.status(f"{cell.id}: {requests} requests, {concurrency} at a time"):
                    before = server.counters()
                    results, elapsed = asyncio.run(
                        run_level(
                            port,
                            target.directory,
                            prompts,
                            concurrency,
                            requests,
                            budget,
                            stop,
                            recipe.load.timeout_s,
                        )
                    )
                    after = server.counters()
                grown = {k: after.get(name, 0.0) - before.get(name, 0.0) for k, name in SPEC_COUNTERS.items()}
                row = summarize(
                    cell.id,
                    concurrency,
                    results,
                    elapsed,
                    grown,
                    recipe.load.slo_ttft_s,
                    recipe.load.slo_tpot_s,
                )
                row.update(
                    key=load_key(recipe, measurer, cell, concurrency),
                    target=cell.target,
                    method=cell.method,
                    engine=target.engine,
                    machine=measurer.machine.id,
                    machine_described=measurer.machine.describe(),
                    engine_version=server.version(),
                    speculative_config=json.dumps(target.speculative_config(spec, drafter)),
                    server_start_s=started,
                )
                rows = [r for r in rows if r["key"] != row["key"]] + [row]
                write_load(out, speedups(rows, _ar_cells(recipe)))
                console.print(
                    f"{cell.id} x{concurrency}: {row['throughput_tok_s']:.1f} tok/s, "
                    f"TTFT p50 {row['ttft_p50_s']:.3f} s, {row['errors']} errors"
                )
                warning = failed_level(row, results)
                if warning:
                    console.print(f"[yellow]warning: {escape(warning)}[/yellow]")
    _write_environment(out, recipe, measurer, session, ended=True)
    return out


def _requests(recipe: Recipe, concurrency: int) -> int:
    return recipe.load.requests or max(8, 2 * concurrency)


def _settings(recipe: Recipe) -> dict:
    """The load: settings a sweep's rows were measured under; its levels may grow on a resume."""
    return recipe.load.model_dump(mode="json", exclude={"concurrency"})


def _write_environment(out: Path, recipe: Recipe, measurer: Measurer, started: str, ended: bool) -> None:
    """environment.json, as `run` writes it (versions, machine, models), bound to the recipe's digest
    and the load: settings: what a resume must match."""
    write_environment(
        out,
        recipe,
        measurer.models,
        started,
        0,  # a sweep writes no rows into examples.jsonl
        ended,
        measurer.gpu_samples,
        recipe_identity=recipe.identity(),
        extra={LOAD_SETTINGS: _settings(recipe)},
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
            "resume with the same settings (only concurrency may change), or measure into another -o",
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


def _check_levels_free(out: Path, rows: list[dict], plan: list[tuple[Cell, list[int]]]) -> None:
    """A level to measure must not be in load.csv already under another key (a directory from before
    environment.json bound sweeps, or one whose environment.json is gone): its speedups would be
    taken against the wrong row."""
    held = {(str(r["cell"]), int(r["concurrency"])) for r in rows}
    for cell, levels in plan:
        for concurrency in levels:
            if (cell.id, concurrency) in held:
                raise SpecbenchError(
                    str(out / LOAD_CSV),
                    f"holds {cell.id} at concurrency {concurrency} measured otherwise (another recipe, "
                    "load: settings or machine: its key differs)",
                    "resume with the recipe that measured it, or measure this one into another -o",
                )


def _budget(recipe: Recipe) -> int:
    """The most new tokens a request may ask for: the largest of the datasets' output budgets."""
    default = recipe.generation.max_new_tokens
    return max(dataset.max_new_tokens or default for dataset in recipe.datasets)


def size_line(recipe: Recipe, plan: list[tuple[Cell, list[int]]]) -> str:
    """What a sweep will do, before it starts a server: levels, requests, tokens."""
    levels = sorted({c for _, cells_levels in plan for c in cells_levels})
    count = sum(len(cells_levels) for _, cells_levels in plan)
    requests = sum(_requests(recipe, c) for _, cells_levels in plan for c in cells_levels)
    budget = _budget(recipe)
    return (
        f"load: {len(plan)} cell(s), {count} level(s) (concurrency {', '.join(map(str, levels))}): "
        f"{requests:,} requests of up to {budget:,} new tokens ({requests * budget:,} tokens at most), "
        "one server start per cell"
    )


# files this process holds besides a level's connections (Python, torch, the server's log)
FILES_BESIDE = 64


def _check_open_files(recipe: Recipe, plan: list[tuple[Cell, list[int]]]) -> None:
    """Every request of a level holds a connection, an open file: a level past the process's limit
    would measure failed connections, not the server."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    widest = max(c for _, levels in plan for c in levels)
    if soft == resource.RLIM_INFINITY or widest + FILES_BESIDE <= soft:
        return
    raise SpecbenchError(
        f"{recipe.path}: load.concurrency",
        f"{widest} requests at a time need {widest} connections; this process may open {soft} files "
        "(ulimit -n), some already in use",
        f"raise the limit first (ulimit -n {widest + FILES_BESIDE}), or keep concurrency at most "
        f"{max(soft - FILES_BESIDE, 1)}",
    )


def _estimate(recipe: Recipe, cell: Cell, levels: list[int], warm: Result, took: float) -> str:
    """How long the cell's levels take at its warm-up request's pace: from as if its requests ran side by
    side at one request's speed to as if they ran one at a time."""
    if warm.error is not None or warm.first is None:
        failed = f"warning: {cell.id}: its warm-up request failed ({warm.error or 'no answer'})"
        return f"[yellow]{escape(failed)}[/yellow]"
    fastest = sum(math.ceil(_requests(recipe, c) / c) for c in levels) * took
    slowest = sum(_requests(recipe, c) for c in levels) * took
    return (
        f"{cell.id}: warm-up request {took:.2f} s; its {len(levels)} level(s) take about "
        f"{_duration(fastest)} (requests side by side at one request's speed) to {_duration(slowest)} "
        "(one at a time)"
    )


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


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


def load_table(rows: list[dict], title: str) -> Table:
    table = Table(title=title)
    columns = [
        ("cell", "cell", "{}"),
        ("concurrency", "conc.", "{}"),
        ("throughput_tok_s", "tok/s", "{:.1f}"),
        ("speedup_throughput", "speedup", "{:.2f}x"),
        ("per_request_tok_s", "tok/s/req", "{:.1f}"),
        ("speedup_per_request", "req. speedup", "{:.2f}x"),
        ("ttft_p50_s", "TTFT p50", "{:.3f}"),
        ("ttft_p99_s", "TTFT p99", "{:.3f}"),
        ("tpot_p50_s", "TPOT p50", "{:.4f}"),
        ("tpot_p99_s", "TPOT p99", "{:.4f}"),
        ("goodput_req_s", "goodput/s", "{:.2f}"),
        ("tokens_per_step_est", "tok/step", "{:.2f}"),
        ("vllm_mean_acceptance_length", "vLLM AL", "{:.2f}"),
        ("errors", "err", "{}"),
    ]
    for _, header, _ in columns:
        table.add_column(header, justify="right")
    for row in sorted(rows, key=lambda r: (r["cell"], r["concurrency"])):
        cells = []
        for key, _, fmt in columns:
            value = row.get(key)
            missing = value is None or (isinstance(value, float) and math.isnan(value))
            cells.append("—" if missing else fmt.format(value))
        table.add_row(*cells)
    return table
