"""SpecDec++'s commands: ``specbench theory threshold`` (Theorem 3.1's threshold policy, checked) and
``specbench specdecpp train`` (the acceptance prediction head)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from specbench.errors import SpecbenchError
from specbench.papers.commands import THEORY, Command, Group

err = Console(stderr=True)


def threshold(
    cost: list[float] = typer.Option([0.05, 0.1, 0.3], "--cost", help="Draft pass / target pass (repeat)."),
    tokens: int = typer.Option(40, min=2, max=200, help="Tokens the generation needs."),
    longest: int = typer.Option(6, min=1, max=8, help="Candidates a round may hold."),
):
    """SpecDec++ Theorem 3.1, checked: a small MDP's optimal stopping is a threshold on P(rejection).

    The MDP of candidate lengths is solved exactly (value iteration over every round's candidates).
    Candidates are accepted with chance 0.95, 0.7 or 0.3 (drawn 50/30/20%, seen when drafted). Per
    remaining budget: the largest rejection chance where continuing is optimal, the smallest where
    stopping is, and whether a threshold separates them (specbench/papers/specdecpp/threshold.py).
    """
    from rich.table import Table

    from specbench.papers.specdecpp.threshold import Problem, threshold_check

    for c in cost:
        if not 0 < c < 1:
            raise SpecbenchError("--cost", f"{c} is not a draft-to-target cost ratio", "use 0 < cost < 1")
    out = Console(width=120)
    problem = Problem(tokens=tokens, longest=longest)
    chances = ", ".join(f"{r:g} ({100 * w:g}%)" for r, w in zip(problem.rates, problem.weights, strict=True))
    out.print(
        f"SpecDec++ Theorem 3.1 (Huang et al. 2024), checked on an MDP solved exactly: candidates accepted "
        f"with chance {chances}, seen when drafted; {tokens} tokens to generate, rounds of at most "
        f"{longest} candidates; c = a draft pass over a target pass.",
        highlight=False,
    )
    for c in cost:
        rows = threshold_check(Problem(c=c, tokens=tokens, longest=longest))
        table = Table("tokens left", "continue up to", "stop from", "threshold", title=f"c = {c:g}")
        for row in rows:
            table.add_row(
                str(row["tokens_left"]),
                *(f"{row[k]:.4f}" if row[k] == row[k] else "—" for k in ("continue_up_to", "stop_from")),
                "yes" if row["threshold"] else "no",
            )
        out.print(table)


def train(
    target: str = typer.Option("smollm2-135m-instruct", help="Target model source (alias, path or hub id)."),
    drafter: str = typer.Option(
        "distilled:smollm2-135m-instruct/small",
        help="Draft model source; the head reads its last hidden state.",
    ),
    target_options: str = typer.Option("{}", help="Loader options of the target, as JSON (tiny models)."),
    drafter_options: str = typer.Option("{}", help="Loader options of the drafter, as JSON (tiny models)."),
    name: str = typer.Option("default", help="Head name: <cache>/specdecpp/<target>/<drafter>/<name>."),
    data_dir: Path = typer.Option(
        None,
        "--data-dir",
        envvar="SPECBENCH_DATA_DIR",
        help="Offline data folder with gsm8k/train.jsonl, mmlu/dev.jsonl and alpaca_seed/train.jsonl.",
    ),
    prompts: int = typer.Option(800, min=2, help="Training + evaluation prompts (the data size)."),
    max_new_tokens: int = typer.Option(128, min=1, help="Length cap of the target's responses."),
    eval_fraction: float = typer.Option(0.1, min=0.0, max=0.5, help="Prompts held out for the eval metrics."),
    mixing_ratio: float = typer.Option(
        0.15, min=0.0, max=0.99, help="r: probability a position keeps the target's token (no loss there)."
    ),
    depth: int = typer.Option(3, min=0, help="Residual SiLU blocks of the head (0: one linear layer)."),
    w_acc: float = typer.Option(1.0, min=0.0, help="BCE weight of acceptance."),
    w_rej: float = typer.Option(6.0, min=0.0, help="BCE weight of rejection."),
    epochs: float = typer.Option(3.0, min=0.01, help="Training epochs."),
    batch_size: int = typer.Option(32, min=1, help="Sequences per optimiser step."),
    lr: float = typer.Option(1e-3, min=0.0, help="Peak learning rate (Adam)."),
    warmup_ratio: float = typer.Option(0.03, min=0.0, max=1.0, help="Linear warm-up share of the steps."),
    seed: int = typer.Option(
        42, help="Seed of the split, draft samples, mixing, initialisation and batches."
    ),
    dtype: str = typer.Option("float32", help="Model dtype: float32, float64, bfloat16 or float16."),
    device: str = typer.Option("cpu", help="cpu, cuda, cuda:N or mps."),
    teacher_batch: int = typer.Option(8, min=1, help="Sequences per target / drafter forward pass."),
    prompt_set: str = typer.Option(
        "distill",
        help="distill: distill's prompts (GSM8K train, MMLU dev, Alpaca seeds), --eval-fraction held out; "
        "alpaca: the paper's split, Alpaca's specdecpp-train prompts to train and specdecpp-dev to "
        "evaluate, so a recipe's alpaca specdecpp-test prompts stay unseen.",
    ),
    temperature: float = typer.Option(
        0.0,
        min=0.0,
        help="Sample the target's responses at this temperature (0: greedy; the release samples).",
    ),
    top_p: float = typer.Option(1.0, min=0.0, max=1.0, help="Nucleus cut of the sampled responses."),
    top_k: int = typer.Option(0, min=0, help="Top-k cut of the sampled responses (0: off)."),
    responses: Path = typer.Option(
        None,
        help="The target's responses from this file (a responses-*.pt an earlier run wrote in its "
        "cache, e.g. one committed beside a run) instead of generating them; its prompts must be this "
        "run's.",
    ),
):
    """Train SpecDec++'s acceptance head for TARGET and DRAFTER (Sec. 3.3) and save it with a manifest.

    The target's responses, the labels and the draft's hidden states are cached under the specbench
    cache (SPECBENCH_CACHE), so re-training with other head settings skips every model pass. Both
    stages keep each finished teacher batch, so an interrupted run, started again with the same
    options, resumes at the first unfinished batch (hours of a real pair's CPU time are not lost).
    """
    import json

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from specbench.drafters import acceptance_head
    from specbench.models.options import parse_loader_options
    from specbench.papers.specdecpp.head_data import PROMPT_SETS
    from specbench.papers.specdecpp.train_config import TrainConfig
    from specbench.papers.specdecpp.training import train as train_head

    if data_dir is None:
        raise SpecbenchError(
            "--data-dir",
            "no training data folder",
            "pass --data-dir ../shared/data or set SPECBENCH_DATA_DIR",
        )
    if dtype not in ("float32", "float64", "bfloat16", "float16"):
        raise SpecbenchError(
            "--dtype", f"unknown dtype {dtype!r}", "use float32, float64, bfloat16 or float16"
        )
    if prompt_set not in PROMPT_SETS:
        raise SpecbenchError(
            "--prompt-set", f"unknown prompt set {prompt_set!r}", "use " + " or ".join(PROMPT_SETS)
        )
    config = TrainConfig(
        target=target,
        drafter=drafter,
        target_options=parse_loader_options("--target-options", target_options),
        drafter_options=parse_loader_options("--drafter-options", drafter_options),
        name=name,
        data_dir=str(Path(data_dir).resolve()),
        prompts=prompts,
        max_new_tokens=max_new_tokens,
        eval_fraction=eval_fraction,
        mixing_ratio=mixing_ratio,
        depth=depth,
        w_acc=w_acc,
        w_rej=w_rej,
        epochs=epochs,
        batch_size=batch_size,
        lr=lr,
        warmup_ratio=warmup_ratio,
        seed=seed,
        teacher_batch=teacher_batch,
        dtype=dtype,
        device=device,
        prompt_set=prompt_set,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        responses=str(responses.resolve()) if responses else "",
    )
    columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn())
    columns += (TextColumn("{task.fields[stats]}"), TimeElapsedColumn())
    with Progress(*columns, console=err) as progress:
        folder = train_head(config, progress)
    manifest = json.loads((folder / acceptance_head.MANIFEST).read_text())
    scores, constant = manifest["eval"], manifest["eval_constant_predictor"]
    err.print(
        f"{folder}: eval binary KL {scores['binary_kl']:.4f} "
        f"(constant predictor {constant['binary_kl']:.4f}), "
        f"accuracy {scores['accuracy']:.1%}, {scores['draft_tokens']} draft tokens, "
        f"{manifest['seconds']['total']:.0f} s\nuse it in a recipe as  head: {manifest['reference']}"
    )
    if warning := underfit_warning(manifest):
        err.print(warning)


def underfit_warning(manifest: dict) -> str | None:
    """A line when the head predicts held-out acceptance no better than the training labels' mean does
    (a constant), which is what a small data set gives the paper's 3-block head: it over-fits, or with
    few optimiser steps barely leaves its initialisation."""
    head, constant = manifest["eval"]["binary_kl"], manifest["eval_constant_predictor"]["binary_kl"]
    if head < constant:
        return None
    config = manifest["config"]
    line = (
        f"! the head's held-out binary KL {head:.4f} is not below a constant predictor's {constant:.4f} "
        f"({manifest['steps']} optimiser steps over {manifest['train_sequences']} sequences, depth "
        f"{config['depth']}): try --depth 0, another --epochs, or more --prompts"
    )
    if config["w_rej"] != config["w_acc"]:
        weights = f"w_rej {config['w_rej']:g} against w_acc {config['w_acc']:g}"
        line += f" ({weights} skews every prediction by design, which raises this KL)"
    return line


GROUPS = (Group("specdecpp", "SpecDec++ (Huang et al. 2024): train the acceptance prediction head."),)
COMMANDS = (
    Command(THEORY, "threshold", threshold, "SpecDec++'s threshold policy (Theorem 3.1, threshold)"),
    Command("specdecpp", "train", train),
)
