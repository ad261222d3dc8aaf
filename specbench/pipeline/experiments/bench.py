"""Our decoding loops on both engines against Hugging Face ``generate``, on the same model, prompts
and k, and against the memory-bandwidth limit, all measured in one process. ``onednn`` adds the eager
engine with oneDNN's linear layers (specbench.models.linear) on copies of both models; ``inductor`` the
compiled engine on frozen weights (``linear: inductor``, specbench.models.compiled) over the same ones.

Each prompt runs every method back to back (interleaved, so drift in machine speed hits all of
them alike) after one untimed warm-up prompt; compiled engines compile every shape before it.
Reported per method: tokens/s, ms per token, mean target passes per request, and for our loops the
loop overhead = 1 - (time inside model passes / walltime). The headline figures are ratios of
walltime per token, each between two rows of this one run.

The bandwidth limit of autoregressive decoding is the time to read the target's weights once per
token: their bytes (tied matrices once) over the memory bandwidth measured here, by streaming a
buffer four times the size of the largest cache level through a sum (GPUs: a device-to-device copy).
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field

import torch
from rich.console import Console
from rich.table import Table

from specbench import sources
from specbench.decoding import autoregressive, hf_generate, speculative
from specbench.decoding.generation import Generation, Stopwatch, truncate_at_eos
from specbench.drafters.maxgram import MaxGramDrafter
from specbench.errors import SpecbenchError
from specbench.models.base import ModelDrafter
from specbench.models.compiled import ENGINES, CompiledHFModel
from specbench.models.linear import can_use_onednn
from specbench.models.sampling import SamplingParams
from specbench.pipeline.analysis.numerics import divergence_fields
from specbench.pipeline.records.rows import divergence
from specbench.tasks import get_task, render_prompt


@dataclass
class Tally:
    tokens: int = 0
    walltime: float = 0.0
    model_seconds: float = 0.0
    target_passes: int = 0
    requests: int = 0
    outputs: list = field(default_factory=list)

    def add(self, generation: Generation, target_name: str) -> None:
        self.tokens += len(generation.tokens)
        self.walltime += generation.walltime
        self.model_seconds += sum(c["seconds"] for c in generation.forwards.values())
        self.target_passes += generation.forwards.get(target_name, {}).get("forward_passes", 0)
        self.requests += 1
        self.outputs.append(generation.tokens)

    @property
    def ms_per_token(self) -> float:
        return 1000 * self.walltime / self.tokens

    @property
    def overhead(self) -> float:
        return 1 - self.model_seconds / self.walltime


@dataclass
class BenchResult:
    tallies: dict[str, Tally]
    k: int
    limit_ms: float  # the bandwidth limit of one AR token, ms
    bandwidth: float  # bytes/s measured
    weight_bytes: int
    compile_s: dict[str, float]
    prompts: list  # the timed prompts' ids
    classes: dict[str, list[str]]  # per compared pair: identical / tie / mismatch per prompt


# bench's engines: the recipe engines, the eager engine with oneDNN's linear layers (linear: onednn), and
# the compiled engine on frozen weights (linear: inductor)
BENCH_ENGINES = (*ENGINES, "onednn", "inductor")


def parse_engines(text: str) -> tuple[str, ...]:
    engines = tuple(dict.fromkeys(e.strip() for e in text.split(",") if e.strip()))
    unknown = [e for e in engines if e not in BENCH_ENGINES]
    if not engines or unknown:
        raise SpecbenchError(
            "--engine",
            f"unknown engine {', '.join(unknown) or text!r}",
            f"use {', '.join(BENCH_ENGINES)}, comma-separated",
        )
    return engines


def run_bench(
    target_source: str,
    drafter_source: str,
    k: int,
    n_prompts: int,
    max_new_tokens: int,
    dtype: str,
    device: str,
    task_name: str,
    console: Console,
    target_options: dict | None = None,
    drafter_options: dict | None = None,
    engines: tuple[str, ...] = ("eager",),
) -> BenchResult:
    target_options = target_options or {}
    if drafter_source == "same":
        drafter_source, drafter_options = target_source, target_options
    for flag, source in (("--target", target_source), ("--drafter", drafter_source)):
        if not sources.source_of(source).neural:
            raise SpecbenchError(
                flag,
                f"{source} is a statistical drafter: bench compares model passes (and always runs "
                "prompt lookup itself beside the model drafter)",
                "give a model, e.g. --drafter distilled:smollm2-135m-instruct/small, or --drafter same",
            )
    with console.status(f"loading {target_source}"):
        target = sources.load(
            sources.ModelRequest("target", target_source, dtype, device, options=_items(target_options))
        )
        draft_model = sources.load(
            sources.ModelRequest(
                "drafter", drafter_source, dtype, device, options=_items(drafter_options or {})
            )
        )
    console.print(
        f"target {target_source} ({target.num_parameters / 1e6:.1f}M params), drafter {drafter_source} "
        f"({draft_model.num_parameters / 1e6:.1f}M), {target.device}, "
        f"{next(target.model.parameters()).dtype}, k={k}, {n_prompts} prompts x {max_new_tokens} tokens, "
        f"engines {', '.join(engines)}"
    )
    examples = get_task(task_name).load(limit=n_prompts + 1)
    prompts = [_prompt_ids(target, example) for example in examples]
    longest = max(p.shape[0] for p in prompts) + max_new_tokens
    eos = target.eos_token_ids()
    lookup = MaxGramDrafter("prompt-lookup", max_ngram=2)
    methods, compile_s = {}, {}
    if "eager" in engines:
        methods.update(_methods("ours eager", target, draft_model, lookup, k, max_new_tokens, eos))
        methods.update(_hf_methods(target, draft_model, k, max_new_tokens, eos))
    if "onednn" in engines:  # copies of both models whose linear layers run on oneDNN
        if not can_use_onednn(target.model):
            raise SpecbenchError(
                "--engine",
                f"onednn serves float32 and bfloat16 models on the CPU; the target is "
                f"{next(target.model.parameters()).dtype} on {target.device}",
                "drop onednn, or pass --device cpu and --dtype float32 or bfloat16",
            )
        with console.status("loading copies with oneDNN's linear layers"):
            onednn = [
                sources.load(
                    sources.ModelRequest(name, source, dtype, device, options=_items(opts), linear="onednn")
                )
                for name, source, opts in (
                    ("target", target_source, target_options),
                    ("drafter", drafter_source, drafter_options or {}),
                )
            ]
        methods.update(_methods("ours onednn", *onednn, lookup, k, max_new_tokens, eos))
    if "inductor" in engines and target.device.type != "cpu":
        raise SpecbenchError(
            "--engine",
            f"inductor freezes the weights into inductor's C++ GEMM templates, which run on the CPU; the "
            f"target is on {target.device}",
            "drop inductor, or pass --device cpu",
        )
    for engine, linear in (("compiled", "aten"), ("inductor", "inductor")):
        if engine not in engines:
            continue
        fast_target = CompiledHFModel(target.model, "target", target.tokenizer, linear=linear)
        fast_drafter = CompiledHFModel(draft_model.model, "drafter", draft_model.tokenizer, linear=linear)
        took = {}
        for model in (fast_target, fast_drafter):
            with console.status(f"compiling the {model.name}'s {engine} passes of 1 and {k + 1} tokens"):
                took[model.name] = model.prepare(longest, (k,))
        compile_s.update({f"{name} ({engine})": seconds for name, seconds in took.items()})
        target_s, drafter_s = took["target"], took["drafter"]
        console.print(f"{engine}: compiled in {target_s:.0f} s (target), {drafter_s:.0f} s (drafter)")
        methods.update(_methods(f"ours {engine}", fast_target, fast_drafter, lookup, k, max_new_tokens, eos))
    if "compiled" in engines:
        static = _hf_static(target, max_new_tokens, eos, longest)
        with console.status("compiling HF generate(cache_implementation='static')"):
            started = time.perf_counter()
            static(prompts[0])
            compile_s["HF static"] = time.perf_counter() - started
        methods["HF static: generate"] = static
    with console.status("measuring the memory bandwidth"):
        bandwidth = measure_bandwidth(target.device)
    weight_bytes = unique_weight_bytes(target.model)
    tallies: dict[str, Tally] = defaultdict(Tally)
    with torch.inference_mode():
        for i, ids in enumerate(prompts):
            for name, method in methods.items():
                generation = method(ids)
                if i > 0:  # prompt 0 is the warm-up
                    tallies[name].add(generation, "target")
            console.log(f"prompt {i + 1}/{len(prompts)} done" + (" (warm-up)" if i == 0 else ""))
    classes = {}
    for ours, reference in (
        ("ours compiled: AR", "HF eager: generate"),
        ("ours compiled: AR", "ours eager: AR"),
        (f"ours compiled: SD k={k}", "ours compiled: AR"),
        (f"ours compiled: SD prompt-lookup k={k}", "ours compiled: AR"),
        (f"ours eager: SD k={k}", "ours eager: AR"),
        ("ours onednn: AR", "ours eager: AR"),
        (f"ours onednn: SD k={k}", "ours onednn: AR"),
        ("ours inductor: AR", "ours eager: AR"),
        (f"ours inductor: SD k={k}", "ours inductor: AR"),
    ):
        if ours in tallies and reference in tallies:
            classes[f"{ours} vs {reference}"] = _classes(
                target, prompts[1:], tallies[reference], tallies[ours]
            )
    return BenchResult(
        dict(tallies),
        k,
        1000 * weight_bytes / bandwidth,
        bandwidth,
        weight_bytes,
        compile_s,
        prompts[1:],
        classes,
    )


def _prompt_ids(target, example) -> torch.Tensor:
    text = render_prompt(example, target.tokenizer, chat_template=target.tokenizer.chat_template is not None)
    return (
        target.tokenizer(text, add_special_tokens=False, return_tensors="pt").input_ids[0].to(target.device)
    )


def _methods(label, target, draft_model, lookup, k, max_new_tokens, eos) -> dict:
    return {
        f"{label}: AR": lambda ids: autoregressive.generate(
            target, ids, max_new_tokens=max_new_tokens, eos_token_id=eos
        ),
        f"{label}: SD k={k}": lambda ids: speculative.generate(
            target, ModelDrafter(draft_model), ids, k=k, max_new_tokens=max_new_tokens, eos_token_id=eos
        ),
        f"{label}: SD prompt-lookup k={k}": lambda ids: speculative.generate(
            target, lookup, ids, k=k, max_new_tokens=max_new_tokens, eos_token_id=eos
        ),
    }


def _hf_methods(target, draft_model, k, max_new_tokens, eos) -> dict:
    greedy = SamplingParams()
    return {
        "HF eager: generate": lambda ids: hf_generate.generate(
            target, ids, max_new_tokens=max_new_tokens, sampling=greedy, eos_token_id=eos
        ),
        f"HF eager: assisted k={k}": lambda ids: hf_generate.generate(
            target,
            ids,
            max_new_tokens=max_new_tokens,
            sampling=greedy,
            eos_token_id=eos,
            assistant=draft_model,
            k=k,
        ),
        f"HF eager: prompt-lookup k={k}": lambda ids: hf_generate.generate(
            target,
            ids,
            max_new_tokens=max_new_tokens,
            sampling=greedy,
            eos_token_id=eos,
            prompt_lookup=True,
            k=k,
            max_ngram=2,
        ),
    }


def _hf_static(target, max_new_tokens: int, eos: list[int], longest: int):
    """HF ``generate`` with a static cache, compiled as transformers does it (its default
    ``CompileConfig``; on CPU it compiles only when told to, ``_compile_all_devices``). One cache,
    sized for the longest prompt and reset between requests, so no request recompiles. Greedy, timed
    like our loops."""
    from transformers import CompileConfig, StaticCache

    config = CompileConfig()
    config._compile_all_devices = True
    cache = StaticCache(config=target.model.config.get_text_config(decoder=True), max_cache_len=longest)

    def run(ids: torch.Tensor) -> Generation:
        cache.reset()
        watch = Stopwatch(target.device)
        with torch.inference_mode():
            output = target.model.generate(
                input_ids=ids[None],
                attention_mask=torch.ones_like(ids[None]),
                cache=cache,
                compile_config=config,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                eos_token_id=eos,
                pad_token_id=eos[0] if eos else None,
                **hf_generate._PLAIN,
            )
        walltime, ttft = watch.stop()
        tokens, stopped = truncate_at_eos(output[0, ids.shape[0] :].tolist(), frozenset(eos))
        return Generation(tokens, walltime, ttft, [(0, 0)] * len(tokens), {}, stopped)

    return run


def _classes(target, prompts, reference: Tally, ours: Tally) -> list[str]:
    """Per prompt: identical outputs, or at the first divergence a numerical tie or a mismatch
    (:mod:`specbench.pipeline.analysis.numerics`, on the eager target)."""
    return [
        divergence_fields(target, prompt, expected, got, divergence(expected, got), single_turn=True)[
            "divergence_class"
        ]
        for prompt, expected, got in zip(prompts, reference.outputs, ours.outputs, strict=True)
    ]


def measure_bandwidth(device: torch.device, repeats: int = 5) -> float:
    """Bytes per second streamed from memory: the best of ``repeats`` reads of a buffer far larger
    than any cache (CPU: a sum over 1 GiB of bfloat16; GPU: a device copy of 1 GiB, read + write)."""
    size = 1 << 30
    if device.type == "cuda":
        source = torch.empty(size, dtype=torch.uint8, device=device)
        target = torch.empty_like(source)
        best = float("inf")
        for _ in range(repeats):
            torch.cuda.synchronize(device)
            started = time.perf_counter()
            target.copy_(source)
            torch.cuda.synchronize(device)
            best = min(best, time.perf_counter() - started)
        return 2 * size / best
    buffer = torch.ones(size // 2, dtype=torch.bfloat16)
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        buffer.sum()
        best = min(best, time.perf_counter() - started)
    return size / best


def unique_weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of the model's parameters and buffers, tied tensors counted once."""
    seen, total = set(), 0
    for tensor in (*model.parameters(), *model.buffers()):
        if tensor.data_ptr() not in seen and tensor.is_floating_point():
            seen.add(tensor.data_ptr())
            total += tensor.numel() * tensor.element_size()
    return total


def print_bench(result: BenchResult, console: Console) -> dict[str, float]:
    tallies, k = result.tallies, result.k
    table = Table(title="specbench bench: same models, prompts and k", title_justify="left")
    for column in ("method", "tok/s", "ms/token", "walltime s", "target passes/req", "loop overhead"):
        table.add_column(column, justify="left" if column == "method" else "right")
    for name, t in tallies.items():
        overhead = f"{t.overhead:.1%}" if name.startswith("ours") else ""
        passes = f"{t.target_passes / t.requests:.1f}" if t.target_passes else ""
        table.add_row(
            name,
            f"{t.tokens / t.walltime:.1f}",
            f"{t.ms_per_token:.1f}",
            f"{t.walltime:.2f}",
            passes,
            overhead,
        )
    table.add_row(
        "bandwidth limit: AR",
        f"{1000 / result.limit_ms:.1f}",
        f"{result.limit_ms:.1f}",
        "",
        "",
        "",
    )
    console.print(table)
    console.print(
        f"bandwidth limit: {result.weight_bytes / 1e6:.0f} MB of target weights per token / "
        f"{result.bandwidth / 1e9:.1f} GB/s measured = {result.limit_ms:.2f} ms"
    )
    if result.compile_s:
        console.print(
            "compile time (never in a walltime): "
            + ", ".join(f"{name} {seconds:.0f} s" for name, seconds in result.compile_s.items())
        )
    ratios = {}
    pairs = (
        ("compiled AR vs HF eager generate", "HF eager: generate", "ours compiled: AR"),
        ("compiled AR vs our eager AR", "ours eager: AR", "ours compiled: AR"),
        ("compiled AR vs HF static generate", "HF static: generate", "ours compiled: AR"),
        (f"compiled SD k={k} vs compiled AR", "ours compiled: AR", f"ours compiled: SD k={k}"),
        (
            "compiled SD prompt-lookup vs compiled AR",
            "ours compiled: AR",
            f"ours compiled: SD prompt-lookup k={k}",
        ),
        (f"compiled SD k={k} vs HF eager assisted", f"HF eager: assisted k={k}", f"ours compiled: SD k={k}"),
        ("eager AR: HF / ours", "HF eager: generate", "ours eager: AR"),
        (f"eager SD k={k}: HF assisted / ours", f"HF eager: assisted k={k}", f"ours eager: SD k={k}"),
        (
            "eager prompt lookup: HF / ours",
            f"HF eager: prompt-lookup k={k}",
            f"ours eager: SD prompt-lookup k={k}",
        ),
        (f"eager SD k={k} vs eager AR", "ours eager: AR", f"ours eager: SD k={k}"),
        ("oneDNN AR vs our eager AR", "ours eager: AR", "ours onednn: AR"),
        ("oneDNN AR vs compiled AR", "ours compiled: AR", "ours onednn: AR"),
        (f"oneDNN SD k={k} vs oneDNN AR", "ours onednn: AR", f"ours onednn: SD k={k}"),
        (f"oneDNN SD k={k} vs compiled AR", "ours compiled: AR", f"ours onednn: SD k={k}"),
        (
            "oneDNN SD prompt-lookup vs oneDNN AR",
            "ours onednn: AR",
            f"ours onednn: SD prompt-lookup k={k}",
        ),
        ("inductor AR vs compiled AR", "ours compiled: AR", "ours inductor: AR"),
        ("inductor AR vs oneDNN AR", "ours onednn: AR", "ours inductor: AR"),
        (f"inductor SD k={k} vs inductor AR", "ours inductor: AR", f"ours inductor: SD k={k}"),
    )
    for label, theirs, ours in pairs:
        if theirs in tallies and ours in tallies:
            ratios[label] = tallies[theirs].ms_per_token / tallies[ours].ms_per_token
            console.print(f"{label}: [bold]{ratios[label]:.2f}x[/bold] (walltime per token)")
    for engine in ("compiled", "inductor"):
        if f"ours {engine}: AR" in tallies:
            bound = ratios[f"{engine} AR / bandwidth limit"] = (
                tallies[f"ours {engine}: AR"].ms_per_token / result.limit_ms
            )
            console.print(f"{engine} AR per token / bandwidth limit: [bold]{bound:.2f}x[/bold]")
    for name, t in tallies.items():
        if name.startswith(("ours compiled", "ours inductor")):
            console.print(f"loop overhead of {name}: [bold]{t.overhead:.1%}[/bold]")
    for label, classes in result.classes.items():
        counts = {c: classes.count(c) for c in ("identical", "tie", "mismatch")}
        console.print(
            f"outputs {label}: {counts['identical']}/{len(classes)} identical, "
            f"{counts['tie']} numerical ties, {counts['mismatch']} mismatches"
        )
    return ratios


def _items(options: dict) -> tuple:
    return tuple(sorted(options.items()))
