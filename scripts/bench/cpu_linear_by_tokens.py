"""What a verification pass of m tokens costs on this CPU, and where: SmolLM2-135M-Instruct's linear
layers (30 layers of q, k, v, o, gate, up, down and the tied LM head) at m = 1 ... 25 rows, each as
``F.linear`` calls it (the eager engine and the compiled engine's stored graphs both call ATen's mm) and
with the weight prepacked for m rows (MKL's packed sgemm for float32, oneDNN's reordered weight for
bfloat16: what inductor's freezing would use). A tree or a k-token draft is worth its acceptance only
if a pass over its tokens costs little more than a pass over one; this measures how much more.

    python -m scripts.bench.cpu_linear_by_tokens > results/bench/cpu_linear_by_tokens_<machine>.txt

Prints, per dtype, implementation and m, the milliseconds of one pass's linear layers (median of
repeats, the model's 211 matmuls run back to back on the model's own shapes) and the ratio to m = 1;
then the whole model's eager pass over m new tokens after a 200-token prefix, loaded as a recipe
loads it with ``linear: aten`` and ``linear: onednn`` (specbench.models.linear), the two interleaved.
"""

import json
import statistics
import time

import torch
import torch.nn.functional as F
from transformers import DynamicCache

from specbench import sources
from specbench.models.machine import this_machine

HIDDEN, INTERMEDIATE, KV, LAYERS, VOCAB = 576, 1536, 192, 30, 49152
SHAPES = [(HIDDEN, HIDDEN), (KV, HIDDEN), (KV, HIDDEN), (HIDDEN, HIDDEN)]  # q, k, v, o (out, in)
SHAPES += [(INTERMEDIATE, HIDDEN), (INTERMEDIATE, HIDDEN), (HIDDEN, INTERMEDIATE)]  # gate, up, down
ROWS = (1, 2, 3, 4, 5, 6, 9, 17, 25)
REPEATS = 15


def weights(dtype):
    torch.manual_seed(0)
    layers = [[torch.randn(o, i, dtype=dtype) * 0.02 for o, i in SHAPES] for _ in range(LAYERS)]
    return [w for layer in layers for w in layer] + [torch.randn(VOCAB, HIDDEN, dtype=dtype) * 0.02]


def plain(ws, m):
    return [lambda x, w=w: F.linear(x, w) for w in ws]


def mkl_packed(ws, m):
    packed = [(torch.ops.mkl._mkl_reorder_linear_weight(w, m), w) for w in ws]
    return [lambda x, p=p, w=w: torch.ops.mkl._mkl_linear(x, p, w, None, m) for p, w in packed]


def onednn_packed(ws, m):
    packed = [torch.ops.mkldnn._reorder_linear_weight(w, m) for w in ws]
    return [lambda x, p=p: torch.ops.mkldnn._linear_pointwise(x, p, None, "none", [], "") for p in packed]


def onednn_dense(ws, m):
    return [lambda x, w=w: torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "") for w in ws]


def one_pass(calls, inputs):
    for call, x in zip(calls, inputs, strict=True):
        call(x)


def time_pass(calls, ws, m, dtype) -> float:
    inputs = [torch.randn(m, w.shape[1], dtype=dtype) for w in ws]
    for _ in range(3):
        one_pass(calls, inputs)
    times = []
    for _ in range(REPEATS):
        started = time.perf_counter()
        one_pass(calls, inputs)
        times.append(time.perf_counter() - started)
    return 1000 * statistics.median(times)


def main():
    print(
        json.dumps(
            {
                "machine": this_machine().describe(),
                "torch": torch.__version__,
                "threads": torch.get_num_threads(),
            }
        )
    )
    implementations = {
        "F.linear": plain,
        "mkl packed": mkl_packed,
        "oneDNN packed": onednn_packed,
        "oneDNN dense": onednn_dense,
    }
    for dtype in (torch.float32, torch.bfloat16):
        ws = weights(dtype)
        for name, build in implementations.items():
            base, line = None, []
            for m in ROWS:
                try:
                    calls = build(ws, m)
                    x = torch.randn(m, HIDDEN, dtype=dtype)
                    gap = (calls[-1](x).float() - F.linear(x, ws[-1]).float()).abs().max().item()
                    if gap > (1e-4 if dtype == torch.float32 else 5e-2):
                        raise ValueError(f"LM head differs from F.linear by {gap:.2g}")
                    ms = time_pass(calls, ws, m, dtype)
                except Exception as error:  # an implementation this build or dtype lacks
                    line.append(f"m={m}: n/a ({type(error).__name__}: {str(error).splitlines()[0][:80]})")
                    break
                base = base or ms
                line.append(f"m={m}: {ms:.1f} ms ({ms / base:.2f}x)")
            print(f"{str(dtype).removeprefix('torch.'):9} {name:14} " + "; ".join(line), flush=True)


def whole_model(dtype: str) -> None:
    models = {
        backend: sources.load(
            sources.ModelRequest("target", "smollm2-135m-instruct", dtype, "cpu", linear=backend)
        ).model
        for backend in ("aten", "onednn")
    }
    prefix = torch.randint(100, 20000, (1, 200), generator=torch.Generator().manual_seed(0))
    caches = {}
    with torch.inference_mode():
        for backend, model in models.items():
            caches[backend] = DynamicCache(config=model.config)
            model(input_ids=prefix, past_key_values=caches[backend], use_cache=True)
        line = {backend: [] for backend in models}
        for m in (1, 5, 9, 17, 25):
            new = torch.randint(100, 20000, (1, m))
            times = {backend: [] for backend in models}
            for _ in range(REPEATS):
                for backend, model in models.items():  # interleaved pass by pass
                    started = time.perf_counter()
                    model(input_ids=new, past_key_values=caches[backend], use_cache=True, logits_to_keep=m)
                    times[backend].append(time.perf_counter() - started)
                    caches[backend].crop(-m)
            for backend in models:
                line[backend].append(f"m={m}: {1000 * statistics.median(times[backend][2:]):.1f} ms")
    for backend, parts in line.items():
        print(
            f"{dtype:9} SmolLM2-135M-Instruct eager pass, linear: {backend:6} " + "; ".join(parts), flush=True
        )


if __name__ == "__main__":
    main()
    for dtype in ("float32", "bfloat16"):
        whole_model(dtype)
