"""Where a compiled AR step's time goes on a GPU: the compiled engine's decode pass of a random-weight
Llama of SmolLM2-135M-Instruct's shape (CUDA graphs, ``mode="reduce-overhead"``), profiled on the host
(cProfile: the pass is host-bound when a 30-layer 135M model takes milliseconds a token on an H100)
and on the device (torch.profiler: the GPU's own time per step).

    python -m scripts.compile.gpu_ar_step_profile ATTN > results/compile/gpu_ar_step_profile_<gpu>_<ATTN>.txt

ATTN is the model's attention implementation (transformers' ``attn_implementation``): ``sdpa``
(the default) or ``eager`` (matmul, softmax, matmul, which inductor compiles into its own kernels).
"""

import argparse
import cProfile
import io
import pstats
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from scripts.smollm2_shape import SMOLLM2
from specbench.decoding import autoregressive
from specbench.models.compiled import CompiledHFModel
from specbench.models.machine import this_machine

TOKENS = 96 if torch.cuda.is_available() else 8


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("attention", nargs="?", default="sdpa", help="attn_implementation (sdpa, eager)")
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # cpu: the plumbing
    torch.manual_seed(0)
    config = LlamaConfig(**SMOLLM2)
    config._attn_implementation = args.attention
    weights = LlamaForCausalLM(config).to(device).eval()
    prompt = torch.randint(0, config.vocab_size, (160,), generator=torch.Generator().manual_seed(2))
    target = CompiledHFModel(weights, "t")
    target.prepare(160 + TOKENS + 64)
    autoregressive.generate(target, prompt, max_new_tokens=TOKENS)  # compile, record the graphs
    started = time.perf_counter()
    out = autoregressive.generate(target, prompt, max_new_tokens=TOKENS)
    wall = time.perf_counter() - started
    counted = out.forwards["t"]
    print(f"# {this_machine().describe()}; attention: {config._attn_implementation}")
    per_pass = 1000 * counted["seconds"] / counted["forward_passes"]
    print(f"AR: {1000 * wall / TOKENS:.3f} ms a token (wall), {per_pass:.3f} ms a pass between CUDA events")
    profile = cProfile.Profile()
    profile.enable()
    autoregressive.generate(target, prompt, max_new_tokens=TOKENS)
    profile.disable()
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(30)
    print(f"## cProfile, {TOKENS} tokens, sorted by own time")
    print("\n".join(line for line in text.getvalue().splitlines() if line.strip())[:9000])
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("cumulative").print_stats(30)
    print(f"## cProfile, {TOKENS} tokens, sorted by cumulative time")
    print("\n".join(line for line in text.getvalue().splitlines() if line.strip())[:9000])
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        autoregressive.generate(target, prompt, max_new_tokens=TOKENS)
    print(f"## torch.profiler, {TOKENS} tokens")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=60))
    if device.type == "cuda":
        print(
            prof.key_averages().table(
                sort_by="self_device_time_total", row_limit=12, max_name_column_width=60
            )
        )


if __name__ == "__main__":
    main()
