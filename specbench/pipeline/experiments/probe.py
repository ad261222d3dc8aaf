"""Cost profiles: what one forward pass of each model costs on a device, as a small JSON file.

``specbench probe RECIPE`` loads every neural model of a recipe as a run would (its dtype, device and
engine; a compiled model compiles the passes of the recipe's draft lengths, as a run does, and its
static cache is sized for the largest probed context: a compiled pass reads the whole cache, so probe
contexts like the run's) and times passes on a grid of tokens fed (n) and cached context (c): each
point is timed in
``rounds`` rounds visited in a shuffled order (so drift hits every point alike), each round a few
passes of which the first is dropped, and the median kept. The profile holds the points, the
:class:`~specbench.pipeline.analysis.cost_model.SizeTable` fitted to them and its fit quality, and names the
machine, dtype, engine and versions. ``--roofline`` adds the device's measured memory bandwidth and
peak matrix FLOP/s (a roofline for models that were not probed).

The file format, and the devices without a probe that have a roofline from their public figures
(``specbench predict RUN --profile h100``), are :mod:`specbench.pipeline.analysis.profiles`.
"""

from __future__ import annotations

import random
import statistics
import time
from dataclasses import dataclass, field

import torch

from specbench import __version__, sources
from specbench.errors import SpecbenchError
from specbench.models.devices import DTYPES
from specbench.models.machine import this_machine
from specbench.pipeline.analysis import cost_model
from specbench.pipeline.analysis.profiles import FORMAT, weights

SIZES = (1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32, 64, 128, 256, 512)
CONTEXTS = (32, 256, 1024)
PASSES_PER_POINT = 3  # the first of each round is dropped (a new shape's first call warms caches)


def probe_model(model, sizes=SIZES, contexts=CONTEXTS, rounds: int = 3, seed: int = 0, progress=None):
    """(n, c, seconds) medians of ``model``'s passes feeding n tokens after c cached positions."""
    generator = torch.Generator().manual_seed(seed)
    longest = max(contexts) + max(sizes) + 2
    ids = torch.randint(4, min(model.vocab_size, 32000), (longest,), generator=generator)
    grid = [(n, c) for n in sizes for c in contexts]
    times: dict[tuple[int, int], list[float]] = {point: [] for point in grid}
    order = random.Random(seed)
    for _ in range(rounds):
        order.shuffle(grid)
        for n, c in grid:
            model.start(ids[:c])  # the prompt: c positions, cached by the untimed pass below
            model.score(ids[c : c + 1], 0)
            for i in range(PASSES_PER_POINT):
                model.rollback(1)
                before = model.counter.seconds
                model.score(ids[c : c + 1 + n], n - 1)  # feeds n tokens after c + 1 cached positions
                if i:
                    times[(n, c)].append(model.counter.seconds - before)
            if progress:
                progress()
    return [(float(n), float(c + 1), statistics.median(times[(n, c)])) for n, c in sorted(times)]


# no model specbench runs reads more positions than this; a probe's grid stays within it before any
# model loads, and within each model's own context once it has
MAX_POSITIONS = 131072
MAX_POINTS = 1024  # (tokens fed, context) points: each is timed rounds x PASSES_PER_POINT times


def check_grid(sizes, contexts) -> None:
    """The probe's grid is bounded before any model loads: a pass of at most MAX_POSITIONS positions
    (the largest context + the largest size + 2) and at most MAX_POINTS points."""
    longest = max(contexts) + max(sizes) + 2
    if longest > MAX_POSITIONS:
        raise SpecbenchError(
            "--sizes/--contexts",
            f"the longest probed pass reads {longest} positions (largest context {max(contexts)} + largest "
            f"size {max(sizes)} + 2), beyond the {MAX_POSITIONS} any model specbench runs reads",
            "probe the sizes and contexts the runs use, e.g. --sizes 1,2,4,8 --contexts 32,256,1024",
        )
    if len(sizes) * len(contexts) > MAX_POINTS:
        raise SpecbenchError(
            "--sizes/--contexts",
            f"{len(sizes)} sizes x {len(contexts)} contexts is {len(sizes) * len(contexts)} points to time, "
            f"more than {MAX_POINTS}",
            "probe fewer: the cost is linear in the context and interpolated between sizes",
        )


def check_context(recipe, name: str, model, sizes, contexts) -> None:
    """A model's probed passes stay within its context (``max_position_embeddings``; models with
    relative positions have none): refused before any pass is timed."""
    config = getattr(getattr(model, "model", None), "config", None)
    limit = getattr(config, "max_position_embeddings", None) if config is not None else None
    longest = max(contexts) + max(sizes) + 2
    if isinstance(limit, int) and not getattr(model, "is_encoder_decoder", False) and longest > limit:
        raise SpecbenchError(
            f"{recipe.path}: models.{name}",
            f"the longest probed pass reads {longest} positions (largest --contexts {max(contexts)} + "
            f"largest --sizes {max(sizes)} + 2), beyond {name}'s context of {limit}",
            f"lower --sizes and --contexts so that their largest values sum to at most {limit - 2}",
        )


class _OnEngine(Exception):
    """A model builds on one that a serving engine runs (heads of a vLLM target): not probed."""


@dataclass
class Loaded:
    """A recipe's models loaded for a probe, in load order, and those not probed with why."""

    models: dict = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)


def load_models(recipe, sizes=SIZES, contexts=CONTEXTS) -> Loaded:
    """Every neural model of ``recipe`` loaded as a run loads it (its threads set first), each checked
    against the grid (:func:`check_grid`, :func:`check_context`) before any pass is timed; models a
    serving engine runs, or that build on one, are skipped (their passes run in the engine's process)."""
    from specbench.engines import ENGINE_NAMES
    from specbench.pipeline.run.measure import model_request

    check_grid(sizes, contexts)
    if recipe.threads is not None:
        torch.set_num_threads(recipe.threads)
    found = Loaded()
    order = sorted(recipe.models, key=lambda n: sources.source_of(recipe.models[n].source).dtype_rule is None)

    def resolve(other: str):
        if other in found.skipped:
            raise _OnEngine(other)
        return found.models[other]

    for name in (n for n in order if sources.source_of(recipe.models[n].source).neural):
        request = model_request(recipe, name)
        if request.engine in ENGINE_NAMES:
            found.skipped[name] = f"runs on {request.engine}: its passes are the engine's"
            continue
        try:
            model = sources.load(request, resolve=resolve)
        except _OnEngine as base:
            found.skipped[name] = f"builds on {base}, which runs on a serving engine"
            continue
        check_context(recipe, name, model, sizes, contexts)
        found.models[name] = model
    if not found.models:
        raise SpecbenchError(
            str(recipe.path),
            "no neural model to probe"
            + (f" ({', '.join(found.skipped)} run on a serving engine)" if found.skipped else ""),
            "name a model with weights that specbench's own loops run (engine eager or compiled)",
        )
    return found


def probe_recipe(
    recipe, sizes=SIZES, contexts=CONTEXTS, rounds: int = 3, progress=None, loaded: Loaded | None = None
) -> dict:
    """The profile of every neural model of ``recipe`` on this machine (module docstring), each under
    its recipe name with its weights (source, revision, options), dtype and engine; ``loaded``: its
    models as :func:`load_models` loaded them (default: loaded here). Models a serving engine runs are
    not probed: ``not_probed`` names them."""
    from specbench.methods import METHODS
    from specbench.pipeline.run.measure import model_request

    check_grid(sizes, contexts)
    loaded = loaded if loaded is not None else load_models(recipe, sizes, contexts)
    models, configuration, skipped = {}, set(), loaded.skipped
    for name, model in loaded.models.items():
        spec, request = recipe.models[name], model_request(recipe, name)
        compiled = {}
        if hasattr(model, "prepare"):  # the compiled engine: the passes the recipe's cells compile
            lengths = sorted(
                {k for cell in recipe.cells() for k in METHODS[cell.method].draft_lengths(cell.params)}
            )
            longest = max(contexts) + max(sizes) + 2
            model.prepare(longest, lengths)
            compiled = {"buckets": list(model.buckets), "capacity": model.capacity}
        points = probe_model(model, sizes, contexts, rounds, progress=progress)
        table = cost_model.fit_size_table(points)
        dtype = str(model.model.dtype).removeprefix("torch.")
        configuration.add((dtype, request.engine, str(model.device)))
        models[name] = {
            "source": spec.source,
            "identity": weights(spec.model_dump(mode="json")),
            "parameters": model.num_parameters,
            "dtype": dtype,
            "engine": request.engine,
            "linear": getattr(model, "linear", None),
            "points": [list(p) for p in points],
            "table": {"sizes": table.sizes, "alpha": table.alpha, "gamma": table.gamma},
            "quality": cost_model.fit_quality(table, points),
            **compiled,
        }
    machine = this_machine()
    dtypes, engines, devices = (sorted({c[i] for c in configuration}) for i in range(3))
    return {
        "format": FORMAT,
        "kind": "probe",
        "machine": machine.to_json() | {"id": machine.id, "described": machine.describe()},
        "device": "+".join(devices),
        "dtype": "+".join(dtypes),
        "engine": "+".join(engines),
        "versions": _versions(),
        "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "recipe": str(recipe.path),
        "recipe_identity": recipe.identity(),
        "rounds": rounds,
        "models": models,
        **({"not_probed": skipped} if skipped else {}),
    }


def _versions() -> dict:
    import transformers

    return {"specbench": __version__, "torch": torch.__version__, "transformers": transformers.__version__}


def measure_roofline(dtype: str, seconds: float = 1.0) -> dict:
    """This CPU's memory bandwidth (a large tensor summed) and peak matrix FLOP/s at ``dtype``."""
    data = torch.ones(64 * 2**20, dtype=torch.float32)  # 256 MiB: far past the caches
    bandwidth = _best_rate(lambda: data.sum(), data.numel() * 4, seconds)
    size = 2048
    a = torch.randn(size, size).to(DTYPES[dtype])
    b = torch.randn(size, size).to(DTYPES[dtype])
    flops = _best_rate(lambda: a @ b, 2 * size**3, seconds)
    return {"bandwidth": bandwidth, "peak_flops": {dtype: flops}}


def _best_rate(work, amount: float, seconds: float) -> float:
    work()
    best, spent = 0.0, 0.0
    while spent < seconds:
        started = time.perf_counter()
        work()
        took = time.perf_counter() - started
        spent += took
        best = max(best, amount / took)
    return best
