"""Cost profiles: what one forward pass of each model costs on a device, as a small JSON file.

``specbench probe RECIPE`` loads every neural model of a recipe as a run would (its dtype, device and
engine; a compiled model compiles the passes of the recipe's draft lengths, as a run does, and its
static cache is sized for the largest probed context: a compiled pass reads the whole cache, so probe
contexts like the run's) and times passes on a grid of tokens fed (n) and cached context (c): each
point is timed in
``rounds`` rounds visited in a shuffled order (so drift hits every point alike), each round a few
passes of which the first is dropped, and the median kept. The profile holds the points, the
:class:`~specbench.pipeline.cost_model.SizeTable` fitted to them and its fit quality, and names the
machine, dtype, engine and versions. ``--roofline`` adds the device's measured memory bandwidth and
peak matrix FLOP/s (a roofline for models that were not probed).

Devices without a probe have a roofline from their public figures (``specbench/data/devices.yaml``):
``specbench predict RUN --profile h100``.
"""

from __future__ import annotations

import functools
import json
import random
import statistics
import time
from importlib import resources
from pathlib import Path

import torch
import yaml

from specbench import __version__, sources
from specbench.errors import SpecbenchError
from specbench.models.cache import write_atomic
from specbench.models.devices import DTYPES
from specbench.models.machine import this_machine
from specbench.pipeline import cost_model

FORMAT = "specbench-cost-profile/1"
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


def probe_recipe(recipe, sizes=SIZES, contexts=CONTEXTS, rounds: int = 3, progress=None) -> dict:
    """The profile of every neural model of ``recipe`` on this machine (module docstring)."""
    from specbench.methods import METHODS
    from specbench.pipeline.measure import model_request

    if recipe.threads is not None:
        torch.set_num_threads(recipe.threads)
    loaded, models, configuration = {}, {}, set()
    order = sorted(recipe.models, key=lambda n: sources.source_of(recipe.models[n].source).dtype_rule is None)
    for name in order:
        spec = recipe.models[name]
        if not sources.source_of(spec.source).neural:
            continue
        request = model_request(recipe, name)
        model = loaded[name] = sources.load(request, resolve=loaded.__getitem__)
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
        models[spec.source] = {
            "recipe_name": name,
            "parameters": model.num_parameters,
            "dtype": dtype,
            "engine": request.engine,
            "points": [list(p) for p in points],
            "table": {"sizes": table.sizes, "alpha": table.alpha, "gamma": table.gamma},
            "quality": cost_model.fit_quality(table, points),
            **compiled,
        }
    if not models:
        raise SpecbenchError(str(recipe.path), "no neural model to probe", "name a model with weights")
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
        "rounds": rounds,
        "models": models,
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


@functools.lru_cache(maxsize=1)
def device_figures() -> dict:
    return yaml.safe_load(resources.files("specbench.data").joinpath("devices.yaml").read_text())


def write_profile(profile: dict, path: Path) -> None:
    write_atomic(path, json.dumps(profile, indent=1) + "\n")


def read_profile(value: str) -> dict:
    """A profile file written by ``specbench probe``, or a device named in devices.yaml (a roofline)."""
    figures = device_figures()
    if value in figures:
        return {"format": FORMAT, "kind": "roofline", "device": value, **figures[value]}
    path = Path(value).expanduser()
    if not path.is_file():
        raise SpecbenchError(
            "--profile",
            f"{value!r} is neither a profile file nor a known device",
            f"write one with specbench probe RECIPE --out FILE, or name one of {', '.join(sorted(figures))}",
        )
    try:
        profile = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise SpecbenchError(
            str(path), f"not a cost profile ({error})", "write it with specbench probe"
        ) from None
    if not isinstance(profile, dict) or profile.get("format") != FORMAT:
        raise SpecbenchError(
            str(path), f"format is not {FORMAT}", "write the profile again with specbench probe"
        )
    return profile


def probed_cost(entry: dict) -> cost_model.SizeTable:
    table = entry["table"]
    return cost_model.SizeTable(tuple(table["sizes"]), tuple(table["alpha"]), tuple(table["gamma"]))


def roofline_cost(
    figures: dict, weight_bytes: float, parameters: float, kv_bytes_per_token: float, dtype: str
):
    peak = figures["peak_flops"].get(dtype)
    if peak is None:
        raise SpecbenchError(
            "--profile",
            f"no peak FLOP/s for {dtype} in the {figures.get('device', 'roofline')} figures",
            f"use a dtype it lists: {', '.join(sorted(figures['peak_flops']))}",
        )
    return cost_model.Roofline(
        weight_bytes=weight_bytes,
        flops_per_token=2.0 * parameters,
        kv_bytes_per_token=kv_bytes_per_token,
        bandwidth=float(figures["bandwidth"]),
        peak_flops=float(peak),
        floor=float(figures.get("floor_s", 0.0)),
    )
