"""Digest of what `specbench report`, `report --paper`, `compare` and `predict` print on every committed run.

Issue 55 restructures the package with the promise that these commands print the same bytes on every
committed run before and after. This script runs each of them, in this process through typer's
CliRunner (importing torch once instead of per command), and writes one line per command:

    <sha256 of the output>  <bytes>  <exit code>  specbench <arguments>

sorted by command, into OUTPUT (default results/refactor_outputs.txt). The output is stdout, then
"--- stderr ---" and stderr when there is any; a traceback is cut to its last line (``ValueError:
...``: its file paths and line numbers change with any refactoring) and counted at the end, since a
traceback in a report is a bug. The commands are found from ROOT/results (the current directory's by
default): every run directory (a folder holding cells.csv) and every folder of run directories,
each with the report formats, every ``--paper`` view and ``--by category`` (an error is output too,
and must stay the same), and predict with and without ``--profile h100``; compare on every group of
run directories of one recipe (resolved_recipe.yaml's name) and of siblings, and a few chosen pairs.
A folder with load.csv but no cells.csv is reported too (its error); `plot` is left out (it writes
into the run directory).

The environment is fixed before specbench is imported (COLUMNS=160, TERM=dumb, NO_COLOR, no
FORCE_COLOR; the specbench and Hugging Face caches pointed at a folder that does not exist), so the
bytes depend neither on the terminal nor on what this machine downloaded; nothing printed holds a time.
The commands go to the `specbench` entry point of the installed package's metadata, imported from
wherever ``PYTHONPATH`` puts ``specbench`` (its folder is printed first).

    # on the committed code, from a worktree of HEAD
    git worktree add /tmp/base HEAD && cd /tmp/base
    PYTHONPATH=/tmp/base /work/main/.venv/bin/python /work/main/scripts/output_snapshot.py out.txt
    # after a change: which commands print something else (exit status 1 if any), their full outputs kept
    .venv/bin/python scripts/output_snapshot.py --diff results/refactor_outputs.txt --save-dir /tmp/after

570 commands on the committed results (102 of them end in a one-line error, exit code 2): 4 minutes
in one process on the 2-core AMD EPYC dev machine when it is idle, 8-9 when it is shared; a separate
process per command would add about 3 s of imports each. ``--check-subprocess N`` also runs N of the
commands as `specbench` processes and checks that they print the same bytes as in this process.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import subprocess
import sys
import time
import traceback
from collections import defaultdict
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

# no model cache either: a roofline prices a model by the config.json in the specbench or Hugging Face
# cache when one is there (a trained drafter's only there), so what this machine downloaded would show
ABSENT_CACHE = "/nonexistent/output-snapshot"
FIXED_ENVIRONMENT = {
    "COLUMNS": "160",
    "LINES": "50",
    "TERM": "dumb",
    "NO_COLOR": "1",
    "PYTHONIOENCODING": "utf-8",
    "SPECBENCH_CACHE": f"{ABSENT_CACHE}/specbench",
    "HF_HOME": f"{ABSENT_CACHE}/huggingface",
    "HF_HUB_OFFLINE": "1",
}
UNSET_ENVIRONMENT = (
    "FORCE_COLOR",
    "TTY_COMPATIBLE",
    "TTY_INTERACTIVE",
    "JUPYTER_COLUMNS",
    "JUPYTER_LINES",
    "HF_HUB_CACHE",
    "HUGGINGFACE_HUB_CACHE",
    "TRANSFORMERS_CACHE",
)

PAPER_VIEWS = ("cs-drafting-table2", "cs-drafting-table3", "spec-cascades-table2", "specdecpp")
# runs compared beside the groups found automatically: same recipe on another dtype or engine, or a
# recipe with more repeats; a pair whose directory is gone is skipped (and shows as a removed command)
CHOSEN_COMPARISONS = (
    ("results/drafters/smollm2_offline", "results/drafters/smollm2_offline_repeats"),
    (
        "results/prediction/amd-epyc-family26-avx512-bf16/demo",
        "results/prediction/amd-epyc-family26-avx512-bf16/demo_float32",
        "results/prediction/amd-epyc-family26-avx512-bf16/demo_compiled",
    ),
    (
        "results/heads/smollm2_eagle_gpu_eager/nvidia-h100-80gb",
        "results/heads/smollm2_eagle_gpu/nvidia-h100-80gb",
        "results/heads/smollm2_eagle_gpu_graphs/nvidia-h100-80gb",
    ),
    ("results/demo/amd-epyc-family25-avx2", "results/quickstart"),
)
STDERR_MARK = "--- stderr ---\n"
TRACEBACK_HEAD = "Traceback (most recent call last):"


@dataclass(frozen=True)
class Outcome:
    exit_code: int
    text: str  # stdout, then STDERR_MARK and stderr where there is any
    traceback: str = ""  # the full traceback, for --save-dir; the text keeps its last line only

    @property
    def data(self) -> bytes:
        return self.text.encode("utf-8")

    def line(self, command: tuple[str, ...]) -> str:
        digest = hashlib.sha256(self.data).hexdigest()
        return f"{digest}  {len(self.data)}  {self.exit_code}  {' '.join(('specbench', *command))}"


# -- the commands ----------------------------------------------------------------------------------


def run_directories(results: Path) -> list[Path]:
    """Every folder below ``results`` holding a cells.csv, relative to the current directory."""
    return sorted(path.parent for path in results.rglob("cells.csv"))


def recipe_name(run: Path) -> str:
    match = re.search(r"^name:\s*(\S.*?)\s*$", _read(run / "resolved_recipe.yaml"), re.MULTILINE)
    return match.group(1).strip("'\"") if match else ""


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8") if path.is_file() else ""


def commands(results: Path) -> list[tuple[str, ...]]:
    runs = run_directories(results)
    folders = sorted({run.parent for run in runs if not (run.parent / "cells.csv").is_file()})
    # a folder is reported whole when it holds two run directories or more one level below it
    folders = [f for f in folders if sum(run.parent == f for run in runs) >= 2]
    loads = sorted(p.parent for p in results.rglob("load.csv") if not (p.parent / "cells.csv").is_file())
    found: list[tuple[str, ...]] = [("report",)]  # its default argument: ./results
    for target in [*runs, *folders]:
        path = str(target)
        found += [("report", path), *(("report", path, "--format", fmt) for fmt in ("csv", "markdown"))]
        found += [("report", path, "--paper", view) for view in PAPER_VIEWS]
        found.append(("report", path, "--by", "category"))
    for run in runs:
        found += [("predict", str(run)), ("predict", str(run), "--profile", "h100")]
    found += [("report", str(load)) for load in loads]
    for group in same_recipe_groups(runs):
        found += [("compare", *group), ("compare", *group, "--allow-incomparable")]
        found += [("compare", *group, "--format", fmt) for fmt in ("csv", "markdown")]
    existing = {str(run) for run in runs}
    for group in (group for group in CHOSEN_COMPARISONS if set(group) <= existing):
        found += [("compare", *group), ("compare", *group, "--allow-incomparable")]
    return sorted(set(found))


def same_recipe_groups(runs: list[Path]) -> list[tuple[str, ...]]:
    """The runs of each recipe (resolved_recipe.yaml's name), and the sibling runs among them, when two
    or more: one recipe measured on several machines or under several loads."""
    groups: dict[tuple[str, Path | None], list[Path]] = defaultdict(list)
    for run in runs:
        name = recipe_name(run)
        if name:
            groups[name, None].append(run)
            groups[name, run.parent].append(run)
    return sorted({tuple(str(run) for run in group) for group in groups.values() if len(group) >= 2})


# -- running them ----------------------------------------------------------------------------------


def run_in_process(command: tuple[str, ...]) -> Outcome:
    from typer.testing import CliRunner

    result = CliRunner().invoke(entry_point(), list(command), prog_name="specbench")
    stdout, stderr = result.stdout, result.stderr
    full = ""
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        full = "".join(traceback.format_exception(*result.exc_info))
        stderr += full
    return Outcome(result.exit_code, _joined(stdout, _last_line_of_traceback(stderr)), full)


def entry_point():
    """The `specbench` command's app (``specbench.cli:app`` today), wherever the package declares it."""
    (point,) = metadata.entry_points(group="console_scripts", name="specbench")
    return point.load()


def run_as_process(command: tuple[str, ...]) -> Outcome:
    executable = Path(sys.executable).with_name("specbench")
    done = subprocess.run([str(executable), *command], capture_output=True, text=True, env=dict(os.environ))
    return Outcome(done.returncode, _joined(done.stdout, _last_line_of_traceback(done.stderr)))


def _last_line_of_traceback(stderr: str) -> str:
    head, found, tail = stderr.partition(TRACEBACK_HEAD)
    if not found:
        return stderr
    last = [line for line in tail.splitlines() if line.strip()][-1]
    return f"{head}{TRACEBACK_HEAD} ... {last}\n"


def _joined(stdout: str, stderr: str) -> str:
    return stdout + (STDERR_MARK + stderr if stderr else "")


def save(directory: Path, command: tuple[str, ...], outcome: Outcome) -> None:
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", " ".join(command)).strip("_")[:200]
    digest = hashlib.sha256(" ".join(command).encode()).hexdigest()[:8]
    (directory / f"{name}.{digest}.txt").write_text(
        f"$ specbench {' '.join(command)}\n# exit {outcome.exit_code}\n{outcome.text}{outcome.traceback}",
        encoding="utf-8",
    )


def read_snapshot(path: Path) -> dict[str, str]:
    """command -> its line, from a snapshot file."""
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line and line[0] != "#"]
    return {line.split("  ", 3)[3]: line for line in lines}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default = "default results/refactor_outputs.txt; with --diff, none"
    parser.add_argument("output", nargs="?", type=Path, help=default)
    parser.add_argument("--root", type=Path, default=Path("."), help="the tree whose results/ is read")
    parser.add_argument("--diff", type=Path, help="a snapshot to compare with: the commands that changed")
    parser.add_argument("--save-dir", type=Path, help="keep every command's full output here")
    parser.add_argument("--check-subprocess", type=int, default=0, metavar="N", help="N commands run twice")
    parser.add_argument("--only", default="", help="only the commands containing this text")
    args = parser.parse_args()
    output = args.output or (None if args.diff else Path("results/refactor_outputs.txt"))
    output = output and output.resolve()
    old = read_snapshot(args.diff.resolve()) if args.diff else None
    save_dir = args.save_dir and args.save_dir.resolve()
    if save_dir:
        save_dir.mkdir(parents=True, exist_ok=True)
    if Path(ABSENT_CACHE).exists():
        parser.error(f"{ABSENT_CACHE} exists: remove it, the commands must find no model cache")
    # rich reads these when a console is made, and specbench makes one at import: fix them first
    os.environ.update(FIXED_ENVIRONMENT)
    for name in UNSET_ENVIRONMENT:
        os.environ.pop(name, None)
    os.chdir(args.root)

    import specbench

    where = f"specbench from {Path(specbench.__file__).parent}, results from {Path('results').resolve()}"
    print(where, file=sys.stderr)
    todo = [c for c in commands(Path("results")) if args.only in " ".join(c)]
    start = time.perf_counter()
    lines, tracebacks = {}, []
    for number, command in enumerate(todo, 1):
        outcome = run_in_process(command)
        key = " ".join(("specbench", *command))
        lines[key] = outcome.line(command)
        if TRACEBACK_HEAD in outcome.text:
            tracebacks.append(f"{key}: {outcome.text.rsplit(' ... ', 1)[-1].strip()}")
        if save_dir:
            save(save_dir, command, outcome)
        if number % 50 == 0:
            print(f"{number}/{len(todo)} commands, {time.perf_counter() - start:.0f} s", file=sys.stderr)
    print(f"{len(todo)} commands in {time.perf_counter() - start:.0f} s", file=sys.stderr)
    for line in tracebacks:
        print(f"traceback: {line}", file=sys.stderr)

    mismatched = check_subprocess(todo, args.check_subprocess, lines)
    if output:
        header = "# what specbench prints (scripts/output_snapshot.py): sha256, bytes, exit code, command\n"
        output.write_text(header + "".join(f"{lines[key]}\n" for key in sorted(lines)), encoding="utf-8")
    if old is None:
        return 1 if mismatched else 0
    changed = sorted(key for key in lines.keys() & old.keys() if lines[key] != old[key])
    for key in changed:
        print(f"changed: {key}\n  was {_described(old[key])}\n  now {_described(lines[key])}")
    for key in sorted(lines.keys() - old.keys()):
        print(f"new: {key}")
    for key in sorted(old.keys() - lines.keys()):
        if not args.only:
            print(f"gone: {key}")
    differs = changed or lines.keys() - old.keys() or (not args.only and old.keys() - lines.keys())
    print("same output on every command" if not differs else f"{len(changed)} commands print other bytes")
    return 1 if differs or mismatched else 0


def _described(line: str) -> str:
    digest, size, exit_code, _ = line.split("  ", 3)
    return f"sha256 {digest[:16]}…, {size} bytes, exit code {exit_code}"


def check_subprocess(todo: list[tuple[str, ...]], count: int, lines: dict[str, str]) -> int:
    """Run ``count`` commands (spread over the list) as processes; the number whose bytes differ."""
    if count <= 0:
        return 0
    mismatched = 0
    for command in todo[:: max(1, len(todo) // count)][:count]:
        key = " ".join(("specbench", *command))
        if run_as_process(command).line(command) != lines[key]:
            mismatched += 1
            print(f"differs as a process: {key}", file=sys.stderr)
    print(f"{count} commands run as processes too, {mismatched} differ", file=sys.stderr)
    return mismatched


if __name__ == "__main__":
    sys.exit(main())
