"""Training an EAGLE head (Li et al., ICML 2024) on the frozen target's features.

The data is the distillation teacher data (:func:`specbench.training.teacher.teacher_data`): the
target's own greedy answers to training prompts and GSM8K train reference answers, never evaluation
prompts. One no-grad pass of the target gives its final feature f_t at every position (cached on disk,
the pass is most of the CPU time). At position t the head reads (x_{t+1}, f_t + noise) and learns
f_{t+1}: EAGLE's loss, a smooth-L1 regression on the feature plus w_cls x the cross-entropy of the
next-token distribution it gives through the frozen LM head against the target's own (soft labels,
over the draft vocabulary), on the answer positions (w_cls: :data:`CLASSIFICATION_WEIGHT`). Uniform
feature noise U(-0.1, 0.1) as in EAGLE; and, as in EAGLE-3's "training-time test" (Li et al., "EAGLE-3:
Scaling up Inference Acceleration of Large Language Models via Training-Time Test", 2025), a second
unrolled step in which every
position reads the head's own (detached) prediction instead of the target's feature, as the tree's
deeper levels do. Deterministic (seeded order and noise).

``--size eagle3`` trains EAGLE-3's multi-layer feature fusion
(:func:`specbench.drafters.eagle.fusion_layers`): the first step reads the target's low, middle and
high states fused by the head's ``fuse`` projection and RMS-normalised (``fusion_norm``, EAGLE-3's
``hidden_norm``; the noise is added to the raw states), and, as in EAGLE-3, the loss is the token loss
alone (no feature regression: what the head predicts need not be
the target's final state).
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import torch
from torch import nn

from specbench.drafters.eagle import EagleHead, causal_mask, fusion_layers
from specbench.training.medusa import target_features, up_to_max_sequence
from specbench.training.teacher import Sequence

NOISE = 0.1  # EAGLE's uniform feature noise, U(-NOISE, NOISE)
# EAGLE's w_cls is 0.1; 1.0 here: with our ~0.4M training positions the token loss is what acceptance
# needs (EAGLE-3 drops the feature loss altogether), and after one epoch it gave 41.9% held-out top-1
# agreement against 39.6% at 0.1 (SmolLM2-135M, 2-core AMD EPYC)
CLASSIFICATION_WEIGHT = 1.0
# teacher-forced step, then one step on the head's own features (EAGLE-3's training-time test); a
# StudentConfig's ``unroll`` asks for more
UNROLL = 2
# how a fused head is trained, part of its training digest (models.cache.trained_identity), so a run
# measured with a head trained otherwise is found stale: 2, the fused feature RMS-normalised. EAGLE-1
# heads are at revision 1, left unrecorded so their digests are those their runs carry.
FUSED_TRAINER_REVISION = 2


def cached_features(
    target, sequences: list[Sequence], path: Path, progress, layers: tuple[int, ...] = ()
) -> list[torch.Tensor]:
    """:func:`target_features` at every position (of ``layers`` too), kept at ``path`` for the next
    training run."""
    if path.is_file():
        return torch.load(path, weights_only=True)
    features = target_features(target, sequences, progress, whole=True, layers=layers)
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_suffix(".tmp")
    torch.save(features, staging)
    staging.rename(path)
    return features


def batches(sequences: list[Sequence], batch_tokens: int, generator: torch.Generator) -> list[list[int]]:
    """Groups of similar length, each at most ``batch_tokens`` padded positions, in seeded order."""
    order = sorted(range(len(sequences)), key=lambda i: sequences[i].ids.shape[0])
    groups, group = [], []
    for i in order:
        width = max([sequences[j].ids.shape[0] for j in group] + [sequences[i].ids.shape[0]])
        if group and width * (len(group) + 1) > batch_tokens:
            groups.append(group)
            group = []
        group.append(i)
    if group:
        groups.append(group)
    return [groups[i] for i in torch.randperm(len(groups), generator=generator).tolist()]


def warmup_cosine(parameters, lr: float, steps: int):
    """(AdamW, its schedule) for a head trained ``steps`` steps: a linear warm-up over the first 5% of
    the steps, then a cosine decay to zero."""
    warmup = max(1, steps // 20)
    optimizer = torch.optim.AdamW(parameters, lr=lr, weight_decay=0.0, betas=(0.9, 0.95))
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps)),
    )
    return optimizer, schedule


def _stack(sequences, features, group):
    """(ids [B, L], features [B, L, H] or, with fused layers, [B, L, layers + 1, H], supervised
    [B, L - 1]): position t of the head predicts f_{t+1}, supervised where t + 1 is an answer's
    feature (``start - 1`` on) inside the sequence."""
    width = max(sequences[i].ids.shape[0] for i in group)
    ids = torch.zeros(len(group), width, dtype=torch.long)
    f = torch.zeros(len(group), width, *features[group[0]].shape[1:])
    supervised = torch.zeros(len(group), width - 1, dtype=torch.bool)
    for row, i in enumerate(group):
        n = sequences[i].ids.shape[0]
        ids[row, :n] = sequences[i].ids
        f[row, :n] = features[i].float()
        supervised[row, max(sequences[i].start - 2, 0) : n - 1] = True
    return ids, f, supervised


def _padded_causal(lengths: list[int], width: int) -> torch.Tensor:
    mask = causal_mask(0, width, "cpu").expand(len(lengths), 1, width, width).clone()
    for row, n in enumerate(lengths):
        mask[row, :, :, n:] = False
        mask[row, :, n:, :] = torch.eye(width, dtype=torch.bool)[n:]  # padding sees itself only
    return mask


def _split(f: torch.Tensor, head: EagleHead) -> tuple[torch.Tensor, torch.Tensor]:
    """(the states the head reads, concatenated [B, L, len(reads) * H]; the final state [B, L, H])."""
    if head.fuse is None:
        return f, f
    return f[:, :, :-1].flatten(2), f[:, :, -1]


def unrolled(head: EagleHead, embed, ids, reads, mask, noise: torch.Generator | None, steps: int = UNROLL):
    """The head's predictions for each of ``steps`` unrolled steps: [B, L - 1, H] each (``reads``:
    the target's states the head reads, :func:`_split`'s first)."""
    inputs = embed[ids[:, 1:]]
    positions = torch.arange(ids.shape[1] - 1).expand(ids.shape[0], -1)
    states = reads[:, :-1]
    if noise is not None:
        states = states + (torch.rand(states.shape, generator=noise) * 2 - 1) * NOISE
    features = head.read(states)
    anchor = head.read(reads[:, :1])  # position 0's feature (noiseless), which no step predicts
    out = []
    for _ in range(steps):
        predicted = head(inputs, features, positions, mask)
        out.append(predicted)
        # the next step reads at t the head's prediction of f_t (made at t - 1)
        features = torch.cat([anchor, predicted[:, :-1].detach()], dim=1)
    return out


def _loss(predicted, target_f, weight, supervised, regression: bool = True):
    pred, true = predicted[supervised], target_f[supervised]
    with torch.no_grad():
        p = torch.softmax(true @ weight.T, dim=-1)
    classification = -(p * torch.log_softmax(pred @ weight.T, dim=-1)).sum(-1).mean()
    if not regression:
        return classification
    return nn.functional.smooth_l1_loss(pred, true) + CLASSIFICATION_WEIGHT * classification


@torch.no_grad()
def accuracy(
    head, embed, full_weight, vocab, sequences, features, batch_tokens: int, steps: int = UNROLL
) -> list[float]:
    """Per unrolled step, how often the head's next token (argmax over the draft vocabulary) is the
    target's greedy token (argmax over the whole vocabulary) at the answer positions."""
    hits, count = [0.0] * steps, 0
    weight = full_weight[vocab]
    for group in batches(sequences, batch_tokens, torch.Generator().manual_seed(0)):
        ids, f, supervised = _stack(sequences, features, group)
        reads, f = _split(f, head)
        lengths = [sequences[i].ids.shape[0] - 1 for i in group]
        mask = _padded_causal(lengths, ids.shape[1] - 1)
        predictions = unrolled(head, embed, ids, reads, mask, None, steps)
        greedy = (f[:, 1:][supervised] @ full_weight.T).argmax(-1)
        for step, predicted in enumerate(predictions):
            # every step predicts f_{t+1}; the second reads at t the head's own prediction of f_t
            guess = vocab[(predicted[supervised] @ weight.T).argmax(-1)]
            hits[step] += float((guess == greedy).sum())
        count += int(supervised.sum())
    return [h / max(count, 1) for h in hits]


def train_head(target, train, held_out, config, vocab, progress, features_at: Path):
    """Train an EAGLE head on ``target`` (``config``: size, epochs, lr, batch_tokens, seed, unroll: None
    for :data:`UNROLL`, max_sequence: None for 512; size eagle3 fuses the target's layers); returns
    (head, record with the loss curve and the held-out accuracy of each unrolled step). The target's
    features are kept at ``features_at``[-layers<i.j.k>]-{train,held}-<count>.pt."""
    torch.manual_seed(config.seed)
    depth = config.unroll or UNROLL
    layers = target.model.config.get_text_config().num_hidden_layers
    fused = fusion_layers(layers) if config.size == "eagle3" else ()
    if fused:
        features_at = f"{features_at}-layers{'.'.join(map(str, fused))}"
    train, held_out, longest = up_to_max_sequence(train, held_out, config)
    f_train = cached_features(target, train, Path(f"{features_at}-train-{len(train)}.pt"), progress, fused)
    f_held = cached_features(
        target, held_out, Path(f"{features_at}-held-{len(held_out)}.pt"), progress, fused
    )
    head = EagleHead.for_target(target.model, fused, fusion_norm=bool(fused)).float()
    embed = target.model.get_input_embeddings().weight.detach().float()
    full_weight = target.model.get_output_embeddings().weight.detach().float()
    weight = full_weight[vocab]
    before = accuracy(head, embed, full_weight, vocab, held_out, f_held, config.batch_tokens, depth)
    generator = torch.Generator().manual_seed(config.seed)
    noise = torch.Generator().manual_seed(config.seed + 1)
    plan = [
        group
        for _ in range(math.ceil(config.epochs))
        for group in batches(train, config.batch_tokens, generator)
    ]
    plan = plan[: math.ceil(config.epochs * len(plan) / math.ceil(config.epochs))]
    optimizer, schedule = warmup_cosine(head.parameters(), config.lr, len(plan))
    curve, started = [], time.perf_counter()
    task = progress.add_task("eagle head", total=len(plan), stats="")
    for step, group in enumerate(plan):
        ids, f, supervised = _stack(train, f_train, group)
        reads, f = _split(f, head)
        lengths = [train[i].ids.shape[0] - 1 for i in group]
        mask = _padded_causal(lengths, ids.shape[1] - 1)
        predictions = unrolled(head, embed, ids, reads, mask, noise, depth)
        losses = [_loss(p, f[:, 1:], weight, supervised, regression=not fused) for p in predictions]
        loss = sum(losses) / len(predictions)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(head.parameters(), 0.5)
        optimizer.step()
        schedule.step()
        if step % 10 == 0 or step == len(plan) - 1:
            seconds = round(time.perf_counter() - started, 1)
            curve.append({"step": step, "loss": round(loss.item(), 4), "seconds": seconds})
            progress.update(task, stats=f"loss {loss.item():.3f}")
        progress.advance(task)
    after = accuracy(head, embed, full_weight, vocab, held_out, f_held, config.batch_tokens, depth)
    record = {
        "sequences": len(train),
        "max_sequence": longest,
        "positions": int(sum(s.ids.shape[0] for s in train)),
        "steps": len(plan),
        "unroll": depth,
        **(
            {
                "fused_layers": list(fused),
                "fusion_norm": True,
                "feature_regression": False,
                "trainer_revision": FUSED_TRAINER_REVISION,
            }
            if fused
            else {}
        ),
        "noise": NOISE,
        "classification_weight": CLASSIFICATION_WEIGHT,
        "curve": curve,
        "held_out_accuracy_before": before,
        "held_out_accuracy_after": after,
        "held_out_before": {"top1_agreement": before[0]},
        "held_out_after": {"top1_agreement": after[0]},
        "seconds": round(time.perf_counter() - started, 1),
    }
    return head, record
