"""``specbench plan``: the bill of a recipe before anything loads.

:func:`build_plan` takes a recipe and the declared hardware and returns plain dicts: every model's
size (:mod:`specbench.models.facts`: parameters, weight bytes at its dtype, KV cache at the recipe's
longest sequence, no weight read), where each model would sit (:mod:`specbench.pipeline.planning.placement`),
and per cell the rows left to run, the expected forward passes per model, walltime and GPU-hours.
Every assumption is returned with the numbers it produced (``plan["assumptions"]``):

* sequence: the longest prompt + the dataset's ``max_new_tokens`` (per turn of multi-turn prompt
  sets). The prompt's length is the previous run's measured ``prompt_tokens`` (``--output-dir``), else
  the longest prompt's characters / 4 when the dataset reads offline, else 1024 tokens. Every output
  is taken to run to its budget (an upper bound: EOS stops earlier).
* passes per row, for T generated tokens and acceptance rate α (:func:`expected_passes`):
  autoregressive T; speculative with k (Leviathan et al., ICML 2023, Eq. 1) T / E target passes,
  E = (1 - α^(k+1)) / (1 - α), and k drafter passes per target pass; rough rules for the other
  methods, stated in each cell's ``rule``. Encoder passes (one per row) are left out.
* α: ``draft_acceptance_rate`` of the previous run's cells with the same target and drafter models
  (the same cell and dataset first), else ``--acceptance`` (0.6). accepted / proposed under-states the
  i.i.d. α for k > 1, so a measured α errs towards more passes.
* time per pass: ``--pass-ms``, else ``--probe`` (each model loaded on the recipe's device and timed over
  a few passes), else the previous run's seconds / forward passes of the same model, else weight bytes /
  memory bandwidth (batch-1 decoding reads every weight once a pass; a lower bound, no kernel launch or
  Python cost). A model split over GPUs runs its parts one after another, so the rule is unchanged.
* rows left: the dataset's examples less those whose row the previous run holds under the key ``run
  --resume`` skips by (the cell's settings, the example and its prompt), so a changed setting counts its
  rows again; by cell name and example id where the dataset does not read offline.
* walltime per cell: (rows x repeats + warm-up) x the passes' time; replayed cells time the target
  only on their ``replay_check`` rows. GPU-hours: walltime x the GPUs the placement occupies.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

from specbench import sources
from specbench.engines import ENGINE_NAMES, is_remote
from specbench.errors import SpecbenchError
from specbench.methods import BASELINE, METHODS, TARGET
from specbench.pipeline.planning import placement
from specbench.pipeline.planning.host_memory import host_memory
from specbench.pipeline.planning.placement import GiB
from specbench.pipeline.planning.previous import Previous, previous_alpha, previous_pass_ms, read_previous
from specbench.pipeline.run.datasets import DatasetRun
from specbench.pipeline.run.keys import RowKeys

DEFAULT_PROMPT_TOKENS = 1024
CHARS_PER_TOKEN = 4  # English text under a ~32k-50k BPE vocabulary; a stated rule, not a tokenizer
DEFAULT_ACCEPTANCE = 0.6


@dataclass(frozen=True)
class Hardware:
    gpus: int = 0  # 0: none declared, sizes only
    gpu_memory: float = 80 * GiB
    margin: float = (
        0.05  # on each model's weights + KV cache (specbench.pipeline.planning.placement says why)
    )
    reserve: float = 1 * GiB  # per GPU: CUDA context, workspace
    bandwidth: float = 2e12  # bytes/s of a GPU's memory
    cpu_bandwidth: float = 20e9


NO_RULE = "no rule for this method: one target pass per token"


def expected_passes(cell, tokens: float, alpha: float) -> tuple[dict[str, float], int | None]:
    """Forward passes per model for one row of ``tokens`` generated tokens (the rule its method
    declares, :class:`specbench.methods.PassRule`), and the draft length k it assumed."""
    rule = METHODS[cell.method].plan
    if rule is None:
        return {cell.target: tokens}, None
    names: dict = {TARGET: cell.target, **dict(enumerate([cell.drafter] if cell.drafter else cell.drafters))}
    passes, k = rule.passes(cell.params, tokens, alpha)
    out: dict[str, float] = {}
    for role, count in passes:
        if role in names:  # a drafter-less cell (prompt lookup inside generate) prices the target only
            out[names[role]] = count
    return out, k


def build_plan(
    recipe,
    hardware: Hardware,
    *,
    output_dir: Path | None = None,
    acceptance: float = DEFAULT_ACCEPTANCE,
    pass_ms: dict[str, float] | None = None,
    probed: dict[str, float] | None = None,
    limit: int | None = None,
    profile: dict | None = None,
) -> dict:
    """The plan of ``recipe`` on ``hardware`` (module docstring); a recipe that cannot fit raises.
    ``limit``: at most that many examples per dataset, as ``specbench run --limit``."""
    import torch

    from specbench.models.devices import cpu_bf16_feature, dtype_choice

    previous = read_previous(output_dir)
    datasets = dataset_shapes(recipe, previous, limit)
    sequence = max(d["prompt_tokens"] + d["tokens_per_row"] for d in datasets)
    gpu_planned = hardware.gpus > 0
    dtypes = {}
    for name, spec in recipe.models.items():
        dtype = spec.dtype
        if dtype == "auto":  # as the loader resolves it: bfloat16 on a GPU; on this CPU, its rule
            on_gpu = spec.device.startswith("cuda") or (spec.device == "auto" and gpu_planned)
            rule = sources.source_of(spec.source).dtype_rule or "auto"
            dtype = "bfloat16" if on_gpu else dtype_choice(rule, "auto", torch.device("cpu"))[0]
        dtypes[name] = dtype
    for name, spec in recipe.models.items():  # an early exit or heads run in their base model's dtype
        if sources.source_of(spec.source).dtype_rule is None and spec.options.get("of") in dtypes:
            dtypes[name] = dtypes[spec.options["of"]]
    facts = {name: _facts(recipe, name, dtypes[name]) for name in recipe.models}
    on_cpu_here = not gpu_planned and not torch.cuda.is_available()
    cpu_lacks_bf16_units = cpu_bf16_feature() is None
    bf16_without_units = [
        name
        for name, spec in recipe.models.items()
        if dtypes[name] == "bfloat16"
        and (spec.device == "cpu" or (spec.device == "auto" and on_cpu_here))
        and spec.engine in (None, "eager", "compiled")
        and sources.source_of(spec.source).neural
        and cpu_lacks_bf16_units
    ]
    models = []
    for name, fact in facts.items():
        kv = fact.kv_bytes_per_token * sequence
        options = recipe.models[name].engine_options
        if recipe.models[name].engine == "llama.cpp":  # llama-server reserves its --ctx-size per slot
            kv = (
                fact.kv_bytes_per_token
                * (options.get("ctx_size") or sequence)
                * (options.get("parallel") or 1)
            )
        elif recipe.models[name].engine in ENGINE_NAMES:  # vLLM reserves its KV cache up front
            kv = int(options.get("kv_cache_gib", 2) * 2**30)
        footprint = math.ceil((fact.weight_bytes + kv) * (1 + hardware.margin))
        if _remote_only(recipe.models[name]):  # a server elsewhere: nothing of it is held here
            kv = footprint = 0
        models.append(fact.as_dict() | {"kv_bytes": kv, "footprint_bytes": footprint})
    placed = None
    if gpu_planned:
        demands = [  # statistical drafters hold nothing on a GPU
            placement.demand(recipe.models[m["name"]], m, facts[m["name"]], hardware.margin)
            for m in models
            if m["footprint_bytes"] or facts[m["name"]].shares
        ]
        placed = placement.place_or_explain(demands, hardware, recipe.path, {m["name"]: m for m in models})
    timed = profiled_times(recipe, profile, sequence // 2)  # --probe's times come first
    timed |= {name: (ms, "--probe") for name, ms in (probed or {}).items()}
    times = pass_times(recipe, facts, placed, hardware, pass_ms or {}, timed, previous)
    for model in models:
        model["pass_ms"], model["pass_ms_source"] = times[model["name"]]
    cells = cell_bills(recipe, datasets, times, previous, acceptance, finished_rows(recipe, previous, limit))
    seconds = [c["seconds"] for c in cells if c["seconds"] is not None]
    gpus_used = len([g for g in placed["gpus"] if g["models"]]) if placed else 0
    hours = sum(seconds) / 3600
    return {
        "recipe": recipe.name,
        "path": str(recipe.path),
        # on a CPU run: whether the models and kept-alive engines fit in this machine's memory at once
        "host_memory": None if gpu_planned else host_memory(recipe, models),
        # models that would compute bfloat16 on this CPU without its matrix units (specbench.models.devices)
        "bf16_without_units": bf16_without_units,
        "assumptions": {
            "sequence_tokens": sequence,
            "datasets": datasets,
            "margin": hardware.margin,
            "reserve_bytes_per_gpu": hardware.reserve,
            "gpus": hardware.gpus,
            "gpu_memory_bytes": hardware.gpu_memory,
            "gpu_bandwidth_bytes_per_s": hardware.bandwidth,
            "cpu_bandwidth_bytes_per_s": hardware.cpu_bandwidth,
            "acceptance_default": acceptance,
            "batch": 1,
        },
        "models": models,
        "placement": placed,
        "cells": cells,
        "totals": {
            "rows": sum(c["rows"] or 0 for c in cells),
            "rows_unknown": sum(c["rows"] is None for c in cells),
            "hours": hours,
            "gpus_used": gpus_used,
            "gpu_hours": hours * gpus_used if gpus_used else None,
        },
    }


def _remote_only(spec) -> bool:
    """A model served elsewhere whose weights specbench does not load (engine: openai without
    audit_weights; with it, its copy is specbench's own, billed as any model)."""
    return is_remote(spec.engine) and not spec.engine_options.get("audit_weights")


def _facts(recipe, name: str, dtype: str):
    """The model's size facts; a remote model's, where none can be had here, are zero (never billed)."""
    try:
        return sources.model_facts(name, recipe.models, dtype)
    except SpecbenchError:
        if not _remote_only(recipe.models[name]):
            raise
        from specbench.models.facts import ModelFacts

        spec = recipe.models[name]
        return ModelFacts(name, spec.source, "remote: not billed (no config here)", dtype, None, 0, 0)


def dataset_shapes(recipe, previous: Previous | None, limit: int | None = None) -> list[dict]:
    """Per dataset: examples, the longest prompt in tokens (and how it was found), tokens per row."""
    from specbench.tasks import get_task

    measured: dict[str, int] = {}
    for row in previous.rows if previous else ():
        measured[row["dataset"]] = max(measured.get(row["dataset"], 0), int(row.get("prompt_tokens") or 0))
    shapes = []
    for spec in recipe.datasets:
        task = get_task(spec.task)
        split = spec.split or task.default_split
        label = f"{spec.task}/{split}"
        examples = _local_examples(task, spec, split)
        count = len(examples) if examples is not None else spec.limit
        count = min(count, limit) if count is not None and limit is not None else count or limit
        turns = 1 + max((len(e.turns) for e in examples), default=0) if examples else 1
        if measured.get(label):
            prompt, how = measured[label], "longest prompt_tokens of the previous run"
        elif examples:
            chars = max(len(e.prompt) + sum(len(t) for t in e.turns) for e in examples)
            prompt, how = (
                math.ceil(chars / CHARS_PER_TOKEN),
                f"longest prompt: {chars} characters / {CHARS_PER_TOKEN}",
            )
        else:
            prompt, how = DEFAULT_PROMPT_TOKENS, "default: the dataset does not read offline"
        max_new = spec.max_new_tokens or recipe.generation.max_new_tokens
        shapes.append(
            {
                "dataset": label,
                "examples": count,
                "examples_source": "read offline" if examples is not None else "limit; not read offline",
                "prompt_tokens": prompt,
                "prompt_source": how,
                "max_new_tokens": max_new,
                "tokens_per_row": max_new * turns,
            }
        )
    return shapes


def _local_examples(task, spec, split: str) -> list | None:
    """The dataset's examples (every / limit applied) when a local file holds them; None: Hub only."""
    data_dir = os.environ.get("SPECBENCH_DATA_DIR")
    folders = task.local_dirs or (task.name,)
    local = data_dir and any((Path(data_dir) / folder / f"{split}.jsonl").is_file() for folder in folders)
    if not (spec.data_files or local or task.embedded):
        return None
    examples = task.load(split=split, data_files=str(spec.data_files) if spec.data_files else None)
    return examples[:: spec.every][: spec.limit]


def profiled_times(recipe, profile: dict | None, context: int) -> dict[str, tuple[float, str]]:
    """(ms, where from) of a one-token pass at ``context`` for each recipe model a cost profile
    (``specbench probe``) probed: the entry of its recipe name with its weights, or in a profile of
    format 1 (keyed by source) the entry of its source where the recipe loads that source in one
    configuration only (:func:`~specbench.pipeline.analysis.profiles.entries_for`)."""
    from specbench.pipeline.analysis import profiles

    if profile is None:
        return {}
    profiles.check_profile(profile)
    models = [
        profiles.ModelConfig(
            name,
            spec.source,
            profiles.weights_identity(spec.model_dump(mode="json")),
            spec.dtype,
            recipe.engine_of(name),
        )
        for name, spec in recipe.models.items()
    ]
    times = {}
    for name, entry in profiles.entries_for(profile, models).items():
        ms = 1000 * profiles.probed_cost(entry).pass_seconds(1, context)
        setup = f"{entry.get('dtype')} {entry.get('engine')}"
        times[name] = (ms, f"--profile ({setup}, one-token pass after {context} positions)")
    return times


def pass_times(recipe, facts, placed, hardware, given, timed, previous) -> dict[str, tuple[float, str]]:
    """(ms per forward pass, where the number comes from) for every recipe model; ``timed``: the
    (ms, where from) of the models timed before planning (--probe, a cost profile)."""
    on_gpu = set()
    for gpu in placed["gpus"] if placed else ():
        on_gpu |= {entry["name"] for entry in gpu["models"]}
    measured = previous_pass_ms(recipe, previous)
    times = {}
    for name in sorted(facts, key=lambda n: facts[n].shares is not None):  # early exits after their base
        fact = facts[name]
        if name in given:
            times[name] = (given[name], "--pass-ms")
        elif name in timed:
            times[name] = timed[name]
        elif name in measured:
            times[name] = (measured[name], "previous run (seconds / forward passes)")
        elif fact.shares is not None and fact.pass_bytes is not None:
            base_ms, _ = times[fact.shares]
            base_bytes = facts[fact.shares].weight_bytes
            times[name] = (
                base_ms * fact.pass_bytes / base_bytes,
                f"{fact.shares}'s pass x {fact.pass_bytes / 2**20:.1f}/{base_bytes / 2**20:.1f} MiB read",
            )
        elif fact.shares is not None:
            base_ms, _ = times[fact.shares]
            times[name] = (
                base_ms * fact.pass_fraction,
                f"{fact.shares}'s pass x {fact.layers}/{facts[fact.shares].layers} layers",
            )
        elif fact.weight_bytes == 0:
            times[name] = (0.0, "statistical drafter")
        else:
            gpu = name in on_gpu or recipe.models[name].device.startswith("cuda")
            rate = hardware.bandwidth if gpu else hardware.cpu_bandwidth
            where = "GPU" if gpu else "CPU"
            times[name] = (
                fact.weight_bytes / rate * 1000,
                f"weights / {rate / 1e9:g} GB/s, {where}",
            )
    return times


class PlannedKeys(RowKeys):
    """The keys a run of ``recipe`` gives its rows on the machine that started it."""

    def __init__(self, recipe):
        self.recipe, self.repeats, self.key_scope, self._resolved = recipe, recipe.repeats, None, {}


def finished_rows(recipe, previous: Previous | None, limit: int | None) -> dict[tuple[str, str], int]:
    """(dataset, cell id) -> rows of the previous run that ``run --resume`` would skip: its rows under
    this recipe's keys. A dataset that does not read offline is counted by cell name and example id."""
    from specbench.tasks import get_task

    if previous is None:
        return {}
    recorded = {row.get("key") for row in previous.rows}
    ids_by_cell: dict[tuple[str, str], set] = {}
    for row in previous.rows:
        ids_by_cell.setdefault((row["dataset"], row["cell"]), set()).add(row.get("example_id"))
    keys, finished = PlannedKeys(recipe), {}
    for spec in recipe.datasets:
        task = get_task(spec.task)
        split = spec.split or task.default_split
        label = f"{spec.task}/{split}"
        examples = _local_examples(task, spec, split)
        for cell in recipe.cells():
            if examples is None:
                finished[label, cell.id] = len(ids_by_cell.get((label, cell.id), ()))
                continue
            dataset = DatasetRun(
                label, task, examples, spec.chat_template, spec.execute_code, spec.max_new_tokens
            )
            done = sum(keys.row_key(cell, dataset, e) in recorded for e in examples[:limit])
            finished[label, cell.id] = done
    return finished


def cell_bills(
    recipe,
    datasets: list[dict],
    times,
    previous: Previous | None,
    acceptance: float,
    done: dict[tuple[str, str], int],
) -> list[dict]:
    """Rows to run, passes per model, α and walltime for every (dataset, cell); ``done``: the rows
    each already has (:func:`finished_rows`)."""
    bills = []
    for dataset in datasets:
        for cell in recipe.cells():
            finished = done.get((dataset["dataset"], cell.id), 0)
            rows = None if dataset["examples"] is None else max(0, dataset["examples"] - finished)
            measured = previous_alpha(recipe, cell, dataset["dataset"], previous)
            alpha = measured if measured is not None else acceptance
            per_row, k = expected_passes(cell, dataset["tokens_per_row"], alpha)
            seconds = None
            if rows is not None:
                timed = rows * recipe.repeats + (min(recipe.warmup, rows) if rows else 0)
                target_rows = min(rows, recipe.replay_check) if cell.replay else timed
                seconds = sum(
                    passes * times[name][0] / 1000 * (target_rows if name == cell.target else timed)
                    for name, passes in per_row.items()
                )
            bills.append(
                {
                    "dataset": dataset["dataset"],
                    "cell": cell.id,
                    "method": cell.method,
                    "target": cell.target,
                    "drafters": list(cell.drafter_names),
                    "rows": rows,
                    "rows_done": finished,
                    "alpha": None if cell.method == BASELINE else alpha,
                    "alpha_source": "previous run" if measured is not None else "assumed (--acceptance)",
                    "passes_per_row": per_row,
                    "passes": {name: p * rows for name, p in per_row.items()} if rows is not None else None,
                    "k": k,
                    "rule": rule.text if (rule := METHODS[cell.method].plan) else NO_RULE,
                    "seconds": seconds,
                }
            )
    return bills


def probe(recipe, passes: int = 8) -> dict[str, float]:
    """ms per decoding pass of every neural recipe model, loaded on its device (``--probe``)."""
    import torch

    loaded, times = {}, {}
    # a model built on another recipe model's weights (early exit) loads after it
    order = sorted(recipe.models, key=lambda n: sources.source_of(recipe.models[n].source).dtype_rule is None)
    for name in order:
        spec = recipe.models[name]
        if not sources.source_of(spec.source).neural or is_remote(spec.engine):  # a remote pass: not ours
            continue
        request = sources.ModelRequest(
            name, spec.source, spec.dtype, spec.device, spec.revision, tuple(sorted(spec.options.items()))
        )
        model = loaded[name] = sources.load(request, resolve=loaded.__getitem__)
        generator = torch.Generator().manual_seed(0)
        ids = torch.randint(4, min(model.vocab_size, 256), (32 + passes + 1,), generator=generator)
        model.start(ids[:32])
        model.score(ids[32:33], 0)  # the prompt's pass, not timed
        model.counter.reset()
        for i in range(1, passes + 1):
            model.score(ids[32 : 33 + i], 0)
        times[name] = model.counter.seconds / passes * 1000
    return times
