"""Is an EAGLE head short of data or of capacity? Held-out agreement against the amount of training data.

The head named (a folder that ``specbench distill --size eagle`` saved) is evaluated as trained, on a
seeded sample of its own training sequences and on its held-out ones; then heads of the same
configuration (epochs, rate, training-time test, sequence limit, seed) are trained on seeded fractions
of the same training sequences, with the draft vocabulary taken from that fraction, and evaluated on the
same held-out sequences. Agreement is the head's top-1 token against the target's greedy token at the
answer positions (:func:`specbench.training.eagle.accuracy`; step 2 reads the head's own features, as a
tree's deeper levels do), given for all held-out sequences and split into the base data (GSM8K, MMLU,
Alpaca) and the extra prompts' answers (e.g. Spec-Bench's questions). A head that agrees far more on
its training text than on held-out text, and gains held-out agreement with every doubling of the
data, is short of data, not of capacity. Needs the head's teacher data and target features in the
specbench cache (the run of ``specbench distill`` that trained it leaves them there).

    python -m scripts.heads.data_scaling HEAD_FOLDER OUT.json [--fractions 0.25 0.5] [--matched-steps]

With ``--matched-steps`` each fraction trains for as many steps as the full head (its epochs divided by
the fraction), which separates the data's effect from the number of optimisation steps.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import tempfile
import time
from pathlib import Path

import torch
from rich.progress import Progress
from safetensors.torch import load_file

from specbench import sources
from specbench.drafters.eagle import EagleHead
from specbench.models.machine import this_machine
from specbench.training import distill
from specbench.training.eagle import accuracy, cached_features, train_head
from specbench.training.medusa import up_to_max_sequence
from specbench.training.teacher import draft_vocabulary, teacher_data

HELD_OUT_FRACTION = 0.04  # as specbench.training.distill.distill splits
SPLIT_SEED = 1234


def teacher_of(record: dict) -> distill.TeacherConfig:
    t = record["teacher"]
    teacher = distill.TeacherConfig(
        t["target"],
        t["generate"],
        t["max_new_tokens"],
        t["teacher_forced"],
        t["top_k"],
        data_dir=t["data_dir"],
        extra=tuple(t.get("extra", ())),
        left_out=tuple(t.get("left_out", ())),
    )
    if teacher.key() != t["key"]:
        raise SystemExit(f"the teacher data of {t['key']} cannot be rebuilt here (key {teacher.key()})")
    return teacher


def agreement(head, target, vocab, sequences, features, steps: int) -> list[float]:
    embed = target.model.get_input_embeddings().weight.detach().float()
    full = target.model.get_output_embeddings().weight.detach().float()
    return accuracy(head, embed, full, vocab, sequences, features, 4096, steps)


def held_out_parts(head, target, vocab, held, f_held, extra: set[int], steps: int) -> dict:
    parts = {"all": list(range(len(held)))}
    parts["base"] = [i for i in parts["all"] if id(held[i]) not in extra]
    parts["extra"] = [i for i in parts["all"] if id(held[i]) in extra]
    return {
        name: {
            "sequences": len(chosen),
            "agreement": agreement(
                head, target, vocab, [held[i] for i in chosen], [f_held[i] for i in chosen], steps
            ),
        }
        for name, chosen in parts.items()
        if chosen
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("head", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--fractions", type=float, nargs="*", default=[0.25, 0.5])
    parser.add_argument(
        "--matched-steps",
        action="store_true",
        help="train each fraction for the full head's number of steps (epochs / fraction), so that a "
        "gain with data is not a gain with optimisation steps",
    )
    args = parser.parse_args()
    record = json.loads((args.head / "distill.json").read_text())
    teacher = teacher_of(record)
    student = record["student"]
    config = distill.student_config(
        record["size"], **{k: student.get(k) for k in ("epochs", "lr", "seed", "draft_vocab", "max_sequence")}
    )
    config = distill.StudentConfig(**(vars(config) | {"unroll": record["unroll"]}))
    target = sources.load(sources.ModelRequest("target", teacher.target, dtype="float32", device="cpu"))
    torch.set_num_threads(max(1, torch.get_num_threads()))
    with Progress() as progress:
        data = teacher_data(target, teacher, progress)
        base_count = len(teacher_data(target, teacher.base(), progress))
        extra = {id(s) for s in data[base_count:]}
        split = torch.randperm(len(data), generator=torch.Generator().manual_seed(SPLIT_SEED)).tolist()
        n_held = max(1, round(HELD_OUT_FRACTION * len(data)))
        held = [data[i] for i in split[:n_held]]
        train = [data[i] for i in split[n_held:]]
        train, held, _ = up_to_max_sequence(train, held, config)
        features_at = teacher.features_at()
        f_train = cached_features(target, train, Path(f"{features_at}-train-{len(train)}.pt"), progress)
        f_held = cached_features(target, held, Path(f"{features_at}-held-{len(held)}.pt"), progress)

        def sample_of(chosen: list[int]) -> tuple[list, list]:
            pick = torch.randperm(len(chosen), generator=torch.Generator().manual_seed(7))[: len(held)]
            return [train[chosen[i]] for i in pick.tolist()], [f_train[chosen[i]] for i in pick.tolist()]

        manifest = json.loads((args.head / "eagle.json").read_text())
        if manifest.get("fused_layers"):
            raise SystemExit(f"{args.head}: a fused (EAGLE-3) head; this script reads EAGLE-1 heads")
        head = EagleHead.for_target(target.model, (), False).float()
        head.load_state_dict(load_file(str(args.head / "eagle_head.safetensors")))
        vocab = torch.tensor(manifest["draft_vocab"])
        steps = config.unroll
        everything = list(range(len(train)))
        rows = [
            {
                "fraction": 1.0,
                "sequences": len(train),
                "epochs": config.epochs,
                "positions": int(sum(s.ids.shape[0] for s in train)),
                "steps": record["steps"],
                "seconds": record["seconds"],
                "trained_here": False,
                "train_sample": agreement(head, target, vocab, *sample_of(everything), steps),
                "held_out": held_out_parts(head, target, vocab, held, f_held, extra, steps),
            }
        ]
        for fraction in sorted(args.fractions):
            order = torch.randperm(len(train), generator=torch.Generator().manual_seed(SPLIT_SEED + 1))
            chosen = sorted(order[: math.ceil(fraction * len(train))].tolist())
            subset, f_subset = [train[i] for i in chosen], [f_train[i] for i in chosen]
            sub_vocab = draft_vocabulary(subset, config.draft_vocab or target.vocab_size, target)
            epochs = config.epochs / fraction if args.matched_steps else config.epochs
            trained_config = distill.StudentConfig(**(vars(config) | {"epochs": epochs}))
            with tempfile.TemporaryDirectory() as scratch:
                at = Path(scratch) / "features"
                torch.save(f_subset, f"{at}-train-{len(subset)}.pt")
                torch.save(f_held, f"{at}-held-{len(held)}.pt")
                started = time.perf_counter()
                trained, training = train_head(target, subset, held, trained_config, sub_vocab, progress, at)
            rows.append(
                {
                    "fraction": fraction,
                    "sequences": len(subset),
                    "epochs": epochs,
                    "positions": int(sum(s.ids.shape[0] for s in subset)),
                    "steps": training["steps"],
                    "seconds": round(time.perf_counter() - started, 1),
                    "trained_here": True,
                    "train_sample": agreement(trained, target, sub_vocab, *sample_of(chosen), steps),
                    "held_out": held_out_parts(trained, target, sub_vocab, held, f_held, extra, steps),
                }
            )
    out = {
        "head": args.head.name,
        "teacher_key": teacher.key(),
        "student": config.manifest(),
        "held_out_sequences": len(held),
        "machine": this_machine().describe(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "rows": sorted(rows, key=lambda r: r["fraction"]),
    }
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    for row in out["rows"]:
        held_out = row["held_out"]
        print(
            f"{row['fraction']:5.2f} {row['sequences']:5d} seqs {row['epochs']:5.1f} epochs  "
            f"train {row['train_sample'][0]:.3f}  "
            + "  ".join(f"{k} {v['agreement'][0]:.3f}/{v['agreement'][1]:.3f}" for k, v in held_out.items())
        )


if __name__ == "__main__":
    main()
