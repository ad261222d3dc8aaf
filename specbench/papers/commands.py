"""The commands a paper folder adds to ``specbench``, and the registries that collect them.

A folder declares, in its ``commands`` module, ``COMMANDS``: :class:`Command` records, each a typer
function (its parameters are the options, its docstring the help) placed in a group, and ``GROUPS``
for groups of its own (``specbench specdecpp train``). The shared group :data:`THEORY` gathers every
paper's check of its theory; its help lists them. The command line registers what these registries
hold, so a paper's new command touches no file of :mod:`specbench.cli`.

Nothing here or in a folder's ``commands`` imports more than typer and rich at module level, and a
folder's ``__init__`` loads its views only when they are read (:func:`views_on_demand`): the command
line imports every folder to build itself, and ``specbench --help`` must not wait for torch.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass

from specbench.registry import Registry

THEORY = "theory"  # the group of the papers' theory checks: specbench theory table1, threshold, ...


@dataclass(frozen=True)
class Group:
    """A command group of one paper's own (``specbench specdecpp ...``)."""

    name: str
    help: str


@dataclass(frozen=True)
class Command:
    """``specbench GROUP NAME``: ``run``'s parameters are its typer options, its docstring the help."""

    group: str  # THEORY, or a Group that a paper folder declares
    name: str
    run: Callable[..., None]
    summary: str = ""  # what the theory group's help says of it (commands of THEORY only)


def _paper_folder(module: pkgutil.ModuleInfo) -> bool:
    return module.ispkg


COMMANDS: Registry[Command] = Registry(
    "paper command",
    "specbench.papers",
    "COMMANDS",
    name=lambda c: f"{c.group} {c.name}",
    modules=_paper_folder,
)
GROUPS: Registry[Group] = Registry("paper command group", "specbench.papers", "GROUPS", modules=_paper_folder)


def theory_help() -> str:
    """The theory group's help: the summary of each paper's theory command."""
    checks = "; ".join(command.summary for command in COMMANDS.values() if command.group == THEORY)
    return f"The papers' theory: {checks}."


def views_on_demand(folder: str) -> Callable[[str], object]:
    """A paper folder's module ``__getattr__``: its ``PAPERS``, ``FIGURES`` and ``SECTIONS``, declared in
    its ``views`` (which imports pandas and torch), load when a registry first reads them."""

    def __getattr__(name: str) -> object:
        if name in ("PAPERS", "FIGURES", "SECTIONS"):
            views = importlib.import_module(f"{folder}.views")
            if hasattr(views, name):
                return getattr(views, name)
        raise AttributeError(f"module {folder!r} has no attribute {name!r}")

    return __getattr__
