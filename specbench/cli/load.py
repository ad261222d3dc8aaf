"""``specbench load``: engine cells served and measured under concurrent load."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

from specbench.cli.common import check_output_dir, err, user_errors


@user_errors
def load(
    recipe: Path = typer.Argument(
        ..., help="Recipe YAML with a load: section and methods whose target runs on a serving engine."
    ),
    output_dir: Path = typer.Option(..., "--output-dir", "-o", help="Where load.csv goes."),
    resume: bool = typer.Option(
        False, "--resume", help="Measure only the levels and repeats load.csv does not hold complete."
    ),
    reference: Path | None = typer.Option(
        None,
        "--reference",
        help="A specbench run of this recipe whose AR rows check the outputs under load (default: "
        "OUTPUT_DIR when a run shares it).",
    ),
):
    """Engine cells under load: each cell's engine served on 127.0.0.1 (vllm serve on a free port),
    driven by an async streaming client at every level of the recipe's load: section (concurrency:
    requests in flight; request_rate: Poisson or gamma arrivals per second), each level repeats times,
    the servers restarted each repeat in turn; per level throughput, per-request speed,
    TTFT/TPOT/end-to-end p50/p90/p99, goodput under the SLO, acceptance from the server's counters, and
    the speedup over the same engine's AR cell at the same load, each with its 95% interval; at
    temperature 0 every output against the engine's batch-1 AR and specbench's AR (identical / tie /
    mismatch, a "!" line where one differs beyond a tie); an engine: openai model is a server specbench
    did not start, measured at its base_url as it runs; into
    OUTPUT_DIR/load.csv (per repeat), load_requests.jsonl (per request) and load_summary.csv (per
    level). The server is always stopped, on errors and Ctrl-C too. Plot: `specbench plot DIR --figure
    load`."""
    from specbench.pipeline.experiments.load_run import run_load
    from specbench.pipeline.views.load_view import equivalence_flags, load_table
    from specbench.recipe import load_recipe
    from specbench.tasks import TASKS

    spec = load_recipe(recipe, known_tasks=TASKS)
    check_output_dir(output_dir)
    out = run_load(spec, output_dir, err, resume, reference)
    import io

    import pandas as pd

    from specbench.engines.load import LOAD_SUMMARY, read_verified

    console = Console()
    if not console.is_terminal:  # piped or captured: do not squeeze the table into 80 columns
        console = Console(width=340)
    text = read_verified(out / LOAD_SUMMARY)
    summary = pd.read_csv(io.StringIO(text), dtype={"cell": str}).to_dict("records")
    console.print(load_table(summary, f"{spec.name} under load ({out})"))
    for line in equivalence_flags(summary):
        console.print(f"[red]{escape(line)}[/red]")
