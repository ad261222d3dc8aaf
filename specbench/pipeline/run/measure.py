"""Measure one example of one cell: its models, its request, the method's Generation (live, replayed or
repeated) and the result row, without touching a file.

The local :class:`~specbench.pipeline.run.runner.Runner` is a Measurer that appends what it measures to
examples.jsonl; a Ray worker (:mod:`specbench.pipeline.run.ray_executor`) holds one and sends its rows to the
driver, the only writer. Both read the AR rows that replay and the lossless check need through
:meth:`Measurer.recorded`: the runner from its log, a worker from the rows the driver ships with each
example. A row the lossless check covers (greedy, a lossless method, an AR row) carries its first
divergence from the AR output and its class: identical, a numerical tie or a mismatch
(:mod:`specbench.pipeline.analysis.numerics`).

Rows are keyed by content (:mod:`specbench.pipeline.run.keys`), so a re-run with ``resume`` skips what
is done. Warm-up examples run once per cell and are never recorded.

Replayed cells (``replay: true``, greedy lossless methods) review with a
:class:`~specbench.models.replay.ReplayTarget` built from the AR cell's row for the same example
(AR cells run first), so they cost drafter passes only. Their first ``replay_check`` examples also
run live, and any difference in outputs, steps or forward counts stops the run, unless the live run
parted from the AR output at a numerical tie (in bf16 a verification pass over several tokens may
round a near-tie the other way than the one-token AR step did): the live run then followed another
text and the counts cannot be compared, so the row records where (``replay_live_tie``) and the
replay stands as the count on the target's AR output. Their rows carry
``replayed: true``; the walltime and TTFT measured without the target are kept as
``walltime_replayed`` and ``ttft_replayed``, and ``walltime``, ``ttft`` and the target's seconds are
NaN, so no tokens/s or speedup is derived from them.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections import Counter
from dataclasses import dataclass

import torch
from rich.console import Console

from specbench import sources
from specbench.decoding.generation import Generation, first_difference
from specbench.engines import BACKENDS, ENGINE_NAMES, EngineModel, audit_model, sampling_audit
from specbench.errors import SpecbenchError
from specbench.methods import METHODS, Request
from specbench.models import memory_pressure
from specbench.models.cache import DISTILLED_PREFIX
from specbench.models.compiled import CompiledHFModel
from specbench.models.costs import cell_costs
from specbench.models.hf import HFModel
from specbench.models.machine import cpu_times, group_cpu_seconds, others_share, this_machine
from specbench.models.replay import ReplayError, ReplayTarget
from specbench.models.sampling import SamplingParams
from specbench.pipeline.analysis.numerics import divergence_fields, is_tie
from specbench.pipeline.records.rows import build_row, divergence
from specbench.pipeline.run.datasets import DatasetRun
from specbench.pipeline.run.environment import gpu_sample, now, peak_memory_mb, reset_peak_memory
from specbench.pipeline.run.keys import ResolvedCell, RowKeys, content_hash
from specbench.recipe import Cell, Recipe, engine_cell_view
from specbench.sources.tokenizers import Tokenized, load_tokenizer
from specbench.tasks import Example, render_turn


def model_request(recipe: Recipe, name: str, linear: str | None = None) -> sources.ModelRequest:
    spec = recipe.models[name]
    options = dict(spec.options or {})
    bigram = options.get("bigram")
    if isinstance(bigram, str) and not bigram.startswith(("/", "~", "$", DISTILLED_PREFIX)):
        options["bigram"] = str(recipe.path.parent / bigram)  # a recipe's paths start at its folder
    options = tuple(sorted(options.items()))
    return sources.ModelRequest(
        name,
        spec.source,
        spec.dtype,
        spec.device,
        spec.revision,
        options,
        recipe.engine_of(name),
        tuple(sorted(spec.engine_options.items())),
        linear or recipe.linear_of(name),  # a resume's: the library its first session chose
    )


def tokenizer_only(request: sources.ModelRequest) -> bool:
    """Whether the request's engine takes the source's tokenizer alone (engine: openai, its weights on a
    server elsewhere, unless audit_weights asks for specbench's copy)."""
    if request.engine not in ENGINE_NAMES:
        return False
    wants = BACKENDS[request.engine].tokenizer_only
    return wants is not None and wants(dict(request.engine_options))


@dataclass
class CellModels:
    """A started cell's models: the target and its drafter (a cascade's list of drafters, or None)."""

    target: HFModel
    drafter: object

    def compiled(self) -> list[CompiledHFModel]:
        """The models that run on the compiled engine."""
        drafters = self.drafter if isinstance(self.drafter, list) else [self.drafter]
        return [m for m in (self.target, *drafters) if isinstance(m, CompiledHFModel)]

    def compile_seconds(self) -> float:
        return sum(m.compile_seconds for m in self.compiled())

    def compile_cache(self) -> Counter:
        """The models' graphs found in inductor's cache, built, not cacheable, and shapes autotuned."""
        return sum((m.compile_cache for m in self.compiled()), Counter())


class Measurer(RowKeys):
    """A recipe and the models it loaded so far; turns (dataset, cell, example) into a row."""

    def __init__(self, recipe: Recipe, console: Console | None = None):
        if recipe.threads is not None:  # before the machine is read: threads are part of it
            torch.set_num_threads(recipe.threads)
        self.recipe = recipe
        self.console = console or Console(stderr=True)
        self.models: dict[str, object] = {}
        self.repeats = recipe.repeats
        self.gpu_samples: list[dict] = []  # nvidia-smi at each cell's first and last row
        self.references: dict[str, dict] = {}  # rows by key that recorded() answers from
        self._resolved: dict[str, ResolvedCell] = {}  # by cell id, on first use (RowKeys)
        self.compile_pending: dict[str, float] = {}  # compile seconds not yet in a row, by cell id
        self.cache_pending: dict[str, Counter] = {}  # what inductor's cache did for them, by cell id
        self.machine = this_machine()  # rows name the machine that timed them
        # another machine's rows than the directory's first carry its id in keys (--allow-other-machine)
        self.key_scope: str | None = None
        self.linear_kept: dict[str, str] = {}  # linear: auto resumed: its first session's (runner.py)

    def recorded(self, key: str) -> dict | None:
        """The recorded row of ``key``, if any (AR rows: what replay and the lossless check read)."""
        return self.references.get(key)

    # -- loading ---------------------------------------------------------------------------

    def model(self, name: str):
        if name not in self.models:
            with self.console.status(f"loading model {name} ({self.recipe.models[name].source})"):
                with self._blame(f"models.{name}"):
                    request = model_request(self.recipe, name, self.linear_kept.get(name))
                    if tokenizer_only(request):  # a server elsewhere holds the weights: never loaded here
                        loaded = load_tokenizer(request)
                    else:
                        loaded = sources.load(request, self.model)
                    if isinstance(loaded, sources.Served | Tokenized):  # the engine holds the weights
                        loaded = BACKENDS[request.engine].open(request, loaded)
                    self.models[name] = loaded
        return self.models[name]

    @contextlib.contextmanager
    def _blame(self, field: str):
        """Name the recipe file (and the field, when the error does not) in errors raised below."""
        try:
            yield
        except SpecbenchError as error:
            where = error.where if error.where.startswith(field) else f"{field} ({error.where})"
            raise SpecbenchError(f"{self.recipe.path}: {where}", error.problem, error.fix) from None

    def close_engines(self) -> None:
        """Stop the serving engines the run started (they hold memory and processes)."""
        for model in self.models.values():
            if isinstance(model, EngineModel):
                model.close()

    def check_cell(self, cell: Cell) -> None:
        """Load the cell's models and check each drafter's tokenizer against its target's (and that
        an engine target's engine is installed)."""
        engine = self.recipe.engine_of(cell.target)
        if engine in ENGINE_NAMES:
            missing = BACKENDS[engine].available(self.recipe.models[cell.target].engine_options)
            if missing:
                raise SpecbenchError(f"{self.recipe.path}: models.{cell.target}.engine", *missing)
        target = self.model(cell.target)
        if METHODS[cell.method].tree_sizes(cell.params) and getattr(target, "is_encoder_decoder", False):
            raise SpecbenchError(
                f"{self.recipe.path}: methods.{cell.method_name}.target",
                f"{cell.method} verifies token trees, which serve decoder-only targets ({cell.target!r} "
                "is an encoder-decoder)",
                "use a decoder-only target, or method speculative (a chain) for this one",
            )
        for name in cell.drafter_names:
            self._check_vocab(cell, name, target, self.model(name))
        over = self.recipe.speedup_over(cell.target)
        if over != cell.target and self.model(over).tokenizer.get_vocab() != target.tokenizer.get_vocab():
            raise SpecbenchError(
                f"{self.recipe.path}: models.{cell.target}.engine_options.baseline",
                f"{over!r} does not share {cell.target!r}'s tokenizer (their tokens are other units)",
                "pair two servers of one model (one tokenizer)",
            )

    def check_context(self, dataset: DatasetRun, cell: Cell) -> None:
        """Every prompt of ``dataset`` plus its output budget fits the target's context (its
        ``max_position_embeddings``; models with relative positions have none): refused before the
        first row, naming the example, instead of decoding past what the model was trained on."""
        target = self.model(cell.target)
        config = getattr(getattr(target, "model", None), "config", None)
        limit = getattr(config, "max_position_embeddings", None) if config is not None else None
        if not isinstance(limit, int) or getattr(target, "is_encoder_decoder", False):
            return
        for example in dataset.examples:
            request = self.request(target, dataset, example)
            prompt, budget = request.prompt_ids.shape[0], request.max_new_tokens
            if prompt + budget > limit:
                raise SpecbenchError(
                    f"{self.recipe.path}: datasets ({dataset.label}), example {example.id}",
                    f"its prompt of {prompt} tokens + {budget} new tokens exceed the context of "
                    f"{cell.target} ({limit} positions)",
                    "lower max_new_tokens, or leave such prompts out of the data file",
                )

    def _check_vocab(self, cell: Cell, name: str, target, drafter) -> None:
        if isinstance(drafter, HFModel) and drafter.tokenizer is not None and target.tokenizer is not None:
            if drafter.tokenizer.get_vocab() != target.tokenizer.get_vocab():
                role = "drafters" if cell.drafters else "drafter"
                raise SpecbenchError(
                    f"{self.recipe.path}: methods.{cell.method_name}.{role}",
                    f"drafter {name!r} does not share the target's tokenizer",
                    "use a drafter trained with the target's vocabulary",
                )

    # -- measuring ---------------------------------------------------------------------------

    def start_cell(self, dataset: DatasetRun, cell: Cell) -> CellModels:
        """The cell's models, and its warm-up (unrecorded) before its first row."""
        target = self.model(cell.target)
        if cell.drafters:  # a cascade gets every drafter, largest first, the statistical one last
            drafter = [self.model(name) for name in cell.drafters]
        else:
            drafter = self.model(cell.drafter) if cell.drafter else None
        models = CellModels(target, drafter)
        self.sample_gpu(dataset, cell, "start")
        self._prepare_engines(dataset, cell, models)
        for example in dataset.examples[: self.recipe.warmup]:
            self._generate(dataset, cell, target, drafter, example, check=False)
        return models

    def _prepare_engines(self, dataset: DatasetRun, cell: Cell, models: CellModels) -> None:
        """Compile every pass shape the cell's compiled models will run, before any timed example; the
        seconds go to the cell's next row as ``compile_s``, never into a walltime."""
        if isinstance(models.target, EngineModel):  # a serving engine starts (and compiles) for the cell
            spec = self.engine_spec(cell, models.target)
            with self.console.status(f"starting {models.target.engine} for {cell.id}"):
                seconds = models.target.prepare(spec, models.drafter)
            self.compile_pending[cell.id] = self.compile_pending.get(cell.id, 0.0) + seconds
            return
        compiled = models.compiled()
        if not compiled or not METHODS[cell.method].runs_engine:
            return
        requests = [self.request(models.target, dataset, e) for e in dataset.examples]
        longest = max(r.prompt_ids.shape[0] + r.max_new_tokens for r in requests)
        lengths = METHODS[cell.method].draft_lengths(cell.params)
        trees = METHODS[cell.method].tree_sizes(cell.params)
        # heads read the target's states: its graphs return them
        hidden = bool(METHODS[cell.method].takes_heads)
        cached = models.compile_cache()
        with self.console.status(f"compiling {', '.join(m.name for m in compiled)} for {cell.id}"):
            seconds = sum(
                model.prepare(longest, lengths, hidden=hidden and model is models.target, tree_sizes=trees)
                for model in compiled
            )
        self.compile_pending[cell.id] = self.compile_pending.get(cell.id, 0.0) + seconds
        self.cache_pending[cell.id] = self.cache_pending.get(cell.id, Counter()) + (
            models.compile_cache() - cached
        )

    def measure(self, dataset: DatasetRun, cell: Cell, example: Example, models: CellModels) -> dict:
        """The row of one example of a started cell."""
        check = cell.replay and example.id in {e.id for e in dataset.examples[: self.recipe.replay_check]}
        engine = models.target if isinstance(models.target, EngineModel) else None
        before, engine_before = cpu_times(), group_cpu_seconds(engine.process_groups()) if engine else 0.0
        memory_before = memory_pressure.snapshot()
        faults_before = memory_pressure.group_major_faults(engine.process_groups()) if engine else 0
        request, generation, replay, repeats = self._measure(dataset, cell, models, example, check)
        # an engine's processes work for this row: their CPU is not the others'
        engine_cpu = group_cpu_seconds(engine.process_groups()) - engine_before if engine else 0.0
        others = others_share(before, cpu_times(), also_own=engine_cpu)
        engine_faults = (
            memory_pressure.group_major_faults(engine.process_groups()) - faults_before if engine else 0
        )
        memory = memory_pressure.row_fields(memory_before, memory_pressure.snapshot(), engine_faults)
        peak = peak_memory_mb(models.target.device)  # before the lossless check's own passes
        row = self._row(dataset, cell, example, models.target, request, generation, replay)
        if repeats:
            row["walltime_repeats"] = [g.walltime for g in repeats]
            row["ttft_repeats"] = [g.ttft for g in repeats]
        row["peak_memory_mb"] = peak
        row.update(memory)  # pages read back from disk while the row ran (memory_pressure.py)
        if others is not None:  # a loaded machine's walltimes are not clean (machine.LOADED)
            row["others_cpu"] = others
            # cores left to our threads after the others' share: < 0, our threads competed for cores
            row["cpu_headroom"] = round(self.machine.cores * (1 - others) - self.machine.threads, 2)
        row["engine"] = self.engine(cell)
        if row["engine"] != "eager":  # compiling, or a serving engine's start (its compile included)
            row["compile_s"] = self.compile_pending.pop(cell.id, 0.0)
            cached = self.cache_pending.pop(cell.id, Counter())
            if cached:
                row["compile_cache"] = dict(cached)
        return row

    def engine(self, cell: Cell) -> str:
        """The engine a cell's target runs on: its model's, except for methods that run transformers'
        generate themselves (always eager)."""
        return self.recipe.engine_of(cell.target) if METHODS[cell.method].runs_engine else "eager"

    def _measure(self, dataset: DatasetRun, cell: Cell, state, example: Example, check: bool):
        """One example, ``repeats`` times for a timed cell: every repeat must give the same outputs and
        counts; the row's times are the repeats' means (each repeat is kept). (request, generation,
        replay, the repeats or [] when measured once)."""
        reset_peak_memory(state.target.device)
        compiled = state.compile_seconds()
        request, first, replay = self._generate(dataset, cell, state.target, state.drafter, example, check)
        while state.compile_seconds() > compiled:  # a shape met for the first time compiled in there
            self.compile_pending[cell.id] = (
                self.compile_pending.get(cell.id, 0.0) + state.compile_seconds() - compiled
            )
            compiled = state.compile_seconds()
            request, first, replay = self._generate(
                dataset, cell, state.target, state.drafter, example, check
            )
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
                model: counts | _mean_clocks(repeats, model) for model, counts in first.forwards.items()
            },
        )
        return request, mean, replay, repeats

    def _generate(self, dataset, cell: Cell, target, drafter, example: Example, check: bool):
        """(request, generation, the ReplayTarget or None): one example, live or replayed; ``check``
        also runs a replayed one live and stops at the first difference."""
        method = self._method(cell, target)
        if example.turns:
            return self._conversation(dataset, cell, target, drafter, example)
        request = self.request(target, dataset, example)
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
            live = method(cell.params, target, drafter, self.request(target, dataset, example))
            difference = first_difference(generation, live)
            if difference:
                ids, parted = reference["output_ids"], divergence(reference["output_ids"], live.tokens)
                if parted != -1 and is_tie(audit_model(target), request.prompt_ids, ids, live.tokens, parted):
                    replay.live_tie = parted
                else:
                    raise SpecbenchError(
                        where,
                        f"{about}: the replayed run differs from the live one, {difference}",
                        "replay is exact only for greedy lossless methods: run this method live "
                        "(remove replay:) and report the difference",
                    )
        return request, generation, replay

    def _method(self, cell: Cell, target):
        """run(params, target, drafter, request): the method's own loop, or on an engine target the
        engine's decoding that the backend mapped the cell to."""
        if not isinstance(target, EngineModel):
            return METHODS[cell.method].run
        spec = self.engine_spec(cell, target)

        def run(params, target, drafter, request):
            generation = target.generate(request, spec, drafter)
            sampling_audit.attach(generation, target.reference, request)  # untimed, T > 0 only
            return generation

        return run

    def engine_spec(self, cell: Cell, target: EngineModel) -> dict | None:
        """The engine's speculative settings for ``cell`` (its backend's mapping; the recipe was checked
        to map)."""
        return BACKENDS[target.engine].speculation(engine_cell_view(self.recipe, cell))[0]

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
            request = self.request(target, dataset, example, answers)
            generation = self._method(cell, target)(cell.params, target, drafter, request)
            turns.append(generation)
            answers.append(target.tokenizer.decode(generation.tokens, skip_special_tokens=True))
            first = first or request
        return first, Generation.joined(turns), None

    def request(self, target: HFModel, dataset: DatasetRun, example: Example, answers=()) -> Request:
        """What a cell decodes for ``example`` (after ``answers``, the earlier turns): the rendered
        prompt, the token budget, the recipe's sampling and the example's seeded generator; public so
        that a script re-tracing a committed row builds exactly the request the run built."""
        text = render_turn(example, list(answers), target.tokenizer, dataset.chat_template)
        add_special = not dataset.chat_template or target.is_encoder_decoder
        ids = target.tokenizer(text, add_special_tokens=add_special, return_tensors="pt").input_ids[0]
        gen = self.recipe.generation
        sampling = SamplingParams(gen.temperature, gen.top_k, gen.top_p)
        generator = torch.Generator(device=target.device)
        turn = [f"turn {len(answers)}"] if answers else []  # turn 0 keeps the single-turn seed
        generator.manual_seed(
            int(content_hash(str(self.recipe.seed), dataset.label, example.id, *turn), 16) % (2**63)
        )
        max_new_tokens = gen.budget(ids.shape[0], dataset.max_new_tokens)
        if max_new_tokens < 1:
            raise SpecbenchError(
                f"{self.recipe.path}: generation.max_length",
                f"{gen.max_length} leaves no new token after the {ids.shape[0]}-token prompt of {example.id} "
                f"({dataset.label})",
                "raise max_length, or leave such prompts out of the data file",
            )
        return Request(ids.to(target.device), max_new_tokens, sampling, target.eos_token_ids(), generator)

    def _row(self, dataset, cell, example, target, request: Request, generation, replay=None) -> dict:
        text = target.tokenizer.decode(generation.tokens, skip_special_tokens=True)
        reference = self._reference(dataset, cell, example) if self._checked(cell) else None
        drafters = {name: self.model(name) for name in cell.drafter_names}
        first = divergence(reference["output_ids"], generation.tokens) if reference else None
        row = build_row(
            dataset,
            cell,
            example,
            text,
            request,
            generation,
            key=self.row_key(cell, dataset, example),
            first_divergence=first,
            costs=cell_costs(self.recipe, cell, target, drafters),
            replay=replay,
        )
        row["machine"] = self.machine.id
        if self.recipe.speedup_over(cell.target) != cell.target:  # another server's AR is its baseline
            row["speedup_over"] = self.recipe.speedup_over(cell.target)
        if reference:  # a tie or a mismatch (numerics.py); the target's counters are left as they were
            scorer = audit_model(self.model(self.recipe.reference_model(cell.target)))  # an engine's is ours
            row.update(
                divergence_fields(
                    scorer,
                    request.prompt_ids,
                    reference["output_ids"],
                    generation.tokens,
                    first,
                    # an engine without a specbench twin has no model here to tell a tie apart
                    single_turn=not example.turns and scorer is not None,
                )
            )
        return row

    def sample_gpu(self, dataset: DatasetRun, cell: Cell, at: str) -> None:
        sample = gpu_sample()
        if sample is not None:
            where = {"dataset": dataset.label, "cell": cell.id, "at": at, "time": now()}
            self.gpu_samples.append({**where, "gpus": sample})


def _mean_clocks(repeats: list, model: str) -> dict[str, float]:
    """A model's clocks averaged over the repeats of one example (its counts are the same in each)."""
    clocks = [c for c in ("seconds", "prefill_seconds") if c in repeats[0].forwards[model]]
    return {c: sum(g.forwards[model][c] for g in repeats) / len(repeats) for c in clocks}
