"""What every command shares: one-line user errors, the output folder check, the threads check,
comma-separated integers, printing a rendered table, and option help read from a registry only when
``--help`` asks for it."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperCommand

from specbench.errors import SpecbenchError

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


def check_output_dir(out: Path) -> None:
    """Results go in a folder of their own: never the current folder or one above it (``-o ''``), nor
    a folder of other files that holds no run (a run's files would mix with the user's)."""
    from specbench.engines.load import LOAD_CSV
    from specbench.pipeline.records.results import CELLS, ENVIRONMENT, EXAMPLES, LOCK, MARKER, RESOLVED_RECIPE

    here = Path.cwd().resolve()
    if out.resolve() in (here, *here.parents):
        raise SpecbenchError(
            "--output-dir",
            f"{str(out) if str(out) != '.' else repr(str(out))} is the current folder or one above it: "
            "results would land among other files",
            "name a folder of their own, e.g. -o results/NAME",
        )
    if out.is_dir():
        entries = sorted(path.name for path in out.iterdir())
        run_files = {EXAMPLES, CELLS, ENVIRONMENT, RESOLVED_RECIPE, LOCK, MARKER, LOAD_CSV}
        if entries and not run_files & set(entries):
            shown = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
            raise SpecbenchError(
                "--output-dir",
                f"{out} holds other files ({shown}) and no run: the run's files would mix with them",
                f"name a new folder, e.g. -o {out / 'run'}",
            )


# --threads above the cores: a warning (the threads take turns on the cores, and the timings show it);
# this many times the cores or more: an error (thousands of threads only thrash the machine)
THREADS_FAR_ABOVE_CORES = 4


def check_threads(threads: int | None, where: str = "--threads") -> None:
    """torch's intra-op threads against this machine's cores, before any work: more than
    THREADS_FAR_ABOVE_CORES times the cores is a one-line error, more than the cores a warning."""
    cores = os.cpu_count() or 1
    if threads is None or threads <= cores:
        return
    if threads > THREADS_FAR_ABOVE_CORES * cores:
        raise SpecbenchError(
            where,
            f"{threads} threads on a machine of {cores} cores: the threads would only take turns",
            f"use at most {cores} (one per core), or leave it out for torch's default",
        )
    err.print(
        f"[yellow]warning:[/yellow] {escape(where)}: {threads} threads on {cores} cores: they take turns "
        "on the cores, and the timings show it",
        highlight=False,
    )


def int_list(value: str, flag: str, minimum: int = 1) -> list[int]:
    """``1,2,4`` as sorted distinct integers of at least ``minimum``; a one-line error otherwise."""
    try:
        numbers = [int(part) for part in value.split(",") if part.strip()]
    except ValueError:
        numbers = []
    if not numbers or min(numbers) < minimum:
        raise SpecbenchError(
            flag, f"{value!r} is not a list of integers >= {minimum}", f"write e.g. {flag} 1,2,4"
        )
    return sorted(set(numbers))


def write_text(text: str | None) -> None:
    """A rendered table (csv, markdown, latex) to stdout, ending in one newline; ``None``: Rich printed it."""
    if text is not None:
        sys.stdout.write(text + ("" if text.endswith("\n") else "\n"))


def help_from(**helps: Callable[[], str]) -> type[TyperCommand]:
    """A command class whose options named in ``helps`` read their help from it when ``--help`` is shown.

    Such help lists a registry's entries, and reading the papers' registries imports pandas and torch:
    seconds that ``specbench --help`` and every run of the command would otherwise pay.
    """

    class RegistryHelp(TyperCommand):
        def format_help(self, ctx, formatter) -> None:
            for param in self.params:
                if param.name in helps:
                    param.help = helps[param.name]()
            super().format_help(ctx, formatter)

    return RegistryHelp


def _replace_unencodable() -> None:
    """A terminal or pipe that cannot encode our tables' characters (PYTHONIOENCODING=ascii, a C
    locale) gets '?' for them, not a UnicodeEncodeError after half a table."""
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure") and (stream.encoding or "").lower().replace("-", "") != "utf8":
            stream.reconfigure(errors="replace")
