"""Training EAGLE-3's own layer (:class:`~specbench.drafters.eagle3.Eagle3Head`) with EAGLE-3's
training-time test (Li, Wei, Zhang and Zhang, "EAGLE-3: Scaling up Inference Acceleration of Large
Language Models via Training-Time Test", 2025, section 3): ``specbench distill --size eagle3-layer``.

The data is the distillation teacher data, as for the other heads; one no-grad pass of the target gives
its states at the head's aux layers (the inputs of decoder layers 2, L // 2 and L - 3,
:func:`~specbench.drafters.eagle.fusion_layers`) and its final state at every position, cached on disk.

**The unrolled head.** Row t of step 1 reads ``fc`` of the aux states at t with the token x_{t+1} at
position t and predicts the target's distribution after x_{t+1}. Row t of step j + 1 reads the head's own
step-j output at row t (its pre-norm state, as a tree's deeper level does; the gradient flows through
it) with the token x_{t+1+j} at position t + j, and predicts the target's distribution after that token:
the (j + 1)-th token the head would draft from the prefix that ends at t. Its query attends to the keys
of step 1 at rows 0..t (the prefix the target's states describe) and to its own row's keys of steps
2..j + 1 (the positions it drafted), never to step 1's row t + 1, the target's own state at the position
it stands for: :func:`ttt_mask`. That is what drafting does at inference
(:class:`~specbench.drafters.eagle.EagleDrafter`: committed pairs, then each drafted node attending to
them and its ancestors), and with one step it is plain teacher-forced training on the target's states.

**The loss** of each step is the cross-entropy to the target's next-token distribution restricted to the
draft vocabulary and renormalised, at the answer positions whose target argmax the draft vocabulary
holds; the steps weigh 0.8^j (the EAGLE-3 reference trainer's weights). The draft vocabulary is the N
tokens most frequent in the training text and the target's argmax (``d2t``/``t2d``); ``norm`` and
``lm_head`` start as the target's final norm and LM head rows; the embedding is the target's, frozen.

The head is saved in the speculators layout (:mod:`specbench.drafters.head_layouts`), which vLLM loads
by its config, with ``distill.json`` beside it, in ``<cache>/drafters/<target>/eagle3-layer``; recipes
load it as ``eagle3:<target>/eagle3-layer`` and ``specbench export`` writes it in the EAGLE layout.
"""

from __future__ import annotations

import copy
import json
import math
import shutil
import time
from pathlib import Path

import torch
from torch import nn

from specbench.drafters.eagle import fusion_layers
from specbench.drafters.eagle3 import LAYER_FAMILIES, Eagle3Head
from specbench.training import Trainer
from specbench.training.distill import StudentConfig, write_training_curve
from specbench.training.eagle import batches, cached_features, warmup_cosine
from specbench.training.medusa import up_to_max_sequence
from specbench.training.teacher import Sequence, _slug, draft_vocabulary

TTT_STEPS = 7  # the EAGLE-3 reference trainer's unrolled steps; --unroll asks for others
STEP_WEIGHT = 0.8  # step j's loss weighs STEP_WEIGHT ** j, as in the reference trainer
# fields of the target's config that do not describe the head's one layer
NOT_LAYER = (
    "architectures",
    "_name_or_path",
    "auto_map",
    "transformers_version",
    "torch_dtype",
    "dtype",
    "_attn_implementation",
    "id2label",
    "label2id",
    "layer_types",
)


def ttt_mask(width: int, step: int, device=None) -> torch.Tensor:
    """Bool ``[width, (step + 1) * width]`` (True: attend): the queries of unrolled step ``step``
    (0: the target's states) over the keys of steps 0..step laid side by side. Block 0 is causal (the
    prefix of target states up to the query's row); every later block only its own row (the query's
    earlier drafted positions, and itself)."""
    blocks = [torch.ones(width, width, dtype=torch.bool, device=device).tril()]
    blocks += [torch.eye(width, dtype=torch.bool, device=device)] * step
    return torch.cat(blocks, dim=1)


class StepKeys:
    """The attention's keys and values of the unrolled steps so far, each step's appended to the
    previous ones' (the cache interface transformers' attention calls)."""

    def __init__(self):
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None

    def update(self, keys, values, layer_idx, *args, **kwargs):
        self.keys = keys if self.keys is None else torch.cat([self.keys, keys], dim=-2)
        self.values = values if self.values is None else torch.cat([self.values, values], dim=-2)
        return self.keys, self.values


def unroll(head: Eagle3Head, embed: torch.Tensor, ids: torch.Tensor, reads: torch.Tensor, steps: int):
    """The head's pre-norm outputs ``[B, W, H]`` for each of ``steps`` unrolled steps. ``reads``: the
    aux states concatenated ``[B, W, n * H_target]``; ``ids``: ``[B, >= W + steps]`` tokens (row t of
    step j reads ``ids[t + 1 + j]``); ``embed``: the embedding matrix."""
    batch, width = reads.shape[:2]
    keys = StepKeys()
    features = head.read(reads)
    rows = torch.arange(width, device=reads.device)
    outs = []
    for step in range(steps):
        tokens = ids[:, 1 + step : 1 + step + width]
        mask = ttt_mask(width, step, reads.device)[None, None]
        out = head(embed[tokens], features, (rows + step).expand(batch, -1), mask, keys)
        outs.append(out)
        features = out  # not detached: the reference trainer differentiates through the unroll
    return outs


def greedy_labels(sequence: Sequence, finals: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``[L]``: at each answer position p (``start - 1 .. L - 2``) the target's argmax after it (from
    its final states ``finals`` and LM head ``weight``), -1 elsewhere."""
    n = sequence.ids.shape[0]
    labels = torch.full((n,), -1, dtype=torch.long)
    first = max(sequence.start - 1, 0)
    for lo in range(first, n - 1, 256):
        hi = min(lo + 256, n - 1)
        labels[lo:hi] = (finals[lo:hi].to(weight.dtype) @ weight.T).argmax(-1).cpu()
    return labels


def stack(sequences, features, labels, group, steps: int, dtype):
    """(ids ``[B, W + steps + 1]``, aux reads ``[B, W, n * H]``, final states ``[B, W + steps + 1, H]``,
    labels ``[B, W + steps + 1]``), right-padded (labels -1)."""
    width = max(sequences[i].ids.shape[0] for i in group)
    padded = width + steps + 1
    first = features[group[0]]
    ids = torch.zeros(len(group), padded, dtype=torch.long)
    reads = torch.zeros(len(group), width, (first.shape[1] - 1) * first.shape[2], dtype=dtype)
    finals = torch.zeros(len(group), padded, first.shape[2], dtype=dtype)
    wanted = torch.full((len(group), padded), -1, dtype=torch.long)
    for row, i in enumerate(group):
        n = sequences[i].ids.shape[0]
        states = features[i].to(dtype)
        ids[row, :n] = sequences[i].ids
        reads[row, :n] = states[:, :-1].flatten(1)
        finals[row, :n] = states[:, -1]
        wanted[row, :n] = labels[i]
    return ids, reads, finals, wanted


def batch_loss(head, embed, weight, batch, steps: int):
    """(weighted loss, each step's loss, each step's hits and answer positions): ``weight``: the
    target's LM head rows of the draft vocabulary; ``batch``: :func:`stack`'s."""
    ids, reads, finals, labels = batch
    width = reads.shape[1]
    outs = unroll(head, embed, ids, reads, steps)
    losses, hits, counts = [], [], []
    for step, out in enumerate(outs):
        wanted = labels[:, 1 + step : 1 + step + width]  # row t predicts after position t + 1 + step
        answer = wanted >= 0
        kept = answer & head.t2d[wanted.clamp(min=0)]  # the target's argmax is a draft token
        with torch.no_grad():
            guess = head.ids[head.subset(out[answer]).argmax(-1)]
        hits.append(float((guess == wanted[answer]).sum()))
        counts.append(int(answer.sum()))
        if not kept.any():
            losses.append(out.sum() * 0.0)
            continue
        with torch.no_grad():
            p = torch.softmax(finals[:, 1 + step : 1 + step + width][kept] @ weight.T, dim=-1)
        logq = torch.log_softmax(head.subset(out[kept]), dim=-1)
        losses.append(-(p * logq).sum(-1).mean())
    total = sum(STEP_WEIGHT**step * loss for step, loss in enumerate(losses))
    return total, losses, hits, counts


@torch.no_grad()
def accuracy(head, embed, weight, sequences, features, labels, steps, batch_tokens, dtype) -> list[float]:
    """Per unrolled step, how often the head's argmax is the target's greedy token at the answer
    positions (the acceptance each drafted position can expect)."""
    hits, counts = [0.0] * steps, [0] * steps
    for group in batches(sequences, batch_tokens, torch.Generator().manual_seed(0)):
        batch = stack(sequences, features, labels, group, steps, dtype)
        _, _, step_hits, step_counts = batch_loss(head, embed, weight, batch, steps)
        hits = [h + s for h, s in zip(hits, step_hits, strict=True)]
        counts = [c + n for c, n in zip(counts, step_counts, strict=True)]
    return [round(h / max(c, 1), 4) for h, c in zip(hits, counts, strict=True)]


def layer_fields(target_model, vocab_size: int) -> dict:
    """The head's decoder layer config: the target's, one layer, its own LM head (Llama's layer for
    targets of a family :data:`~specbench.drafters.eagle3.LAYER_FAMILIES` lacks)."""
    config = target_model.config.get_text_config()
    fields = {k: v for k, v in config.to_dict().items() if k not in NOT_LAYER}
    family = config.model_type if config.model_type in LAYER_FAMILIES else "llama"
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    fields.update(
        model_type=family,
        num_hidden_layers=1,
        vocab_size=vocab_size,
        tie_word_embeddings=False,
        head_dim=head_dim,
    )
    return fields


def new_head(target, aux: tuple[int, ...], vocab: torch.Tensor, dtype) -> tuple[Eagle3Head, dict]:
    """(a fresh head reading ``aux`` over the draft vocabulary ``vocab``, its layer config fields)."""
    from specbench.models.facts import config_from_dict

    model = target.model
    text = model.config.get_text_config()
    fields = layer_fields(model, target.vocab_size)
    head = Eagle3Head(config_from_dict(fields), len(aux) * text.hidden_size, vocab.shape[0])
    head.aux_layers = tuple(aux)
    with torch.no_grad():
        head.d2t.copy_(vocab - torch.arange(vocab.shape[0]))
        head.t2d.zero_().index_fill_(0, vocab, True)
        head.lm_head.weight.copy_(model.get_output_embeddings().weight.detach()[vocab])
        final = getattr(getattr(model.base_model, "norm", None), "weight", None)
        if final is not None and final.shape == head.norm.weight.shape:
            head.norm.weight.copy_(final.detach())
    return head.to(dtype), fields


def train_layer(target, train, held_out, config: StudentConfig, vocab, progress, features_at):
    """Train EAGLE-3's layer on ``target`` with ``config.unroll`` (None: :data:`TTT_STEPS`) unrolled
    steps; returns (head, its layer config fields, record with the loss curve and each step's held-out
    accuracy). The target's states are kept at ``features_at``-layers<ids>-{train,held}-<count>.pt."""
    torch.manual_seed(config.seed)
    steps = config.unroll or TTT_STEPS
    aux = fusion_layers(target.model.config.get_text_config().num_hidden_layers)
    at = f"{features_at}-layers{'.'.join(map(str, aux))}"
    train, held_out, longest = up_to_max_sequence(train, held_out, config)
    f_train = cached_features(target, train, Path(f"{at}-train-{len(train)}.pt"), progress, aux)
    f_held = cached_features(target, held_out, Path(f"{at}-held-{len(held_out)}.pt"), progress, aux)
    dtype = torch.float64 if target.model.dtype == torch.float64 else torch.float32
    head, fields = new_head(target, aux, vocab, dtype)
    embed = target.model.get_input_embeddings().weight.detach().to(dtype)
    full = target.model.get_output_embeddings().weight.detach().to(dtype)
    weight = full[vocab]
    y_train = [greedy_labels(s, f[:, -1], full) for s, f in zip(train, f_train, strict=True)]
    y_held = [greedy_labels(s, f[:, -1], full) for s, f in zip(held_out, f_held, strict=True)]
    measure = (embed, weight, held_out, f_held, y_held, steps, config.batch_tokens, dtype)
    before = accuracy(head, *measure)
    generator = torch.Generator().manual_seed(config.seed)
    epochs = math.ceil(config.epochs)
    plan = [g for _ in range(epochs) for g in batches(train, config.batch_tokens, generator)]
    plan = plan[: max(1, math.ceil(config.epochs * len(plan) / epochs))]
    optimizer, schedule = warmup_cosine(head.parameters(), config.lr, len(plan))
    curve, started = [], time.perf_counter()
    task = progress.add_task("eagle3 layer (training-time test)", total=len(plan), stats="")
    head.train()
    for number, group in enumerate(plan):
        batch = stack(train, f_train, y_train, group, steps, dtype)
        loss, losses, _, _ = batch_loss(head, embed, weight, batch, steps)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(head.parameters(), 0.5)
        optimizer.step()
        schedule.step()
        if number % 10 == 0 or number == len(plan) - 1:
            curve.append(
                {
                    "step": number,
                    "loss": round(loss.item(), 4),
                    "step_losses": [round(x.item(), 4) for x in losses],
                    "seconds": round(time.perf_counter() - started, 1),
                }
            )
            progress.update(task, stats=f"loss {loss.item():.3f}")
        progress.advance(task)
    head.eval()
    after = accuracy(head, *measure)
    record = {
        "sequences": len(train),
        "max_sequence": longest,
        "positions": int(sum(s.ids.shape[0] for s in train)),
        "steps": len(plan),
        "unroll": steps,
        "step_weight": STEP_WEIGHT,
        "aux_layer_ids": list(aux),
        "layout": "speculators",
        "curve": curve,
        "held_out_accuracy_before": before,
        "held_out_accuracy_after": after,
        "held_out_before": {"top1_agreement": before[0]},
        "held_out_after": {"top1_agreement": after[0]},
        "seconds": round(time.perf_counter() - started, 1),
    }
    return head, fields, record


def save(folder: Path, head: Eagle3Head, fields: dict, verifier: str, manifest: dict) -> Path:
    """The head in the speculators layout (config.json, model.safetensors) with ``distill.json``,
    written beside ``folder`` and moved into place."""
    from specbench.drafters import head_layouts
    from specbench.models.facts import config_from_dict

    checkpoint = head_layouts.HeadCheckpoint(
        folder=folder,
        layout="speculators",
        layer_fields=fields,
        layer_config=config_from_dict(fields),
        draft_vocab_size=head.lm_head.weight.shape[0],
        target_hidden_size=head.fc.weight.shape[1] // len(head.aux_layers),
        aux_layer_ids=tuple(head.aux_layers),
        norm_before_residual=head.midlayer.norm_before_residual,
        tensors={},
        digest="",
    )
    staging = folder.with_name(folder.name + ".tmp")
    if staging.exists():
        shutil.rmtree(staging)
    head_layouts.write(checkpoint, copy.deepcopy(head).float(), staging, "speculators", verifier)
    (staging / "distill.json").write_text(json.dumps(manifest, indent=1) + "\n")
    title = f"{folder.name} on {verifier}"
    write_training_curve(staging / "training_curve.png", manifest, title)
    if folder.exists():
        shutil.rmtree(folder)
    staging.rename(folder)
    return folder


def _train(target, teacher, train, held_out, config: StudentConfig, progress) -> Path:
    from specbench.drafters.heads import target_facts
    from specbench.models import cache

    vocab = draft_vocabulary(train, config.draft_vocab or target.vocab_size, target)
    head, fields, record = train_layer(
        target, train, held_out, config, vocab, progress, teacher.features_at()
    )
    manifest = {
        "size": config.size,
        **target_facts(target),
        "parameters": sum(p.numel() for p in head.parameters()),
        "teacher": teacher.record() | {"origin": getattr(target, "origin", ""), "key": teacher.key()},
        "student": config.manifest(),
        **record,
    }
    folder = cache.distilled_dir(f"{_slug(teacher.target)}/{config.folder(teacher)}")
    return save(folder, head, fields, teacher.target, manifest)


TRAINERS = (
    Trainer(
        "eagle3-layer",
        "EAGLE-3's own layer (2H attention, its own norm and LM head over d2t/t2d) on the target's low, "
        f"middle and high states, trained with EAGLE-3's training-time test ({TTT_STEPS} unrolled "
        "steps, --unroll for others); saved in the speculators layout vLLM loads; recipes name it "
        "eagle3:<target>/eagle3-layer",
        StudentConfig("eagle3-layer", epochs=8.0, lr=1e-3, batch_tokens=1024, draft_vocab=8192),
        _train,
        heads=True,
        unrolls=True,
    ),
)
