"""Run a recipe: for every dataset and cell, every example, one Generation, one result row.

The runner owns the run directory: its lock, examples.jsonl (through :class:`ExampleLog`, the only
writer), ``--resume`` by the rows' content keys, cells.csv and environment.json. What one example
measures is :class:`~specbench.pipeline.run.measure.Measurer`'s (the runner is one); an ``executor`` (the
Ray one, :mod:`specbench.pipeline.run.ray_executor`) measures the rows elsewhere and hands them back here
to be written, otherwise this process measures them in :func:`~specbench.pipeline.run.schedule.work_order`.
An executor has ``run(runner, order) -> failed cells`` (it hands each row to :meth:`Runner.record`) and
``amend_environment(directory, started)`` (what its workers loaded, added to environment.json).
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import yaml
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from specbench.engines import EngineModel
from specbench.errors import SpecbenchError
from specbench.methods import BASELINE
from specbench.models.machine import cpu_times, others_share, recorded_machine
from specbench.pipeline.analysis.summary import write_cells_csv
from specbench.pipeline.records.results import (
    CELLS,
    ENVIRONMENT,
    EXAMPLES,
    REJECTED,
    RESOLVED_RECIPE,
    ExampleLog,
    RunLock,
    check_format,
    machines_of,
    read_cells_csv,
    read_environment,
    write_atomic,
)
from specbench.pipeline.records.rows import gold_sha
from specbench.pipeline.run.datasets import DatasetRun, load_datasets
from specbench.pipeline.run.environment import now, write_environment
from specbench.pipeline.run.head_identity import check_heads_unchanged
from specbench.pipeline.run.measure import CellModels, Measurer
from specbench.pipeline.run.schedule import work_order
from specbench.recipe import Cell, Recipe
from specbench.tasks import Example


class Runner(Measurer):
    def __init__(
        self,
        recipe: Recipe,
        output_dir: Path,
        *,
        limit: int | None = None,
        resume: bool = False,
        console: Console | None = None,
        schedule: str | None = None,  # overrides the recipe's (tuning runs measure by cell)
        executor=None,  # measures the rows elsewhere (RayExecutor); None: in this process
        allow_other_machine: bool = False,  # measure here beside another machine's rows, kept apart
        extend: bool = False,  # resume with another recipe that produces every recorded row
    ):
        super().__init__(recipe, console)
        self.output_dir = Path(output_dir)
        self.limit = limit
        if self.output_dir.exists() and not self.output_dir.is_dir():
            raise SpecbenchError(
                str(self.output_dir), "is a file, not a directory", "choose another --output-dir"
            )
        log_path = self.output_dir / EXAMPLES
        if log_path.exists() and log_path.stat().st_size and not resume:
            raise SpecbenchError(
                str(self.output_dir),
                "already holds results of a run",
                "pass --resume to continue it (finished rows are kept), or choose another --output-dir",
            )
        self.log = ExampleLog(log_path, load=False)  # read under the lock when a run starts
        self.started = now()
        self.cpu_at_start, self.loadavg_at_start = cpu_times(), _loadavg()
        self.written = 0  # rows this process appended
        self.schedule = schedule or recipe.schedule
        self.executor = executor
        self.allow_other_machine = allow_other_machine
        self.extend = extend

    def recorded(self, key: str) -> dict | None:
        return self.log.by_key.get(key)

    def datasets(self) -> list[DatasetRun]:
        return load_datasets(self.recipe, self.limit, self._blame)

    # -- running ---------------------------------------------------------------------------

    def run(self, plan: list[tuple[DatasetRun, list[Cell]]] | None = None) -> Path:
        """Run every cell on every example, or only ``plan``: (dataset, its cells) pairs, e.g. a tune's
        round (a dataset's examples cut short, a subset of cells)."""
        recipe = self.recipe
        self._whole_recipe = plan is None  # a tune's round runs part of its recipe on purpose
        if plan is None:
            plan = [(dataset, recipe.cells()) for dataset in self.datasets()]

        # AR first, specbench's own before an engine's: the lossless check's reference, and what
        # replayed cells replay
        def order(cell: Cell) -> tuple[bool, bool]:
            return cell.method != BASELINE, recipe.reference_model(cell.target) != cell.target

        plan = [(dataset, sorted(cells, key=order)) for dataset, cells in plan]
        try:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            lock = RunLock(self.output_dir)
        except OSError as error:  # read-only, no permission, a name too long
            raise SpecbenchError(
                str(self.output_dir),
                f"cannot be written ({error.strerror or error})",
                "choose a writable --output-dir",
            ) from None
        try:
            return self._run_locked(plan)
        finally:
            self.close_engines()
            lock.release()

    def _run_locked(self, plan: list[tuple[DatasetRun, list[Cell]]]) -> Path:
        recipe = self.recipe
        check_format(self.output_dir)
        self.log = ExampleLog(self.output_dir / EXAMPLES, repair=True)
        for bad in self.log.rejected:
            self.console.print(
                f"[yellow]{escape(str(self.log.path))} line {bad.number} {escape(bad.why)}: moved to "
                f"{REJECTED}; its row is computed again[/yellow]"
            )
        environment = read_environment(self.output_dir)
        self._check_same_setup(environment)
        if self._whole_recipe:
            self._check_same_recipe(environment)
            self._check_rows_belong(plan, environment)
        done = self.log.done
        check_not_trained_on(self.recipe, plan)
        self._preflight(plan, done)
        written_before = self.written
        order = work_order(
            plan, lambda d, c, e: self.row_key(c, d, e) not in done, self.schedule, self.recipe.seed
        )
        resolved = self.output_dir / RESOLVED_RECIPE
        if order or not resolved.exists():  # a resume with nothing to run rewrites nothing
            write_atomic(resolved, yaml.safe_dump(recipe.resolved(), sort_keys=False))
        self._todo = Counter((dataset.label, cell.id) for dataset, cell, _ in order)
        self._cells: dict[tuple[str, str], _CellState] = {}
        total = sum(len(dataset.examples) * len(cells) for dataset, cells in plan)
        with Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[stats]}"),
            TimeElapsedColumn(),
            console=self.console,
            transient=False,
        ) as progress:
            self._progress = progress
            self._overall = progress.add_task("all cells", total=total, stats="")
            progress.advance(self._overall, total - len(order))
            failed = self._run_here(order) if self.executor is None else self.executor.run(self, order)
        ran = self.written > written_before
        if ran or not (self.output_dir / ENVIRONMENT).exists():
            self._write_environment(ended=True)
        if ran or not _readable(self.output_dir / CELLS):  # a resume that ran nothing rewrites nothing
            self._write_cells(plan, read_environment(self.output_dir))
        if failed:
            raise SpecbenchError(
                str(self.output_dir),
                f"{len(failed)} cell(s) failed, the others' rows are written: {'; '.join(failed)}",
                "fix the cause and run again with --resume (finished rows are kept)",
            )
        return self.output_dir

    def _run_here(self, order: list[tuple[DatasetRun, Cell, Example]]) -> list[str]:
        """The local executor: every row in ``order``, in this process; the first error stops the run."""
        for i, (dataset, cell, example) in enumerate(order):
            state = self._cell(dataset, cell)
            if state.models is None:
                state.models = self.start_cell(dataset, cell)
            self.record(dataset, cell, self.measure(dataset, cell, example, state.models))
            if not state.left:
                self.sample_gpu(dataset, cell, "end")
            if i + 1 < len(order):
                self._stop_engine_left(cell, order[i + 1][1])
        return []

    def _stop_engine_left(self, cell: Cell, following: Cell) -> None:
        """In a by-cell run, stop a served target's engine when the next row is another target's: one
        engine's memory at a time (issue 59's recipes serve one pair in vLLM and in two llama.cpp files
        beside specbench's own copies); it starts again, outside any walltime, if a later cell needs it.
        An interleaved run returns to every engine row by row, so it keeps them."""
        if self.schedule != "by-cell" or following.target == cell.target:
            return
        model = self.models.get(cell.target)
        if isinstance(model, EngineModel):
            model.close()

    def record(self, dataset: DatasetRun, cell: Cell, row: dict) -> None:
        """Append one measured row of ``cell`` (this process's or an executor's) and advance its bars."""
        if not self.written:  # this session's versions are on disk before its first row
            self.log.mark()  # after checksums.json: a session records that its rows carry checksums
            self._write_environment(ended=False)
        self.log.append(row)
        self.written += 1
        state = self._cell(dataset, cell)
        state.tokens += row["n_tokens"]
        state.steps += len(row["steps"])
        stats = f"acc.len {state.tokens / max(state.steps, 1):.2f}"
        if not cell.replay:
            state.seconds += row["walltime"]
            stats += f" · {state.tokens / max(state.seconds, 1e-9):.1f} tok/s"
        self._progress.update(state.bar, advance=1, stats=stats)
        self._progress.advance(self._overall)
        state.left -= 1

    def _cell(self, dataset: DatasetRun, cell: Cell) -> _CellState:
        """The cell's progress state, its bar added on first use."""
        state = self._cells.get((dataset.label, cell.id))
        if state is None:
            todo = self._todo[dataset.label, cell.id]
            label = escape(f"{dataset.label} {cell.id}") + (" (replayed)" if cell.replay else "")
            bar = self._progress.add_task(label, total=todo, stats="")
            state = self._cells[dataset.label, cell.id] = _CellState(bar, todo)
        return state

    def _preflight(self, plan: list[tuple[DatasetRun, list[Cell]]], done: set[str]) -> None:
        """Load every model a cell with work left needs, and check each cell's drafters against its
        target, before the first row: a bad option or tokenizer fails in minutes, not after the
        AR cell's hours. (A run keeps its models loaded anyway, so this costs no memory.) An executor's
        workers load and check their own models instead."""
        pending, budgets = [], []
        for dataset, cells in plan:
            for cell in cells:
                keys = [self.row_key(cell, dataset, example) for example in dataset.examples]
                if any(key not in done for key in keys):
                    pending.append(cell)
                    budgets.append((dataset, cell))
                for key, example in zip(keys, dataset.examples, strict=True):
                    self._check_gold(dataset, example, self.log.by_key.get(key))
        if self.executor is None:
            for cell in pending:
                self.check_cell(cell)
            checked = set()
            for dataset, cell in budgets:  # once per dataset and target
                if (dataset.label, cell.target) not in checked:
                    checked.add((dataset.label, cell.target))
                    self.check_context(dataset, cell)

    def _check_gold(self, dataset: DatasetRun, example: Example, row: dict | None) -> None:
        """A row keeps the hash of the gold answer it was scored against: a data file whose answers
        changed since (the prompt, part of the key, did not) must not keep the old scores."""
        if row is None or "gold_sha" not in row or row["gold_sha"] == gold_sha(example):
            return
        raise SpecbenchError(
            f"{self.recipe.path}: datasets ({dataset.label})",
            f"the gold answer of example {example.id} changed since its rows were scored",
            "run into a new --output-dir (or restore the data file these results were scored on)",
        )

    def _check_same_setup(self, environment: dict) -> None:
        """A directory holds one machine's walltimes, each model in one dtype on one engine: resuming
        it elsewhere, or with a model that now resolves otherwise, is refused (machine.py), unless
        ``allow_other_machine``, which keys this machine's rows apart from the first machine's."""
        if not self.log.rows:
            return
        home, here = recorded_machine(environment), self.machine
        fix = (
            "run into a new --output-dir, or pass --allow-other-machine to measure this machine's rows "
            "beside them (the report keeps the machines apart)"
        )
        if home is not None and home.id != here.id:
            if not self.allow_other_machine:
                raise SpecbenchError(
                    str(self.output_dir),
                    f"was measured on {home.describe()}; this is {here.describe()}: resuming would mix "
                    "their walltimes",
                    fix,
                )
            self.key_scope = here.id
        recorded = environment.get("models") or {}
        check_heads_unchanged(self.output_dir, recorded, self.recipe.models)
        for name in self.recipe.models:
            before = recorded.get(name)
            if self.allow_other_machine or not isinstance(before, dict) or not before.get("dtype"):
                continue
            was = (str(before["dtype"]).removeprefix("torch."), before.get("engine") or "eager")
            will = (self.recipe.dtype_of(name), self.recipe.engine_of(name))
            if will[0] is None:  # trained heads take their target's dtype, which is checked itself
                continue
            if will != was:
                raise SpecbenchError(
                    f"{self.output_dir}: model {name}",
                    f"was measured in {was[0]} on the {was[1]} engine; this recipe runs it in {will[0]} "
                    f"on the {will[1]} engine on {here.describe()}",
                    fix,
                )
            self._keep_linear(name, before, fix)

    def _keep_linear(self, name: str, before: dict, fix: str) -> None:
        """A resumed run keeps its linear layers' library (specbench.models.linear): ``auto`` takes
        the one the first session chose (a near tie must not flip it between sessions), and a recipe
        that names another is refused. Runs from before the choice existed ran on aten."""
        was, wanted = before.get("linear") or "aten", self.recipe.linear_of(name)
        if wanted == "auto":
            self.linear_kept[name] = was
        elif wanted != was:
            raise SpecbenchError(
                f"{self.output_dir}: model {name}",
                f"was measured with linear: {was}; this recipe runs it with linear: {wanted}",
                fix,
            )

    def _check_same_recipe(self, environment: dict) -> None:
        """A run directory belongs to the recipe that started it: a resume with another one (a cell,
        dataset, model or setting added or changed) is refused unless ``extend``, which adds its cells
        where it still produces every recorded row (checked next)."""
        recorded = environment.get("recipe_identity")
        if not self.log.rows or recorded is None or recorded == self.recipe.identity() or self.extend:
            return
        raise SpecbenchError(
            str(self.output_dir),
            f"belongs to another recipe than {self.recipe.path} (recipe digest {recorded}, this one "
            f"{self.recipe.identity()}; the run's own is its {RESOLVED_RECIPE})",
            "resume with that recipe, run this one into a new --output-dir, or pass --extend to add this "
            "recipe's cells to the run (allowed only where it still produces every recorded row)",
        )

    def _check_rows_belong(self, plan: list[tuple[DatasetRun, list[Cell]]], environment: dict) -> None:
        """cells.csv is this recipe's cells: a resume whose recipe (or data, seed, --limit) no longer
        yields some recorded rows would drop them from it, so it is refused, naming them."""
        stray = self._stray(plan, environment)
        if not stray:
            return
        raise SpecbenchError(
            str(self.output_dir),
            f"holds {len(stray)} row(s) that {self.recipe.path} (as given, with its data and --limit) "
            f"does not produce ({name_cells(stray)}): resuming would drop them from {CELLS}",
            f"resume with the recipe that wrote them ({RESOLVED_RECIPE} in that directory holds it), or run "
            "this recipe into a new --output-dir",
        )

    def _stray(self, plan: list[tuple[DatasetRun, list[Cell]]], environment: dict) -> list[dict]:
        """The recorded rows whose keys this recipe's plan does not produce."""
        if not self.log.rows:
            return []
        covered = set()
        for keys in self._scoped(
            environment,
            lambda: [self.row_key(c, d, e) for d, cells in plan for c in cells for e in d.examples],
        ):
            covered.update(keys)
        return [row for row in self.log.rows if row.get("key") not in covered]

    def stale_rows(self) -> tuple[list[dict], int]:
        """Read-only: the directory's rows that this recipe, under today's code, no longer produces
        (their key differs: a method, a default, a model entry or the data changed since they were
        measured), and how many of the recipe's (dataset, cell, example) rows the directory lacks."""
        self.log = ExampleLog(self.output_dir / EXAMPLES)
        environment = read_environment(self.output_dir)
        plan = [(dataset, self.recipe.cells()) for dataset in self.datasets()]
        stray = self._stray(plan, environment)
        done = {row.get("key") for row in self.log.rows}
        expected = [self.row_key(c, d, e) for d, cells in plan for c in cells for e in d.examples]
        return stray, sum(1 for key in expected if key not in done)

    def _scoped(self, environment: dict, compute) -> list:
        """``compute()`` under the keys of every machine that wrote rows here (the first machine's plain
        keys, the others' scoped by their id: ``allow_other_machine``)."""
        home = recorded_machine(environment)
        scopes = [None] + [m for m in machines_of(environment) if home is None or m != home.id]
        kept, out = self.key_scope, []
        try:
            for scope in scopes:
                self.key_scope = scope
                out.append(compute())
        finally:
            self.key_scope = kept
        return out

    def _write_cells(self, plan: list[tuple[DatasetRun, list[Cell]]], environment: dict) -> None:
        """cells.csv from the plan's rows of every machine that measured them (one, unless rows were
        added with ``allow_other_machine``): summary.py keeps machines apart."""
        home = recorded_machine(environment)
        rows = [
            row
            for rows in self._scoped(
                environment,
                lambda: [r for dataset, cells in plan for c in cells for r in self.rows(dataset, c)],
            )
            for row in rows
        ]
        write_cells_csv(self.output_dir, rows, home.id if home else self.machine.id)

    def rows(self, dataset: DatasetRun, cell: Cell) -> list[dict]:
        """The recorded rows of ``cell`` on the examples of ``dataset`` that have one, in example order."""
        keys = (self.row_key(cell, dataset, example) for example in dataset.examples)
        return [self.log.by_key[key] for key in keys if key in self.log.by_key]

    def _write_environment(self, ended: bool) -> None:
        load = {
            "loadavg_at_start": self.loadavg_at_start,
            "loadavg_now": _loadavg(),
            "others_cpu": others_share(self.cpu_at_start, cpu_times()),
        }
        write_environment(
            self.output_dir,
            self.recipe,
            self.models,
            self.started,
            self.written,
            ended,
            self.gpu_samples,
            load,
            self.recipe.identity() if self._whole_recipe else None,
        )
        if self.executor is not None:  # what the workers loaded, and where they ran
            self.executor.amend_environment(self.output_dir, self.started)


@dataclass
class _CellState:
    """A cell of this run: its progress bar, its running totals for the bar, and (run here) its models."""

    bar: int
    left: int  # rows still to measure in this session
    tokens: int = 0
    seconds: float = 0.0
    steps: int = 0
    models: CellModels | None = None


def check_not_trained_on(recipe: Recipe, plan: list[tuple[DatasetRun, list[Cell]]]) -> None:
    """Refuse, before the first row, a drafter that specbench trained on an example this run evaluates
    (``specbench distill --extra-prompts`` trains on a split's rows but those ``--leave-out`` named):
    its acceptance there would measure memory, not drafting."""
    from specbench import sources
    from specbench.training.teacher import split_label

    for dataset, cells in plan:
        names = {name for cell in cells for name in cell.drafter_names}
        for name in sorted(names):
            source = recipe.models[name].source
            teacher = (sources.trained_record(source) or {}).get("teacher") or {}
            if dataset.label not in {split_label(extra) for extra in teacher.get("extra", ())}:
                continue
            seen = sorted({e.id for e in dataset.examples} - set(teacher.get("left_out", ())))
            if seen:
                shown = ", ".join(seen[:3]) + (f" and {len(seen) - 3} more" if len(seen) > 3 else "")
                raise SpecbenchError(
                    f"models.{name}.source",
                    f"{source} was trained on {len(seen)} {dataset.label} example(s) this run evaluates "
                    f"({shown})",
                    "retrain it with specbench distill --leave-out THIS_RECIPE, or evaluate other examples",
                )


def name_cells(rows: list[dict], most: int = 4) -> str:
    """``gsm8k/test sd[k=2], ... and 3 more``: the (dataset, cell) pairs of ``rows``."""
    where = sorted({(str(row.get("dataset")), str(row.get("cell"))) for row in rows})
    named = ", ".join(f"{dataset} {cell}" for dataset, cell in where[:most])
    return named + (f" and {len(where) - most} more" if len(where) > most else "")


def _loadavg() -> list[float] | None:
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return None


def _readable(cells: Path) -> bool:
    if not cells.is_file():
        return False
    try:
        read_cells_csv(cells)
        return True
    except SpecbenchError:
        return False
