"""Devices and dtypes: where a model runs and in which precision, detected on this machine (never
assumed). A source declares what ``dtype: auto`` means for it (:attr:`Source.dtype_rule`)."""

from __future__ import annotations

import functools

import torch

from specbench.models.machine import NO_BF16_UNITS

DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def dtype_choice(rule: str, dtype: str, device: torch.device) -> tuple[str, str]:
    """(dtype name, why) for a model's ``dtype:`` on ``device``. Under the rule ``auto``, ``dtype:
    auto`` is bfloat16 on a GPU that supports it and on a CPU with bfloat16 matrix units (AMX or
    AVX512-BF16: there a verification of k + 1 tokens costs far less than in float32, which is where
    speculative decoding pays), float32 elsewhere (without those units bfloat16's one-token pass may be
    faster, but its verification costs more one-token passes and parts from AR at near-ties: the CPU
    sections of results/engines/README.md); under ``float32`` (models that tests compare exactly) it is
    float32 everywhere."""
    if dtype == "bfloat16" and device.type == "cpu" and cpu_bf16_feature() is None:
        return dtype, f"set in the recipe; {NO_BF16_UNITS}"
    if dtype != "auto":
        return dtype, "set in the recipe"
    if rule == "auto" and device.type == "cuda":
        if torch.cuda.is_bf16_supported():
            return "bfloat16", "auto: the GPU supports bfloat16"
        return "float32", "auto: the GPU does not support bfloat16"
    if rule == "auto" and device.type == "cpu":
        feature = cpu_bf16_feature()
        if feature:
            return "bfloat16", f"auto: this CPU has {feature}"
        return "float32", f"auto: {NO_BF16_UNITS}"
    return "float32", "auto: float32 here"


@functools.lru_cache(maxsize=1)
def cpu_bf16_feature() -> str | None:
    """The CPU feature that makes bfloat16 matmuls fast here (detected, never assumed), or None."""
    checks = (("AMX", "_is_amx_tile_supported"), ("AVX512-BF16", "_is_avx512_bf16_supported"))
    for name, check in checks:
        probe = getattr(torch.cpu, check, None)
        try:
            if probe is not None and probe():
                return name
        except RuntimeError:
            continue
    return None
