"""``specbench run`` and ``specbench tune``: measure a recipe's cells, or search its grids."""

from __future__ import annotations

from pathlib import Path

import typer

from specbench.cli.common import check_output_dir, check_threads, err, user_errors
from specbench.errors import SpecbenchError


@user_errors
def run(
    recipe: Path = typer.Argument(
        ..., help="Recipe YAML: models, datasets, methods and their hyperparameter grids."
    ),
    limit: int = typer.Option(None, "--limit", min=1, help="Run at most N examples per dataset."),
    output_dir: Path = typer.Option(
        None, "--output-dir", "-o", help="Where results go (default: results/<recipe name>)."
    ),
    seed: int = typer.Option(
        None, "--seed", help="Override the recipe's seed (changes sampled outputs and row keys)."
    ),
    resume: bool = typer.Option(
        False, "--resume", help="Continue a run in OUTPUT_DIR, skipping finished rows."
    ),
    threads: int = typer.Option(
        None,
        "--threads",
        min=1,
        help="torch's intra-op threads (default: the recipe's threads:, else torch's default, one per "
        "core). Recorded with the machine; on a machine shared with other work, fewer threads than cores "
        "keep walltimes clean (the report flags cells measured while others used the CPU).",
    ),
    allow_other_machine: bool = typer.Option(
        False,
        "--allow-other-machine",
        help="With --resume into a directory measured on another machine (CPU, its bf16/AMX units, GPUs, "
        "threads, torch build) or with a model now in another dtype or engine: measure this machine's "
        "rows beside the first machine's, keyed and reported apart (refused without it: walltimes of two "
        "machines never share a cell).",
    ),
    extend: bool = typer.Option(
        False,
        "--extend",
        help="With --resume into a directory another recipe started: add this recipe's cells to the run "
        "(allowed only where this recipe still produces every recorded row, i.e. the same experiment by "
        "key; the directory then belongs to this recipe). Refused without it.",
    ),
    repeats: int = typer.Option(
        None,
        "--repeats",
        min=1,
        max=100,
        help="Measure each timed row N times (outputs and counts must agree; rows keep every repeat). "
        "Overrides the recipe's repeats:.",
    ),
    schedule: str = typer.Option(
        None,
        "--schedule",
        help="interleaved: every cell per example back to back, so machine drift hits all cells alike "
        "(the default); by-cell: each cell over all its examples in turn. Overrides the recipe's schedule:.",
    ),
    executor: str = typer.Option(
        "local",
        "--executor",
        help="local: measure in this process; ray: on the workers of a Ray cluster, this process staying "
        "the only writer of OUTPUT_DIR (needs pip install 'specbench-llm\\[ray]').",
    ),
    address: str = typer.Option(
        None,
        "--address",
        help="With --executor ray: the cluster to join, auto (the one `ray start --head` started here) or "
        "the head's HOST:PORT. Default: a local cluster on this machine's cores and GPUs.",
    ),
    gpus_per_worker: float = typer.Option(
        None,
        "--gpus-per-worker",
        min=0,
        help="With --executor ray: GPUs each worker holds for its models (several for a model that needs "
        "them; 0: CPU workers). Default: 1 when the cluster has GPUs, else 0.",
    ),
):
    """Run every cell of RECIPE on every example; write examples.jsonl, cells.csv and run records."""
    from specbench.pipeline.run.runner import Runner
    from specbench.pipeline.run.schedule import SCHEDULES
    from specbench.recipe import load_recipe
    from specbench.tasks import TASKS

    if executor not in ("local", "ray"):
        raise SpecbenchError("--executor", f"unknown executor {executor!r}", "use local or ray")
    workers = None
    if executor == "ray":
        from specbench.pipeline.run.ray_executor import RayExecutor

        workers = RayExecutor(address, gpus_per_worker)
    elif address is not None or gpus_per_worker is not None:
        raise SpecbenchError(
            "--address/--gpus-per-worker", "apply to Ray runs only", "add --executor ray, or drop them"
        )
    loaded = load_recipe(recipe, known_tasks=set(TASKS))
    if seed is not None:
        loaded = loaded.model_copy(update={"seed": seed})
    if schedule is not None and schedule not in SCHEDULES:
        raise SpecbenchError("--schedule", f"unknown schedule {schedule!r}", f"use {' or '.join(SCHEDULES)}")
    overrides = {"repeats": repeats, "schedule": schedule, "threads": threads}
    loaded = loaded.model_copy(update={k: v for k, v in overrides.items() if v is not None})
    check_threads(loaded.threads, "--threads" if threads is not None else f"{recipe}: threads")
    out = output_dir or Path("results") / loaded.name
    check_output_dir(out)
    Runner(
        loaded,
        out,
        limit=limit,
        resume=resume,
        console=err,
        executor=workers,
        allow_other_machine=allow_other_machine,
        extend=extend,
    ).run()
    err.print(f"results written to {out} — see them with: specbench report {out}")


@user_errors
def tune(
    recipe: Path = typer.Argument(..., help="Recipe YAML whose methods' grids are searched."),
    table: str = typer.Option(
        "ms", "--table", help="Cost table of the SWI that ranks cells: ms (model size) or pw (prior work)."
    ),
    rounds: int = typer.Option(
        None, "--rounds", min=1, help="Stop after R rounds (default: until one cell is left)."
    ),
    start: int = typer.Option(4, "--start", min=1, help="Examples per dataset in the first round."),
    output_dir: Path = typer.Option(
        None, "--output-dir", "-o", help="Where results go (default: results/<recipe name>-tune)."
    ),
    resume: bool = typer.Option(
        False, "--resume", help="Continue a tune in OUTPUT_DIR, skipping finished rows."
    ),
):
    """Successive halving over every method's grid, per dataset: evaluate all cells on the first START
    examples, keep the better half by SWI, double the examples, until one cell is left.

    Greedy lossless cells (speculative with lenience 1, cs_drafting) replay the target from its
    autoregressive output (one is added if the recipe has none), so the search costs one AR run plus
    the drafters' passes. Writes tune.csv (every evaluation) and best.yaml (the best params per method
    and dataset, to paste into the recipe's params:) beside an ordinary, resumable run directory.

    CS Drafting's search space (k11, k12, k22, l; paper, Appendix B) is a cs_drafting grid with
    K = [\\[k11, k12], [0, k22]] in the paper's cumulative convention; this one holds all four
    settings of the paper's Table 5:

        params: {mag_lenience: false}

        grid: {K: [[[5, 8], [0, 1]], [[5, 9], [0, 1]], [[8, 13], [0, 1]], [[5, 19], [0, 1]]],
        lenience: [1, 3, 5]}
    """
    from specbench.pipeline.experiments.tune import tune as run_tune
    from specbench.recipe import load_recipe
    from specbench.tasks import TASKS

    loaded = load_recipe(recipe, known_tasks=set(TASKS))
    out = output_dir or Path("results") / f"{loaded.name}-tune"
    check_output_dir(out)
    _, best = run_tune(loaded, out, table=table, rounds=rounds, start=start, resume=resume, console=err)
    for method, datasets in best.items():
        for dataset, entry in datasets.items():
            err.print(
                f"best {method} on {dataset}: {entry['cell']} (SWI {table} "
                f"{entry[f'swi_{table}']:.3f} on {entry['examples']} examples)",
                highlight=False,
            )
    err.print(f"tune.csv, best.yaml and the run's rows written to {out}")
