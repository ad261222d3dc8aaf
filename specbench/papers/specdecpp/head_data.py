"""The data SpecDec++'s acceptance head trains on (Huang et al. 2024, Sec. 3.3; the head and its
training: :mod:`specbench.papers.specdecpp.training`).

1. **Target responses.** For each training prompt x, the target's response Y (``max_new_tokens`` at
   most), greedy or, as the release does, sampled (``temperature``, ``top_p``, ``top_k``). The prompts
   are distill's (GSM8K train, MMLU dev, Alpaca seed tasks, rendered as the benchmark renders them;
   the responses ``specbench distill`` cached for the same target are reused when greedy) or, with
   ``prompt_set="alpaca"``, the paper's: Alpaca's ``specdecpp-train`` partition to train on and its
   ``specdecpp-dev`` partition to evaluate on (Sec. 4, App. C), leaving ``specdecpp-test`` unseen.
2. **Mixed sequences and labels.** Teacher-forced on (x, Y), the draft gives q_i and the target p_i
   for every response position i (both batched, one pass each). A draft token Z_i ~ q_i is drawn,
   labelled with its acceptance probability min(1, p_i(Z_i) / q_i(Z_i)) (computed on the target's
   prefix Y_<i, as the paper and the release do). BERT-style mixing: each position keeps the target's
   Y_i with probability r (``mixing_ratio``, 0.15) and takes Z_i otherwise; only the Z positions carry
   a loss. The draft then reads the mixed sequence once more, and its final hidden state at each Z
   position is the head's input (the draft is frozen, so these features are computed once and cached).

Both stages keep each finished teacher batch (responses in one growing file, labels one file per
batch), so a real pair's hours of CPU survive an interruption; everything is seeded per example.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from specbench import sources
from specbench.drafters.acceptance_head import slug
from specbench.errors import SpecbenchError
from specbench.models import cache
from specbench.papers.specdecpp.train_config import TrainConfig
from specbench.training import teacher as teaching


@dataclass
class Example:
    """One training sequence: prompt x, target response Y, draft samples Z and the mixing mask."""

    prompt: torch.Tensor  # [a] long
    response: torch.Tensor  # [m] long, the target's greedy Y
    draft: torch.Tensor | None = None  # [m] long, Z_i ~ q_i(. | x, Y_<i)
    keep: torch.Tensor | None = None  # [m] bool: True keeps Y_i (no loss), False takes Z_i
    label: torch.Tensor | None = None  # [m] float64: min(1, p_i(Z_i) / q_i(Z_i))

    @property
    def mixed(self) -> torch.Tensor:
        return torch.where(self.keep, self.response, self.draft)


def _hidden(model, seqs: list[torch.Tensor]) -> torch.Tensor:
    """Final (normed) hidden states of a decoder-only model, right-padded batch ``[B, T, H]`` (the base
    model's output: what ``output_hidden_states`` gives last, without keeping every layer's)."""
    ids, mask = teaching.right_padded(seqs, next(model.parameters()).device)
    return model.base_model(input_ids=ids, attention_mask=mask).last_hidden_state


def _response_logprobs(model, examples: list[Example]) -> list[torch.Tensor]:
    """log-softmax rows ``[m, V]`` after x + Y_<i for each response position i, one batched pass."""
    hidden = _hidden(model, [torch.cat([e.prompt, e.response]) for e in examples])
    head = model.get_output_embeddings()
    rows = []
    for r, e in enumerate(examples):
        a, m = e.prompt.shape[0], e.response.shape[0]
        rows.append(torch.log_softmax(head(hidden[r, a - 1 : a + m - 1]).double(), dim=-1))
    return rows


def _batches(n: int, lengths: list[int], size: int) -> list[list[int]]:
    order = sorted(range(n), key=lambda i: lengths[i])  # similar lengths together: little padding
    return [order[i : i + size] for i in range(0, n, size)]


@torch.inference_mode()
def build_examples(
    target,
    drafter,
    examples: list[Example],
    config: TrainConfig,
    progress,
    finished: dict[int, dict] | None = None,
    on_batch=None,
) -> list[torch.Tensor]:
    """Fill in Z, the mixing mask and the labels of ``examples``; return the draft's hidden states at
    the Z positions of each mixed sequence (``[#Z, H]``, float32). ``target``/``drafter`` are the
    transformers models; the randomness of example j comes from seed ``(config.seed, j)`` alone, so a
    batch found in ``finished`` (an interrupted run's rows, by example index: draft, keep, label,
    features) is taken as it is, and ``on_batch`` gets each newly built batch's rows."""
    features: list[torch.Tensor | None] = [None] * len(examples)
    for j, row in (finished or {}).items():
        examples[j].draft, examples[j].keep, examples[j].label = row["draft"], row["keep"], row["label"]
        features[j] = row["features"]
    task = progress.add_task(
        "labels (draft q, target p) and draft hidden states",
        total=len(examples),
        completed=sum(f is not None for f in features),
        stats="",
    )
    lengths = [e.prompt.shape[0] + e.response.shape[0] for e in examples]
    for batch in _batches(len(examples), lengths, config.teacher_batch):
        if all(features[j] is not None for j in batch):
            continue
        chosen = [examples[j] for j in batch]
        logq = _response_logprobs(drafter, chosen)
        logp = _response_logprobs(target, chosen)
        for j, e, lq, lp in zip(batch, chosen, logq, logp, strict=True):
            gen = torch.Generator().manual_seed(config.seed * 1_000_003 + j)
            q = lq.exp().cpu()
            e.draft = torch.multinomial(q, 1, generator=gen).squeeze(-1)
            e.keep = torch.rand(e.response.shape[0], generator=gen) < config.mixing_ratio
            rows = torch.arange(e.response.shape[0])
            ratio = lp.cpu()[rows, e.draft] - lq.cpu()[rows, e.draft]
            e.label = ratio.clamp(max=0.0).exp()  # min(1, p/q)
        del logq, logp
        hidden = _hidden(drafter, [torch.cat([e.prompt, e.mixed]) for e in chosen])
        for r, (j, e) in enumerate(zip(batch, chosen, strict=True)):
            a, m = e.prompt.shape[0], e.response.shape[0]
            # the hidden state at Z_i's own position (it has read Z_i): Eq. 3.1's input
            features[j] = hidden[r, a : a + m][~e.keep.to(hidden.device)].float().cpu()
        if on_batch is not None:
            on_batch({
                j: {"draft": examples[j].draft, "keep": examples[j].keep, "label": examples[j].label,
                    "features": features[j], "response": examples[j].response}
                for j in batch
            })  # fmt: skip
        progress.advance(task, len(batch))
    return features


def features_and_labels(config: TrainConfig, progress) -> tuple[dict, str]:
    """({"features": the draft's hidden states at the Z positions, "labels": their acceptance
    probabilities}, one tensor of each per example, and the data folder's fingerprint), read from the
    cache or built there (the models are loaded only then)."""
    fingerprint = teaching._data_fingerprint(config.data_dir)
    cached = (
        cache.cache_dir()
        / "specdecpp"
        / slug(config.target)
        / slug(config.drafter)
        / f"data-{config.data_key(fingerprint)}.pt"
    )
    if cached.is_file():
        return torch.load(cached, weights_only=True), fingerprint
    target = _load("target", config.target, config.target_options, config)
    drafter = _load("drafter", config.drafter, config.drafter_options, config)
    if target.vocab_size != drafter.vocab_size:
        raise SpecbenchError(
            f"--drafter {config.drafter}",
            f"the drafter's vocabulary ({drafter.vocab_size}) is not the target's ({target.vocab_size})",
            "use a drafter that shares the target's tokenizer",
        )
    examples = target_responses(target, config, progress)
    partial = cached.with_name(f"{cached.stem}.partial-b{config.teacher_batch}")
    partial.mkdir(parents=True, exist_ok=True)

    def keep(rows: dict[int, dict]) -> None:
        _save_atomic([{"index": j} | row for j, row in rows.items()], partial / f"batch-{min(rows)}.pt")

    finished = _finished_labels(partial, examples)
    features = build_examples(
        target.model, drafter.model, examples, config, progress, finished=finished, on_batch=keep
    )
    labels = [e.label[~e.keep] for e in examples]
    data = {"features": features, "labels": labels}
    _save_atomic(data, cached)
    shutil.rmtree(partial)
    return data, fingerprint


def _load(role: str, source: str, options: dict, config: TrainConfig):
    request = sources.ModelRequest(
        role,
        source,
        dtype=config.dtype,
        device=config.device,
        options=tuple(sorted(options.items())),
    )
    model = sources.load(request)
    if not hasattr(model, "model") or model.is_encoder_decoder:
        raise SpecbenchError(
            f"--target/--drafter {source}",
            "SpecDec++ training needs decoder-only neural models",
            "use causal language models (e.g. smollm2-135m-instruct and a distilled: drafter)",
        )
    return model


PROMPT_SETS = ("distill", "alpaca")
ALPACA_SPLITS = ("specdecpp-train", "specdecpp-dev")  # specbench.tasks.alpaca's partitions


def _prompt_examples(target, config: TrainConfig) -> list:
    """The distill prompts (its GENERATE_FROM sources in order), or Alpaca's head-training and
    evaluation partitions (train first), as rendered for the benchmark."""
    if config.prompt_set == "alpaca":
        train, dev = alpaca_partitions(config)
        return train + dev
    chosen = []
    for task, split in teaching.GENERATE_FROM:
        chosen += teaching._examples(task, split, config.data_dir)[: config.prompts - len(chosen)]
    return chosen


def alpaca_partitions(config: TrainConfig) -> tuple[list, list]:
    """Alpaca's head-training prompts (at most ``config.prompts``) and its evaluation prompts."""
    source = str(teaching._training_file_or_fail("alpaca", "train", config.data_dir))
    train, dev = (teaching.get_task("alpaca").load(split=s, data_files=source) for s in ALPACA_SPLITS)
    return train[: config.prompts], dev


def target_responses(target, config: TrainConfig, progress) -> list[Example]:
    """(x, Y) pairs: distill's cached greedy responses when it cached them for this target, length
    cap and its prompts, else generated here (batched, greedy or sampled) and cached under the
    specdecpp cache; or read from ``config.responses``, whose prompts must be these."""
    if config.responses:
        return _read_responses(Path(config.responses), target, config)
    if not config.target_options and config.prompt_set == "distill" and config.temperature == 0:
        teacher = teaching.TeacherConfig(
            config.target, max_new_tokens=config.max_new_tokens, data_dir=config.data_dir
        )
        cached = cache.cache_dir() / "distill" / teaching._slug(config.target) / f"teacher-{teacher.key()}.pt"
        if config.prompts <= teacher.generate and cached.is_file():
            rows = torch.load(cached, weights_only=True)[: teacher.generate]
            pairs = [Example(r["ids"][: r["start"]], r["ids"][r["start"] :]) for r in rows]
            return [pairs[i] for i in _subset(len(pairs), config.prompts, config.seed)]
    key = config.data_key(teaching._data_fingerprint(config.data_dir))
    path = cache.cache_dir() / "specdecpp" / slug(config.target) / f"responses-{key}.pt"
    if path.is_file():
        return [Example(**row) for row in torch.load(path, weights_only=True)]
    prompts = [teaching._prompt_ids(target, e) for e in _prompt_examples(target, config)]
    partial = path.with_name(f"{path.stem}.partial-b{config.teacher_batch}.pt")
    finished = _finished_batches(partial, prompts)
    path.parent.mkdir(parents=True, exist_ok=True)

    def keep(done: dict[int, Example]) -> None:
        rows = [{"index": i, "prompt": e.prompt, "response": e.response} for i, e in sorted(done.items())]
        _save_atomic(rows, partial)

    examples = generate_responses(target, prompts, config, progress, finished=finished, on_batch=keep)
    _save_atomic([{"prompt": e.prompt, "response": e.response} for e in examples], path)
    partial.unlink(missing_ok=True)
    return examples


def _read_responses(path: Path, target, config: TrainConfig) -> list[Example]:
    """The (x, Y) pairs of a responses file this command wrote, checked against the prompts ``config``
    gives (a file for other prompts, or none, is one clear error)."""
    where = f"--responses {path}"
    try:
        rows = torch.load(path, weights_only=True)
        examples = [Example(row["prompt"], row["response"]) for row in rows]
    except Exception as error:
        raise SpecbenchError(
            where,
            f"not a responses file ({type(error).__name__})",
            "pass a responses-*.pt from a specdecpp cache",
        ) from None
    prompts = iter(teaching._prompt_ids(target, e) for e in _prompt_examples(target, config))
    # generation leaves out prompts whose response came back empty, so the file's prompts are these
    # prompts in order, some perhaps missing
    if not examples or not all(any(torch.equal(e.prompt, p) for p in prompts) for e in examples):
        raise SpecbenchError(
            where,
            f"its {len(examples)} prompts are not this run's (--target, --prompt-set, --prompts, --data-dir)",
            "pass the responses written with these options, or drop --responses to generate them",
        )
    return examples


def _save_atomic(payload, path: Path) -> None:
    torch.save(payload, path.with_suffix(".tmp"))
    path.with_suffix(".tmp").rename(path)


def _finished_labels(partial: Path, examples: list[Example]) -> dict[int, dict]:
    """The labelled batches an interrupted ``build_examples`` kept (one folder per teacher batch size),
    by example index; a batch file whose responses are not these examples' is left out."""
    finished: dict[int, dict] = {}
    for path in sorted(partial.glob("batch-*.pt")):
        rows = torch.load(path, weights_only=True)
        if all(
            r["index"] < len(examples) and torch.equal(r["response"], examples[r["index"]].response)
            for r in rows
        ):
            finished.update({r["index"]: r for r in rows})
    return finished


def _finished_batches(partial: Path, prompts: list[torch.Tensor]) -> dict[int, Example]:
    """The responses an interrupted generation kept (one file per teacher batch size, since the
    batching decides the sampled responses), or none when its prompts are not these prompts."""
    if not partial.is_file():
        return {}
    rows = torch.load(partial, weights_only=True)
    if any(r["index"] >= len(prompts) or not torch.equal(r["prompt"], prompts[r["index"]]) for r in rows):
        return {}
    return {r["index"]: Example(r["prompt"], r["response"]) for r in rows}


def _subset(n: int, k: int, seed: int) -> list[int]:
    if k >= n:
        return list(range(n))
    return sorted(torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()[:k])


@torch.inference_mode()
def generate_responses(
    target,
    prompts: list[torch.Tensor],
    config: TrainConfig,
    progress,
    finished: dict[int, Example] | None = None,
    on_batch=None,
) -> list[Example]:
    """Greedy or sampled responses (EOS included, cut at ``max_new_tokens``), batched with left
    padding; before a sampled batch, torch's RNG (which ``generate`` draws from) is seeded from the
    config's seed and the batch, so the responses do not depend on what ran before, and a batch whose
    prompts are all in ``finished`` (an interrupted run's) is not generated again. ``on_batch`` gets
    the finished responses by prompt index after each generated batch."""
    eos = set(target.eos_token_ids())
    pad = target.tokenizer.pad_token_id if target.tokenizer.pad_token_id is not None else min(eos)
    done = dict(finished or {})
    out: list[Example | None] = [done.get(i) for i in range(len(prompts))]
    task = progress.add_task("target responses", total=len(prompts), completed=len(done), stats="")
    for batch in _batches(len(prompts), [p.shape[0] for p in prompts], config.teacher_batch):
        if all(out[i] is not None for i in batch):
            continue
        ids, mask = teaching.left_padded([prompts[i] for i in batch], pad)
        width = ids.shape[1]
        sampling = {"do_sample": False}
        if config.temperature > 0:
            torch.manual_seed(config.seed * 1_000_003 + min(batch))  # generate draws from torch's RNG
            sampling = {
                "do_sample": True,
                "temperature": config.temperature,
                "top_p": config.top_p,
                "top_k": config.top_k or None,
            }
        new = target.model.generate(
            input_ids=ids.to(target.device),
            attention_mask=mask.to(target.device),
            max_new_tokens=config.max_new_tokens,
            pad_token_id=pad,
            eos_token_id=sorted(eos),
            **sampling,
        )[:, width:].cpu()
        for row, i in enumerate(batch):
            tokens = new[row].tolist()
            n = next((j + 1 for j, t in enumerate(tokens) if t in eos), len(tokens))
            out[i] = done[i] = Example(prompts[i], new[row, :n])
        if on_batch is not None:
            on_batch(done)
        progress.advance(task, len(batch))
    return [e for e in out if e is not None and e.response.shape[0] > 0]
