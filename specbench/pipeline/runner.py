"""Run a recipe: for every dataset and cell, every example, one Generation, one result row.

Rows are keyed by a content hash of (cell fingerprint, dataset, example id, prompt), so a
re-run with ``resume`` skips what is done, and a changed setting produces new rows instead of
silently reusing old ones. Warm-up examples run once per cell and are never recorded.

Replayed cells (``replay: true``, greedy lossless methods) review with a
:class:`~specbench.models.replay.ReplayTarget` built from the AR cell's row for the same example
(AR cells run first), so they cost drafter passes only. Their first ``replay_check`` examples also
run live, and any difference in outputs, steps or forward counts stops the run. Their rows carry
``replayed: true``; the walltime and TTFT measured without the target are kept as
``walltime_replayed`` and ``ttft_replayed``, and ``walltime``, ``ttft`` and the target's seconds are
NaN, so no tokens/s or speedup is derived from them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch
import yaml
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from specbench.decoding.generation import Generation, first_difference
from specbench.decoding.sampling import SamplingParams
from specbench.errors import SpecbenchError
from specbench.methods import METHODS, Request
from specbench.models import registry
from specbench.models.hf import HFModel
from specbench.models.replay import ReplayError, ReplayTarget
from specbench.pipeline.costs import cell_costs
from specbench.pipeline.datasets import DatasetRun, load_datasets
from specbench.pipeline.environment import (
    gpu_sample,
    now,
    peak_memory_mb,
    reset_peak_memory,
    write_environment,
)
from specbench.pipeline.report import read_cells_csv
from specbench.pipeline.results import (
    CELLS,
    ENVIRONMENT,
    EXAMPLES,
    REJECTED,
    RESOLVED_RECIPE,
    ExampleLog,
    RunLock,
    check_format,
    write_atomic,
)
from specbench.pipeline.rows import build_row, divergence, gold_sha
from specbench.pipeline.schedule import work_order
from specbench.pipeline.summary import write_cells_csv
from specbench.recipe import Cell, Recipe
from specbench.tasks import Example, render_turn


def _hash(*parts: str) -> str:
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:16]


def _model_request(recipe: Recipe, name: str) -> registry.ModelRequest:
    spec = recipe.models[name]
    options = dict(spec.options or {})
    bigram = options.get("bigram")
    if isinstance(bigram, str) and not bigram.startswith(("/", "~", "$", registry.DISTILLED_PREFIX)):
        options["bigram"] = str(recipe.path.parent / bigram)  # a recipe's paths start at its folder
    options = tuple(sorted(options.items()))
    return registry.ModelRequest(name, spec.source, spec.dtype, spec.device, spec.revision, options)


def _drafter_names(cell: Cell) -> tuple[str, ...]:
    """Every drafter of a cell: a cascade's list, the one drafter, or none."""
    return cell.drafters or ((cell.drafter,) if cell.drafter else ())


class Runner:
    def __init__(
        self,
        recipe: Recipe,
        output_dir: Path,
        *,
        limit: int | None = None,
        resume: bool = False,
        console: Console | None = None,
        schedule: str | None = None,  # overrides the recipe's (tuning runs measure by cell)
    ):
        self.recipe = recipe
        self.output_dir = Path(output_dir)
        self.limit = limit
        self.console = console or Console(stderr=True)
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
        self.models: dict[str, object] = {}
        self.started = now()
        self.written = 0  # rows this process appended
        self.repeats = recipe.repeats
        self.gpu_samples: list[dict] = []  # nvidia-smi at each cell's first and last row
        self.schedule = schedule or recipe.schedule

    # -- loading ---------------------------------------------------------------------------

    def model(self, name: str):
        if name not in self.models:
            with self.console.status(f"loading model {name} ({self.recipe.models[name].source})"):
                with self._blame(f"models.{name}"):
                    self.models[name] = registry.load(_model_request(self.recipe, name), self.model)
        return self.models[name]

    @contextlib.contextmanager
    def _blame(self, field: str):
        """Name the recipe file (and the field, when the error does not) in errors raised below."""
        try:
            yield
        except SpecbenchError as error:
            where = error.where if error.where.startswith(field) else f"{field} ({error.where})"
            raise SpecbenchError(f"{self.recipe.path}: {where}", error.problem, error.fix) from None

    def datasets(self) -> list[DatasetRun]:
        return load_datasets(self.recipe, self.limit, self._blame)

    # -- running ---------------------------------------------------------------------------

    def run(self, plan: list[tuple[DatasetRun, list[Cell]]] | None = None) -> Path:
        """Run every cell on every example, or only ``plan``: (dataset, its cells) pairs, e.g. a tune's
        round (a dataset's examples cut short, a subset of cells)."""
        recipe = self.recipe
        if plan is None:
            plan = [(dataset, recipe.cells()) for dataset in self.datasets()]
        # AR first: the lossless check's reference, and what replayed cells replay
        plan = [
            (dataset, sorted(cells, key=lambda c: c.method != "autoregressive")) for dataset, cells in plan
        ]
        self.output_dir.mkdir(parents=True, exist_ok=True)
        lock = RunLock(self.output_dir)
        try:
            return self._run_locked(plan)
        finally:
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
        done = self.log.done
        self._preflight(plan, done)
        write_atomic(self.output_dir / RESOLVED_RECIPE, yaml.safe_dump(recipe.resolved(), sort_keys=False))
        written_before = self.written
        order = work_order(
            plan, lambda d, c, e: self._key(c, d, e) not in done, self.schedule, self.recipe.seed
        )
        todo = Counter((dataset.label, cell.id) for dataset, cell, _ in order)
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
            overall = progress.add_task("all cells", total=total, stats="")
            progress.advance(overall, total - len(order))
            started: dict[tuple[str, str], _CellState] = {}
            for dataset, cell, example in order:
                state = started.get((dataset.label, cell.id))
                if state is None:
                    state = started[dataset.label, cell.id] = self._start_cell(
                        dataset, cell, progress, todo[dataset.label, cell.id]
                    )
                self._run_example(dataset, cell, example, state, progress)
                progress.advance(overall)
        ran = self.written > written_before
        if ran or not (self.output_dir / ENVIRONMENT).exists():
            self._write_environment(ended=True)
        if ran or not _readable(self.output_dir / CELLS):  # a resume that ran nothing rewrites nothing
            write_cells_csv(
                self.output_dir,
                [row for dataset, cells in plan for c in cells for row in self.rows(dataset, c)],
            )
        return self.output_dir

    def _preflight(self, plan: list[tuple[DatasetRun, list[Cell]]], done: set[str]) -> None:
        """Load every model a cell with work left needs, and check each cell's drafters against its
        target, before the first row: a bad option or tokenizer fails in minutes, not after the
        AR cell's hours. (A run keeps its models loaded anyway, so this costs no memory.)"""
        pending = []
        for dataset, cells in plan:
            for cell in cells:
                keys = [self._key(cell, dataset, example) for example in dataset.examples]
                if any(key not in done for key in keys):
                    pending.append(cell)
                for key, example in zip(keys, dataset.examples, strict=True):
                    self._check_gold(dataset, example, self.log.by_key.get(key))
        for cell in pending:
            target = self.model(cell.target)
            for name in _drafter_names(cell):
                self._check_vocab(cell, name, target, self.model(name))

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

    def _key(self, cell: Cell, dataset: DatasetRun, example: Example) -> str:
        parts = [cell.fingerprint(self.recipe), dataset.label, example.id, example.prompt, *example.turns]
        if dataset.execute_code:  # rows graded by running code differ from ungraded ones
            parts.append("execute_code")
        if dataset.max_new_tokens is not None:
            parts.append(f"max_new_tokens={dataset.max_new_tokens}")
        if self.repeats > 1 and not cell.replay:  # rows measured once stay valid for repeats: 1
            parts.append(f"repeats={self.repeats}")
        return _hash(*parts)

    def rows(self, dataset: DatasetRun, cell: Cell) -> list[dict]:
        """The recorded rows of ``cell`` on the examples of ``dataset`` that have one, in example order."""
        keys = (self._key(cell, dataset, example) for example in dataset.examples)
        return [self.log.by_key[key] for key in keys if key in self.log.by_key]

    def _start_cell(self, dataset: DatasetRun, cell: Cell, progress: Progress, todo: int) -> _CellState:
        """The cell's models, its progress bar, and its warm-up (unrecorded) before its first row."""
        target = self.model(cell.target)
        if cell.drafters:  # a cascade gets every drafter, largest first, the statistical one last
            drafter = [self.model(name) for name in cell.drafters]
        else:
            drafter = self.model(cell.drafter) if cell.drafter else None
        label = f"{dataset.label} {cell.id}" + (" (replayed)" if cell.replay else "")
        state = _CellState(target, drafter, progress.add_task(label, total=todo, stats=""), todo)
        self._sample_gpu(dataset, cell, "start")
        for example in dataset.examples[: self.recipe.warmup]:
            self._generate(dataset, cell, target, drafter, example, check=False)
        return state

    def _run_example(self, dataset: DatasetRun, cell: Cell, example: Example, state, progress) -> None:
        check = cell.replay and example.id in {e.id for e in dataset.examples[: self.recipe.replay_check]}
        request, generation, replay, repeats = self._measure(dataset, cell, state, example, check)
        if not self.written:  # this session's versions are on disk before its first row
            self._write_environment(ended=False)
        row = self._row(dataset, cell, example, state.target, request, generation, replay)
        if repeats:
            row["walltime_repeats"] = [g.walltime for g in repeats]
            row["ttft_repeats"] = [g.ttft for g in repeats]
        row["peak_memory_mb"] = peak_memory_mb(state.target.device)
        self.log.append(row)
        self.written += 1
        state.tokens += len(generation.tokens)
        state.seconds += generation.walltime
        state.steps += len(generation.steps)
        stats = f"acc.len {state.tokens / max(state.steps, 1):.2f}"
        if not cell.replay:
            stats += f" · {state.tokens / max(state.seconds, 1e-9):.1f} tok/s"
        progress.update(state.bar, advance=1, stats=stats)
        state.left -= 1
        if not state.left:
            self._sample_gpu(dataset, cell, "end")

    def _measure(self, dataset: DatasetRun, cell: Cell, state, example: Example, check: bool):
        """One example, ``repeats`` times for a timed cell: every repeat must give the same outputs and
        counts; the row's times are the repeats' means (each repeat is kept). (request, generation,
        replay, the repeats or [] when measured once)."""
        reset_peak_memory(state.target.device)
        request, first, replay = self._generate(dataset, cell, state.target, state.drafter, example, check)
        if self.repeats == 1 or cell.replay:
            return request, first, replay, []
        repeats = [first]
        for number in range(2, self.repeats + 1):
            again = self._generate(dataset, cell, state.target, state.drafter, example, False)[1]
            difference = first_difference(first, again)
            if difference:
                raise SpecbenchError(
                    f"{self.recipe.path}: repeats",
                    f"repeat {number} of cell {cell.id} on {dataset.label} example {example.id} differs "
                    f"from the first, {difference}",
                    "the outputs are not deterministic on this device: set repeats: 1 and report it",
                )
            repeats.append(again)
        mean = dataclasses.replace(
            first,
            walltime=sum(g.walltime for g in repeats) / len(repeats),
            ttft=sum(g.ttft for g in repeats) / len(repeats),
            forwards={
                model: {
                    **counts,
                    "seconds": sum(g.forwards[model]["seconds"] for g in repeats) / len(repeats),
                }
                for model, counts in first.forwards.items()
            },
        )
        return request, mean, replay, repeats

    def _generate(self, dataset, cell: Cell, target, drafter, example: Example, check: bool):
        """(request, generation, the ReplayTarget or None): one example, live or replayed; ``check``
        also runs a replayed one live and stops at the first difference."""
        method = METHODS[cell.method].run
        if example.turns:
            return self._conversation(dataset, cell, target, drafter, example)
        request = self._request(target, dataset, example)
        if METHODS[cell.method].needs_reference:
            reference = self._reference(dataset, cell, example)
            if reference is None:  # AR cells run first, so only a failed AR row leads here
                raise SpecbenchError(
                    f"{self.recipe.path}: methods.{cell.method_name}",
                    f"no autoregressive row of {cell.target!r} for {dataset.label} example {example.id}",
                    "run the recipe's autoregressive method on this target first (it is in the plan)",
                )
            request = dataclasses.replace(request, reference_ids=reference["output_ids"])
        if not cell.replay:
            return request, method(cell.params, target, drafter, request), None
        where = f"{self.recipe.path}: methods.{cell.method_name}.replay"
        about = f"cell {cell.id}, {dataset.label} example {example.id}"
        reference = self._reference(dataset, cell, example)
        if reference is None:
            raise SpecbenchError(
                where,
                f"{about}: no autoregressive row of {cell.target!r} to replay",
                f"add an autoregressive method with target: {cell.target} (it runs first)",
            )
        replay = ReplayTarget(target, reference["output_ids"], reference["stopped_by_eos"])
        try:
            generation = method(cell.params, replay, drafter, request)
        except ReplayError as error:
            raise SpecbenchError(where, f"{about}: {error.problem}", error.fix) from None
        if check:
            live = method(cell.params, target, drafter, self._request(target, dataset, example))
            difference = first_difference(generation, live)
            if difference:
                raise SpecbenchError(
                    where,
                    f"{about}: the replayed run differs from the live one, {difference}",
                    "replay is exact only for greedy lossless methods: run this method live "
                    "(remove replay:) and report the difference",
                )
        return request, generation, replay

    def _conversation(self, dataset, cell: Cell, target, drafter, example: Example):
        """A multi-turn example (Spec-Bench's MT-Bench questions): each turn after the model's own
        answers to the turns before it, all turns one row (their tokens, counts and times summed)."""
        if cell.replay or METHODS[cell.method].needs_reference:
            raise SpecbenchError(
                f"{self.recipe.path}: methods.{cell.method_name}",
                f"{dataset.label} example {example.id} has {len(example.turns) + 1} turns, and "
                f"{'replay' if cell.replay else 'an oracle'} follows one AR output per prompt",
                "run this method live on multi-turn data (remove replay:), or use single-turn data",
            )
        turns, answers, first = [], [], None
        for _ in range(len(example.turns) + 1):
            request = self._request(target, dataset, example, answers)
            generation = METHODS[cell.method].run(cell.params, target, drafter, request)
            turns.append(generation)
            answers.append(target.tokenizer.decode(generation.tokens, skip_special_tokens=True))
            first = first or request
        return first, Generation.joined(turns), None

    def _request(self, target: HFModel, dataset: DatasetRun, example: Example, answers=()) -> Request:
        text = render_turn(example, list(answers), target.tokenizer, dataset.chat_template)
        add_special = not dataset.chat_template or target.is_encoder_decoder
        ids = target.tokenizer(text, add_special_tokens=add_special, return_tensors="pt").input_ids[0]
        gen = self.recipe.generation
        sampling = SamplingParams(gen.temperature, gen.top_k, gen.top_p)
        generator = torch.Generator(device=target.device)
        turn = [f"turn {len(answers)}"] if answers else []  # turn 0 keeps the single-turn seed
        generator.manual_seed(
            int(_hash(str(self.recipe.seed), dataset.label, example.id, *turn), 16) % (2**63)
        )
        max_new_tokens = dataset.max_new_tokens or gen.max_new_tokens
        return Request(ids.to(target.device), max_new_tokens, sampling, target.eos_token_ids(), generator)

    def _check_vocab(self, cell: Cell, name: str, target, drafter) -> None:
        if isinstance(drafter, HFModel) and drafter.tokenizer is not None and target.tokenizer is not None:
            if drafter.tokenizer.get_vocab() != target.tokenizer.get_vocab():
                role = "drafters" if cell.drafters else "drafter"
                raise SpecbenchError(
                    f"{self.recipe.path}: methods.{cell.method_name}.{role}",
                    f"drafter {name!r} does not share the target's tokenizer",
                    "use a drafter trained with the target's vocabulary",
                )

    def _row(self, dataset, cell, example, target, request: Request, generation, replay=None) -> dict:
        text = target.tokenizer.decode(generation.tokens, skip_special_tokens=True)
        checked = (
            self.recipe.lossless_check
            and self.recipe.generation.temperature == 0
            and METHODS[cell.method].lossless(cell.params)
        )
        reference = self._reference(dataset, cell, example) if checked else None
        drafters = {name: self.model(name) for name in _drafter_names(cell)}
        return build_row(
            dataset,
            cell,
            example,
            text,
            request,
            generation,
            key=self._key(cell, dataset, example),
            first_divergence=divergence(reference["output_ids"], generation.tokens) if reference else None,
            costs=cell_costs(self.recipe, cell, target, drafters),
            replay=replay,
        )

    def _reference(self, dataset, cell, example) -> dict | None:
        """The row of the (first) AR cell of ``cell``'s target on this example, if recorded."""
        for other in self.recipe.cells():
            if other.method == "autoregressive" and other.target == cell.target:
                return self.log.by_key.get(self._key(other, dataset, example))
        return None

    def _write_environment(self, ended: bool) -> None:
        write_environment(
            self.output_dir, self.recipe, self.models, self.started, self.written, ended, self.gpu_samples
        )

    def _sample_gpu(self, dataset: DatasetRun, cell: Cell, at: str) -> None:
        sample = gpu_sample()
        if sample is not None:
            where = {"dataset": dataset.label, "cell": cell.id, "at": at, "time": now()}
            self.gpu_samples.append({**where, "gpus": sample})


@dataclass
class _CellState:
    """A started cell: its models, its progress bar, and its running totals for the bar."""

    target: HFModel
    drafter: object
    bar: int
    left: int  # rows still to measure in this session
    tokens: int = 0
    seconds: float = 0.0
    steps: int = 0


def _readable(cells: Path) -> bool:
    if not cells.is_file():
        return False
    try:
        read_cells_csv(cells)
        return True
    except SpecbenchError:
        return False
