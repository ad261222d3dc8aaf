"""The papers' commands on the command line: the shared ``theory`` group and each paper's own groups,
built from :mod:`specbench.papers.commands`' registries (a new paper command touches nothing here)."""

from __future__ import annotations

import typer

from specbench.cli.common import user_errors
from specbench.papers.commands import COMMANDS, GROUPS, THEORY, theory_help


def add_theory(app: typer.Typer) -> None:
    """``specbench theory ...``: every paper's check of its theory."""
    _add_group(app, THEORY, theory_help())


def add_paper_groups(app: typer.Typer) -> None:
    """``specbench specdecpp ...`` and every other group a paper declares."""
    for group in GROUPS.values():
        _add_group(app, group.name, group.help)


def _add_group(app: typer.Typer, name: str, help: str) -> None:
    group = typer.Typer(help=help)
    for command in COMMANDS.values():
        if command.group == name:
            group.command(command.name)(user_errors(command.run))
    app.add_typer(group, name=name)
