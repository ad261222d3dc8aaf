"""Training Medusa-1 heads (Cai et al., ICML 2024) by self-distillation on the frozen target.

The data is the distillation teacher data (:func:`specbench.training.teacher.teacher_data`): the
target's own greedy answers to training prompts and GSM8K train reference answers, never evaluation
prompts. One no-grad pass of the target gives its last hidden state f_t at every answer position;
head k learns to predict the sequence's token t + k + 1 from f_t (cross-entropy over the draft
vocabulary, through the target's frozen LM head). Deterministic (seeded order), a few CPU minutes for
SmolLM2-135M; the held-out sequences give each head's top-1 accuracy, the acceptance it can expect.
"""

from __future__ import annotations

import math
import time

import torch
from torch import nn

from specbench.drafters import medusa
from specbench.training.teacher import Sequence, right_padded

IGNORE = -100


@torch.inference_mode()
def target_features(
    target,
    sequences: list[Sequence],
    progress,
    batch_size: int = 16,
    whole: bool = False,
    layers: tuple[int, ...] = (),
) -> list[torch.Tensor]:
    """The target's last hidden state (after the final norm, what its LM head reads) at each
    sequence's positions ``start - 1 ..`` (``whole``: at every position), in bfloat16 (half the
    memory, ample for training): [positions, H]; with ``layers``, the states of those layers first
    (``hidden_states[i]``), then the last: [positions, len(layers) + 1, H]."""
    out: list[torch.Tensor | None] = [None] * len(sequences)
    order = sorted(range(len(sequences)), key=lambda i: sequences[i].ids.shape[0])
    task = progress.add_task("target features", total=len(sequences), stats="")
    for first in range(0, len(order), batch_size):
        batch = order[first : first + batch_size]
        ids, mask = right_padded([sequences[i].ids for i in batch], target.device)
        output = target.model.base_model(
            input_ids=ids, attention_mask=mask, output_hidden_states=bool(layers)
        )
        hidden = output.last_hidden_state
        if layers:
            hidden = torch.stack([*(output.hidden_states[i] for i in layers), hidden], dim=2)
        for row, i in enumerate(batch):
            s = sequences[i]
            first = 0 if whole else s.start - 1
            out[i] = hidden[row, first : s.ids.shape[0]].to(torch.bfloat16).cpu()
        progress.advance(task, len(batch))
    return out


def labelled(sequences: list[Sequence], features: list[torch.Tensor], heads: int, vocab: torch.Tensor):
    """(features [P, H], labels [P, K]): head k's label at feature t is token t + k + 1 as a draft
    vocabulary index (IGNORE past the sequence's end or outside the draft vocabulary)."""
    index = torch.full((int(vocab.max()) + 1,), IGNORE, dtype=torch.long)
    index[vocab] = torch.arange(vocab.shape[0])
    rows, labels = [], []
    for s, f in zip(sequences, features, strict=True):
        length = s.ids.shape[0]
        positions = torch.arange(s.start - 1, length)  # f[j] is the state at position start - 1 + j
        label = torch.full((positions.shape[0], heads), IGNORE, dtype=torch.long)
        for k in range(1, heads + 1):
            wanted = positions + k + 1
            inside = wanted < length
            tokens = s.ids[wanted[inside]]
            known = tokens <= index.shape[0] - 1
            column = torch.full((int(inside.sum()),), IGNORE, dtype=torch.long)
            column[known] = index[tokens[known]]
            label[inside, k - 1] = column
        rows.append(f)
        labels.append(label)
    return torch.cat(rows), torch.cat(labels)


def accuracy(
    heads: medusa.MedusaHeads, weight: torch.Tensor, features, labels, batch: int = 4096
) -> list[float]:
    """Each head's top-1 accuracy over the positions where it has a label."""
    hits = torch.zeros(labels.shape[1])
    counts = torch.zeros(labels.shape[1])
    with torch.no_grad():
        for first in range(0, features.shape[0], batch):
            f = features[first : first + batch].float()
            y = labels[first : first + batch]
            predicted = (heads(f) @ weight.T).argmax(-1).T  # [B, K]
            valid = y != IGNORE
            hits += ((predicted == y) & valid).sum(0).float()
            counts += valid.sum(0).float()
    return (hits / counts.clamp_min(1)).tolist()


def up_to_max_sequence(train: list[Sequence], held_out: list[Sequence], config):
    """The training and held-out sequences of at most ``config.max_sequence`` tokens (default
    ``MAX_SEQUENCE``), and that limit: what every head trainer learns from."""
    longest = config.max_sequence or MAX_SEQUENCE
    return (
        [s for s in train if s.ids.shape[0] <= longest],
        [s for s in held_out if s.ids.shape[0] <= longest],
        longest,
    )


def train_heads(target, train: list[Sequence], held_out: list[Sequence], config, vocab, progress):
    """Train ``config``'s heads (``StudentConfig``: epochs, lr, batch_tokens, seed; the head count
    is ``MEDUSA_HEADS``); returns (heads, record with the loss curve and held-out accuracies).
    Sequences longer than ``config.max_sequence`` (default ``MAX_SEQUENCE``) tokens are left out (the
    few-shot MMLU prompts, whose target pass costs most for few answer positions), and at most
    ``MAX_SEQUENCES`` of the rest are used (a seeded choice): the target's pass over them is most of
    the CPU time."""
    torch.manual_seed(config.seed)
    train, held_out, longest = up_to_max_sequence(train, held_out, config)
    chosen = torch.randperm(len(train), generator=torch.Generator().manual_seed(config.seed))
    train = [train[i] for i in sorted(chosen[:MAX_SEQUENCES].tolist())]
    hidden_size = target.model.config.get_text_config().hidden_size
    heads = medusa.MedusaHeads(hidden_size, MEDUSA_HEADS)
    weight = target.model.get_output_embeddings().weight.detach().float()[vocab]  # [Vr, H], frozen
    f_train, y_train = labelled(train, target_features(target, train, progress), MEDUSA_HEADS, vocab)
    f_held, y_held = labelled(held_out, target_features(target, held_out, progress), MEDUSA_HEADS, vocab)
    before = accuracy(heads, weight, f_held, y_held)
    steps = math.ceil(config.epochs * f_train.shape[0] / config.batch_tokens)
    optimizer = torch.optim.AdamW(heads.parameters(), lr=config.lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: 0.5 * (1 + math.cos(math.pi * s / steps))
    )
    generator = torch.Generator().manual_seed(config.seed)
    order = torch.cat(
        [torch.randperm(f_train.shape[0], generator=generator) for _ in range(math.ceil(config.epochs))]
    )
    curve, started = [], time.perf_counter()
    task = progress.add_task("medusa heads", total=steps, stats="")
    loss_fn = nn.CrossEntropyLoss(ignore_index=IGNORE)
    for step in range(steps):
        batch = order[step * config.batch_tokens : (step + 1) * config.batch_tokens]
        f, y = f_train[batch].float(), y_train[batch]
        logits = heads(f) @ weight.T  # [K, B, Vr]
        loss = sum(loss_fn(logits[k], y[:, k]) for k in range(MEDUSA_HEADS)) / MEDUSA_HEADS
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
        if step % 20 == 0 or step == steps - 1:
            curve.append(
                {
                    "step": step,
                    "loss": round(loss.item(), 4),
                    "seconds": round(time.perf_counter() - started, 1),
                }
            )
            progress.update(task, stats=f"loss {loss.item():.3f}")
        progress.advance(task)
    after = accuracy(heads, weight, f_held, y_held)
    record = {
        "sequences": len(train),
        "max_sequence": longest,
        "positions": int(f_train.shape[0]),
        "steps": steps,
        "curve": curve,
        "held_out_accuracy_before": before,
        "held_out_accuracy_after": after,
        "held_out_before": {"top1_agreement": before[0]},
        "held_out_after": {"top1_agreement": after[0]},
        "seconds": round(time.perf_counter() - started, 1),
    }
    return heads, record


MEDUSA_HEADS = 4
MAX_SEQUENCE = 512
MAX_SEQUENCES = 1200
