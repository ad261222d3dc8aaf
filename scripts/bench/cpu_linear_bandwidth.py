"""How fast each CPU matmul library streams a bandwidth-bound model's weights: Qwen2.5-Coder-1.5B's
linear layers (28 layers of q, k, v with their biases, o, gate, up, down, and the 151,936-row LM head;
random bfloat16 weights of the model's shapes, 3.09 GB) run back to back over 1 and 5 rows, as a decode
pass and a k = 4 verification call them, with

* ``aten``: ``F.linear`` (the eager engine's default, and the compiled engine's stored graphs);
* ``onednn``: each weight reordered once by oneDNN (the eager engine's ``linear: onednn``);
* ``inductor``: the layers compiled with frozen weights and ``max_autotune`` (the compiled engine's
  ``linear: inductor``): per shape, inductor's C++ GEMM template or oneDNN's prepacked matmul, the faster;

beside a plain read of 1 GiB (``torch.sum`` over float32) on the same threads: the rate a pass could
reach if reading its weights were all it did.

    python -m scripts.bench.cpu_linear_bandwidth > results/bench/cpu_linear_bandwidth_<machine>.txt

Prints the milliseconds of one pass's linear layers (median of repeats, after a warm-up) and the weight
bytes per second that makes.
"""

import statistics
import time

import torch
import torch._inductor.config as inductor_config
import torch.nn.functional as F
from torch import nn

from specbench.models.compiled import FROZEN_OPTIONS
from specbench.models.linear import apply, reorder
from specbench.models.machine import this_machine

HIDDEN, INTERMEDIATE, KV, LAYERS, VOCAB = 1536, 8960, 256, 28, 151936
# (out, in, bias) of q, k, v, o, gate, up, down
SHAPES = [(HIDDEN, HIDDEN, True), (KV, HIDDEN, True), (KV, HIDDEN, True), (HIDDEN, HIDDEN, False)]
SHAPES += [(INTERMEDIATE, HIDDEN, False), (INTERMEDIATE, HIDDEN, False), (HIDDEN, INTERMEDIATE, False)]
ROWS = (1, 5)
REPEATS = 7


class Layers(nn.Module):
    """The model's linear layers, each fed its own input (a pass's activations do not matter to its cost)."""

    def __init__(self):
        super().__init__()
        shapes = [shape for _ in range(LAYERS) for shape in SHAPES] + [(VOCAB, HIDDEN, False)]
        self.layers = nn.ModuleList(nn.Linear(i, o, bias=b) for o, i, b in shapes)

    def forward(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        return [layer(x) for layer, x in zip(self.layers, inputs, strict=True)]


def timed(run) -> float:
    times = []
    for _ in range(REPEATS + 1):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return 1000 * statistics.median(times[1:])


def plain_read() -> str:
    data = torch.randn(2**28)
    ms = timed(data.sum)
    return f"plain read (sum of 1 GiB float32): {ms:.1f} ms, {data.numel() * 4 / ms / 1e6:.1f} GB/s"


def libraries(model: Layers, rows: int) -> dict:
    """Each library's pass over ``rows`` rows, and the seconds inductor took to compile its own."""
    inputs = [torch.randn(rows, layer.in_features).to(torch.bfloat16) for layer in model.layers]
    pairs = list(zip(model.layers, inputs, strict=True))
    packed = [(reorder(layer.weight), layer.bias, layer.out_features, x) for layer, x in pairs]
    with inductor_config.patch(FROZEN_OPTIONS):
        compiled = torch.compile(model, dynamic=False)
        started = time.perf_counter()
        compiled(inputs)
        compile_s = time.perf_counter() - started
    return {
        "aten": lambda: [F.linear(x, layer.weight, layer.bias) for layer, x in pairs],
        "onednn": lambda: [apply(x, weight, bias, out) for weight, bias, out, x in packed],
        "inductor": lambda: compiled(inputs),
    }, compile_s


def main() -> None:
    torch.manual_seed(0)
    model = Layers().to(torch.bfloat16).eval()
    weight_bytes = sum(layer.weight.numel() * 2 for layer in model.layers)
    print(f"machine: {this_machine().describe()}")
    matmuls = len(model.layers)
    print(f"Qwen2.5-Coder-1.5B's linear layers, bfloat16: {matmuls} matmuls, {weight_bytes / 1e9:.2f} GB")
    print(plain_read())
    print("library    rows   ms/pass   GB/s of weights")
    with torch.inference_mode():
        for rows in ROWS:
            runs, compile_s = libraries(model, rows)
            for name, run in runs.items():
                ms = timed(run)
                extra = f"   (compiled in {compile_s:.0f} s)" if name == "inductor" else ""
                print(f"{name:9s} {rows:5d} {ms:9.1f} {weight_bytes / ms / 1e6:12.1f}{extra}", flush=True)


if __name__ == "__main__":
    main()
