"""``specbench distill``: small drafters for a target that has no small sibling (DistillSpec-style).

1. **Teacher data, cached.** Training prompts (GSM8K train, MMLU dev, Alpaca seed tasks — never an
   evaluation split) are rendered exactly as the benchmark renders them (task template + chat
   template). The target generates a greedy continuation for some of them, and its next-token
   distributions on those continuations come for free from ``generate(output_logits=True)``; the
   reference answers of the others are teacher-forced. Only the top-k log-probabilities of each
   supervised position are kept, on disk, keyed by a hash of everything that made them, so
   re-training never re-runs the teacher.
2. **Students.** ``base`` is the target cut to its first two layers (embedding, layers 0-1, final
   norm, tied head copied; all of it trains) and ``small`` a 2-layer, 160-wide model whose tied
   embedding starts as the target's embedding projected on its top principal directions; ``mini``
   (60 wide) and ``micro`` (20 wide) are the same at CS Drafting's cost ratios (~0.022 and ~0.007 of
   the target's parameters). An
   ``exit<N>`` student trains only an exit head on the target's first N layers (an early-exit
   self-draft that shares the target's weights). The model students score only a draft vocabulary
   (FR-Spec, see :mod:`specbench.drafters.draft_vocab`): the N tokens most frequent in the training data.
3. **Loss.** Forward KL from the teacher, exact on the teacher's top-k tokens plus the lumped tail:
   ``-sum_i p_i log q_i - (1 - sum_i p_i) log(1 - sum_i q_i)`` (up to the teacher's entropy).

Everything is seeded (initialisation, batch order); a drafter is saved with ``save_pretrained``
next to the target's tokenizer and a ``distill.json`` manifest, and loads as
``distilled:<target>/<size>``.
"""

from __future__ import annotations

import copy
import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from specbench import sources, training
from specbench.drafters import draft_vocab
from specbench.drafters.early_exit import EXIT_HEAD_FILE, ExitHead, early_exit_model
from specbench.errors import SpecbenchError
from specbench.models import cache
from specbench.training import Trainer, either, trainer_of
from specbench.training.teacher import (
    Sequence,
    TeacherConfig,
    _slug,
    draft_vocabulary,
    teacher_data,
)


@dataclass(frozen=True)
class StudentConfig:
    size: str  # a trainer's name (specbench.training.TRAINERS), or the numbered one's: "exit<N>"
    epochs: float
    lr: float
    batch_tokens: int = 2048
    seed: int = 0
    draft_vocab: int = 0  # 0: the head scores every token; N: only the N most frequent (FR-Spec)
    unroll: int | None = None  # EAGLE only: training-time test steps (None: training.eagle.UNROLL)
    # heads only: the longest training sequence, prompt and answer, in tokens (None: the trainer's
    # training.medusa.MAX_SEQUENCE, 512)
    max_sequence: int | None = None
    label: str | None = None  # the folder name the user chose (--name), in place of the derived one

    @property
    def name(self) -> str:
        """The drafter's name derived from its options (what ``folder`` extends)."""
        name = self.size if self.unroll is None else f"{self.size}-unroll{self.unroll}"
        return name if self.max_sequence is None else f"{name}-seq{self.max_sequence}"

    def folder(self, teacher: TeacherConfig) -> str:
        """The drafter's folder under <cache>/drafters/<target>/ (and its name in recipes)."""
        return self.label or self.name + teacher.suffix()

    def manifest(self) -> dict:
        """The configuration as recorded in distill.json; unset ``unroll``, ``max_sequence`` and
        ``label`` are left out, so the identity of heads trained before the options existed stays what
        their rows carry."""
        optional = ("unroll", "max_sequence", "label")
        return {k: v for k, v in asdict(self).items() if not (k in optional and v is None)}


def student_config(size: str, **overrides) -> StudentConfig:
    trainer = trainer_of(size)
    if trainer.full_vocabulary:
        overrides.pop("draft_vocab", None)
    for option, allowed, why in (
        ("unroll", "unrolls", "has no training-time test"),
        ("max_sequence", "heads", "trains on the teacher data's whole sequences"),
    ):
        if overrides.get(option) is not None and not getattr(trainer, allowed):
            flag = "--" + option.replace("_", "-")
            takers = [t.name for t in training.TRAINERS.values() if getattr(t, allowed)]
            raise SpecbenchError(
                flag, f"--size {size} {why}", f"pass {flag} with --size {either(takers)} only"
            )
    fields = asdict(trainer.defaults) | {"size": size}
    return StudentConfig(**(fields | {k: v for k, v in overrides.items() if v is not None}))


# width and attention heads of the students that are not the target cut short (2 layers each)
NARROW = {"small": (160, 5), "mini": (60, 2), "micro": (20, 2)}


def build_student(target: nn.Module, size: str, seed: int) -> nn.Module:
    """A fresh student for ``size``; an exit head's student freezes the target's own weights."""
    torch.manual_seed(seed)
    if size.startswith("exit"):
        draft = early_exit_model(target, int(size[4:]), ExitHead(target.config.hidden_size))
        for name, parameter in draft.named_parameters():
            parameter.requires_grad_(name.startswith("model.norm.exit_head"))
        return draft.to(target.dtype)
    config = copy.deepcopy(target.config)
    config.num_hidden_layers = min(2, config.num_hidden_layers)
    if getattr(config, "layer_types", None):
        config.layer_types = config.layer_types[: config.num_hidden_layers]
    config.tie_word_embeddings = True
    if size in NARROW:
        width, heads = NARROW[size]
        config.hidden_size, config.intermediate_size = width, 3 * width
        config.num_attention_heads = config.num_key_value_heads = heads
        config.head_dim = width // heads
    student = type(target)(config).to(target.dtype)
    source = target.get_input_embeddings().weight.detach()
    with torch.no_grad():
        if size == "base":
            student.model.embed_tokens.weight.copy_(source)
            for layer, source_layer in zip(student.model.layers, target.model.layers[:2], strict=True):
                layer.load_state_dict(source_layer.state_dict())
            student.model.norm.load_state_dict(target.model.norm.state_dict())
        else:  # the target's embedding on its top principal directions (same token geometry)
            width = min(config.hidden_size, source.shape[1])
            _, _, directions = torch.linalg.svd(source.float(), full_matrices=False)
            projected = source.float() @ directions[:width].T
            scale = student.model.embed_tokens.weight.std() / projected.std()
            student.model.embed_tokens.weight.zero_()
            student.model.embed_tokens.weight[:, :width] = (projected * scale).to(source.dtype)
    student.tie_weights()
    return student


def distill_loss(logits: torch.Tensor, top_ids: torch.Tensor, top_logp: torch.Tensor):
    """Forward KL cross-entropy, exact on the teacher's top-k and its lumped tail; and top-1 agreement.

    A top-k id of -1 is a token the student cannot emit (outside its draft vocabulary): its teacher
    mass joins the tail, which the student's tail then has to cover.
    """
    logq = torch.log_softmax(logits.float(), dim=-1)
    inside = top_ids >= 0
    logq_top = logq.gather(1, top_ids.long().clamp(min=0))
    p_top = top_logp.float().exp() * inside
    p_tail = (1.0 - p_top.sum(-1)).clamp(min=0.0)
    q_tail = (1.0 - (logq_top.exp() * inside).sum(-1)).clamp(min=1e-6)
    loss = -(p_top * logq_top).sum(-1) - p_tail * q_tail.log()
    agree = (logq.argmax(-1) == top_ids[:, 0].long()).float()
    return loss.mean(), agree.mean()


def _batches(sequences: list[Sequence], batch_tokens: int, generator: torch.Generator) -> list[list[int]]:
    order = torch.randperm(len(sequences), generator=generator).tolist()
    batches, current, tokens = [], [], 0
    for i in order:
        current.append(i)
        tokens += sequences[i].ids.shape[0]
        if tokens >= batch_tokens:
            batches.append(current)
            current, tokens = [], 0
    if current:
        batches.append(current)
    return batches


def _forward(
    student: nn.Module, sequences: list[Sequence], batch: list[int], device: torch.device, vocab=None
):
    """Distillation loss and agreement of one batch; ``vocab`` (token ids) restricts the head to them."""
    rows = [sequences[i] for i in batch]
    width = max(s.ids.shape[0] for s in rows)
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    supervised = torch.zeros((len(rows), width), dtype=torch.bool)
    for r, s in enumerate(rows):
        ids[r, : s.ids.shape[0]] = s.ids
        mask[r, : s.ids.shape[0]] = 1
        supervised[r, s.start - 1 : s.ids.shape[0] - 1] = True  # position t predicts token t + 1
    hidden = student.model(input_ids=ids.to(device), attention_mask=mask.to(device)).last_hidden_state
    hidden = hidden[supervised.to(device)]
    top_ids = torch.cat([s.top_ids for s in rows]).to(device)
    top_logp = torch.cat([s.top_logp for s in rows]).to(device)
    if vocab is None:
        return distill_loss(student.lm_head(hidden), top_ids, top_logp)
    rows_of = draft_vocab.positions(vocab, student.lm_head.weight.shape[0])
    logits = hidden @ student.lm_head.weight.index_select(0, vocab).T  # stays tied to the embedding
    return distill_loss(logits, rows_of[top_ids.long()], top_logp)


def train_student(
    student: nn.Module,
    train: list[Sequence],
    held_out: list[Sequence],
    config: StudentConfig,
    progress,
    vocab: torch.Tensor | None = None,
):
    """AdamW with linear warm-up (3%) and cosine decay; returns the manifest's training record."""
    device = next(student.parameters()).device
    params = [p for p in student.parameters() if p.requires_grad]
    generator = torch.Generator().manual_seed(config.seed)
    epochs = [_batches(train, config.batch_tokens, generator) for _ in range(math.ceil(config.epochs))]
    steps = [b for epoch in epochs for b in epoch][: max(1, round(config.epochs * len(epochs[0])))]
    optimizer = torch.optim.AdamW(params, lr=config.lr, betas=(0.9, 0.95), weight_decay=0.0)
    warmup = max(1, round(0.03 * len(steps)))

    def schedule(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, len(steps) - warmup)))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    before = evaluate(student, held_out, vocab=vocab)
    task = progress.add_task(f"training {config.size}", total=len(steps), stats="")
    started, loss_avg, agree_avg = time.perf_counter(), None, None
    student.train()
    for batch in steps:
        loss, agree = _forward(student, train, batch, device, vocab)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        scheduler.step()
        loss_avg = loss.item() if loss_avg is None else 0.95 * loss_avg + 0.05 * loss.item()
        agree_avg = agree.item() if agree_avg is None else 0.95 * agree_avg + 0.05 * agree.item()
        progress.update(task, advance=1, stats=f"loss {loss_avg:.3f} · top-1 agreement {agree_avg:.1%}")
    student.eval()
    after = evaluate(student, held_out, vocab=vocab)
    return {
        "steps": len(steps),
        "train_sequences": len(train),
        "train_tokens": sum(s.top_ids.shape[0] for s in train),
        "seconds": round(time.perf_counter() - started, 1),
        "held_out_before": before,
        "held_out_after": after,
    }


@torch.no_grad()
def evaluate(student: nn.Module, sequences: list[Sequence], batch_tokens: int = 4096, vocab=None) -> dict:
    """Held-out cross-entropy to the teacher and top-1 agreement with its argmax (greedy acceptance proxy)."""
    was_training = student.training
    student.eval()
    device = next(student.parameters()).device
    total = loss_sum = agree_sum = 0.0
    for batch in _batches(sequences, batch_tokens, torch.Generator().manual_seed(0)):
        n = sum(sequences[i].top_ids.shape[0] for i in batch)
        loss, agree = _forward(student, sequences, batch, device, vocab)
        total, loss_sum, agree_sum = total + n, loss_sum + loss.item() * n, agree_sum + agree.item() * n
    student.train(was_training)
    return {
        "cross_entropy": round(loss_sum / max(total, 1), 4),
        "top1_agreement": round(agree_sum / max(total, 1), 4),
    }


def save_student(student: nn.Module, target, name: str, record: dict, vocab=None) -> Path:
    """``save_pretrained`` (or the exit head alone) into ``<cache>/drafters/<target>/<name>``."""
    out = cache.distilled_dir(f"{_slug(record['teacher']['target'])}/{name}")
    staging = out.with_name(out.name + ".tmp")
    staging.mkdir(parents=True, exist_ok=True)
    if name.startswith("exit"):
        from safetensors.torch import save_file

        head = student.model.norm.exit_head
        save_file({k: v.contiguous() for k, v in head.state_dict().items()}, str(staging / EXIT_HEAD_FILE))
    else:
        student.generation_config = copy.deepcopy(target.model.generation_config)
        student.save_pretrained(staging)
        target.tokenizer.save_pretrained(staging)
    if vocab is not None:
        draft_vocab.save(staging, vocab)
    (staging / "distill.json").write_text(json.dumps(record, indent=2) + "\n")
    if out.exists():
        import shutil

        shutil.rmtree(out)
    staging.rename(out)
    return out


def distill(
    teacher: TeacherConfig, students: list[StudentConfig], progress, held_out_fraction: float = 0.04
) -> list[Path]:
    """Build (or read) the teacher data, then train and save each student; returns their folders."""
    target = sources.load(sources.ModelRequest("target", teacher.target, dtype="float32", device="cpu"))
    check_students(target, teacher.target, students)  # before minutes of teacher data
    data = teacher_data(target, teacher, progress)
    split = torch.randperm(len(data), generator=torch.Generator().manual_seed(1234)).tolist()
    n_held = max(1, round(held_out_fraction * len(data)))
    held_out = [data[i] for i in split[:n_held]]
    train = [data[i] for i in split[n_held:]]
    return [trainer_of(c.size).train(target, teacher, train, held_out, c, progress) for c in students]


def check_students(target, source: str, students: list[StudentConfig]) -> None:
    """Each student fits ``target`` (loaded from ``source``): an exit head ``exit<N>`` reads fewer of
    its layers than it has."""
    layers = getattr(target.model.config, "num_hidden_layers", None)
    for config in students:
        if not config.size.startswith("exit") or layers is None:
            continue
        exit_after = int(config.size[4:])
        if not 1 <= exit_after < layers:
            raise SpecbenchError(
                f"--size {config.size}",
                f"an exit after {exit_after} layers of {source}, which has {layers}",
                f"use exit1 ... exit{layers - 1}",
            )


def _train_model(target, teacher: TeacherConfig, train, held_out, config: StudentConfig, progress) -> Path:
    """A student model (or an exit head on the target's first layers), saved with its manifest."""
    student = build_student(target.model, config.size, config.seed)
    vocab = None
    if config.draft_vocab:
        vocab = draft_vocabulary(train, config.draft_vocab, target)
    record = train_student(student, train, held_out, config, progress, vocab)
    manifest = {
        "size": config.size,
        "parameters": sum(p.numel() for p in student.parameters()),
        "teacher": teacher.record() | {"origin": getattr(target, "origin", ""), "key": teacher.key()},
        "student": config.manifest(),
        **record,
    }
    return save_student(student, target, config.folder(teacher), manifest, vocab)


def _train_heads(target, teacher: TeacherConfig, train, held_out, config: StudentConfig, progress) -> Path:
    """Medusa heads or an EAGLE head on ``target``, saved with their manifest and vLLM's layout."""
    from specbench.drafters import eagle, medusa
    from specbench.drafters.heads import target_facts

    vocab = draft_vocabulary(train, config.draft_vocab or target.vocab_size, target)
    manifest = {"size": config.size, **target_facts(target)}
    if config.size == "medusa":
        from specbench.training.medusa import MEDUSA_HEADS, train_heads

        module, record = train_heads(target, train, held_out, config, vocab, progress)
        manifest["heads"] = MEDUSA_HEADS
    else:
        from specbench.training.eagle import train_head

        module, record = train_head(target, train, held_out, config, vocab, progress, teacher.features_at())
    manifest |= {
        "draft_vocab": vocab.tolist(),
        "parameters": sum(p.numel() for p in module.parameters()),
        "teacher": teacher.record() | {"origin": getattr(target, "origin", ""), "key": teacher.key()},
        "student": config.manifest(),
        **record,
    }
    folder = cache.distilled_dir(f"{_slug(teacher.target)}/{config.folder(teacher)}")
    if config.size == "medusa":
        medusa.save(folder, module, manifest)
        medusa.save_vllm(folder / "vllm", module, target.model.get_output_embeddings().weight, vocab)
    else:
        eagle.save(folder, module, manifest)
        if module.fuse is None:  # vLLM's eagle layout has no fusion (HeadForEngine refuses one)
            eagle.save_vllm(folder / "vllm", module, target.model)
    (folder / "distill.json").write_text(
        json.dumps({k: v for k, v in manifest.items() if k != "draft_vocab"}, indent=1)
    )
    write_training_curve(folder / "training_curve.png", record, f"{folder.name} on {teacher.target}")
    return folder


# small and base are two layers each (160 wide; the target's own width and first layers); micro and
# mini are CS Drafting's cost ratios (Chen et al., NeurIPS 2024, Table 2: FLAN-T5-small and -base are
# 0.0069 and 0.022 of FLAN-T5-XXL's parameters) for a SmolLM2-135M target, ~1.0M and ~3.0M
# parameters, nearly all of it the tied embedding, so they learn faster with a higher rate and more
# epochs (the same for both: only their width differs). medusa, eagle and eagle3 train on the frozen
# target's states (batch_tokens: positions, padded for EAGLE, a step).
TRAINERS = (
    Trainer(
        "small",
        "~8.5M, 2 layers x 160",
        StudentConfig("small", epochs=3.0, lr=2e-3, draft_vocab=8192),
        _train_model,
    ),
    Trainer(
        "base",
        "the target's embedding and first 2 layers",
        StudentConfig("base", epochs=2.0, lr=1e-3, draft_vocab=8192),
        _train_model,
    ),
    Trainer(
        "micro",
        "2 layers x 20: ~1.0M for SmolLM2-135M, CS Drafting's FLAN-T5-small cost ratio to XXL",
        StudentConfig("micro", epochs=6.0, lr=5e-3, draft_vocab=8192),
        _train_model,
    ),
    Trainer(
        "mini",
        "2 layers x 60: ~3.0M for SmolLM2-135M, CS Drafting's FLAN-T5-base cost ratio to XXL",
        StudentConfig("mini", epochs=6.0, lr=5e-3, draft_vocab=8192),
        _train_model,
    ),
    Trainer(
        "medusa",
        "4 Medusa-1 heads on the target's last hidden state; recipes name them medusa:<target>/medusa",
        StudentConfig("medusa", epochs=2.0, lr=1e-3, batch_tokens=1024, draft_vocab=8192),
        _train_heads,
        heads=True,
    ),
    Trainer(
        "eagle",
        "an EAGLE head: one decoder layer on the target's features, also saved in vLLM's eagle layout; "
        "recipes name it eagle:<target>/eagle",
        StudentConfig("eagle", epochs=8.0, lr=1e-3, batch_tokens=4096, draft_vocab=8192),
        _train_heads,
        heads=True,
        unrolls=True,
    ),
    Trainer(
        "eagle3",
        "the same head reading EAGLE-3's fusion of the target's low, middle and high layers, "
        "RMS-normalised, trained on the token loss alone; eagle:<target>/eagle3, no vLLM layout",
        StudentConfig("eagle3", epochs=8.0, lr=1e-3, batch_tokens=4096, draft_vocab=8192),
        _train_heads,
        heads=True,
        unrolls=True,
    ),
    Trainer(
        "exit",
        "an exit head on the target's first N layers",
        StudentConfig("exit", epochs=1.0, lr=1e-3),
        _train_model,
        numbered=True,
        full_vocabulary=True,
    ),
)


def write_training_curve(path: Path, record: dict, title: str) -> Path:
    """The training loss by step, and the held-out agreement before and after, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(5, 3.5))
    axis.plot([p["step"] for p in record["curve"]], [p["loss"] for p in record["curve"]])
    before, after = record["held_out_accuracy_before"], record["held_out_accuracy_after"]
    agreement = ", ".join(f"{b:.2f}->{a:.2f}" for b, a in zip(before, after, strict=True))
    axis.set(xlabel="step", ylabel="training loss", title=f"{title}\nheld-out agreement {agreement}")
    axis.title.set_fontsize(8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path
