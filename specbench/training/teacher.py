"""The distillation teacher data: prompts from training splits (GSM8K train, MMLU dev, Alpaca seed
tasks), the target's greedy answers with its top-k next-token log-probabilities, and reference answers
scored by the target; built once and cached under the specbench cache, each finished batch saved as it
completes so that a killed build resumes where it stopped. An evaluation split enters only
on request (``TeacherConfig.extra``: every row but those the named recipes evaluate), cached beside
the base data. Every trained drafter and head (:mod:`specbench.training.distill`,
:mod:`specbench.training.medusa`) learns from it."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from specbench.drafters import draft_vocab
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
    # further prompts the target answers greedily, "task:split" (every row but those left out), e.g. the
    # rows of an evaluation set that no recipe evaluates; kept in their own cache beside the base data
    extra: tuple[str, ...] = ()
    left_out: tuple[str, ...] = ()  # ids of ``extra`` examples never used (what recipes evaluate)

    def record(self) -> dict:
        """The settings as manifests record them; no extras leaves them out, so the base data's key and
        the identity of drafters trained before extras existed stay what they were."""
        fields = asdict(self)
        return {k: v for k, v in fields.items() if k not in ("extra", "left_out") or v}

    def base(self) -> TeacherConfig:
        return replace(self, extra=(), left_out=())

    def suffix(self) -> str:
        """What a drafter trained with extras adds to its folder name: ``+task-split`` each."""
        return "".join(f"+{source.replace(':', '-')}" for source in self.extra)

    def key(self) -> str:
        """Hash of every setting and the training files' bytes; not of where the data folder lives."""
        data = _data_fingerprint(self.data_dir, self.extra)
        fields = self.record() | {"data_dir": None, "data": data, "version": 2}
        return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:12]

    def features_at(self) -> Path:
        """Where the target's hidden states on this data are cached, less the ``-train-<n>.pt`` /
        ``-held-<n>.pt`` ending that :func:`specbench.training.eagle.train_head` adds."""
        return cache.cache_dir() / "distill" / _slug(self.target) / f"features-{self.key()}"


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


def _data_fingerprint(data_dir: str, extra: tuple[str, ...] = ()) -> str:
    digest = hashlib.sha256()
    for task, split in sorted(set(GENERATE_FROM + TEACHER_FORCE_FROM)) + [split_source(e) for e in extra]:
        path = _training_file(task, split, data_dir)
        if path is not None:
            digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def split_source(source: str) -> tuple[str, str]:
    """``"task:split"`` -> (task, split), or a one-line error naming ``--extra-prompts``."""
    from specbench.tasks import TASKS

    task, _, split = source.partition(":")
    if not split or task not in TASKS:
        raise SpecbenchError(
            f"--extra-prompts {source}",
            "not a task:split of a known task",
            f"write TASK:SPLIT with TASK one of {', '.join(sorted(TASKS))} (e.g. spec_bench:question)",
        )
    return task, split


def check_extra(extra: tuple[str, ...] | list[str], data_dir: str) -> None:
    """Every ``--extra-prompts`` source names a known task and a split the data folder holds, checked
    before the target loads and the teacher data is built (minutes)."""
    for source in extra:
        task, split = split_source(source)
        if _training_file(task, split, data_dir) is None:
            raise SpecbenchError(
                f"--extra-prompts {source}",
                f"no {split}.jsonl of {task} under {data_dir}",
                "name a split the data folder holds (ls it), or point --data-dir at another folder",
            )


def split_label(source: str) -> str:
    """``"task:split"`` -> the label of its rows in a run (``task/split``, :class:`DatasetRun`'s)."""
    return "/".join(split_source(source))


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


class _Batches:
    """A build's finished batches, one file each under ``folder`` (``None``: kept in memory only),
    named by the build and the batch's first position and holding the indices it answered, so a killed
    build resumes at the first batch it did not finish and a file of other indices is never taken."""

    def __init__(self, folder: Path | None, kind: str):
        self.folder, self.kind = folder, kind

    def todo(self, order: list[int], size: int, out: list, advance) -> Iterator[tuple[int, list[int]]]:
        """The batches of ``order`` (``size`` indices each) still to compute, as (first position, indices):
        a saved batch goes straight into ``out``; a yielded one is saved once the caller has filled its
        indices of ``out``, when the loop asks for the next. ``advance(n)`` is told every finished batch."""
        for first in range(0, len(order), size):
            batch = order[first : first + size]
            done = self.load(first, batch)
            if done is None:
                yield first, batch
                self.save(first, batch, [out[i] for i in batch])
            else:
                for i, seq in zip(batch, done, strict=True):
                    out[i] = seq
            advance(len(batch))

    def load(self, first: int, batch: list[int]) -> list[Sequence] | None:
        path = self._path(first)
        if path is None or not path.is_file():
            return None
        saved = torch.load(path, weights_only=True)
        if saved["indices"] != batch:
            return None
        return [Sequence(**row) for row in saved["sequences"]]

    def save(self, first: int, batch: list[int], sequences: list[Sequence]) -> None:
        path = self._path(first)
        if path is None:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        staging = path.with_suffix(".tmp")
        torch.save({"indices": batch, "sequences": [asdict(s) for s in sequences]}, staging)
        staging.rename(path)

    def _path(self, first: int) -> Path | None:
        return None if self.folder is None else self.folder / f"{self.kind}-{first:06d}.pt"


@torch.inference_mode()
def _generated(
    target, prompts: list[torch.Tensor], config: TeacherConfig, progress, parts: Path | None = None
) -> list[Sequence]:
    """Greedy continuations, batched with left padding; top-k of the logits generate() returns."""
    model, tokenizer = target.model, target.tokenizer
    eos = set(target.eos_token_ids())
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos)
    order = sorted(range(len(prompts)), key=lambda i: prompts[i].shape[0])
    out: list[Sequence | None] = [None] * len(prompts)
    batches = _Batches(parts, "generated")
    task = progress.add_task("target generations", total=len(prompts), stats="")
    for _, batch in batches.todo(order, config.batch_size, out, lambda n: progress.advance(task, n)):
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
    return [s for s in out if s is not None]


@torch.inference_mode()
def _teacher_forced(
    target,
    pairs: list[tuple[torch.Tensor, torch.Tensor]],
    config: TeacherConfig,
    progress,
    parts: Path | None = None,
):
    """The target's top-k on reference answers (prompt + answer), batched with right padding."""
    model = target.model
    order = sorted(range(len(pairs)), key=lambda i: sum(t.shape[0] for t in pairs[i]))
    out: list[Sequence | None] = [None] * len(pairs)
    batches = _Batches(parts, "forced")
    task = progress.add_task("teacher-forced answers", total=len(pairs), stats="")
    batch_size = max(1, config.batch_size // 2)
    for _, batch in batches.todo(order, batch_size, out, lambda n: progress.advance(task, n)):
        seqs = [torch.cat(pairs[i]) for i in batch]
        ids, mask = right_padded(seqs, target.device)
        # the head only where an answer token is predicted: most positions are prompt
        hidden = model.base_model(input_ids=ids, attention_mask=mask)
        for row, i in enumerate(batch):
            start, length = pairs[i][0].shape[0], seqs[row].shape[0]
            logits = model.get_output_embeddings()(hidden.last_hidden_state[row, start - 1 : length - 1])
            top_ids, top_logp = _top(logits, config.top_k)
            out[i] = Sequence(seqs[row], start, top_ids.cpu(), top_logp.cpu())
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
    """The cached teacher data for ``config`` (built once with the target, then read from disk): the
    base data, then the extra prompts' answers (cached apart, so adding extras keeps the base)."""
    folder = cache.cache_dir() / "distill" / _slug(config.target)
    base = config.base()
    sequences = _cached(
        folder / f"teacher-{base.key()}.pt", lambda parts: _base_data(target, base, progress, parts)
    )
    if config.extra:
        extra = folder / f"teacher-{base.key()}-extra-{config.key()}.pt"
        sequences += _cached(extra, lambda parts: _extra_data(target, config, progress, parts))
    return sequences


def extra_examples(config: TeacherConfig) -> list:
    """The examples of ``config.extra``, every row but the ids ``config.left_out``."""
    left_out, examples = set(config.left_out), []
    for source in config.extra:
        task, split = split_source(source)
        examples += [e for e in _examples(task, split, config.data_dir) if e.id not in left_out]
    return examples


def _extra_data(target, config: TeacherConfig, progress, parts: Path) -> list[Sequence]:
    prompts = [_prompt_ids(target, e) for e in extra_examples(config)]
    return _generated(target, prompts, config, progress, parts)


def _cached(path: Path, build) -> list[Sequence]:
    """The data at ``path``, else ``build(parts)``'s, which keeps each finished batch under ``parts``
    until the whole is saved; the cache key names the settings, so the parts fit only this build."""
    if path.is_file():
        return [Sequence(**row) for row in torch.load(path, weights_only=True)]
    parts = path.with_suffix(".parts")
    sequences = build(parts)
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_suffix(".tmp")
    torch.save([asdict(s) for s in sequences], staging)
    staging.rename(path)  # a killed run never leaves a half-written cache
    shutil.rmtree(parts, ignore_errors=True)
    return sequences


def _base_data(target, config: TeacherConfig, progress, parts: Path) -> list[Sequence]:
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
    prompts = [_prompt_ids(target, e) for e in generated]
    sequences = _generated(target, prompts, config, progress, parts)
    answers = [_answer_ids(target, e, a) for e, a in forced]
    sequences += _teacher_forced(target, answers, config, progress, parts)
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
