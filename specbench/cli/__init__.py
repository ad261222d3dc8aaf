"""The ``specbench`` command line: one module per group of commands, each command parsing its options
and handing over to the module that does the work (imported inside it, so ``specbench --help`` stays
fast). The papers' own commands are declared in their folders and collected by :mod:`.papers`.

The commands are registered here, in the order ``specbench --help`` lists them.
"""

from __future__ import annotations

import typer

from specbench.cli import bench, costs, heads, load, papers, plot, results, run, serving, training

app = typer.Typer(
    help="Benchmark speculative-decoding algorithms and reproduce their papers' tables.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command()(run.run)
app.command()(run.tune)
app.command(cls=results.REPORT_COMMAND)(results.report)
app.command()(results.compare)
app.command()(results.check)
app.command()(results.site)
app.command()(costs.plan)
app.command()(costs.probe)
app.command()(costs.predict)
app.command()(bench.bench)
app.command()(training.distill)
app.command()(heads.export)
app.command(cls=plot.PLOT_COMMAND)(plot.plot)
app.command()(load.load)
app.command(cls=serving.SERVING_COMMAND)(serving.serving)
papers.add_theory(app)
app.add_typer(training.bigram_app, name="bigram")
papers.add_paper_groups(app)


def main() -> None:  # pragma: no cover
    app()
