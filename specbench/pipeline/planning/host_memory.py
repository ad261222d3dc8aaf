"""Whether a recipe's models and the serving engines it keeps alive fit in this machine's memory
together, before a run: where they do not, the kernel evicts weights and rows re-read them from disk,
which spoils their walltimes without any CPU used by others (:mod:`specbench.models.memory_pressure`).

The bill: every model specbench itself loads (weights + KV cache, the plan's footprint), plus, for each
target served by an engine (``engine: vllm``), one engine per speculative setting its cells ask for, up
to the engine's ``max_engines`` (llama.cpp: ``max_servers``) kept at once (4 on a CPU; one engine in all
in a ``by-cell`` run, which stops each when its cells are done), each holding the target's weights, its KV
cache (``kv_cache_gib``), a model drafter's weights where the setting drafts with one, and
:data:`ENGINE_RUNTIME` for the engine's own process. A server specbench does not start (``engine:
openai``) holds nothing here: it is listed as remote and not billed (specbench loads its tokenizer
alone; with ``audit_weights`` its copy of the weights is billed as specbench's own). A compiled model on
``linear: inductor`` holds one packed copy of its weights per pass shape it compiles (frozen graphs take
their weights as constants, laid out for their GEMM kernels), billed as specbench's own. An estimate,
stated as one: allocator slack, page cache and the engine's compile caches come on top.
"""

from __future__ import annotations

import json

from specbench.engines import ENGINE_NAMES, is_remote
from specbench.methods import BASELINE, METHODS
from specbench.models.memory_pressure import available_bytes
from specbench.pipeline.planning.placement import GiB

ENGINE_RUNTIME = 1 * GiB  # an engine process's interpreter, torch and scheduler, besides its tensors
ENGINES_KEPT_ON_CPU = 4  # vLLM's max_engines default on a CPU (specbench.engines.vllm)
KEPT_OPTION = {
    "llama.cpp": "max_servers"
}  # the option naming how many an engine keeps, where not max_engines


def host_memory(recipe, models: list[dict], available: int | None = None) -> dict:
    """The bill (module docstring) against ``available`` bytes (default: MemAvailable now).
    ``models``: the plan's model entries (name, weight_bytes, footprint_bytes)."""
    by_name = {m["name"]: m for m in models}
    by_cell = getattr(recipe, "schedule", None) == "by-cell"
    own = sum(m["footprint_bytes"] for m in models if recipe.models[m["name"]].engine not in ENGINE_NAMES)
    own += sum(m["footprint_bytes"] for m in models if is_remote(recipe.models[m["name"]].engine))
    frozen = {m["name"]: m["weight_bytes"] * len(frozen_passes(recipe, m["name"])) for m in models}
    own += sum(frozen.values())
    engines = []
    for name, spec in recipe.models.items():
        if spec.engine not in ENGINE_NAMES:
            continue
        if is_remote(spec.engine):
            engines.append({"model": name, "engine": spec.engine, "remote": True, "bytes": 0})
            continue
        settings: dict[str, int] = {}
        for cell in recipe.cells():
            if cell.target != name:
                continue
            key = json.dumps([cell.method, cell.drafter, cell.params], sort_keys=True, default=str)
            drafter = by_name.get(cell.drafter) if cell.method != BASELINE and cell.drafter else None
            settings[key] = drafter["weight_bytes"] if drafter else 0
        if not settings:
            continue
        limit = spec.engine_options.get(KEPT_OPTION.get(spec.engine, "max_engines"))
        kept = 1 if by_cell else min(len(settings), limit or ENGINES_KEPT_ON_CPU)
        drafters = sorted(settings.values(), reverse=True)[:kept]  # the largest kept at once, at worst
        each = by_name[name]["footprint_bytes"] + ENGINE_RUNTIME
        engines.append(
            {"model": name, "engine": spec.engine, "settings": len(settings), "kept": kept,
             "bytes": kept * each + sum(drafters)}
        )  # fmt: skip
    # a by-cell run stops each engine when its cells are done (pipeline.run.runner): one lives at a time
    served = max((e["bytes"] for e in engines), default=0) if by_cell else sum(e["bytes"] for e in engines)
    needed = own + served
    available = available_bytes() if available is None else available
    return {
        "own_bytes": own,
        "frozen_bytes": sum(frozen.values()),
        "engines": engines,
        "needed_bytes": needed,
        "one_engine_at_a_time": by_cell,
        "available_bytes": available,
        "fits": None if available is None else needed <= available,
    }


def frozen_passes(recipe, name: str) -> set[tuple[str, int]]:
    """The pass shapes model ``name`` compiles into frozen graphs (``linear: inductor`` on the compiled
    engine; none otherwise): one token, and k + 1 and 1 + tree nodes for each cell it serves in, as
    :meth:`~specbench.models.compiled.CompiledHFModel.prepare` compiles them for the target and its
    drafters alike."""
    if recipe.engine_of(name) != "compiled" or recipe.linear_of(name) != "inductor":
        return set()
    shapes = {("chain", 1)}
    for cell in recipe.cells():
        if name not in (cell.target, *cell.drafter_names):
            continue
        method = METHODS[cell.method]
        shapes |= {("chain", k + 1) for k in method.draft_lengths(cell.params) if k > 0}
        shapes |= {("tree", n + 1) for n in method.tree_sizes(cell.params) if n > 0}
    return shapes
