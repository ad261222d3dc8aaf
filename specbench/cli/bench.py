"""``specbench bench``: our decoding loops against Hugging Face generate on each engine."""

from __future__ import annotations

import typer
from rich.console import Console

from specbench.cli.common import user_errors


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
        "linear layers on oneDNN's reordered weights: a recipe's linear: onednn), inductor (compiled, "
        "weights frozen into inductor's autotuned GEMM templates: linear: inductor; CPU), e.g. "
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
    from specbench.models.options import parse_loader_options
    from specbench.pipeline.experiments.bench import parse_engines, print_bench, run_bench

    console = Console()
    if not console.is_terminal:  # piped into a file: do not squeeze the table into 80 columns
        console = Console(width=160)
    options = {
        name: parse_loader_options(f"--{name}", value)
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
