"""Where a recipe's models would sit on the declared GPUs (``specbench plan``), before anything loads.

A model needs (weights + KV cache) x (1 + margin); a GPU offers its memory less a reserve. The defaults,
5% and 1 GiB: weights are allocated once, in large tensors, so what grows past them at batch 1 is the
KV cache (with its transient copies while it grows), the logits of a scored block and the caching
allocator's rounding; the reserve holds the CUDA context and cuBLAS workspace. (10% of a 70B model is
13 GiB, more than any of that, and would reject a split that puts 72 GiB of weights on an 80 GiB GPU.)

A model's own placement is honoured, as the loader reads it:

* ``options.device_map`` ``sequential`` / ``balanced`` / ``auto`` / ``balanced_low_0``: the split
  accelerate computes for ``from_pretrained`` (:func:`specbench.models.facts.weights_by_device`), under the
  recipe's ``max_memory`` (else what the GPUs have free at that point, less the margin); weights it
  would leave on ``cpu`` or ``disk`` are refused unless ``max_memory`` names ``cpu`` or an
  ``offload_folder`` is set;
* an explicit ``device_map`` (module -> device): those modules' bytes where it says;
* ``device: cuda:N`` / ``device: cpu``: the whole model there.

Every other model is placed by the plan, largest first: on the GPU where it leaves the least room (best
fit), or, bigger than any GPU's free memory, split over consecutive GPUs in order, as
``device_map: sequential`` would (at any byte, where accelerate splits between layers: the plan then
says to set one). An early-exit draft sits with the model whose weights it shares; its KV cache is
its own.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass

from specbench.errors import SpecbenchError
from specbench.models.options import parse_size

GiB = 2**30
STRATEGIES = ("sequential", "balanced", "auto", "balanced_low_0")
MOST_GPUS = 64  # the search for the fewest GPUs that fit stops here


def show_bytes(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value / GiB:,.2f} GiB" if abs(value) >= GiB else f"{value / 2**20:,.1f} MiB"


def show_gpu(value: float) -> str:
    return f"{value / GiB:.4g} GiB"


def device_of(value) -> int | str:
    """A GPU index, or "cpu" / "disk", from a device_map or max_memory key or value."""
    text = str(value)
    if text.isdigit():
        return int(text)
    match = re.fullmatch(r"cuda(?::(\d+))?", text)
    if match:
        return int(match[1] or 0)
    return "cpu" if text == "mps" else text  # mps: not a GPU of this plan


@dataclass
class Demand:
    """What one model asks of the GPUs."""

    name: str
    weights: float
    kv: float
    margin: float
    device: int | str | None = None  # pinned: a GPU index or "cpu"
    strategy: str | None = None  # an accelerate device_map strategy
    explicit: dict | None = None  # an explicit device_map: device -> weight bytes
    max_memory: dict | None = None  # the recipe's: device -> bytes
    offload_folder: bool = False
    follows: str | None = None  # early exit: sits with the model whose weights it runs
    split: Callable[[str, dict], dict] | None = None  # (strategy, max_memory) -> device -> weight bytes

    @property
    def bytes(self) -> int:
        return math.ceil((self.weights + self.kv) * (1 + self.margin))

    @property
    def chosen_by_plan(self) -> bool:
        return self.device is None and self.strategy is None and self.explicit is None

    def with_margin(self, weights: dict) -> dict:
        """Bytes per device for weight bytes per device (the KV cache shared in proportion)."""
        whole = sum(weights.values()) or 1
        return {d: math.ceil((w + self.kv * w / whole) * (1 + self.margin)) for d, w in weights.items() if w}


def demand(spec, model: dict, fact, margin: float) -> Demand:
    """The demand of recipe model ``spec`` (``model``: its sizes from the plan, ``fact``: its facts)."""
    options = spec.options
    need = Demand(model["name"], model["weight_bytes"], model["kv_bytes"], margin, follows=fact.shares)
    device_map, max_memory = options.get("device_map"), options.get("max_memory")
    need.offload_folder = bool(options.get("offload_folder"))
    if isinstance(max_memory, dict):
        where = f"models.{model['name']}.options.max_memory"
        need.max_memory = {device_of(k): parse_size(v, where) for k, v in max_memory.items()}
    if isinstance(device_map, dict):
        from specbench.models.facts import bytes_by_device

        need.explicit = {device_of(d): size for d, size in bytes_by_device(fact, device_map).items()}
    elif device_map in STRATEGIES:
        need.strategy = device_map
        need.split = None if fact.meta is None else _accelerate(fact)
    elif device_map is not None:
        need.device = device_of(device_map)
    elif spec.device == "cpu" or spec.device.startswith("cuda"):
        need.device = device_of(spec.device)
    return need


def _accelerate(fact) -> Callable[[str, dict], dict]:
    from specbench.models.facts import weights_by_device

    seen: dict = {}

    def split(strategy: str, max_memory: dict) -> dict:
        key = (strategy, tuple(sorted(max_memory.items(), key=str)))
        if key not in seen:
            seen[key] = {device_of(d): b for d, b in weights_by_device(fact, strategy, max_memory).items()}
        return seen[key]

    return split


def place(demands: list[Demand], gpus: int, usable: float) -> tuple[dict | None, Demand | None, str]:
    """({GPU index or "cpu": [(name, bytes)]}, None, ""), or (None, the first demand that does not fit,
    why)."""
    free = {g: usable for g in range(gpus)}
    sits: dict = {g: [] for g in range(gpus)} | {"cpu": []}
    order = sorted(demands, key=lambda d: (d.follows is not None, d.chosen_by_plan, -d.bytes))
    for need in order:
        parts, why = _parts(need, free, sits)
        if parts is None:
            return None, need, why
        for device, size in parts.items():
            if device != "cpu":
                free[device] -= size
            sits[device].append((need.name, size))
    return sits, None, ""


def _parts(need: Demand, free: dict, sits: dict) -> tuple[dict | None, str]:
    """Bytes per device for ``need`` given the GPUs' ``free`` bytes, or (None, why it does not fit)."""
    if need.explicit is not None:
        return _checked(need, need.with_margin(need.explicit), free, "its device_map")
    if need.device == "cpu":
        return {"cpu": need.bytes}, ""
    if need.follows is not None and need.device is None:
        home = [g for g, entries in sits.items() if any(name == need.follows for name, _ in entries)]
        if home and (home[0] == "cpu" or free[home[0]] >= need.bytes):
            return {home[0]: need.bytes}, ""
    if isinstance(need.device, int):
        if need.device not in free:
            return None, f"the recipe pins it to GPU {need.device}, which is not declared"
        return _checked(need, {need.device: need.bytes}, free, f"GPU {need.device}")
    if need.strategy is not None:
        return _strategy(need, free)
    single = [g for g in free if free[g] >= need.bytes]
    if single:
        return {min(single, key=lambda g: free[g]): need.bytes}, ""
    parts, left = {}, need.bytes
    for g in sorted(free):
        take = min(max(free[g], 0), left)
        if take > 0:
            parts[g], left = take, left - take
    if left > 0:
        return None, f"{show_bytes(sum(max(f, 0) for f in free.values()))} is free on all GPUs together"
    return parts, ""


def _strategy(need: Demand, free: dict) -> tuple[dict | None, str]:
    caps = need.max_memory or {g: room / (1 + need.margin) for g, room in free.items()}
    caps = {d: math.floor(b) for d, b in caps.items() if not isinstance(d, int) or d in free}
    if need.split is None:  # no configuration to split by (a .gguf file): the plan's own sequential fill
        return None, "a device_map strategy needs the model's configuration (a checkpoint, not a .gguf file)"
    what = f"device_map: {need.strategy}" + (
        f" with max_memory {_show_caps(need.max_memory)}" if need.max_memory else ""
    )
    weights = need.split(need.strategy, caps)
    return _checked(need, need.with_margin(weights), free, what, weights)


def _checked(
    need: Demand, parts: dict, free: dict, what: str, weights: dict | None = None
) -> tuple[dict | None, str]:
    """``parts`` if every GPU part fits and nothing is offloaded that the recipe did not allow."""
    for device, size in parts.items():
        size = (weights or parts)[device]
        if device == "disk" and not need.offload_folder:
            return None, f"{what} leaves {show_bytes(size)} of it on disk and there is no offload_folder"
        if device == "cpu" and not (need.max_memory and "cpu" in need.max_memory):
            return None, f"{what} leaves {show_bytes(size)} of it on the CPU (max_memory names no cpu)"
        if isinstance(device, int) and device not in free:
            return None, f"{what} uses GPU {device}, which is not declared"
        if isinstance(device, int) and parts[device] > free[device]:
            room = show_bytes(free[device])
            return None, f"{what} puts {show_bytes(parts[device])} on GPU {device}, which has {room} free"
    return {("cpu" if d == "disk" else d): size for d, size in parts.items()}, ""


def _show_caps(caps: dict) -> str:
    return "{" + ", ".join(f"{d}: {show_gpu(b)}" for d, b in caps.items()) + "}"


def gpus_needed(demands: list[Demand], usable: float) -> int | None:
    """The fewest such GPUs that hold every demand (None: none up to MOST_GPUS)."""
    for gpus in range(1, MOST_GPUS + 1):
        if place(demands, gpus, usable)[0] is not None:
            return gpus
    return None


def replanned(demands: list[Demand]) -> list[Demand]:
    """The same demands with every placement left to the plan (what more GPUs could do unpinned)."""
    return [Demand(d.name, d.weights, d.kv, d.margin, follows=d.follows) for d in demands]


def place_or_explain(demands: list[Demand], hardware, recipe_path, models: dict) -> dict:
    """The placement as plain data, or a one-line SpecbenchError naming the model that does not fit and
    the fewest such GPUs that would hold the recipe."""
    usable = hardware.gpu_memory - hardware.reserve
    sits, failed, why = place(demands, hardware.gpus, usable)
    gpu = show_gpu(hardware.gpu_memory)
    if failed is not None:
        model = models[failed.name]
        weights, kv = show_bytes(model["weight_bytes"]), show_bytes(model["kv_bytes"])
        problem = (
            f"{model['source']} ({weights} weights + {kv} KV cache, + {hardware.margin:.0%} = "
            f"{show_bytes(failed.bytes)}) does not fit on {hardware.gpus} x {gpu} "
            f"({show_bytes(usable)} usable on each after a {show_bytes(hardware.reserve)} reserve): {why}"
        )
        raise SpecbenchError(
            f"{recipe_path}: models.{failed.name}", problem, _fix(demands, failed, usable, gpu)
        )
    table, notes = [], []
    for g in range(hardware.gpus):
        used = sum(size for _, size in sits[g])
        entries = [{"name": name, "bytes": size, "part": _part(name, g, sits)} for name, size in sits[g]]
        table.append(
            {
                "gpu": g,
                "usable_bytes": usable,
                "used_bytes": used,
                "free_bytes": usable - used,
                "models": entries,
            }
        )
    for need in demands:
        spread = [g for g in range(hardware.gpus) if any(name == need.name for name, _ in sits[g])]
        if len(spread) > 1 and need.chosen_by_plan:
            notes.append(
                f"{need.name} is split over GPUs {', '.join(map(str, spread))}: give it options: "
                "{device_map: sequential} (and max_memory if accelerate's split must leave room), since "
                "without a device_map a model loads whole onto one device"
            )
    off = [{"name": name, "bytes": size} for name, size in sits["cpu"]]
    placed_by = {need.name: "plan" if need.chosen_by_plan else "recipe" for need in demands}
    return {
        "gpus": table,
        "off_gpu": off,
        "gpus_needed": gpus_needed(demands, usable),
        "placed_by": placed_by,
        "notes": notes,
    }


def _fix(demands: list[Demand], failed: Demand, usable: float, gpu: str) -> str:
    needed = gpus_needed(demands, usable)
    if needed:
        return f"needs {needed} x {gpu}: pass --gpus {needed}, or use a smaller dtype"
    hint = ""
    if failed.strategy not in (None, "sequential") and failed.max_memory:
        trial = Demand(**{**failed.__dict__, "strategy": "sequential"})
        if gpus_needed([trial if d is failed else d for d in demands], usable):
            hint = (
                " (device_map: sequential keeps max_memory as written; the others cap all but the last GPU)"
            )
    unpinned = gpus_needed(replanned(demands), usable)
    more = f"; placed by the plan it needs {unpinned} x {gpu}" if unpinned else ""
    return f"change its device, device_map or max_memory{hint}{more}"


def _part(name: str, gpu: int, sits: dict) -> str | None:
    spread = [g for g, entries in sits.items() if g != "cpu" and any(n == name for n, _ in entries)]
    return f"{spread.index(gpu) + 1}/{len(spread)}" if len(spread) > 1 else None
