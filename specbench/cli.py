"""The ``specbench`` command line: one function per command, each with its ``--help``.

About 500 lines on purpose: the commands' options and help texts are the user's manual, and each
command only parses them and hands over to the module that does the work (imported inside it, so
``specbench --help`` stays fast).
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

from specbench.errors import SpecbenchError

app = typer.Typer(
    help="Benchmark speculative-decoding algorithms and reproduce their papers' tables.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
err = Console(stderr=True)


def user_errors(command):
    """Print a SpecbenchError as one line and exit 2; an interrupt says how to resume."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        _replace_unencodable()
        try:
            return command(*args, **kwargs)
        except SpecbenchError as error:
            # the message is plain text: a "[/x]" in a path or "[a, b]" in a hint is not markup
            err.print(f"[red]error:[/red] {escape(str(error))}", highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None
        except KeyboardInterrupt:
            err.print("interrupted — finished rows are saved; re-run with --resume to continue")
            raise typer.Exit(130) from None

    return wrapper


@app.command()
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
    from specbench.pipeline.runner import Runner
    from specbench.pipeline.schedule import SCHEDULES
    from specbench.recipe import load_recipe
    from specbench.tasks import TASKS

    if executor not in ("local", "ray"):
        raise SpecbenchError("--executor", f"unknown executor {executor!r}", "use local or ray")
    workers = None
    if executor == "ray":
        from specbench.pipeline.ray_executor import RayExecutor

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


@app.command()
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
    from specbench.pipeline.tune import tune as run_tune
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


@app.command()
@user_errors
def report(
    results: Path = typer.Argument(Path("results"), help="A run directory, or a folder of run directories."),
    format: str = typer.Option("table", "--format", "-f", help="table (Rich), csv, markdown or latex."),
    paper: str = typer.Option(
        None,
        "--paper",
        help="Print a paper's table with our best cells beside it: cs-drafting-table2 (SWI, FLAN-T5) "
        "or cs-drafting-table3 (walltime, Vicuna-7B, with Table 4); spec-cascades-table2 (latency "
        "reduction at the large model's quality and best quality within its latency, from each "
        "method's Pareto frontier over α); specdecpp (Table 1 throughput and speedup, discard and "
        "verification rates, fitted t_draft/t_target). Formats: table, markdown, csv.",
    ),
    by: str = typer.Option(
        None,
        "--by",
        help="category: Spec-Bench's leaderboard from examples.jsonl, one row per method cell: speedup "
        "over AR per category (MT-Bench, Translation, Summarization, QA, Math, RAG) and overall, with "
        "paired bootstrap intervals, and #Mean Accepted Tokens. Needs rows that carry a category "
        "(task spec_bench).",
    ),
):
    """One table per dataset: method, drafters, k, SWI (MS, PW), tokens/s, speedup, acceptance, quality.

    With --paper, the paper's table instead: each paper row beside the best of our matching cells.
    With --by category, Spec-Bench's leaderboard by category (Xia et al., Findings of ACL 2024).
    """
    if by is not None:
        if by != "category":
            raise SpecbenchError("--by", f"unknown breakdown {by!r}", "use --by category")
        if paper is not None:
            raise SpecbenchError("--by", "cannot be combined with --paper", "pass one of --by and --paper")
        from specbench.pipeline.categories import render_categories

        text = render_categories(results, format)
    elif paper is not None:
        from specbench.papers.registry import check_paper, render_paper

        check_paper(paper)  # a misspelt name is reported before the results are read
        text = render_paper(results, paper, format)
    else:
        from specbench.pipeline.report import render

        text = render(results, format)
    if text is not None:
        sys.stdout.write(text + ("" if text.endswith("\n") else "\n"))


@app.command()
@user_errors
def compare(
    runs: list[Path] = typer.Argument(
        ..., help="Two run directories or more (each holding cells.csv); the first is the reference."
    ),
    format: str = typer.Option("table", "--format", "-f", help="table (Rich), csv, markdown or latex."),
    allow_incomparable: bool = typer.Option(
        False,
        "--allow-incomparable",
        help="Show cells that are another experiment in a later run (other models, generation settings, "
        "method parameters or examples) marked ≠ instead of refusing them.",
    ),
):
    """The same cells of several runs side by side, one table per dataset.

    Cells are matched on dataset and cell id. Per run: tokens/s, speedup over that run's AR cell and
    SWI MS (each with its 95% bootstrap interval where cells.csv has one; older files show the value
    alone), acceptance length; and for each run after the first, its tokens/s over the first run's on
    the same cell (> 1: faster). A cell missing from a run, or a value it did not measure (replayed
    cells have no time), shows "—". The runs may differ in machine, dtype, engine and threads (each
    run's is named above its table); a cell whose models, generation settings, method parameters or
    examples differ is refused unless --allow-incomparable. Example:
    specbench compare results/quickstart results/quickstart-mine
    """
    from specbench.pipeline.compare import render_compare

    text = render_compare(runs, format, allow_incomparable=allow_incomparable)
    if text is not None:
        sys.stdout.write(text + ("" if text.endswith("\n") else "\n"))


@app.command()
@user_errors
def check(
    results: list[Path] = typer.Argument(
        ..., help="Run directories, or folders searched for them (e.g. results/)."
    ),
):
    """Whether committed results still are what today's code measures.

    For each run directory (one holding examples.jsonl): its resolved_recipe.yaml must still validate,
    must key every recorded row as the row is keyed (a method revision, a changed default or model
    entry changes the keys), and its trained drafters and heads must have been trained as the local
    copies were (environment.json records a digest of each one's training). A directory kept on
    purpose although stale names, in the first line of its PROVENANCE.md, the commit that made it and
    why it stays. Reads only. Exit 1 when a directory is stale without such a declaration, e.g.
    specbench check results/
    """
    from rich.table import Table

    from specbench.pipeline.provenance import check_run, result_directories

    table = Table("run", "state", "why")
    failed = False
    for directory in [d for path in results for d in result_directories(path)]:
        finding = check_run(directory)
        if not finding.stale:
            state = "current"
        elif finding.accepted:
            state = "stale, declared"
        else:
            state, failed = "stale", True
        why = finding.problems + ([f"PROVENANCE.md: {finding.declared}"] if finding.declared else [])
        text = "\n".join(why + [f"note: {n}" for n in finding.notes])
        table.add_row(escape(str(directory)), state, escape(text))
    Console(width=200).print(table)
    if failed:
        raise typer.Exit(1)


@app.command()
@user_errors
def plan(
    recipe: Path = typer.Argument(..., help="Recipe YAML to plan; nothing is loaded or run."),
    gpus: int = typer.Option(
        0, "--gpus", min=0, help="GPUs to place the models on (0: report sizes and time only)."
    ),
    gpu_memory: str = typer.Option(
        "80GiB", "--gpu-memory", help="Memory of each GPU: 80GiB, 80GB, 81920MiB."
    ),
    format: str = typer.Option("table", "--format", "-f", help="table (Rich) or json (the same data)."),
    probe: bool = typer.Option(
        False,
        "--probe",
        help="Load every model on its recipe device and time a few forward passes (loads weights!).",
    ),
    pass_ms: list[str] = typer.Option(
        [], "--pass-ms", help="NAME=MS: a recipe model's time per forward pass, e.g. --pass-ms target=95."
    ),
    acceptance: float = typer.Option(
        0.6,
        "--acceptance",
        min=0.0,
        max=1.0,
        help="Acceptance rate α assumed where no earlier run in --output-dir measured one.",
    ),
    output_dir: Path = typer.Option(
        None,
        "--output-dir",
        "-o",
        help="A run directory: rows already there are not counted again, and its cells.csv gives α and "
        "its rows the time per pass of the same models.",
    ),
    limit: int = typer.Option(None, "--limit", min=1, help="At most N examples per dataset, as run --limit."),
    profile: Path = typer.Option(
        None,
        "--profile",
        help="A cost profile (specbench probe): time per pass of the models it probed, by source, as a "
        "one-token pass after half the recipe's longest sequence.",
    ),
    bandwidth: str = typer.Option("2TB/s", "--bandwidth", help="GPU memory bandwidth for the time rule."),
    cpu_bandwidth: str = typer.Option("20GB/s", "--cpu-bandwidth", help="CPU memory bandwidth, likewise."),
    margin: float = typer.Option(
        0.05, "--margin", min=0.0, max=1.0, help="Added to each model's weights + KV cache."
    ),
    reserve: str = typer.Option(
        "1GiB", "--reserve", help="Kept free on every GPU (CUDA context, workspace)."
    ),
):
    """The bill of RECIPE before anything loads: sizes, placement, forward passes, time.

    Models: parameters and weight bytes at their dtype, from the configuration instantiated on the meta
    device (a local path or .gguf file, the local Hugging Face cache, the tiny and distilled models,
    else specbench/data/model_facts.yaml), and the KV cache at the recipe's longest sequence, batch 1.
    Placement: each model needs (weights + KV cache) x (1 + margin); the recipe's device, device_map
    and max_memory are honoured as accelerate would apply them, the rest placed largest first, split
    over consecutive GPUs when one is not enough. A recipe that does not fit is a one-line error naming
    the model and the fewest such GPUs that would hold it. Cells: rows left to run, forward passes per
    model (speculative: T / E(α, k) target passes, E = (1 - α^(k+1)) / (1 - α), Leviathan et al. 2023),
    walltime and GPU-hours; time per pass from --pass-ms, --probe, a cost profile (--profile), an
    earlier run in --output-dir, or weight bytes / --bandwidth. Every assumption is printed with the numbers.

    Example: specbench plan recipes/specdecpp/llama2_chat_7b_70b.yaml --gpus 2 --gpu-memory 80GiB
    """
    from specbench.pipeline import plan as planning
    from specbench.pipeline.placement import parse_size
    from specbench.pipeline.plan_view import plan_json, print_plan
    from specbench.recipe import load_recipe
    from specbench.tasks import TASKS

    if format not in ("table", "json"):
        raise SpecbenchError("--format", f"unknown format {format!r}", "use table or json")
    loaded = load_recipe(recipe, known_tasks=set(TASKS))
    given = {}
    for item in pass_ms:
        name, _, value = item.partition("=")
        if name not in loaded.models:
            raise SpecbenchError(
                "--pass-ms", f"{name!r} is no model of the recipe", f"use one of {', '.join(loaded.models)}"
            )
        try:
            given[name] = float(value)
        except ValueError:
            raise SpecbenchError(
                "--pass-ms", f"{item!r} is not NAME=MS", "write e.g. --pass-ms target=95"
            ) from None
    hardware = planning.Hardware(
        gpus=gpus,
        gpu_memory=parse_size(gpu_memory, "--gpu-memory"),
        margin=margin,
        reserve=parse_size(reserve, "--reserve"),
        bandwidth=parse_size(bandwidth, "--bandwidth", per_second=True),
        cpu_bandwidth=parse_size(cpu_bandwidth, "--cpu-bandwidth", per_second=True),
    )
    probed = planning.probe(loaded) if probe else None
    profiled = None
    if profile is not None:
        from specbench.pipeline.probe import read_profile

        profiled = read_profile(str(profile))
        if profiled["kind"] != "probe":
            raise SpecbenchError(
                "--profile", f"{profile} is not a probe's profile", "write one with specbench probe"
            )
    bill = planning.build_plan(
        loaded,
        hardware,
        output_dir=output_dir,
        acceptance=acceptance,
        pass_ms=given,
        probed=probed,
        limit=limit,
        profile=profiled,
    )
    if format == "json":
        sys.stdout.write(plan_json(bill))
        return
    console = Console()
    print_plan(bill, console if console.is_terminal else Console(width=200))


@app.command()
@user_errors
def probe(
    recipe: Path = typer.Argument(..., help="Recipe YAML whose neural models are timed (loads weights!)."),
    out: Path = typer.Option(..., "--out", "-o", help="The profile file to write (JSON)."),
    sizes: str = typer.Option(
        "1,2,3,4,5,6,8,12,16,24,32,64,128,256,512",
        "--sizes",
        help="Tokens fed per pass to time, comma-separated (1: a decoding step; k + 1: a verification).",
    ),
    contexts: str = typer.Option("32,256,1024", "--contexts", help="Cached positions before the pass."),
    rounds: int = typer.Option(3, "--rounds", min=1, max=20, help="Shuffled rounds over the grid."),
    roofline: bool = typer.Option(
        False, "--roofline", help="Also measure this device's memory bandwidth and peak matrix FLOP/s."
    ),
    threads: int = typer.Option(
        None, "--threads", min=1, help="torch's intra-op threads (as run --threads)."
    ),
):
    """Time one forward pass of every model of RECIPE over tokens fed x context: a cost profile.

    Each model loads as `specbench run` would load it (dtype, device, engine); each (tokens, context)
    point is timed in --rounds shuffled rounds and its median kept; per size, time = alpha + gamma x
    context is fitted and the profile records it with its fit quality (R², median and worst relative
    error), the machine, dtype, engine and versions. `specbench predict RUN --profile FILE` then says
    what a run measured elsewhere would take here. Example:
    specbench probe recipes/demo.yaml --out profile.json
    """
    import torch
    from rich.progress import Progress

    from specbench import sources
    from specbench.pipeline import probe as probing
    from specbench.recipe import load_recipe
    from specbench.tasks import TASKS

    loaded = load_recipe(recipe, known_tasks=set(TASKS))
    if threads is not None:
        loaded.threads = threads
    grid = [_int_list(sizes, "--sizes"), _int_list(contexts, "--contexts", minimum=0)]
    neural = sum(1 for spec in loaded.models.values() if sources.source_of(spec.source).neural)
    with Progress(console=err) as progress:
        task = progress.add_task("probing", total=neural * rounds * len(grid[0]) * len(grid[1]))
        profile = probing.probe_recipe(loaded, *grid, rounds=rounds, progress=lambda: progress.advance(task))
    if roofline:
        dtype = profile["dtype"].split("+")[0] or "float32"
        profile["roofline"] = probing.measure_roofline(dtype) | {"threads": torch.get_num_threads()}
    probing.write_profile(profile, out)
    for source, entry in profile["models"].items():
        quality = entry["quality"]
        err.print(
            f"{source}: {entry['dtype']} {entry['engine']}, one-token pass "
            f"{1000 * entry['table']['alpha'][0]:.2f} ms + {1e6 * entry['table']['gamma'][0]:.2f} µs per "
            f"cached position; fit R² {quality['r2']:.4f}, "
            f"median error {100 * quality['median_relative_error']:.1f}%"
        )
    err.print(f"profile written to {out}")


@app.command()
@user_errors
def predict(
    run_dir: Path = typer.Argument(..., help="A run directory (examples.jsonl, environment.json)."),
    profile: str = typer.Option(
        None,
        "--profile",
        "-p",
        help="A profile file from `specbench probe`, or a device's roofline: h100, h100-pcie, a100, "
        "rtx3090. Without it: held-out predictions on the machine that measured the run.",
    ),
    against: Path = typer.Option(
        None, "--against", help="A run of the same recipe measured where the profile was: its speedups."
    ),
    dtype: str = typer.Option(None, "--dtype", help="With a roofline: the dtype to cost the models in."),
    roofline: bool = typer.Option(
        False,
        "--roofline",
        help="Price every model by the roofline of the profile's device (the bandwidth and peak that "
        "probe --roofline measured), not by its probed passes. Models a profile did not probe always are.",
    ),
    loop: str = typer.Option(
        "auto",
        "--loop",
        help="measured: add each row's measured loop overhead (Python, statistical drafting); none: "
        "passes only; auto: measured with a probe's profile, none with a roofline.",
    ),
    format: str = typer.Option("table", "--format", "-f", help="table (Rich), csv or markdown."),
):
    """What RUN's cells would take under another pass cost: walltime, tokens/s, speedup over AR.

    A run's forward counts and pass shapes (tokens fed, context read) do not depend on the hardware;
    the profile prices each pass. Without --profile, each half of the examples is predicted from a cost
    fitted to the other half on the machine that measured the run (the check of the cost model that
    cells.csv's *_predicted columns carry). With --against, the measured speedups of that run sit beside
    the predicted ones, with the error. Example:
    specbench predict results/demo/amd-epyc-avx512-bf16 --profile profile.json --against runs/demo
    """
    from specbench.pipeline import prediction_view

    if loop not in ("auto", "measured", "none"):
        raise SpecbenchError("--loop", f"unknown value {loop!r}", "use auto, measured or none")
    if format not in ("table", "csv", "markdown"):
        raise SpecbenchError("--format", f"unknown format {format!r}", "use table, csv or markdown")
    text = prediction_view.render(
        run_dir, profile, against, dtype, None if loop == "auto" else loop == "measured", format, roofline
    )
    if text:
        sys.stdout.write(text + ("" if text.endswith("\n") else "\n"))


def _int_list(value: str, flag: str, minimum: int = 1) -> list[int]:
    try:
        numbers = [int(part) for part in value.split(",") if part.strip()]
    except ValueError:
        numbers = []
    if not numbers or min(numbers) < minimum:
        raise SpecbenchError(
            flag, f"{value!r} is not a list of integers >= {minimum}", f"write e.g. {flag} 1,2,4"
        )
    return sorted(set(numbers))


@app.command()
@user_errors
def bench(
    target: str = typer.Option("smollm2-135m-instruct", help="Target model source (alias, path or hub id)."),
    drafter: str = typer.Option(
        "same", help="Drafter model source; 'same' loads a second copy of the target."
    ),
    k: int = typer.Option(4, min=1, help="Draft length, identical for our loops and HF's."),
    prompts: int = typer.Option(8, min=1, help="Timed prompts (one more is run first as warm-up)."),
    max_new_tokens: int = typer.Option(64, min=1, help="Tokens generated per prompt."),
    task: str = typer.Option("arithmetic", help="Prompt set (a task name)."),
    dtype: str = typer.Option("auto", help="float32, bfloat16, float16, float64 or auto."),
    device: str = typer.Option("auto", help="cpu, cuda, cuda:N or auto."),
    engine: str = typer.Option(
        "eager",
        help="Engines to time, comma-separated: eager (HF passes, dynamic cache), compiled (static cache, "
        "compiled passes: minutes of compilation on a CPU, reported apart), onednn (eager, with the "
        "linear layers on oneDNN's reordered weights: a recipe's linear: onednn), e.g. "
        "eager,onednn,compiled.",
    ),
    target_options: str = typer.Option(
        "{}", help='Loader options as JSON, e.g. \'{"hidden_size": 2048, "layers": 16}\' for tiny-llama.'
    ),
    drafter_options: str = typer.Option("{}", help="Loader options of the drafter as JSON."),
):
    """Time our AR/SD loops on each engine against HF generate (eager; assisted; prompt lookup; and
    with --engine compiled, HF's static-cache compiled generate) and the memory-bandwidth limit.

    Every ratio printed compares two rows of this one run (walltime per token; > 1 means the second
    named is faster). Also printed: our loops' overhead (1 - time inside model passes / walltime), the
    compile times (never part of a walltime), and whether outputs are identical, and where not, whether
    they part at a numerical tie. Greedy decoding.
    """
    from specbench.pipeline.bench import parse_engines, print_bench, run_bench

    console = Console()
    if not console.is_terminal:  # piped into a file: do not squeeze the table into 80 columns
        console = Console(width=160)
    options = {
        name: _json_option(f"--{name}", value)
        for name, value in (("target-options", target_options), ("drafter-options", drafter_options))
    }
    result = run_bench(
        target,
        drafter,
        k,
        prompts,
        max_new_tokens,
        dtype,
        device,
        task,
        console,
        options["target-options"],
        options["drafter-options"],
        engines=parse_engines(engine),
    )
    print_bench(result, console)


@app.command()
@user_errors
def distill(
    target: str = typer.Option("smollm2-135m-instruct", help="Teacher model source (alias, path or hub id)."),
    size: list[str] = typer.Option(
        ["small", "base"],
        "--size",
        help="Drafters to train: small (~8.5M, 2 layers x 160), base (the target's embedding and first "
        "2 layers), mini and micro (2 layers x 60 and x 20: ~3.0M and ~1.0M for SmolLM2-135M, CS Drafting's "
        "FLAN-T5-base and -small cost ratios to XXL), exit<N> (an exit head on the target's first N layers), "
        "medusa (4 Medusa-1 heads on "
        "the target's last hidden state; recipes name them medusa:<target>/medusa), eagle (an EAGLE head: "
        "one decoder layer on the target's features, also saved in vLLM's eagle layout; recipes name it "
        "eagle:<target>/eagle), eagle3 (the same head reading EAGLE-3's fusion of the target's low, middle "
        "and high layers, RMS-normalised, trained on the token loss alone; eagle:<target>/eagle3, no vLLM "
        "layout). Repeat "
        "the option for several.",
    ),
    data_dir: Path = typer.Option(
        None,
        "--data-dir",
        envvar="SPECBENCH_DATA_DIR",
        help="Offline data folder with gsm8k/train.jsonl, mmlu/dev.jsonl and alpaca_seed/train.jsonl.",
    ),
    generate: int = typer.Option(800, min=1, help="Training prompts the target answers greedily."),
    teacher_forced: int = typer.Option(1200, min=0, help="GSM8K train reference answers the target scores."),
    max_new_tokens: int = typer.Option(128, min=1, help="Length cap of the target's answers."),
    top_k: int = typer.Option(32, min=1, help="Teacher log-probabilities kept per position."),
    epochs: float = typer.Option(
        None,
        min=0.01,
        help="Training epochs (default per size: small 3, base 2, micro 6, mini 6, exit 1, medusa 2, "
        "eagle and eagle3 8).",
    ),
    lr: float = typer.Option(None, min=0.0, help="Peak learning rate (default per size)."),
    seed: int = typer.Option(0, help="Seed of the student's initialisation and batch order."),
    draft_vocab: int = typer.Option(
        None,
        min=0,
        help="Score only the N tokens most frequent in the training data (FR-Spec); the drafter "
        "gives the others probability 0, which keeps decoding lossless and each pass cheaper. "
        "0 = the whole vocabulary (default per size: 8192; exit heads always 0).",
    ),
    extra_prompts: list[str] = typer.Option(
        [],
        "--extra-prompts",
        help="Further prompts the target answers greedily, as TASK:SPLIT (e.g. spec_bench:question): "
        "every row of the split except those the --leave-out recipes evaluate. Cached apart from the "
        "base data; the drafters are saved with +TASK-SPLIT added to their names. Repeat for several.",
    ),
    leave_out: list[str] = typer.Option(
        [],
        "--leave-out",
        help="With --extra-prompts: a recipe whose evaluated examples (its datasets, limits and every, "
        "as `specbench run` selects them) never become training text; repeat for several, or write "
        "--leave-out none to state that nothing is evaluated on those splits.",
    ),
    unroll: int = typer.Option(
        None,
        min=1,
        help="EAGLE heads only: steps of EAGLE-3's training-time test (1: teacher-forced features only; "
        "each further step reads the head's own predicted features, as a tree's deeper levels do; "
        "default 2). A head trained with --unroll N is saved as eagle-unrollN (eagle3-unrollN).",
    ),
    max_sequence: int = typer.Option(
        None,
        "--max-sequence",
        min=16,
        help="Heads only (medusa, eagle, eagle3): train on teacher sequences (prompt and answer) of at "
        "most this many tokens (default 512). Long-prompt tasks such as Spec-Bench's summarization and "
        "RAG questions need about 1024; each target pass then costs more. Saved as <size>-seqN.",
    ),
):
    """Train drafters that share the target's tokenizer by distillation (forward KL on its top-k).

    The target's answers and top-k log-probabilities are cached under the specbench cache
    (SPECBENCH_CACHE, default ~/.cache/specbench), so re-training skips the teacher. Drafters are
    saved to <cache>/drafters/<target>/<size> and load anywhere as source: distilled:<target>/<size>.
    """
    import json

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from specbench.training import distill as distillation

    if data_dir is None:
        raise SpecbenchError(
            "--data-dir",
            "no training data folder",
            "pass --data-dir ../shared/data or set SPECBENCH_DATA_DIR",
        )
    data_dir = str(Path(data_dir).resolve())
    teacher = distillation.TeacherConfig(
        target,
        generate,
        max_new_tokens,
        teacher_forced,
        top_k,
        data_dir=data_dir,
        extra=tuple(extra_prompts),
        left_out=evaluated_ids(extra_prompts, leave_out, data_dir),
    )
    overrides = {"epochs": epochs, "lr": lr, "seed": seed, "draft_vocab": draft_vocab}
    overrides |= {"unroll": unroll, "max_sequence": max_sequence}
    students = [distillation.student_config(s, **overrides) for s in size]
    columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn())
    columns += (TextColumn("{task.fields[stats]}"), TimeElapsedColumn())
    with Progress(*columns, console=err) as progress:
        saved = distillation.distill(teacher, students, progress)
    for path in saved:
        record = json.loads((path / "distill.json").read_text())
        after = record["held_out_after"]
        err.print(
            f"{path}: {record['parameters'] / 1e6:.1f}M parameters, held-out top-1 agreement "
            f"{after['top1_agreement']:.1%} (before {record['held_out_before']['top1_agreement']:.1%})"
        )


def evaluated_ids(extra: list[str], recipes: list[str], data_dir: str) -> tuple[str, ...]:
    """The ids of the examples of the ``extra`` splits that the ``recipes`` evaluate (sorted)."""
    import contextlib
    import os
    from unittest import mock

    from specbench.pipeline.datasets import load_datasets
    from specbench.recipe import load_recipe
    from specbench.training.teacher import split_label

    if not extra:
        if recipes:
            raise SpecbenchError("--leave-out", "nothing to leave out of", "use it with --extra-prompts")
        return ()
    if not recipes:
        raise SpecbenchError(
            "--extra-prompts",
            "no recipe named whose evaluated prompts must stay out of training",
            "add --leave-out RECIPE (repeatable), or --leave-out none if none evaluates these splits",
        )
    if recipes == ["none"]:
        return ()
    labels = {split_label(source) for source in extra}
    ids: set[str] = set()
    for path in recipes:
        # the recipes' data is the training data's folder
        with mock.patch.dict(os.environ, {"SPECBENCH_DATA_DIR": data_dir}):
            runs = load_datasets(load_recipe(path), None, lambda field: contextlib.nullcontext())
        chosen = [run for run in runs if run.label in labels]
        if not chosen:
            raise SpecbenchError(
                f"--leave-out {path}",
                f"the recipe evaluates none of {', '.join(sorted(labels))}",
                "name the recipes that evaluate the --extra-prompts splits",
            )
        ids |= {example.id for run in chosen for example in run.examples}
    return tuple(sorted(ids))


@app.command()
@user_errors
def plot(
    results: Path = typer.Argument(..., help="A run directory (holding examples.jsonl)."),
    figure: str = typer.Option(
        "acceptance",
        "--figure",
        help="acceptance: acceptance rate by draft position (CS Drafting Fig. 2); curves: quality vs "
        "relative latency per cascade and α, curves.csv, cascades_table2.csv and Pareto PNGs "
        "(Speculative Cascades Figs. 2-3, Table 2); specdecpp: discard/verification rates, the "
        "t_draft/t_target regression CSVs and the Figure 4 PNG (SpecDec++); load: speculation's speedup "
        "over the same engine's AR by concurrency, from `specbench load`'s load.csv; all: every one that "
        "applies.",
    ),
):
    """Figures of a run, written as CSV + PNG into RESULTS (see --figure)."""
    from specbench.pipeline.plots import write_acceptance_plot

    figures = ("acceptance", "curves", "specdecpp", "load", "all")
    if figure not in figures:
        raise SpecbenchError("--figure", f"unknown figure {figure!r}", f"use one of {', '.join(figures)}")
    writers = {"acceptance": lambda r: list(write_acceptance_plot(r))}
    if figure in ("load", "all"):
        from specbench.pipeline.plots import write_load_plot

        writers["load"] = write_load_plot
    if figure in ("curves", "all"):
        from specbench.papers.spec_cascades.curves import write_curves

        writers["curves"] = write_curves
    if figure in ("specdecpp", "all"):
        from specbench.papers.specdecpp.efficiency import write_efficiency

        writers["specdecpp"] = write_efficiency
    for name, write in writers.items():
        if figure not in (name, "all"):
            continue
        try:
            paths = write(results)
        except SpecbenchError as error:
            if figure != "all":
                raise
            err.print(f"skipped {name}: {error}", highlight=False, soft_wrap=True)
            continue
        err.print("wrote " + ", ".join(str(p) for p in paths), highlight=False, soft_wrap=True)


@app.command()
@user_errors
def load(
    recipe: Path = typer.Argument(
        ..., help="Recipe YAML with a load: section and methods whose target runs on a serving engine."
    ),
    output_dir: Path = typer.Option(..., "--output-dir", "-o", help="Where load.csv goes."),
    resume: bool = typer.Option(False, "--resume", help="Measure only the levels load.csv does not hold."),
):
    """Engine cells under load: each cell's engine served on 127.0.0.1 (vllm serve on a free port),
    driven by an async streaming client at every concurrency of the recipe's load: section; per level
    throughput, TTFT/TPOT/end-to-end p50/p90/p99, goodput under the SLO, acceptance from the server's
    counters, and the speedup over the same engine's AR cell at the same load, into OUTPUT_DIR/load.csv.
    The server is always stopped, on errors and Ctrl-C too. Plot: `specbench plot DIR --figure load`."""
    from specbench.pipeline.load_run import load_table, run_load
    from specbench.recipe import load_recipe
    from specbench.tasks import TASKS

    spec = load_recipe(recipe, known_tasks=TASKS)
    out = run_load(spec, output_dir, err, resume)
    from specbench.engines.load import read_load

    console = Console()
    if not console.is_terminal:  # piped or captured: do not squeeze the table into 80 columns
        console = Console(width=220)
    console.print(load_table(read_load(out), f"{spec.name} under load ({out})"))


theory_app = typer.Typer(
    help="The papers' theory: CS Drafting's expected walltime improvement (Section 4, table1); SpecDec++'s "
    "threshold policy (Theorem 3.1, threshold)."
)
app.add_typer(theory_app, name="theory")


@theory_app.command("table1")
@user_errors
def theory_table1(
    costs: str = typer.Option("params", help="params: parameter-count ratios (MS); leviathan: Table 4 (PW)."),
    temperature: int = typer.Option(0, help="Acceptance rates of Leviathan et al. Table 3 at t=0 or t=1."),
    steps: int = typer.Option(200_000, min=1000, help="Monte-Carlo steps of the simulator per row."),
):
    """CS Drafting Table 1: simulated EWIF of SD and the horizontal cascade, ours beside the paper's.

    Inputs are the T5-XXL acceptance rates of Leviathan et al. 2023 (Table 3) and per-pass costs. The
    paper's numbers reproduce with parameter-count costs (FLAN-T5 77M/248M over 11.1B), not Table 4's.
    """
    from rich.table import Table

    from specbench.papers.cs_drafting import theory

    tables = {"params": theory.PARAM_COSTS, "leviathan": theory.LEVIATHAN_COSTS}
    if costs not in tables:
        raise SpecbenchError("--costs", f"unknown cost table {costs!r}", "use params or leviathan")
    if temperature not in (0, 1):
        raise SpecbenchError("--temperature", f"no acceptance rates for t={temperature}", "use 0 or 1")
    table = Table(title=f"CS Drafting Table 1 (costs: {costs}, t={temperature})", title_justify="left")
    for column in ("dataset", "Md1", "Md2", "k1", "k2", "paper EWIF", "ours", "simulated", "best k"):
        table.add_column(column, justify="left" if column in ("dataset", "Md1", "Md2") else "right")
    for row in theory.table1_rows(tables[costs], temperature_index=temperature, steps=steps):
        best = f"{row['best_k1']}" + (f", {row['best_k2']}" if row["best_k2"] is not None else "")
        table.add_row(
            row["dataset"],
            row["md1"],
            row["md2"] or "",
            str(row["k1"]),
            str(row["k2"] or ""),
            f"{row['paper_ewif']:.2f}",
            f"{row['ewif']:.3f}",
            f"{row['ewif_sim']:.3f}",
            best,
        )
    Console().print(table)


@theory_app.command("threshold")
@user_errors
def theory_threshold(
    cost: list[float] = typer.Option([0.05, 0.1, 0.3], "--cost", help="Draft pass / target pass (repeat)."),
    tokens: int = typer.Option(40, min=2, max=200, help="Tokens the generation needs."),
    longest: int = typer.Option(6, min=1, max=8, help="Candidates a round may hold."),
):
    """SpecDec++ Theorem 3.1, checked: a small MDP's optimal stopping is a threshold on P(rejection).

    The MDP of candidate lengths is solved exactly (value iteration over every round's candidates).
    Candidates are accepted with chance 0.95, 0.7 or 0.3 (drawn 50/30/20%, seen when drafted). Per
    remaining budget: the largest rejection chance where continuing is optimal, the smallest where
    stopping is, and whether a threshold separates them (specbench/papers/specdecpp/threshold.py).
    """
    from rich.table import Table

    from specbench.papers.specdecpp.threshold import Problem, threshold_check

    for c in cost:
        if not 0 < c < 1:
            raise SpecbenchError("--cost", f"{c} is not a draft-to-target cost ratio", "use 0 < cost < 1")
    out = Console(width=120)
    problem = Problem(tokens=tokens, longest=longest)
    chances = ", ".join(f"{r:g} ({100 * w:g}%)" for r, w in zip(problem.rates, problem.weights, strict=True))
    out.print(
        f"SpecDec++ Theorem 3.1 (Huang et al. 2024), checked on an MDP solved exactly: candidates accepted "
        f"with chance {chances}, seen when drafted; {tokens} tokens to generate, rounds of at most "
        f"{longest} candidates; c = a draft pass over a target pass.",
        highlight=False,
    )
    for c in cost:
        rows = threshold_check(Problem(c=c, tokens=tokens, longest=longest))
        table = Table("tokens left", "continue up to", "stop from", "threshold", title=f"c = {c:g}")
        for row in rows:
            table.add_row(
                str(row["tokens_left"]),
                *(f"{row[k]:.4f}" if row[k] == row[k] else "—" for k in ("continue_up_to", "stop_from")),
                "yes" if row["threshold"] else "no",
            )
        out.print(table)


bigram_app = typer.Typer(help="Argmax bigram tables: the fill of CS Drafting's Max-Gram drafter.")
app.add_typer(bigram_app, name="bigram")


@bigram_app.command("build")
@user_errors
def bigram_build(
    tokenizer: str = typer.Option(..., help="Model source whose tokenizer to use (alias, path or hub id)."),
    corpus: list[Path] = typer.Option(
        ..., help="Text corpus: .jsonl (every string field of every row) or plain text. Repeatable."
    ),
    out: Path = typer.Option(
        ..., help="Where to write the table (a JSON list: entry i = argmax successor of i)."
    ),
):
    """Count token bigrams over a corpus and keep each token's most frequent successor.

    Use the result as a Max-Gram fill: models: {mag: {source: maxgram, options: {bigram: OUT}}}.
    """
    from specbench import sources
    from specbench.drafters.bigram import BigramTable, corpus_texts

    model = sources.load(sources.ModelRequest("tokenizer", tokenizer, device="cpu"))
    texts = corpus_texts(corpus)
    ids = [model.tokenizer(text, add_special_tokens=False).input_ids for text in texts]
    table = BigramTable.build(ids, len(model.tokenizer))
    table.save(out)  # makes its folder
    learned = int((table.next_token != table.next_token.new_tensor(range(len(table)))).sum())
    err.print(f"{out}: {len(table)} entries, {learned} learned from {len(texts)} texts")


specdecpp_app = typer.Typer(help="SpecDec++ (Huang et al. 2024): train the acceptance prediction head.")
app.add_typer(specdecpp_app, name="specdecpp")


@specdecpp_app.command("train")
@user_errors
def specdecpp_train(
    target: str = typer.Option("smollm2-135m-instruct", help="Target model source (alias, path or hub id)."),
    drafter: str = typer.Option(
        "distilled:smollm2-135m-instruct/small",
        help="Draft model source; the head reads its last hidden state.",
    ),
    target_options: str = typer.Option("{}", help="Loader options of the target, as JSON (tiny models)."),
    drafter_options: str = typer.Option("{}", help="Loader options of the drafter, as JSON (tiny models)."),
    name: str = typer.Option("default", help="Head name: <cache>/specdecpp/<target>/<drafter>/<name>."),
    data_dir: Path = typer.Option(
        None,
        "--data-dir",
        envvar="SPECBENCH_DATA_DIR",
        help="Offline data folder with gsm8k/train.jsonl, mmlu/dev.jsonl and alpaca_seed/train.jsonl.",
    ),
    prompts: int = typer.Option(800, min=2, help="Training + evaluation prompts (the data size)."),
    max_new_tokens: int = typer.Option(128, min=1, help="Length cap of the target's responses."),
    eval_fraction: float = typer.Option(0.1, min=0.0, max=0.5, help="Prompts held out for the eval metrics."),
    mixing_ratio: float = typer.Option(
        0.15, min=0.0, max=0.99, help="r: probability a position keeps the target's token (no loss there)."
    ),
    depth: int = typer.Option(3, min=0, help="Residual SiLU blocks of the head (0: one linear layer)."),
    w_acc: float = typer.Option(1.0, min=0.0, help="BCE weight of acceptance."),
    w_rej: float = typer.Option(6.0, min=0.0, help="BCE weight of rejection."),
    epochs: float = typer.Option(3.0, min=0.01, help="Training epochs."),
    batch_size: int = typer.Option(32, min=1, help="Sequences per optimiser step."),
    lr: float = typer.Option(1e-3, min=0.0, help="Peak learning rate (Adam)."),
    warmup_ratio: float = typer.Option(0.03, min=0.0, max=1.0, help="Linear warm-up share of the steps."),
    seed: int = typer.Option(
        42, help="Seed of the split, draft samples, mixing, initialisation and batches."
    ),
    dtype: str = typer.Option("float32", help="Model dtype: float32, float64, bfloat16 or float16."),
    device: str = typer.Option("cpu", help="cpu, cuda, cuda:N or mps."),
    teacher_batch: int = typer.Option(8, min=1, help="Sequences per target / drafter forward pass."),
    prompt_set: str = typer.Option(
        "distill",
        help="distill: distill's prompts (GSM8K train, MMLU dev, Alpaca seeds), --eval-fraction held out; "
        "alpaca: the paper's split, Alpaca's specdecpp-train prompts to train and specdecpp-dev to "
        "evaluate, so a recipe's alpaca specdecpp-test prompts stay unseen.",
    ),
    temperature: float = typer.Option(
        0.0,
        min=0.0,
        help="Sample the target's responses at this temperature (0: greedy; the release samples).",
    ),
    top_p: float = typer.Option(1.0, min=0.0, max=1.0, help="Nucleus cut of the sampled responses."),
    top_k: int = typer.Option(0, min=0, help="Top-k cut of the sampled responses (0: off)."),
):
    """Train SpecDec++'s acceptance head for TARGET and DRAFTER (Sec. 3.3) and save it with a manifest.

    The target's responses, the labels and the draft's hidden states are cached under the specbench
    cache (SPECBENCH_CACHE), so re-training with other head settings skips every model pass.
    """
    import json

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from specbench.drafters import acceptance_head
    from specbench.papers.specdecpp import training

    if data_dir is None:
        raise SpecbenchError(
            "--data-dir",
            "no training data folder",
            "pass --data-dir ../shared/data or set SPECBENCH_DATA_DIR",
        )
    if dtype not in ("float32", "float64", "bfloat16", "float16"):
        raise SpecbenchError(
            "--dtype", f"unknown dtype {dtype!r}", "use float32, float64, bfloat16 or float16"
        )
    if prompt_set not in training.PROMPT_SETS:
        raise SpecbenchError(
            "--prompt-set", f"unknown prompt set {prompt_set!r}", "use " + " or ".join(training.PROMPT_SETS)
        )
    config = training.TrainConfig(
        target=target,
        drafter=drafter,
        target_options=_json_option("--target-options", target_options),
        drafter_options=_json_option("--drafter-options", drafter_options),
        name=name,
        data_dir=str(Path(data_dir).resolve()),
        prompts=prompts,
        max_new_tokens=max_new_tokens,
        eval_fraction=eval_fraction,
        mixing_ratio=mixing_ratio,
        depth=depth,
        w_acc=w_acc,
        w_rej=w_rej,
        epochs=epochs,
        batch_size=batch_size,
        lr=lr,
        warmup_ratio=warmup_ratio,
        seed=seed,
        teacher_batch=teacher_batch,
        dtype=dtype,
        device=device,
        prompt_set=prompt_set,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
    )
    columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn())
    columns += (TextColumn("{task.fields[stats]}"), TimeElapsedColumn())
    with Progress(*columns, console=err) as progress:
        folder = training.train(config, progress)
    manifest = json.loads((folder / acceptance_head.MANIFEST).read_text())
    scores, constant = manifest["eval"], manifest["eval_constant_predictor"]
    err.print(
        f"{folder}: eval binary KL {scores['binary_kl']:.4f} "
        f"(constant predictor {constant['binary_kl']:.4f}), "
        f"accuracy {scores['accuracy']:.1%}, {scores['draft_tokens']} draft tokens, "
        f"{manifest['seconds']['total']:.0f} s\nuse it in a recipe as  head: {manifest['reference']}"
    )


def _json_option(flag: str, value: str) -> dict:
    import json

    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as error:
        raise SpecbenchError(
            flag, f"not valid JSON ({error.msg})", "write an object like '{\"layers\": 2}'"
        ) from None
    if not isinstance(parsed, dict):
        raise SpecbenchError(flag, "must be a JSON object", "write an object like '{\"layers\": 2}'")
    return parsed


def main() -> None:  # pragma: no cover
    app()


def check_output_dir(out: Path) -> None:
    """Results go in a folder of their own: never the current folder or one above it (``-o ''``)."""
    here = Path.cwd().resolve()
    if out.resolve() in (here, *here.parents):
        raise SpecbenchError(
            "--output-dir",
            f"{str(out) if str(out) != '.' else repr(str(out))} is the current folder or one above it: "
            "results would land among other files",
            "name a folder of their own, e.g. -o results/NAME",
        )


def _replace_unencodable() -> None:
    """A terminal or pipe that cannot encode our tables' characters (PYTHONIOENCODING=ascii, a C
    locale) gets '?' for them, not a UnicodeEncodeError after half a table."""
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure") and (stream.encoding or "").lower().replace("-", "") != "utf8":
            stream.reconfigure(errors="replace")


if __name__ == "__main__":  # pragma: no cover
    main()
