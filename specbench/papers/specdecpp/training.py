"""``specbench specdecpp train``: the acceptance prediction head of SpecDec++ (Huang et al. 2024, Sec. 3.3).

1. **Target responses.** For each training prompt x, the target's response Y (128 tokens at
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
``specdecpp:<target>/<drafter>[/<name>]`` (the slugs :func:`slug` makes) or by its folder's path.

Longer than the house limit on purpose, for now: the head's data (responses and labels, each kept batch
by batch so that a real pair's hours of CPU survive an interruption), its training and its evaluation
share one TrainConfig, its cache keys and the Example record; the data half is the part to split out.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from specbench import sources
from specbench.drafters.acceptance_head import (
    AcceptanceHead,
    head_dir,
    reference,
    save_head,
    slug,
)
from specbench.errors import SpecbenchError
from specbench.models import cache
from specbench.models.cache import DISTILLED_PREFIX
from specbench.sources.smollm2 import ALIAS as SMOLLM2_ALIAS
from specbench.training import teacher as teaching

DEFAULT_DRAFTER = f"{DISTILLED_PREFIX}{SMOLLM2_ALIAS}/small"


@dataclass(frozen=True)
class TrainConfig:
    target: str = SMOLLM2_ALIAS
    drafter: str = DEFAULT_DRAFTER
    target_options: dict = field(default_factory=dict)
    drafter_options: dict = field(default_factory=dict)
    name: str = "default"
    data_dir: str = ""
    prompts: int = 800  # training + evaluation prompts
    max_new_tokens: int = 128  # length cap of the target's responses
    eval_fraction: float = 0.1
    mixing_ratio: float = 0.15  # r: probability that a position keeps the target's token (no loss)
    depth: int = 3  # residual blocks D (0: one linear layer)
    w_acc: float = 1.0
    w_rej: float = 6.0
    epochs: float = 3.0
    batch_size: int = 32  # sequences per optimiser step
    lr: float = 1e-3  # the release keeps HF's 5e-5 for ~50x more steps (40k prompts)
    warmup_ratio: float = 0.03
    seed: int = 42
    teacher_batch: int = 8  # sequences per teacher / draft forward pass
    dtype: str = "float32"
    device: str = "cpu"
    # "distill": distill's prompts, eval_fraction of them held out at random; "alpaca": the paper's
    # setup, Alpaca's specdecpp-train prompts to train and its specdecpp-dev prompts to evaluate
    # (specdecpp-test stays for the benchmark)
    prompt_set: str = "distill"
    # the target's responses: greedy at temperature 0, else sampled (the release samples them with the
    # checkpoint's generation config)
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0

    def data_key(self, fingerprint: str) -> str:
        """Hash of everything the features and labels depend on (not the head's hyperparameters)."""
        fields = {
            k: getattr(self, k)
            for k in (
                "target",
                "drafter",
                "target_options",
                "drafter_options",
                "prompts",
                "max_new_tokens",
                "eval_fraction",
                "mixing_ratio",
                "seed",
                "dtype",
            )
        }
        defaults = TrainConfig()
        for name in ("prompt_set", "temperature", "top_p", "top_k"):  # at their defaults keys stay as before
            if getattr(self, name) != getattr(defaults, name):
                fields[name] = getattr(self, name)
        payload = json.dumps(fields | {"data": fingerprint, "version": 1}, sort_keys=True, default=str)
        return hashlib.sha256(payload.encode()).hexdigest()[:12]


# -- data --------------------------------------------------------------------------------------


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
        train, dev = _alpaca_partitions(config)
        return train + dev
    chosen = []
    for task, split in teaching.GENERATE_FROM:
        chosen += teaching._examples(task, split, config.data_dir)[: config.prompts - len(chosen)]
    return chosen


def _alpaca_partitions(config: TrainConfig) -> tuple[list, list]:
    """Alpaca's head-training prompts (at most ``config.prompts``) and its evaluation prompts."""
    source = str(teaching._training_file_or_fail("alpaca", "train", config.data_dir))
    train, dev = (teaching.get_task("alpaca").load(split=s, data_files=source) for s in ALPACA_SPLITS)
    return train[: config.prompts], dev


def target_responses(target, config: TrainConfig, progress) -> list[Example]:
    """(x, Y) pairs: distill's cached greedy responses when it cached them for this target, length
    cap and its prompts, else generated here (batched, greedy or sampled) and cached under the
    specdecpp cache."""
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


def split(n: int, eval_fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """(train, eval) example indices, seeded."""
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed + 1)).tolist()
    n_eval = min(n - 1, max(1, round(eval_fraction * n))) if eval_fraction > 0 else 0
    return sorted(order[n_eval:]), sorted(order[:n_eval])


def train(config: TrainConfig, progress) -> Path:
    """Build (or read) the features and labels, train the head, evaluate it, save it; returns its folder."""
    started = time.perf_counter()
    fingerprint = teaching._data_fingerprint(config.data_dir)
    cached = (
        cache.cache_dir()
        / "specdecpp"
        / slug(config.target)
        / slug(config.drafter)
        / f"data-{config.data_key(fingerprint)}.pt"
    )
    if cached.is_file():
        data = torch.load(cached, weights_only=True)
    else:  # the models are loaded only when the data must be built
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
    data_seconds = time.perf_counter() - started
    features, labels = data["features"], data["labels"]
    if config.prompt_set == "alpaca":  # the paper's split: train on train, evaluate on dev
        count = len(_alpaca_partitions(config)[0])
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
