"""Which library runs a CPU model's linear layers: ATen's default (``aten``: ``F.linear``, which for float32
calls MKL's sgemm) or oneDNN with the weight reordered once into its blocked layout (``onednn``).

On a 2-core AMD EPYC (family 26, AVX512-BF16) SmolLM2-135M's eager float32 pass took 40.0 ms over one
token and 67.0 ms over nine with ATen, 23.2 and 30.2 ms with oneDNN's reordered weights; in bfloat16
24.6 and 28.9 against 16.7 and 21.8 ms (``scripts/bench/cpu_linear_by_tokens.py``; its output for that
machine is committed beside it); on an AVX2-only AMD EPYC (family 25) float32 68.7 and 110.4 ms with
ATen, 62.4 and 74.5 with oneDNN, whose bfloat16 path that CPU lacks. A verification pass over k + 1
tokens (or a tree) is worth its acceptance only where it costs little more than a one-token pass, so
this decides speculative decoding's walltime on such machines. Which one is faster depends on the CPU
(MKL takes its fast paths on Intel's), so it is measured, never assumed: ``auto`` times both on the
model's own layers at load (:func:`fastest`).

Only the eager engine swaps its layers (the compiled engine's stored graphs take the weights as inputs,
and oneDNN's reordered weight is an opaque tensor a graph cannot take); the compiled engine's own choice,
``linear: inductor``, freezes the weights into its graphs instead (specbench.models.compiled).
Numerics: both compute in the model's dtype with float32 accumulation; sums run in another order, so
logits differ in the last bits, as they do between pass sizes on one library (the lossless audit's
business, pipeline/analysis/numerics.py).
"""

from __future__ import annotations

import functools
import statistics
import time

import torch
from torch import nn

BACKENDS = ("auto", "aten", "onednn")
ONEDNN_DTYPES = (torch.float32, torch.bfloat16)
# the pass sizes ``auto`` compares the two on: a decode step and a k = 4 verification
PROBE_ROWS = (1, 5)
# oneDNN is chosen where it takes at most this share of ATen's time: a near tie keeps the default, so a
# noisy probe does not flip the choice between sessions
MARGIN = 0.9


class OneDNNLinear(nn.Module):
    """``nn.Linear`` with its weight reordered once by oneDNN (``_reorder_linear_weight``) and applied by
    ``mkldnn._linear_pointwise``: what inductor's weight prepacking does for frozen graphs, here for
    the eager engine."""

    def __init__(self, linear: nn.Linear, keep_weight: bool = False):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.packed = reorder(linear.weight.detach())
        self.bias = None if linear.bias is None else linear.bias.detach()
        if keep_weight:  # the LM head: heads read it (tied to the embedding, so it costs no memory)
            self.weight = linear.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return apply(x, self.packed, self.bias, self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, oneDNN reordered"


def reorder(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` [out, in] in oneDNN's blocked layout (an opaque tensor), laid out for a few rows
    (the hint 4: a verification's size; the measured passes used it)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight, 4)


def apply(
    x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, out_features: int
) -> torch.Tensor:
    """``x @ weight.T + bias`` over any leading dimensions, with the weight :func:`reorder` made."""
    out = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, x.shape[-1]), packed, bias, "none", [], "")
    return out.reshape(*x.shape[:-1], out_features)


def can_use_onednn(module: nn.Module) -> bool:
    """oneDNN serves this model: on the CPU, float32 or bfloat16, built into this torch, and this CPU's
    oneDNN reorders weights of that dtype (:func:`reorders`)."""
    parameter = next(module.parameters(), None)
    return (
        parameter is not None
        and parameter.device.type == "cpu"
        and parameter.dtype in ONEDNN_DTYPES
        and torch.backends.mkldnn.is_available()
        and reorders(parameter.dtype)
    )


@functools.cache
def reorders(dtype: torch.dtype) -> bool:
    """Whether this CPU's oneDNN reorders a ``dtype`` weight: bfloat16 needs AVX512 (BW, VL, DQ) or
    AVX-NE-CONVERT, and an AVX2-only CPU (seen: an AMD EPYC of family 25) refuses it."""
    try:
        reorder(torch.zeros(8, 8, dtype=dtype))
    except RuntimeError:
        return False
    return True


def _linears(module: nn.Module) -> list[tuple[nn.Module, str, nn.Linear]]:
    return [
        (parent, name, child)
        for parent in module.modules()
        for name, child in parent.named_children()
        if type(child) is nn.Linear
    ]


def _reordered(module: nn.Module, layers: list[nn.Linear]) -> list[OneDNNLinear]:
    """oneDNN copies of ``layers``; the output embedding keeps its weight (EAGLE and Medusa heads read
    ``get_output_embeddings().weight``)."""
    output = module.get_output_embeddings() if hasattr(module, "get_output_embeddings") else None
    return [OneDNNLinear(layer, keep_weight=layer is output) for layer in layers]


def use_onednn(module: nn.Module, packed: list[OneDNNLinear] | None = None) -> int:
    """Swap every ``nn.Linear`` of ``module`` for a :class:`OneDNNLinear` (``packed``: ones already
    made, in :func:`_linears` order), in place; inference only: the reordered weights are copies (the
    originals are freed, but a tied LM head's stays with the embedding). Returns how many were swapped."""
    found = _linears(module)
    packed = packed or _reordered(module, [linear for _, _, linear in found])
    for (parent, name, _), swapped in zip(found, packed, strict=True):
        setattr(parent, name, swapped)
    for part in module.modules():  # layers of their own kind (a draft vocabulary's LM head) swap themselves
        if callable(getattr(part, "use_onednn", None)):
            part.use_onednn()
    return len(found)


def fastest(module: nn.Module, repeats: int = 5) -> tuple[str, dict, list[OneDNNLinear]]:
    """("aten" or "onednn", the milliseconds each took, the oneDNN layers made to time them): every
    linear layer of ``module`` run once in model order, as a pass streams its weights from memory
    (one layer timed alone would sit in the CPU's cache), at each of :data:`PROBE_ROWS` rows; the
    median of ``repeats``. oneDNN wins only below :data:`MARGIN` of ATen's time."""
    found = [linear for _, _, linear in _linears(module)]
    if not found:
        return "aten", {}, []
    packed = _reordered(module, found)
    dtype = found[0].weight.dtype
    generator = torch.Generator().manual_seed(0)
    took = {"aten": 0.0, "onednn": 0.0}
    with torch.inference_mode():
        for rows in PROBE_ROWS:
            inputs = [
                torch.randn(rows, linear.in_features, generator=generator).to(dtype) for linear in found
            ]
            for name, layers in (("aten", found), ("onednn", packed)):
                times = []
                for _ in range(repeats + 1):  # the first: oneDNN creates its primitives
                    started = time.perf_counter()
                    for layer, x in zip(layers, inputs, strict=True):
                        layer(x)
                    times.append(time.perf_counter() - started)
                took[name] += 1000 * statistics.median(times[1:])
    return choose(took), {name: round(ms, 2) for name, ms in took.items()}, packed


def choose(took: dict[str, float]) -> str:
    """oneDNN where it took at most :data:`MARGIN` of ATen's time, else ATen."""
    return "onednn" if took["onednn"] <= MARGIN * took["aten"] else "aten"


def resolve(module: nn.Module, wanted: str) -> tuple[str, dict]:
    """Apply ``wanted`` (auto, aten or onednn) to an eager model: (the backend it runs on, the probe's
    timings when ``auto`` measured). oneDNN where it cannot serve the model (a GPU, float64) is aten."""
    if wanted not in BACKENDS:
        raise ValueError(f"unknown linear backend {wanted!r} (use {', '.join(BACKENDS)})")
    if wanted == "aten" or not can_use_onednn(module):
        return "aten", {}
    timings, packed = {}, None
    if wanted == "auto":
        wanted, timings, packed = fastest(module)
    if wanted == "onednn":
        use_onednn(module, packed)
    return wanted, timings


# on the compiled engine: aten (the default: graphs that take the weights as inputs and call ATen's
# matmul, stored on disk) or inductor (frozen weights, autotuned C++ GEMM templates: models/compiled.py)
COMPILED_BACKENDS = ("aten", "inductor")


def model_problem(name: str, wanted: str | None, engine: str) -> tuple[str, str] | None:
    """Why model ``name`` on ``engine`` cannot take ``linear: wanted``, as (problem, fix); None when it
    can. The eager engine swaps its layers for oneDNN's, the compiled engine can freeze its weights into
    inductor's GEMM templates, and a serving engine picks its own kernels."""
    if wanted in (None, "aten"):
        return None
    if engine == "eager" and wanted == "inductor":
        return (
            f"linear: inductor applies to the compiled engine, and model {name} runs on the eager engine",
            f"set engine: compiled on model {name}, or use linear: onednn for the eager engine",
        )
    if engine == "compiled" and wanted not in COMPILED_BACKENDS:
        return (
            f"linear: {wanted} applies to the eager engine; on the compiled engine model {name} takes "
            f"linear: aten or inductor",
            f"set linear: inductor on model {name} (frozen weights, autotuned GEMM templates), or remove it",
        )
    if engine not in ("eager", "compiled"):
        return (
            f"linear: {wanted} applies to the eager and compiled engines, and model {name} runs on the "
            f"{engine} engine",
            f"set engine: eager or compiled on model {name}, or remove its linear",
        )
    return None


def recipe_problem(linear: str, engines: list[str]) -> tuple[str, str] | None:
    """Why a recipe whose neural models run on ``engines`` cannot take ``linear``, its default for
    eager models, as (problem, fix); None when it can (it has an eager model, or asks for aten)."""
    if linear != "aten" and "eager" not in engines:
        return (
            f"linear: {linear} applies to models on the eager engine, and this recipe has none",
            "remove linear, or run a model on engine: eager",
        )
    return None
