"""Making drafters: ``distill`` (drafters and heads by distillation from the target) and ``bigram build``
(Max-Gram's argmax bigram tables)."""

from __future__ import annotations

from pathlib import Path

import typer

from specbench.cli.common import err, user_errors
from specbench.errors import SpecbenchError


@user_errors
def distill(
    target: str = typer.Option("smollm2-135m-instruct", help="Teacher model source (alias, path or hub id)."),
    size: list[str] = typer.Option(
        ["small", "base"],
        "--size",
        help="Drafters to train: small (~8.5M, 2 layers x 160), base (the target's embedding and first "
        "2 layers), mini and micro (2 layers x 60 and x 20: ~3.0M and ~1.0M for SmolLM2-135M, CS Drafting's "
        "FLAN-T5-base and -small cost ratios to XXL), exit<N> (an exit head on the target's first N layers), "
        "medusa (4 Medusa-1 heads on "
        "the target's last hidden state; recipes name them medusa:<target>/medusa), eagle (an EAGLE head: "
        "one decoder layer on the target's features, also saved in vLLM's eagle layout; recipes name it "
        "eagle:<target>/eagle), eagle3 (the same head reading EAGLE-3's fusion of the target's low, middle "
        "and high layers, RMS-normalised, trained on the token loss alone; eagle:<target>/eagle3, no vLLM "
        "layout), eagle3-layer (EAGLE-3's own layer, trained with its training-time test and saved in the "
        "speculators layout vLLM loads; recipes name it eagle3:<target>/eagle3-layer). Repeat "
        "the option for several.",
    ),
    data_dir: Path = typer.Option(
        None,
        "--data-dir",
        envvar="SPECBENCH_DATA_DIR",
        help="Offline data folder with gsm8k/train.jsonl, mmlu/dev.jsonl and alpaca_seed/train.jsonl.",
    ),
    generate: int = typer.Option(800, min=1, help="Training prompts the target answers greedily."),
    teacher_forced: int = typer.Option(1200, min=0, help="GSM8K train reference answers the target scores."),
    max_new_tokens: int = typer.Option(128, min=1, help="Length cap of the target's answers."),
    top_k: int = typer.Option(32, min=1, help="Teacher log-probabilities kept per position."),
    epochs: float = typer.Option(
        None,
        min=0.01,
        help="Training epochs (default per size: small 3, base 2, micro 6, mini 6, exit 1, medusa 2, "
        "eagle, eagle3 and eagle3-layer 8).",
    ),
    lr: float = typer.Option(None, min=0.0, help="Peak learning rate (default per size)."),
    seed: int = typer.Option(0, help="Seed of the student's initialisation and batch order."),
    draft_vocab: int = typer.Option(
        None,
        min=0,
        help="Score only the N tokens most frequent in the training data (FR-Spec); the drafter "
        "gives the others probability 0, which keeps decoding lossless and each pass cheaper. "
        "0 = the whole vocabulary (default per size: 8192; exit heads always 0).",
    ),
    extra_prompts: list[str] = typer.Option(
        [],
        "--extra-prompts",
        help="Further prompts the target answers greedily, as TASK:SPLIT (e.g. spec_bench:question): "
        "every row of the split except those the --leave-out recipes evaluate. Cached apart from the "
        "base data; the drafters are saved with +TASK-SPLIT added to their names. Repeat for several.",
    ),
    leave_out: list[str] = typer.Option(
        [],
        "--leave-out",
        help="With --extra-prompts: a recipe whose evaluated examples (its datasets, limits and every, "
        "as `specbench run` selects them) never become training text; repeat for several, or write "
        "--leave-out none to state that nothing is evaluated on those splits.",
    ),
    unroll: int = typer.Option(
        None,
        min=1,
        help="EAGLE heads only: steps of EAGLE-3's training-time test (1: teacher-forced features only; "
        "each further step reads the head's own predicted features, as a tree's deeper levels do; "
        "default 2, eagle3-layer 7). A head trained with --unroll N is saved as eagle-unrollN "
        "(eagle3-unrollN, eagle3-layer-unrollN).",
    ),
    max_sequence: int = typer.Option(
        None,
        "--max-sequence",
        min=16,
        help="Heads only (medusa, eagle, eagle3): train on teacher sequences (prompt and answer) of at "
        "most this many tokens (default 512). Long-prompt tasks such as Spec-Bench's summarization and "
        "RAG questions need about 1024; each target pass then costs more. Saved as <size>-seqN.",
    ),
    name: str = typer.Option(
        None,
        "--name",
        help="Save the drafter under this folder name instead of the one its options give (e.g. keep "
        "a longer-trained small beside the first: --name small-e15); recipes then name it "
        "distilled:<target>/<name>. Letters, digits, '.', '_', '+' and '-'; one --size only.",
    ),
):
    """Train drafters that share the target's tokenizer by distillation (forward KL on its top-k).

    The target's answers and top-k log-probabilities are cached under the specbench cache
    (SPECBENCH_CACHE, default ~/.cache/specbench), so re-training skips the teacher; each finished
    teacher batch is kept as it completes, so a killed run, started again with the same options, resumes
    at its first unfinished batch (the hours a large target takes on a CPU are not lost). Drafters are
    saved to <cache>/drafters/<target>/<size> and load anywhere as source: distilled:<target>/<size>.
    """
    import json

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from specbench.training import distill as distillation

    if data_dir is None:
        raise SpecbenchError(
            "--data-dir",
            "no training data folder",
            "pass --data-dir ../shared/data or set SPECBENCH_DATA_DIR",
        )
    data_dir = str(Path(data_dir).resolve())
    from specbench.training.teacher import check_extra

    check_extra(extra_prompts, data_dir)  # before the target loads and the teacher data is built
    teacher = distillation.TeacherConfig(
        target,
        generate,
        max_new_tokens,
        teacher_forced,
        top_k,
        data_dir=data_dir,
        extra=tuple(extra_prompts),
        left_out=evaluated_ids(extra_prompts, leave_out, data_dir),
    )
    overrides = {"epochs": epochs, "lr": lr, "seed": seed, "draft_vocab": draft_vocab}
    overrides |= {"unroll": unroll, "max_sequence": max_sequence}
    if name is not None:
        _check_name(name, size)
        overrides["label"] = name
    students = [distillation.student_config(s, **overrides) for s in size]
    columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn())
    columns += (TextColumn("{task.fields[stats]}"), TimeElapsedColumn())
    with Progress(*columns, console=err) as progress:
        saved = distillation.distill(teacher, students, progress)
    for path in saved:
        record = json.loads((path / "distill.json").read_text())
        after = record["held_out_after"]
        err.print(
            f"{path}: {record['parameters'] / 1e6:.1f}M parameters, held-out top-1 agreement "
            f"{after['top1_agreement']:.1%} (before {record['held_out_before']['top1_agreement']:.1%})"
        )


def _check_name(name: str, sizes: list[str]) -> None:
    import re

    if len(sizes) != 1:
        raise SpecbenchError("--name", f"one name for {len(sizes)} sizes", "train one --size with --name")
    if not re.fullmatch(r"[A-Za-z0-9._+-]+", name) or name.strip(".") == "":
        raise SpecbenchError(
            "--name", f"{name!r} is not a folder name", "use letters, digits, '.', '_', '+' and '-'"
        )


def evaluated_ids(extra: list[str], recipes: list[str], data_dir: str) -> tuple[str, ...]:
    """The ids of the examples of the ``extra`` splits that the ``recipes`` evaluate (sorted)."""
    import contextlib
    import os
    from unittest import mock

    from specbench.pipeline.run.datasets import load_datasets
    from specbench.recipe import load_recipe
    from specbench.training.teacher import split_label

    if not extra:
        if recipes:
            raise SpecbenchError("--leave-out", "nothing to leave out of", "use it with --extra-prompts")
        return ()
    if not recipes:
        raise SpecbenchError(
            "--extra-prompts",
            "no recipe named whose evaluated prompts must stay out of training",
            "add --leave-out RECIPE (repeatable), or --leave-out none if none evaluates these splits",
        )
    if recipes == ["none"]:
        return ()
    labels = {split_label(source) for source in extra}
    ids: set[str] = set()
    for path in recipes:
        # the recipes' data is the training data's folder
        with mock.patch.dict(os.environ, {"SPECBENCH_DATA_DIR": data_dir}):
            runs = load_datasets(load_recipe(path), None, lambda field: contextlib.nullcontext())
        chosen = [run for run in runs if run.label in labels]
        if not chosen:
            raise SpecbenchError(
                f"--leave-out {path}",
                f"the recipe evaluates none of {', '.join(sorted(labels))}",
                "name the recipes that evaluate the --extra-prompts splits",
            )
        ids |= {example.id for run in chosen for example in run.examples}
    return tuple(sorted(ids))


bigram_app = typer.Typer(help="Argmax bigram tables: the fill of CS Drafting's Max-Gram drafter.")


@bigram_app.command("build")
@user_errors
def bigram_build(
    tokenizer: str = typer.Option(..., help="Model source whose tokenizer to use (alias, path or hub id)."),
    corpus: list[Path] = typer.Option(
        ..., help="Text corpus: .jsonl (every string field of every row) or plain text. Repeatable."
    ),
    out: Path = typer.Option(
        ..., help="Where to write the table (a JSON list: entry i = argmax successor of i)."
    ),
):
    """Count token bigrams over a corpus and keep each token's most frequent successor.

    Use the result as a Max-Gram fill: models: {mag: {source: maxgram, options: {bigram: OUT}}}.
    """
    from specbench import sources
    from specbench.drafters.bigram import BigramTable, corpus_texts

    model = sources.load(sources.ModelRequest("tokenizer", tokenizer, device="cpu"))
    texts = corpus_texts(corpus)
    ids = [model.tokenizer(text, add_special_tokens=False).input_ids for text in texts]
    table = BigramTable.build(ids, len(model.tokenizer))
    learned = int((table.next_token != table.next_token.new_tensor(range(len(table)))).sum())
    if not learned:  # an empty corpus, or texts of one token each: the table would only repeat tokens
        raise SpecbenchError(
            "--corpus", f"{len(texts)} texts gave no bigram to learn", "give a corpus of running text"
        )
    table.save(out)  # makes its folder
    err.print(f"{out}: {len(table)} entries, {learned} learned from {len(texts)} texts")
