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
   embedding starts as the target's embedding projected on its top principal directions. An
   ``exit<N>`` student trains only an exit head on the target's first N layers (an early-exit
   self-draft that shares the target's weights). ``small`` and ``base`` score only a draft vocabulary
   (FR-Spec, see :mod:`specbench.drafters.draft_vocab`): the N tokens most frequent in the training data.
3. **Loss.** Forward KL from the teacher, exact on the teacher's top-k tokens plus the lumped tail:
   ``-sum_i p_i log q_i - (1 - sum_i p_i) log(1 - sum_i q_i)`` (up to the teacher's entropy).

Everything is seeded (initialisation, batch order); a drafter is saved with ``save_pretrained``
next to the target's tokenizer and a ``distill.json`` manifest, and loads as
``distilled:<target>/<size>``.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from specbench import sources
from specbench.drafters import draft_vocab
from specbench.drafters.early_exit import EXIT_HEAD_FILE, ExitHead, early_exit_model
from specbench.errors import SpecbenchError
from specbench.models import cache
from specbench.sources.smollm2 import ALIAS as SMOLLM2_ALIAS
from specbench.tasks import get_task, render_prompt

# (task, split): the training sources. Evaluation splits (GSM8K test, MMLU test, Spec-Bench) never appear.
GENERATE_FROM = (("mmlu", "dev"), ("alpaca", "train"), ("gsm8k", "train"))
TEACHER_FORCE_FROM = (("gsm8k", "train"),)


@dataclass(frozen=True)
class TeacherConfig:
    target: str = SMOLLM2_ALIAS
    generate: int = 800  # prompts whose greedy continuation the target generates
    max_new_tokens: int = 128
    teacher_forced: int = 1200  # GSM8K train reference answers scored by the target
    top_k: int = 32
    batch_size: int = 32
    data_dir: str = ""

    def key(self) -> str:
        """Hash of every setting and the training files' bytes; not of where the data folder lives."""
        fields = asdict(self) | {"data_dir": None, "data": _data_fingerprint(self.data_dir), "version": 2}
        return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:12]


@dataclass(frozen=True)
class StudentConfig:
    size: str  # "small", "base" or "exit<N>"
    epochs: float
    lr: float
    batch_tokens: int = 2048
    seed: int = 0
    draft_vocab: int = 0  # 0: the head scores every token; N: only the N most frequent (FR-Spec)


STUDENTS = {
    "small": StudentConfig("small", epochs=3.0, lr=2e-3, draft_vocab=8192),
    "base": StudentConfig("base", epochs=2.0, lr=1e-3, draft_vocab=8192),
}
EXIT_DEFAULTS = {"epochs": 1.0, "lr": 1e-3}


def student_config(size: str, **overrides) -> StudentConfig:
    if size in STUDENTS:
        base = STUDENTS[size]
    elif size.startswith("exit") and size[4:].isdigit():
        base = StudentConfig(size, **EXIT_DEFAULTS)
        overrides.pop("draft_vocab", None)  # an exit head shares the target's full head
    else:
        raise SpecbenchError(
            "--size", f"unknown drafter size {size!r}", "use small, base or exit<N> (e.g. exit4)"
        )
    return StudentConfig(**(asdict(base) | {k: v for k, v in overrides.items() if v is not None}))


# -- teacher data ------------------------------------------------------------------------------


@dataclass
class Sequence:
    """A token sequence whose positions ``start..`` carry the teacher's top-k next-token log-probs."""

    ids: torch.Tensor  # [L] long: prompt + continuation
    start: int  # first supervised token index: rows j of the top-k predict ids[start + j]
    top_ids: torch.Tensor  # [L - start, k] int32
    top_logp: torch.Tensor  # [L - start, k] float16


def _training_file(task: str, split: str, data_dir: str) -> Path | None:
    """``<data_dir>/<folder>/<split>.jsonl`` for the task's first local folder that has it."""
    for folder in get_task(task).local_dirs or (task,):
        path = Path(data_dir) / folder / f"{split}.jsonl"
        if path.is_file():
            return path
    return None


def _data_fingerprint(data_dir: str) -> str:
    digest = hashlib.sha256()
    for task, split in sorted(set(GENERATE_FROM + TEACHER_FORCE_FROM)):
        path = _training_file(task, split, data_dir)
        if path is not None:
            digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def _training_file_or_fail(task: str, split: str, data_dir: str) -> Path:
    path = _training_file(task, split, data_dir)
    if path is None:
        raise SpecbenchError(
            f"--data-dir {data_dir}",
            f"no {task}/{split}.jsonl training data",
            "point --data-dir (or SPECBENCH_DATA_DIR) at the offline data folder (../shared/data)",
        )
    return path


def _examples(task: str, split: str, data_dir: str):
    return get_task(task).load(split=split, data_files=str(_training_file_or_fail(task, split, data_dir)))


def _top(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    logp = torch.log_softmax(logits.float(), dim=-1)
    values, ids = logp.topk(k, dim=-1)
    return ids.to(torch.int32), values.to(torch.float16)


def right_padded(seqs: list[torch.Tensor], device) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, attention mask) of sequences of different lengths, padded with 0 on the right."""
    width = max(s.shape[0] for s in seqs)
    ids = torch.zeros((len(seqs), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, s in enumerate(seqs):
        ids[row, : s.shape[0]] = s
        mask[row, : s.shape[0]] = 1
    return ids.to(device), mask.to(device)


def left_padded(prompts: list[torch.Tensor], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask) of a batch of prompts padded on the left for ``generate``."""
    width = max(p.shape[0] for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, prompt in enumerate(prompts):
        ids[row, width - prompt.shape[0] :] = prompt
        mask[row, width - prompt.shape[0] :] = 1
    return ids, mask


@torch.inference_mode()
def _generated(target, prompts: list[torch.Tensor], config: TeacherConfig, progress) -> list[Sequence]:
    """Greedy continuations, batched with left padding; top-k of the logits generate() returns."""
    model, tokenizer = target.model, target.tokenizer
    eos = set(target.eos_token_ids())
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos)
    order = sorted(range(len(prompts)), key=lambda i: prompts[i].shape[0])
    out: list[Sequence | None] = [None] * len(prompts)
    task = progress.add_task("target generations", total=len(prompts), stats="")
    for first in range(0, len(order), config.batch_size):
        batch = order[first : first + config.batch_size]
        ids, mask = left_padded([prompts[i] for i in batch], pad)
        width = ids.shape[1]
        result = model.generate(
            input_ids=ids.to(target.device),
            attention_mask=mask.to(target.device),
            max_new_tokens=config.max_new_tokens,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
            pad_token_id=pad,
            eos_token_id=sorted(eos),
        )
        new = result.sequences[:, width:].cpu()
        tops = [_top(step, config.top_k) for step in result.logits]
        top_ids = torch.stack([t[0].cpu() for t in tops], dim=1)  # [B, steps, k]
        top_logp = torch.stack([t[1].cpu() for t in tops], dim=1)
        for row, i in enumerate(batch):
            n = new.shape[1]
            for j, token in enumerate(new[row].tolist()):
                if token in eos:
                    n = j + 1
                    break
            seq = torch.cat([prompts[i], new[row, :n]])
            out[i] = Sequence(seq, prompts[i].shape[0], top_ids[row, :n], top_logp[row, :n])
        progress.advance(task, len(batch))
    return [s for s in out if s is not None]


@torch.inference_mode()
def _teacher_forced(target, pairs: list[tuple[torch.Tensor, torch.Tensor]], config: TeacherConfig, progress):
    """The target's top-k on reference answers (prompt + answer), batched with right padding."""
    model = target.model
    order = sorted(range(len(pairs)), key=lambda i: sum(t.shape[0] for t in pairs[i]))
    out: list[Sequence | None] = [None] * len(pairs)
    task = progress.add_task("teacher-forced answers", total=len(pairs), stats="")
    batch_size = max(1, config.batch_size // 2)
    for first in range(0, len(order), batch_size):
        batch = order[first : first + batch_size]
        seqs = [torch.cat(pairs[i]) for i in batch]
        ids, mask = right_padded(seqs, target.device)
        # the head only where an answer token is predicted: most positions are prompt
        hidden = model.base_model(input_ids=ids, attention_mask=mask)
        for row, i in enumerate(batch):
            start, length = pairs[i][0].shape[0], seqs[row].shape[0]
            logits = model.get_output_embeddings()(hidden.last_hidden_state[row, start - 1 : length - 1])
            top_ids, top_logp = _top(logits, config.top_k)
            out[i] = Sequence(seqs[row], start, top_ids.cpu(), top_logp.cpu())
        progress.advance(task, len(batch))
    return [s for s in out if s is not None]


def _prompt_ids(target, example) -> torch.Tensor:
    text = render_prompt(example, target.tokenizer, chat_template=True)
    return target.tokenizer(text, add_special_tokens=False, return_tensors="pt").input_ids[0]


def _answer_ids(target, example, answer: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(prompt ids, answer ids) of a chat whose assistant turn is the reference answer."""
    tokenizer = target.tokenizer
    messages = [{"role": "user", "content": example.prompt}, {"role": "assistant", "content": answer}]
    full = tokenizer.apply_chat_template(messages, tokenize=False)
    ids = tokenizer(full, add_special_tokens=False, return_tensors="pt").input_ids[0]
    prompt = _prompt_ids(target, example)
    return ids[: prompt.shape[0]], ids[prompt.shape[0] :]


def teacher_data(target, config: TeacherConfig, progress) -> list[Sequence]:
    """The cached teacher data for ``config`` (built once with the target, then read from disk)."""
    path = cache.cache_dir() / "distill" / _slug(config.target) / f"teacher-{config.key()}.pt"
    if path.is_file():
        return [Sequence(**row) for row in torch.load(path, weights_only=True)]
    generated = []
    for task, split in GENERATE_FROM:  # the small sources first and whole, GSM8K fills the rest
        generated += _examples(task, split, config.data_dir)[: config.generate - len(generated)]
    forced = []
    for task, split in TEACHER_FORCE_FROM:
        used = {e.id for e in generated}
        raw = _read_rows(task, split, config.data_dir)
        examples = _examples(task, split, config.data_dir)
        pool = [(e, raw[i]["answer"]) for i, e in enumerate(examples) if e.id not in used]
        forced += pool[-config.teacher_forced :]  # from the end, away from the generated prompts
    sequences = _generated(target, [_prompt_ids(target, e) for e in generated], config, progress)
    sequences += _teacher_forced(target, [_answer_ids(target, e, a) for e, a in forced], config, progress)
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_suffix(".tmp")
    torch.save([asdict(s) for s in sequences], staging)
    staging.rename(path)  # a killed run never leaves a half-written cache
    return sequences


def _read_rows(task: str, split: str, data_dir: str) -> list[dict]:
    with _training_file_or_fail(task, split, data_dir).open() as lines:  # not str.splitlines: U+2028
        return [json.loads(line) for line in lines if line.strip()]


def _slug(source: str) -> str:
    return source.replace("/", "--")


# -- students ----------------------------------------------------------------------------------


def draft_vocabulary(train: list[Sequence], n: int, target) -> torch.Tensor:
    """The ``n`` tokens most frequent in the training text and the teacher's argmax, EOS included."""
    counts = torch.zeros(target.vocab_size, dtype=torch.long)
    for s in train:
        counts += torch.bincount(s.ids, minlength=target.vocab_size)
        counts += torch.bincount(s.top_ids[:, 0].long(), minlength=target.vocab_size)
    return draft_vocab.frequent_tokens(counts, n, target.eos_token_ids())


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
    if size == "small":
        config.hidden_size, config.intermediate_size = 160, 480
        config.num_attention_heads = config.num_key_value_heads = 5
        config.head_dim = 32
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


def save_student(student: nn.Module, target, size: str, record: dict, vocab=None) -> Path:
    """``save_pretrained`` (or the exit head alone) into ``<cache>/drafters/<target>/<size>``."""
    out = cache.distilled_dir(f"{_slug(record['teacher']['target'])}/{size}")
    staging = out.with_name(out.name + ".tmp")
    staging.mkdir(parents=True, exist_ok=True)
    if size.startswith("exit"):
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
    data = teacher_data(target, teacher, progress)
    split = torch.randperm(len(data), generator=torch.Generator().manual_seed(1234)).tolist()
    n_held = max(1, round(held_out_fraction * len(data)))
    held_out = [data[i] for i in split[:n_held]]
    train = [data[i] for i in split[n_held:]]
    saved = []
    for config in students:
        student = build_student(target.model, config.size, config.seed)
        vocab = None
        if config.draft_vocab:
            vocab = draft_vocabulary(train, config.draft_vocab, target)
        record = train_student(student, train, held_out, config, progress, vocab)
        manifest = {
            "size": config.size,
            "parameters": sum(p.numel() for p in student.parameters()),
            "teacher": asdict(teacher) | {"origin": getattr(target, "origin", ""), "key": teacher.key()},
            "student": asdict(config),
            **record,
        }
        saved.append(save_student(student, target, config.size, manifest, vocab))
    return saved
