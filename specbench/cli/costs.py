"""What runs cost: ``plan`` (a recipe's bill before anything loads), ``probe`` (a machine's cost profile)
and ``predict`` (a run's cells under another pass cost)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import typer
from rich.console import Console

from specbench.cli.common import check_threads, err, int_list, user_errors, write_text
from specbench.errors import SpecbenchError


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
        help="A cost profile (specbench probe): time per pass of the models it probed (by recipe name "
        "and weights), as a one-token pass after half the recipe's longest sequence.",
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
    earlier run in --output-dir, or weight bytes / --bandwidth. Every assumption is printed with the numbers,
    and a warning where a model would compute in bfloat16 on this CPU without bfloat16 matrix units (AMX,
    AVX512-BF16), where a verification pass can cost several one-token passes.

    Example: specbench plan recipes/specdecpp/llama2_chat_7b_70b.yaml --gpus 2 --gpu-memory 80GiB
    """
    from specbench.pipeline.planning import plan as planning
    from specbench.pipeline.planning.placement import parse_size
    from specbench.pipeline.views.plan_view import plan_json, print_plan
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
        from specbench.pipeline.analysis.profiles import read_profile

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
    error), under the model's recipe name with its weights (source, revision, options), dtype and
    engine, and the machine and versions. `specbench predict RUN --profile FILE` then says what a run
    measured elsewhere would take here. The grid is bounded before any model loads, and by each model's
    context before any pass is timed. Example:
    specbench probe recipes/demo.yaml --out profile.json
    """
    import torch
    from rich.progress import Progress

    from specbench.pipeline.analysis.profiles import write_profile
    from specbench.pipeline.experiments import probe as probing
    from specbench.recipe import load_recipe
    from specbench.tasks import TASKS

    if out.is_dir():
        raise SpecbenchError(
            "--out", f"{out} is a directory", f"name the file to write, e.g. {out / 'profile.json'}"
        )
    folder = next(p for p in (out.parent, *out.parent.parents) if p.exists())  # before minutes of probing
    if not folder.is_dir() or not os.access(folder, os.W_OK):
        raise SpecbenchError(
            "--out", f"cannot write under {folder} (not a writable folder)", "name another file"
        )
    loaded = load_recipe(recipe, known_tasks=set(TASKS))
    check_threads(
        threads if threads is not None else loaded.threads, "--threads" if threads else f"{recipe}: threads"
    )
    if threads is not None:  # a recipe is frozen: a copy with the threads, as run --threads makes
        loaded = loaded.model_copy(update={"threads": threads})
    grid = [int_list(sizes, "--sizes"), int_list(contexts, "--contexts", minimum=0)]
    probing.check_grid(*grid)
    models = probing.load_models(loaded, *grid)  # checked against each model's context before timing
    with Progress(console=err) as progress:
        task = progress.add_task("probing", total=len(models.models) * rounds * len(grid[0]) * len(grid[1]))
        advance = lambda: progress.advance(task)  # noqa: E731
        profile = probing.probe_recipe(loaded, *grid, rounds=rounds, progress=advance, loaded=models)
    if roofline:
        dtype = profile["dtype"].split("+")[0] or "float32"
        profile["roofline"] = probing.measure_roofline(dtype) | {"threads": torch.get_num_threads()}
    write_profile(profile, out)
    for name, entry in profile["models"].items():
        quality = entry["quality"]
        err.print(
            f"{name} ({entry['source']}): {entry['dtype']} {entry['engine']}, one-token pass "
            f"{1000 * entry['table']['alpha'][0]:.2f} ms + {1e6 * entry['table']['gamma'][0]:.2f} µs per "
            f"cached position; fit R² {quality['r2']:.4f}, "
            f"median error {100 * quality['median_relative_error']:.1f}%"
        )
    for name, why in profile.get("not_probed", {}).items():
        err.print(f"{name}: not probed ({why})")
    err.print(f"profile written to {out}")


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
        None,
        "--against",
        help="A run of the same recipe measured where the profile was (its machine, and each model in the "
        "dtype and engine the profile prices it in): its speedups. Another experiment is refused.",
    ),
    dtype: str = typer.Option(
        None,
        "--dtype",
        help="With a roofline (a device, or --roofline): the dtype to cost the models in. A probe's "
        "entries are priced in the dtype they were probed in: --dtype with them is refused.",
    ),
    roofline: bool = typer.Option(
        False,
        "--roofline",
        help="Price every model by the roofline of the profile's device (the bandwidth and peak that "
        "probe --roofline measured), not by its probed passes. Without it, a run's model the profile did "
        "not probe is refused.",
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
    from specbench.models.facts import DTYPE_BYTES
    from specbench.pipeline.views import prediction_view

    if dtype is not None and dtype not in DTYPE_BYTES:
        raise SpecbenchError("--dtype", f"unknown dtype {dtype!r}", f"use one of {', '.join(DTYPE_BYTES)}")
    if loop not in ("auto", "measured", "none"):
        raise SpecbenchError("--loop", f"unknown value {loop!r}", "use auto, measured or none")
    if format not in ("table", "csv", "markdown"):
        raise SpecbenchError("--format", f"unknown format {format!r}", "use table, csv or markdown")
    text = prediction_view.render(
        run_dir, profile, against, dtype, None if loop == "auto" else loop == "measured", format, roofline
    )
    if text:
        write_text(text)
