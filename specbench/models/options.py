"""The options that reach transformers' ``from_pretrained`` for a checkpoint (placement, attention,
quantization, remote code), and which values are sound.

Each kind of source (:mod:`specbench.sources`) declares which options it takes; the ones here are
checked for every source that takes them when a recipe is validated, before anything loads, so a
misspelt or impossible option is a one-line error instead of being dropped or failing hours into a run.
"""

from __future__ import annotations

import json
import re

from specbench.errors import SpecbenchError

# Placement (accelerate's big-model loading): where a model's layers go, how much each device may hold,
# where offloaded weights wait.
PLACEMENT_OPTIONS = ("device_map", "max_memory", "offload_folder")
# what reaches transformers' from_pretrained for checkpoints; trust_remote_code runs code from the
# checkpoint, so only a recipe that writes trust_remote_code: true gets it
LOADER_OPTIONS = (
    *PLACEMENT_OPTIONS,
    "attn_implementation",
    "low_cpu_mem_usage",
    "trust_remote_code",
    "quantization",
)
DEVICE_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")
ATTENTION = ("eager", "sdpa", "flash_attention_2", "flex_attention")
BOOLEAN_OPTIONS = ("trust_remote_code", "low_cpu_mem_usage", "cuda_graphs", "step_graph")


def option_bounds_problem(options: dict, bounds: dict) -> tuple[str, str, str] | None:
    """(option, problem, fix) for a value outside ``bounds`` (option -> (type, lowest, highest)) or a
    boolean option that is not true or false; None when all fit."""
    for name, value in sorted(options.items()):
        if name not in bounds:
            continue
        kind, low, high = bounds[name]
        fits = isinstance(value, kind) and not isinstance(value, bool) and low <= value <= high
        if not fits:
            what = "an integer" if kind is int else "a number"
            return name, f"{name} {value!r} is out of range", f"use {what} from {low} to {high}"
    for name in BOOLEAN_OPTIONS:
        if name in options and not isinstance(options[name], bool):
            return name, f"{name} {options[name]!r} is not true or false", f"write {name}: true or false"
    return None


def placement_problem(options: dict) -> tuple[str, str, str] | None:
    """(option, problem, fix) for a device_map, max_memory, attention or quantization value that
    accelerate or transformers would reject (or worse, misread); None when they fit."""
    device_map = options.get("device_map")
    if device_map is not None:
        if isinstance(device_map, dict):
            bad = next((v for v in device_map.values() if not _is_device(v, disk=True)), None)
            if not device_map or bad is not None:
                return (
                    "device_map",
                    f"{bad!r} is not a device" if device_map else "an empty device_map places nothing",
                    "map module names to a GPU index, cuda:N, cpu, mps or disk",
                )
        elif device_map not in DEVICE_MAPS:
            return (
                "device_map",
                f"{device_map!r} is not a device map",
                f"use {', '.join(DEVICE_MAPS)} or a mapping",
            )
    max_memory = options.get("max_memory")
    if max_memory is not None:
        if not isinstance(max_memory, dict) or not max_memory:
            return "max_memory", "max_memory is not a mapping", "write e.g. {0: 70GiB, 1: 70GiB, cpu: 200GiB}"
        bad = next((k for k, v in max_memory.items() if not _is_device(k) or not _is_size(v)), None)
        if bad is not None:
            return (
                "max_memory",
                f"{bad!r}: {max_memory[bad]!r} is not a device and size",
                "e.g. {0: 70GiB, cpu: 200GiB}",
            )
        if "device_map" not in options:
            return (
                "max_memory",
                "max_memory limits a device_map",
                "add device_map: auto (or balanced, sequential)",
            )
    if "offload_folder" in options and not isinstance(options["offload_folder"], str):
        return "offload_folder", "offload_folder is not a path", "give a folder for weights offloaded to disk"
    attention = options.get("attn_implementation")
    if attention is not None and attention not in ATTENTION:
        return (
            "attn_implementation",
            f"{attention!r} is not an attention kernel",
            f"use {', '.join(ATTENTION)}",
        )
    quantization = options.get("quantization")
    if quantization is not None and not isinstance(quantization, dict):
        return (
            "quantization",
            "quantization is not a mapping",
            "write e.g. {load_in_4bit: true} (bitsandbytes)",
        )
    return None


def _is_device(value, disk: bool = False) -> bool:
    if isinstance(value, int) and not isinstance(value, bool):
        return value >= 0
    return isinstance(value, str) and bool(
        re.fullmatch(r"cpu|mps|cuda(:\d+)?" + ("|disk" if disk else ""), value)
    )


def _is_size(value) -> bool:
    try:
        parse_size(value, "max_memory")
        return True
    except SpecbenchError:
        return False


_UNITS = {"b": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12}
_UNITS |= {"kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_size(text, flag: str, per_second: bool = False) -> float:
    """Bytes in ``80GiB``, ``80 GB``, ``81920MiB`` (bytes/s in ``2TB/s`` with ``per_second``); an int
    is bytes already (max_memory takes both)."""
    if isinstance(text, int) and not isinstance(text, bool) and text > 0 and not per_second:
        return float(text)
    suffix = r"/s" if per_second else ""
    match = re.fullmatch(rf"\s*([0-9]*\.?[0-9]+)\s*([kmgt]i?b|b){suffix}\s*", str(text), re.IGNORECASE)
    if not match or float(match[1]) <= 0:
        example = "2TB/s or 900GB/s" if per_second else "80GiB, 80GB or 81920MiB"
        kind = "rate" if per_second else "size"
        raise SpecbenchError(flag, f"{text!r} is not a positive {kind}", f"write e.g. {example}")
    return float(match[1]) * _UNITS[match[2].lower()]


def parse_loader_options(flag: str, text: str) -> dict:
    """A command line's loader options (``--target-options '{"layers": 2}'``): a JSON object."""
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as error:
        raise SpecbenchError(
            flag, f"not valid JSON ({error.msg})", "write an object like '{\"layers\": 2}'"
        ) from None
    if not isinstance(parsed, dict):
        raise SpecbenchError(flag, "must be a JSON object", "write an object like '{\"layers\": 2}'")
    return parsed
