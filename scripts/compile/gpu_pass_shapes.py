"""What a compiled target pass costs by its shape on a GPU: a one-row decode pass, a 5-row chain
verification, and tree verifications of 25 and 49 rows (EAGLE's, with the hidden states it reads), each
run on its own after the same prompt and rolled back, as a speculative step runs it. Per shape: the
wall time of a pass with the host waiting for it, the GPU's busy time in it (torch.profiler's device
time over the passes), and the kernels it launched.

On an H100 the trained EAGLE tree's 25-row verification took 5.40 ms against 2.48 ms for the decode
pass (results/heads/smollm2_eagle_gpu_graphs/nvidia-h100-80gb/step_parts.txt) although its arithmetic
is negligible: this says whether the difference is the GPU's (kernels, the mask's width) or the host's
(graph replay, input copies). A random-weight Llama of SmolLM2-135M-Instruct's shape: no weights travel.

    python -m scripts.compile.gpu_pass_shapes [ATTN] > results/compile/gpu_pass_shapes_<gpu>_<ATTN>.txt
    python -m scripts.compile.gpu_pass_shapes eager --tiny    # the plumbing, on a CPU
"""

import argparse
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from scripts.smollm2_shape import SMOLLM2, TINY
from specbench.models.base import LAST
from specbench.models.compiled import CompiledHFModel
from specbench.models.machine import this_machine
from specbench.models.tree import TokenTree

PROMPT = 160


def bushy_tree(nodes: int) -> TokenTree:
    """A tree of ``nodes`` nodes, four children per node breadth first (EAGLE-2's shape, roughly)."""
    parents = [-1 if i < 4 else (i - 4) // 4 for i in range(nodes)]
    return TokenTree(torch.arange(10, 10 + nodes), tuple(parents))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("attention", nargs="?", default="eager", help="attn_implementation (eager, sdpa)")
    parser.add_argument("--tiny", action="store_true", help="a 2-layer model (plumbing)")
    parser.add_argument("--passes", type=int, default=200)
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    config = LlamaConfig(**(TINY if args.tiny else SMOLLM2))
    config._attn_implementation = args.attention
    target = CompiledHFModel(LlamaForCausalLM(config).to(device).eval(), "t")
    compile_s = target.prepare(PROMPT + 64, draft_lengths=(4,), hidden=True, tree_sizes=(24, 48))
    empty = torch.tensor([], dtype=torch.long)
    shapes = {  # name -> one pass, rolled back
        "decode, 1 row": lambda: (target.score(torch.tensor([7]), 0), target.rollback(0)),
        "chain, 5 rows": lambda: (target.score(torch.arange(7, 12), 4), target.rollback(0)),
        "chain, 5 rows, hidden": lambda: (target.score(torch.arange(7, 12), 4, (LAST,)), target.rollback(0)),
        "tree, 25 rows, hidden": lambda: (
            target.score_tree(empty, bushy_tree(24), (LAST,)),
            target.keep_path([]),
        ),
        "tree, 49 rows, hidden": lambda: (
            target.score_tree(empty, bushy_tree(48), (LAST,)),
            target.keep_path([]),
        ),
    }
    synchronize = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    print(f"# {this_machine().describe()}; attention: {args.attention}; compiling took {compile_s:.1f} s")
    print(f"# {args.passes} passes of each shape after a {PROMPT}-token prompt; wall: host waiting for each")
    print(f"{'pass':24} {'wall ms':>8} {'GPU busy ms':>12} {'kernels':>8}")
    target.start(torch.arange(100, 100 + PROMPT))
    target.score(empty, 0)  # the prefill
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    for name, run in shapes.items():
        for _ in range(5):
            run()
        synchronize()
        started = time.perf_counter()
        for _ in range(args.passes):
            run()
            synchronize()
        wall = 1000 * (time.perf_counter() - started) / args.passes
        with torch.profiler.profile(activities=activities) as prof:
            for _ in range(20):
                run()
            synchronize()
        events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        busy = sum(e.device_time for e in events) / 1000 / 20
        print(f"{name:24} {wall:8.3f} {busy:12.3f} {len(events) / 20:8.1f}")


if __name__ == "__main__":
    main()
