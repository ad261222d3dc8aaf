"""Heads published for engines: ``export`` writes an EAGLE-3 head in the layout an engine loads."""

from __future__ import annotations

from pathlib import Path

import typer

from specbench.cli.common import err, user_errors


@user_errors
def export(
    head_dir: Path = typer.Argument(..., help="A published EAGLE-3 head: its config.json and weights."),
    layout: str = typer.Option(
        ..., "--format", help="speculators (vLLM loads it by its config) or eagle (EAGLE / SpecForge)."
    ),
    output: Path = typer.Option(..., "--output", "-o", help="A new folder for the exported head."),
    verifier: str = typer.Option(
        None, help="speculators only: the target named in its config (default: the head's own, if any)."
    ),
):
    """Write an EAGLE-3 head (either layout) in the speculators or the EAGLE layout.

    The export holds the same tensors under the layout's names: loaded back (source eagle3:DIR), it
    drafts exactly as the original.
    """
    from specbench.drafters import head_layouts

    read = head_layouts.export(head_dir, output, layout, verifier)
    err.print(
        f"{output}: the {read.layout}-layout head of {head_dir} in the {layout} layout (digest {read.digest})"
    )
