"""What an EAGLE head's passes cost a GPU eagerly and replayed as CUDA graphs (drafters/head_graphs.py),
and what is left of a step outside the model passes, on the compiled engine (the target's passes are CUDA
graphs already).

The target is a random-weight Llama of SmolLM2-135M-Instruct's shape and the head a random EAGLE head of
its shape (a pass costs what its shapes cost; no weights, GGUF or trained head need to travel to the
GPU), so nearly nothing is accepted: this measures the cost of each part of a step, not a speedup. Every
output is checked against AR's, token for token. Cells run interleaved, prompt by prompt, after one
untimed prompt each (compiling and capturing).

    python -m scripts.heads.gpu_head_graphs > results/heads/gpu_head_graphs_<device>.txt
    python -m scripts.heads.gpu_head_graphs --tiny      # the plumbing, on a CPU, in seconds
    python -m scripts.heads.gpu_head_graphs --attention eager --only "nodes=24] head graphs" --profile

``--profile`` then runs one more prompt of the first cell under cProfile and prints the host functions
that took the most time (on a GPU a step that waits for the device shows it as time in the call that
synchronises: ``tolist``, ``item``, ``cpu``). ``--syncs`` runs one more prompt of each cell with
torch's CUDA sync debug mode on and counts the host's waits for the device per step (every read of a
value, every copy from pageable host memory).
"""

import argparse
import cProfile
import io
import json
import pstats
import statistics
import time
import warnings

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from scripts.smollm2_shape import SMOLLM2, TINY
from specbench.decoding import autoregressive, tree_speculative
from specbench.drafters import eagle
from specbench.drafters.heads import draft_head
from specbench.models.compiled import CompiledHFModel
from specbench.models.machine import this_machine

DRAFT_VOCAB = 8192  # the trained heads' draft vocabulary (FR-Spec), the most frequent tokens
CHAIN = {"depth": 5, "branch": 1, "frontier": 1, "nodes": 5}
TREE = {"depth": 6, "branch": 4, "frontier": 4, "nodes": 24}
CELLS = {  # name -> (tree parameters, head passes as CUDA graphs, the graphs' attention implementation,
    # a greedy tree's levels as one graph a step: EagleDrafter.greedy_tree)
    "eagle-chain[depth=5] eager head": (CHAIN, False, None, False),
    "eagle-chain[depth=5] head graphs": (CHAIN, True, None, False),
    "eagle-chain[depth=5] head graphs, eager attn": (CHAIN, True, "eager", False),
    "eagle-chain[depth=5] step graph, eager attn": (CHAIN, True, "eager", True),
    "eagle-tree[nodes=24] eager head": (TREE, False, None, False),
    "eagle-tree[nodes=24] head graphs": (TREE, True, None, False),
    "eagle-tree[nodes=24] head graphs, eager attn": (TREE, True, "eager", False),
    "eagle-tree[nodes=24] step graph, eager attn": (TREE, True, "eager", True),
}


def head(weights, static: bool, attention: str | None, step_graph: bool = False) -> eagle.EagleDrafter:
    torch.manual_seed(1)
    module = eagle.EagleHead.for_target(weights)
    weight = weights.get_output_embeddings().weight.detach()
    module = module.to(weight.device, weight.dtype)
    vocab = torch.arange(min(DRAFT_VOCAB, weight.shape[0]), device=weight.device)
    lm_head = draft_head(weight, vocab)
    embeddings = weights.get_input_embeddings()
    return eagle.EagleDrafter(
        "head", module, embeddings, lm_head, "t", static, attention or "sdpa", step_graph
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="a 2-layer model (plumbing)")
    parser.add_argument("--prompts", type=int, default=6)
    parser.add_argument("--prompt-tokens", type=int, default=160)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--attention", default="sdpa", help="the target's attn_implementation (sdpa, eager)")
    parser.add_argument("--only", default="", help="run only the cells whose name contains this")
    parser.add_argument("--profile", action="store_true", help="cProfile a prompt of the first cell")
    parser.add_argument("--syncs", action="store_true", help="count each cell's host-device syncs a step")
    args = parser.parse_args()
    began = time.perf_counter()
    cells = {name: cell for name, cell in CELLS.items() if args.only in name}
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    config = LlamaConfig(**(TINY if args.tiny else SMOLLM2))
    config._attn_implementation = args.attention
    weights = LlamaForCausalLM(config).to(device).eval()
    generator = torch.Generator().manual_seed(2)
    prompts = [
        torch.randint(0, config.vocab_size, (args.prompt_tokens,), generator=generator)
        for _ in range(args.prompts + 1)
    ]
    target = CompiledHFModel(weights, "t")
    longest = args.prompt_tokens + args.new_tokens + 64
    target.prepare(longest, hidden=True, tree_sizes=sorted({p["nodes"] for p, *_ in cells.values()}))
    drafters = {name: head(weights, *cell[1:]) for name, cell in cells.items()}
    rows: dict[str, list[dict]] = {"ar": [], **{name: [] for name in cells}}
    for index, prompt in enumerate(prompts):  # prompt 0: compiling and capturing, not timed
        ar = autoregressive.generate(target, prompt, max_new_tokens=args.new_tokens)
        if index:
            rows["ar"].append({"s": ar.walltime, "tokens": len(ar.tokens), "steps": len(ar.tokens)})
        for name, (params, *_) in cells.items():
            out = tree_speculative.generate(
                target, drafters[name], prompt, max_new_tokens=args.new_tokens, **params
            )
            assert out.tokens == ar.tokens, f"{name}: output differs from AR on prompt {index}"
            if index:
                t, h = out.forwards["t"], out.forwards["head"]
                rows[name].append(
                    {
                        "s": out.walltime,
                        "tokens": len(out.tokens),
                        "steps": len(out.steps),
                        "target_s": t["seconds"],
                        "target_passes": t["forward_passes"],
                        "head_s": h["seconds"],
                        "head_passes": h["forward_passes"],
                    }
                )
    print(
        json.dumps(
            {
                "machine": this_machine().describe(),
                "torch": torch.__version__,
                "model": "tiny" if args.tiny else "SmolLM2-135M shape, random weights, float32",
                "prompts": args.prompts,
                "prompt_tokens": args.prompt_tokens,
                "new_tokens": args.new_tokens,
                "target_attention": args.attention,
            }
        )
    )
    ar_s = sum(r["s"] for r in rows["ar"])
    ar_tokens = sum(r["tokens"] for r in rows["ar"])
    print(
        f"{'cell':46} {'tok/s':>8} {'vs AR':>6} {'ms/step':>8} {'target ms/pass':>15} "
        f"{'head passes/step':>17} {'head ms/pass':>13} {'outside passes ms/step':>23}"
    )
    print(f"{'ar (compiled)':46} {ar_tokens / ar_s:8.1f} {1.0:6.2f} {1000 * ar_s / ar_tokens:8.2f}")
    for name in cells:
        cell = rows[name]
        s, steps = sum(r["s"] for r in cell), sum(r["steps"] for r in cell)
        target_s, head_s = sum(r["target_s"] for r in cell), sum(r["head_s"] for r in cell)
        head_passes = sum(r["head_passes"] for r in cell)
        tokens = sum(r["tokens"] for r in cell)
        print(
            f"{name:46} {tokens / s:8.1f} {ar_s / ar_tokens * tokens / s:6.2f} {1000 * s / steps:8.2f} "
            f"{1000 * target_s / sum(r['target_passes'] for r in cell):15.3f} {head_passes / steps:17.2f} "
            f"{1000 * head_s / max(head_passes, 1):13.3f} {1000 * (s - target_s - head_s) / steps:23.2f}"
        )
    spread = statistics.pstdev(r["s"] for r in rows["ar"]) / statistics.mean(r["s"] for r in rows["ar"])
    print(f"every output identical to AR; AR walltime spread over prompts {spread:.1%}")
    if args.syncs and device.type == "cuda":
        print(f"{'cell':46} {'syncs/step':>10}  (one prompt, torch.cuda.set_sync_debug_mode)")
        for name, (params, *_) in cells.items():
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn")
                out = tree_speculative.generate(
                    target, drafters[name], prompts[1], max_new_tokens=args.new_tokens, **params
                )
                torch.cuda.set_sync_debug_mode("default")
            syncs = sum("synchroniz" in str(w.message) for w in caught)
            print(f"{name:46} {syncs / len(out.steps):10.2f}")
    print(f"# {time.perf_counter() - began:.0f} s in all")
    if args.profile:
        name, (params, *_) = next(iter(cells.items()))
        profiler = cProfile.Profile()
        profiler.enable()
        tree_speculative.generate(
            target, drafters[name], prompts[1], max_new_tokens=args.new_tokens, **params
        )
        if device.type == "cuda":
            torch.cuda.synchronize()
        profiler.disable()
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(30)
        print(f"# cProfile of {name}, prompt 1, by own time")
        print("\n".join(line for line in text.getvalue().splitlines() if line.strip())[:6000])


if __name__ == "__main__":
    main()
