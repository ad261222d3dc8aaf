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
from pathlib import Path

from rich.console import Console
from rich.table import Table

from specbench.engines import BACKENDS, EngineModel
from specbench.engines.load import (
    SPEC_COUNTERS,
    Server,
    free_port,
    read_load,
    run_level,
    speedups,
    summarize,
    write_load,
)
from specbench.errors import SpecbenchError
from specbench.pipeline.measure import Measurer
from specbench.recipe import Cell, Recipe


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
            f"{recipe.path}: methods", "no method runs on a serving engine", "give a target engine: vllm"
        )
    out = Path(out)
    rows = read_load(out)
    if rows and not resume:
        raise SpecbenchError(str(out), "already holds a load sweep", "pass --resume, or choose another -o")
    out.mkdir(parents=True, exist_ok=True)
    measurer = Measurer(recipe, console)
    done = {row["key"] for row in rows}
    for cell in cells:
        levels = [c for c in recipe.load.concurrency if load_key(recipe, measurer, cell, c) not in done]
        if not levels:
            continue
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
            asyncio.run(run_level(port, target.directory, prompts, 1, 1, budget, stop, recipe.load.timeout_s))
            for concurrency in levels:
                requests = recipe.load.requests or max(8, 2 * concurrency)
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
    return out


def _ar_cells(recipe: Recipe) -> dict[str, str]:
    """Engine cell -> the engine AR cell of the same target (its load baseline)."""
    cells = engine_cells(recipe)
    ar = {c.target: c.id for c in cells if c.method == "autoregressive"}
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
    from specbench.pipeline.datasets import load_datasets

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
            cells.append("" if missing else fmt.format(value))
        table.add_row(*cells)
    return table
