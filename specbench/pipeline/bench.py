"""Our decoding loops against Hugging Face ``generate`` on the same model, prompts and k.

Each prompt runs every method back to back (interleaved, so drift in machine speed hits all of
them alike) after one untimed warm-up prompt. Reported per method: tokens/s, mean target passes
per request, and — for our loops — loop overhead = 1 - (time inside model forwards / walltime).
The headline figures are the walltime ratios HF / ours (> 1 means ours is faster).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import torch
from rich.console import Console
from rich.table import Table

from specbench.decoding import autoregressive, hf_generate, speculative
from specbench.decoding.sampling import SamplingParams
from specbench.drafters.maxgram import MaxGramDrafter
from specbench.models import registry
from specbench.models.base import ModelDrafter
from specbench.tasks import get_task, render_prompt


@dataclass
class Tally:
    tokens: int = 0
    walltime: float = 0.0
    model_seconds: float = 0.0
    target_passes: int = 0
    requests: int = 0

    def add(self, generation, target_name: str) -> None:
        self.tokens += len(generation.tokens)
        self.walltime += generation.walltime
        self.model_seconds += sum(c["seconds"] for c in generation.forwards.values())
        self.target_passes += generation.forwards[target_name]["forward_passes"]
        self.requests += 1


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
) -> dict[str, Tally]:
    target_options = target_options or {}
    if drafter_source == "same":
        drafter_source, drafter_options = target_source, target_options
    with console.status(f"loading {target_source}"):
        target = registry.load(
            registry.ModelRequest("target", target_source, dtype, device, options=_items(target_options))
        )
        draft_model = registry.load(
            registry.ModelRequest(
                "drafter", drafter_source, dtype, device, options=_items(drafter_options or {})
            )
        )
    console.print(
        f"target {target_source} ({target.num_parameters / 1e6:.1f}M params), drafter {drafter_source} "
        f"({draft_model.num_parameters / 1e6:.1f}M), {target.device}, "
        f"{next(target.model.parameters()).dtype}, k={k}, {n_prompts} prompts x {max_new_tokens} tokens"
    )
    task = get_task(task_name)
    examples = task.load(limit=n_prompts + 1)
    sampling = SamplingParams()
    eos = target.eos_token_ids()
    lookup = MaxGramDrafter("prompt-lookup", max_ngram=2)
    methods = {
        "ours: autoregressive": lambda ids: autoregressive.generate(
            target, ids, max_new_tokens=max_new_tokens, eos_token_id=eos
        ),
        "HF: generate (greedy)": lambda ids: hf_generate.generate(
            target, ids, max_new_tokens=max_new_tokens, sampling=sampling, eos_token_id=eos
        ),
        f"ours: SD k={k}": lambda ids: speculative.generate(
            target, ModelDrafter(draft_model), ids, k=k, max_new_tokens=max_new_tokens, eos_token_id=eos
        ),
        f"HF: assisted k={k}": lambda ids: hf_generate.generate(
            target,
            ids,
            max_new_tokens=max_new_tokens,
            sampling=sampling,
            eos_token_id=eos,
            assistant=draft_model,
            k=k,
        ),
        f"ours: SD prompt-lookup k={k}": lambda ids: speculative.generate(
            target, lookup, ids, k=k, max_new_tokens=max_new_tokens, eos_token_id=eos
        ),
        f"HF: prompt-lookup k={k}": lambda ids: hf_generate.generate(
            target,
            ids,
            max_new_tokens=max_new_tokens,
            sampling=sampling,
            eos_token_id=eos,
            prompt_lookup=True,
            k=k,
            max_ngram=2,
        ),
    }
    tallies: dict[str, Tally] = defaultdict(Tally)
    with torch.inference_mode():
        for i, example in enumerate(examples):
            text = render_prompt(
                example, target.tokenizer, chat_template=target.tokenizer.chat_template is not None
            )
            ids = (
                target.tokenizer(text, add_special_tokens=False, return_tensors="pt")
                .input_ids[0]
                .to(target.device)
            )
            for name, method in methods.items():
                generation = method(ids)
                if i > 0:  # prompt 0 is the warm-up
                    tallies[name].add(generation, "target")
            console.log(f"prompt {i + 1}/{len(examples)} done" + (" (warm-up)" if i == 0 else ""))
    return dict(tallies)


def print_bench(tallies: dict[str, Tally], console: Console) -> dict[str, float]:
    table = Table(title="specbench bench: same model, prompts and k", title_justify="left")
    for column in ("method", "tok/s", "walltime s", "target passes/req", "loop overhead"):
        table.add_column(column, justify="left" if column == "method" else "right")
    for name, t in tallies.items():
        overhead = f"{1 - t.model_seconds / t.walltime:.1%}" if name.startswith("ours") else ""
        table.add_row(
            name,
            f"{t.tokens / t.walltime:.1f}",
            f"{t.walltime:.2f}",
            f"{t.target_passes / t.requests:.1f}",
            overhead,
        )
    console.print(table)
    names = list(tallies)
    ratios = {
        "AR (HF/ours walltime per token)": _ratio(tallies[names[1]], tallies[names[0]]),
        "SD model drafter (HF assisted/ours)": _ratio(tallies[names[3]], tallies[names[2]]),
        "SD prompt lookup (HF/ours)": _ratio(tallies[names[5]], tallies[names[4]]),
    }
    for label, value in ratios.items():
        console.print(f"{label}: [bold]{value:.3f}x[/bold]")
    sd = tallies[names[2]]
    console.print(
        f"loop overhead of our SD (1 - model time / walltime): [bold]{1 - sd.model_seconds / sd.walltime:.1%}"
        "[/bold]"
    )
    return ratios


def _items(options: dict) -> tuple:
    return tuple(sorted(options.items()))


def _ratio(theirs: Tally, ours: Tally) -> float:
    """Walltime per generated token, theirs over ours (> 1: ours is faster)."""
    return (theirs.walltime / theirs.tokens) / (ours.walltime / ours.tokens)
