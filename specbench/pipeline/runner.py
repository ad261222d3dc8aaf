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
import math
from dataclasses import dataclass
from pathlib import Path

import torch
import yaml
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from specbench.decoding.generation import Generation
from specbench.decoding.sampling import SamplingParams
from specbench.errors import SpecbenchError
from specbench.methods import METHODS, Request
from specbench.models import registry
from specbench.models.hf import HFModel
from specbench.models.replay import ReplayError, ReplayTarget
from specbench.pipeline.costs import pw_cost
from specbench.pipeline.environment import now, write_environment
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
from specbench.pipeline.summary import write_cells_csv
from specbench.recipe import Cell, Recipe
from specbench.tasks import Example, get_task, render_prompt


@dataclass
class DatasetRun:
    label: str  # e.g. "gsm8k/test"
    task: object
    examples: list[Example]
    chat_template: bool
    execute_code: bool = False  # the recipe's opt-in to run generated code (code tasks' pass@1)
    max_new_tokens: int | None = None  # the dataset's own output length (else the recipe's)


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


def _pw_of(recipe: Recipe, name: str, role_target: bool) -> float | None:
    cost = recipe.models[name].cost
    value = getattr(cost, "pw", None) if cost is not None else None
    if value is None:
        return 1.0 if role_target else None
    if hasattr(value, "model_dump"):
        value = value.model_dump()
    return pw_cost(value, f"{recipe.path}: models.{name}.cost.pw")


class Runner:
    def __init__(
        self,
        recipe: Recipe,
        output_dir: Path,
        *,
        limit: int | None = None,
        resume: bool = False,
        console: Console | None = None,
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
        runs = []
        for i, spec in enumerate(self.recipe.datasets):
            task = get_task(spec.task)
            split = spec.split or task.default_split
            limit = (
                min(x for x in (spec.limit, self.limit) if x is not None)
                if (spec.limit or self.limit)
                else None
            )
            data_files = str(spec.data_files) if spec.data_files else None
            if spec.execute_code and not task.executes_code:
                raise SpecbenchError(
                    f"{self.recipe.path}: datasets[{i}].execute_code",
                    f"task {spec.task} does not run generated code",
                    "remove execute_code (it applies to code tasks such as humaneval and mbpp)",
                )
            with self._blame(f"datasets[{i}]"):
                if spec.every == 1:
                    examples = task.load(split=split, data_files=data_files, limit=limit)
                else:
                    examples = task.load(split=split, data_files=data_files)[:: spec.every][:limit]
            label = f"{spec.task}/{split}"
            runs.append(
                DatasetRun(label, task, examples, spec.chat_template, spec.execute_code, spec.max_new_tokens)
            )
        return runs

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
            for dataset, cells in plan:
                for cell in cells:
                    self._run_cell(dataset, cell, done, progress, overall)
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
        if row is None or "gold_sha" not in row or row["gold_sha"] == _gold_sha(example):
            return
        raise SpecbenchError(
            f"{self.recipe.path}: datasets ({dataset.label})",
            f"the gold answer of example {example.id} changed since its rows were scored",
            "run into a new --output-dir (or restore the data file these results were scored on)",
        )

    def _key(self, cell: Cell, dataset: DatasetRun, example: Example) -> str:
        parts = [cell.fingerprint(self.recipe), dataset.label, example.id, example.prompt]
        if dataset.execute_code:  # rows graded by running code differ from ungraded ones
            parts.append("execute_code")
        if dataset.max_new_tokens is not None:
            parts.append(f"max_new_tokens={dataset.max_new_tokens}")
        return _hash(*parts)

    def rows(self, dataset: DatasetRun, cell: Cell) -> list[dict]:
        """The recorded rows of ``cell`` on the examples of ``dataset`` that have one, in example order."""
        keys = (self._key(cell, dataset, example) for example in dataset.examples)
        return [self.log.by_key[key] for key in keys if key in self.log.by_key]

    def _run_cell(self, dataset: DatasetRun, cell: Cell, done: set[str], progress: Progress, overall) -> None:
        todo = [ex for ex in dataset.examples if self._key(cell, dataset, ex) not in done]
        progress.advance(overall, len(dataset.examples) - len(todo))
        if not todo:
            return
        target = self.model(cell.target)
        for name in _drafter_names(cell):
            self._check_vocab(cell, name, target, self.model(name))
        if cell.drafters:  # a cascade gets every drafter, largest first, the statistical one last
            drafter = [self.model(name) for name in cell.drafters]
        else:
            drafter = self.model(cell.drafter) if cell.drafter else None
        label = f"{dataset.label} {cell.id}" + (" (replayed)" if cell.replay else "")
        bar = progress.add_task(label, total=len(todo), stats="")
        for example in dataset.examples[: self.recipe.warmup]:
            self._generate(dataset, cell, target, drafter, example, check=False)
        checked = {example.id for example in dataset.examples[: self.recipe.replay_check]}
        tokens = seconds = steps = 0.0
        for example in todo:
            request, generation, replay = self._generate(
                dataset, cell, target, drafter, example, check=cell.replay and example.id in checked
            )
            if not self.written:  # this session's versions are on disk before its first row
                self._write_environment(ended=False)
            self.log.append(self._row(dataset, cell, example, target, request, generation, replay))
            self.written += 1
            tokens += len(generation.tokens)
            seconds += generation.walltime
            steps += len(generation.steps)
            stats = f"acc.len {tokens / max(steps, 1):.2f}"
            if not cell.replay:
                stats += f" · {tokens / max(seconds, 1e-9):.1f} tok/s"
            progress.update(bar, advance=1, stats=stats)
            progress.advance(overall)

    def _generate(self, dataset, cell: Cell, target, drafter, example: Example, check: bool):
        """(request, generation, the ReplayTarget or None): one example, live or replayed; ``check``
        also runs a replayed one live and stops at the first difference."""
        method = METHODS[cell.method].run
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
            difference = _first_difference(generation, live)
            if difference:
                raise SpecbenchError(
                    where,
                    f"{about}: the replayed run differs from the live one, {difference}",
                    "replay is exact only for greedy lossless methods: run this method live "
                    "(remove replay:) and report the difference",
                )
        return request, generation, replay

    def _request(self, target: HFModel, dataset: DatasetRun, example: Example) -> Request:
        text = render_prompt(example, target.tokenizer, dataset.chat_template)
        add_special = not dataset.chat_template or target.is_encoder_decoder
        ids = target.tokenizer(text, add_special_tokens=add_special, return_tensors="pt").input_ids[0]
        gen = self.recipe.generation
        sampling = SamplingParams(gen.temperature, gen.top_k, gen.top_p)
        generator = torch.Generator(device=target.device)
        generator.manual_seed(int(_hash(str(self.recipe.seed), dataset.label, example.id), 16) % (2**63))
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

    def _row(
        self, dataset, cell, example, target, request: Request, generation, replay: ReplayTarget | None = None
    ) -> dict:
        text = target.tokenizer.decode(generation.tokens, skip_special_tokens=True)
        quality = dataset.task.score(example, text, execute_code=dataset.execute_code)
        lossless = None
        if (
            self.recipe.lossless_check
            and self.recipe.generation.temperature == 0
            and METHODS[cell.method].lossless(cell.params)
        ):
            lossless = self._divergence(dataset, cell, example, generation.tokens)
        row = {
            "key": self._key(cell, dataset, example),
            "dataset": dataset.label,
            "cell": cell.id,
            "method_name": cell.method_name,
            "method": cell.method,
            "params": cell.params,
            "target": cell.target,
            "drafter": cell.drafter,
            "example_id": example.id,
            "gold_sha": _gold_sha(example),
            "prompt_tokens": int(request.prompt_ids.shape[0]),
            "output_ids": generation.tokens,
            "output_text": text,
            "n_tokens": len(generation.tokens),
            "stopped_by_eos": generation.stopped_by_eos,
            "walltime": generation.walltime,
            "ttft": generation.ttft,
            "forwards": generation.forwards,
            "steps": [list(s) for s in generation.steps],
            "accepted_by_position": [list(x) for x in generation.accepted_by_position()],
            "quality": quality,
            "first_divergence": lossless,
            "costs": self._costs(cell, target),
        }
        # corpus metrics' sufficient statistics (BLEU), and why a metric is missing (unrun code);
        # only the rows of tasks that have them carry these keys
        statistics = dataset.task.corpus_statistics(example, text)
        if statistics:
            row["quality_statistics"] = statistics
        skipped = dataset.task.skipped(dataset.execute_code)
        if skipped:
            row["quality_skipped"] = skipped
        if cell.drafters:  # cascades only, so the rows of other methods keep their shape
            row["drafters"] = list(cell.drafters)
            row["inner_steps"] = {
                name: [list(s) for s in steps] for name, steps in generation.inner_steps.items()
            }
        if generation.deferrals is not None:  # cascades only
            row["deferrals"] = generation.deferrals
        if replay is not None:  # only replayed rows carry these keys (module docstring)
            row["replayed"] = True
            row["replay_live_passes"] = replay.live_passes
            row["walltime_replayed"], row["walltime"] = row["walltime"], math.nan
            row["ttft_replayed"], row["ttft"] = row["ttft"], math.nan
            row["forwards"] = {name: dict(counts) for name, counts in row["forwards"].items()}
            row["forwards"][cell.target]["seconds"] = math.nan
        return row

    def _costs(self, cell: Cell, target) -> dict:
        """Per-model cost coefficients under MS and PW for this cell (relative to its target)."""
        ms = {cell.target: 1.0}
        pw = {cell.target: _pw_of(self.recipe, cell.target, True)}
        for name in _drafter_names(cell):
            drafter = self.model(name)
            ms[name] = drafter.num_parameters / target.num_parameters
            pw[name] = 0.0 if drafter.num_parameters == 0 else _pw_of(self.recipe, name, False)
        return {"ms": ms, "pw": pw}

    def _reference(self, dataset, cell, example) -> dict | None:
        """The row of the (first) AR cell of ``cell``'s target on this example, if recorded."""
        for other in self.recipe.cells():
            if other.method == "autoregressive" and other.target == cell.target:
                return self.log.by_key.get(self._key(other, dataset, example))
        return None

    def _divergence(self, dataset, cell, example, tokens: list[int]) -> int | None:
        """-1 when identical to the AR cell's output for the same target, else the first differing index."""
        reference = self._reference(dataset, cell, example)
        if reference is None:
            return None
        ar = reference["output_ids"]
        for i, (a, b) in enumerate(zip(ar, tokens, strict=False)):
            if a != b:
                return i
        return -1 if len(ar) == len(tokens) else min(len(ar), len(tokens))

    def _write_environment(self, ended: bool) -> None:
        write_environment(self.output_dir, self.recipe, self.models, self.started, self.written, ended)


def _first_difference(replayed: Generation, live: Generation) -> str | None:
    """The first count, step or token in which two generations of one request differ, in words."""
    for model in sorted(live.forwards.keys() | replayed.forwards.keys()):
        for count in ("forward_passes", "tokens_scored", "encoder_passes"):
            a = replayed.forwards.get(model, {}).get(count)
            b = live.forwards.get(model, {}).get(count)
            if a != b:
                return f"{model} {count}: replayed {a}, live {b}"
    steps = [("target step", replayed.steps, live.steps)]
    steps += [
        (f"{name} review", replayed.inner_steps.get(name, []), live.inner_steps.get(name, []))
        for name in sorted(live.inner_steps.keys() | replayed.inner_steps.keys())
    ]
    for what, a, b in [*steps, ("output token", replayed.tokens, live.tokens)]:
        a, b = [_plain(x) for x in a], [_plain(x) for x in b]
        if a != b:
            i = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
            mine, theirs = (a[i] if i < len(a) else "none"), (b[i] if i < len(b) else "none")
            return f"{what} {i}: replayed {mine}, live {theirs}"
    return None


def _gold_sha(example: Example) -> str:
    return _hash(example.reference, *example.answers)


def _readable(cells: Path) -> bool:
    if not cells.is_file():
        return False
    try:
        read_cells_csv(cells)
        return True
    except SpecbenchError:
        return False


def _plain(value):
    return tuple(value) if isinstance(value, (list, tuple)) else value
