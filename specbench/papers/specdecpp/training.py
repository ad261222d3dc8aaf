"""``specbench specdecpp train``: the acceptance prediction head of SpecDec++ (Huang et al. 2024, Sec. 3.3).

Its data, the target's responses and the draft's labelled, mixed sequences (steps 1-2 of Sec. 3.3), is
built and cached by :mod:`specbench.papers.specdecpp.head_data`; here:

3. **Head and loss.** :class:`~specbench.drafters.acceptance_head.AcceptanceHead` (D residual SiLU blocks
   and a linear read-out, sigmoid) trained with the weighted BCE of Sec. 3.3 on soft labels y,
   ``-(w_acc y log p̂ + w_rej (1 - y) log(1 - p̂))``, normalised by ``w_acc Σy + w_rej Σ(1-y)`` as in the
   release; Adam, linear warm-up then cosine decay, batches of 32 sequences (Appendix C.1).
4. **Evaluation** on held-out prompts: the unweighted binary KL of Table 3,
   ``y log(y/p̂) + (1-y) log((1-y)/(1-p̂))`` averaged over draft tokens, and the expected accuracy of
   thresholding p̂ at 1/2 against the Bernoulli(y) acceptance event.

Everything is seeded (prompt split, draft samples, mixing masks, initialisation, batch order). A head
is saved as ``head.safetensors`` next to a ``specdecpp.json`` manifest in
``<cache>/specdecpp/<target>/<drafter>/<name>`` and is named in a recipe as
``specdecpp:<target>/<drafter>[/<name>]`` (the slugs :func:`~specbench.drafters.acceptance_head.slug`
makes) or by its folder's path.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict
from pathlib import Path

import torch

from specbench.drafters.acceptance_head import (
    AcceptanceHead,
    head_dir,
    reference,
    save_head,
)
from specbench.papers.specdecpp.head_data import alpaca_partitions, features_and_labels
from specbench.papers.specdecpp.train_config import TrainConfig

# -- training ----------------------------------------------------------------------------------


def weighted_bce(logits: torch.Tensor, y: torch.Tensor, w_acc: float, w_rej: float) -> torch.Tensor:
    """Sec. 3.3's weighted BCE on soft labels, normalised by the total label weight (the release's)."""
    log_p = torch.nn.functional.logsigmoid(logits)
    log_not_p = torch.nn.functional.logsigmoid(-logits)
    total = -(w_acc * y * log_p + w_rej * (1 - y) * log_not_p).sum()
    return total / (w_acc * y.sum() + w_rej * (1 - y).sum()).clamp(min=1e-12)


def binary_kl(y: torch.Tensor, p_hat: torch.Tensor) -> torch.Tensor:
    """Table 3's unweighted binary KL(Bern(y) || Bern(p̂)) per token, with 0 log 0 = 0."""
    p_hat = p_hat.double().clamp(1e-12, 1 - 1e-12)
    y = y.double()
    first = torch.where(y > 0, y * (y.clamp(min=1e-300).log() - p_hat.log()), 0.0)
    second = torch.where(y < 1, (1 - y) * ((1 - y).clamp(min=1e-300).log() - (1 - p_hat).log()), 0.0)
    return first + second


@torch.no_grad()
def evaluate(head: AcceptanceHead, features: list[torch.Tensor], labels: list[torch.Tensor]) -> dict:
    if not features:
        return {}
    x, y = torch.cat(features), torch.cat(labels).double()
    p_hat = head.probability(x).double()
    correct = torch.where(p_hat > 0.5, y, 1 - y)
    return {
        "binary_kl": round(float(binary_kl(y, p_hat).mean()), 4),
        "accuracy": round(float(correct.mean()), 4),
        "mean_label": round(float(y.mean()), 4),
        "mean_prediction": round(float(p_hat.mean()), 4),
        "draft_tokens": int(y.shape[0]),
    }


def train_head(
    features: list[torch.Tensor], labels: list[torch.Tensor], config: TrainConfig, progress
) -> tuple[AcceptanceHead, dict]:
    """Adam with linear warm-up and cosine decay over batches of ``batch_size`` sequences."""
    torch.manual_seed(config.seed)
    head = AcceptanceHead(features[0].shape[-1], config.depth)
    generator = torch.Generator().manual_seed(config.seed)
    per_epoch = math.ceil(len(features) / config.batch_size)
    total = max(1, round(config.epochs * per_epoch))
    steps: list[list[int]] = []
    while len(steps) < total:
        order = torch.randperm(len(features), generator=generator).tolist()
        steps += [order[i : i + config.batch_size] for i in range(0, len(order), config.batch_size)]
    steps = steps[:total]
    optimizer = torch.optim.Adam(head.parameters(), lr=config.lr)
    warmup = max(1, math.ceil(config.warmup_ratio * total))

    def schedule(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    task = progress.add_task("training the head", total=total, stats="")
    loss_avg = None
    for batch in steps:
        x = torch.cat([features[i] for i in batch])
        y = torch.cat([labels[i] for i in batch]).float()
        if x.shape[0] == 0:
            progress.advance(task)
            continue
        loss = weighted_bce(head(x), y, config.w_acc, config.w_rej)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        scheduler.step()
        loss_avg = loss.item() if loss_avg is None else 0.9 * loss_avg + 0.1 * loss.item()
        progress.update(task, advance=1, stats=f"weighted BCE {loss_avg:.4f}")
    head.eval()
    return head, {"steps": total, "train_sequences": len(features)}


# -- the command -------------------------------------------------------------------------------


def split(n: int, eval_fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """(train, eval) example indices, seeded."""
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed + 1)).tolist()
    n_eval = min(n - 1, max(1, round(eval_fraction * n))) if eval_fraction > 0 else 0
    return sorted(order[n_eval:]), sorted(order[:n_eval])


def train(config: TrainConfig, progress) -> Path:
    """Build (or read) the features and labels, train the head, evaluate it, save it; returns its folder."""
    started = time.perf_counter()
    data, fingerprint = features_and_labels(config, progress)
    data_seconds = time.perf_counter() - started
    features, labels = data["features"], data["labels"]
    if config.prompt_set == "alpaca":  # the paper's split: train on train, evaluate on dev
        count = len(alpaca_partitions(config)[0])
        train_ids, eval_ids = list(range(count)), list(range(count, len(features)))
    else:
        train_ids, eval_ids = split(len(features), config.eval_fraction, config.seed)
    train_x, train_y = [features[i] for i in train_ids], [labels[i] for i in train_ids]
    eval_x, eval_y = [features[i] for i in eval_ids], [labels[i] for i in eval_ids]
    head, record = train_head(train_x, train_y, config, progress)
    mean_train = torch.cat(train_y).double().mean()
    constant = AcceptanceHead(head.hidden_size, 0)
    with torch.no_grad():  # all labels 1 (a drafter equal to its target) must not divide by zero
        constant.out.weight.zero_()
        constant.out.bias.fill_(float(torch.logit(mean_train, eps=1e-6)))
    manifest = {
        "target": config.target,
        "drafter": config.drafter,
        "reference": reference(config.target, config.drafter, config.name),
        "hidden_size": head.hidden_size,
        "depth": head.depth,
        "parameters": sum(p.numel() for p in head.parameters()),
        "config": asdict(config),
        "data": {
            "sources": (
                "Alpaca specdecpp-train prompts (eval: specdecpp-dev)"
                if config.prompt_set == "alpaca"
                else "distill's prompts (MMLU dev, Alpaca seed, GSM8K train)"
            )
            + (
                f", the target's sampled responses (T {config.temperature}, top-p {config.top_p}, "
                f"top-k {config.top_k})"
                if config.temperature > 0
                else ", the target's greedy responses"
            ),
            "fingerprint": fingerprint,
            "train_sequences": len(train_ids),
            "eval_sequences": len(eval_ids),
        },
        **record,
        "train": evaluate(head, train_x, train_y),
        "eval": evaluate(head, eval_x, eval_y),
        "eval_constant_predictor": evaluate(constant, eval_x, eval_y),
        "seconds": {"data": round(data_seconds, 1), "total": round(time.perf_counter() - started, 1)},
    }
    return save_head(head, manifest, head_dir(config.target, config.drafter, config.name))
