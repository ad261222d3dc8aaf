"""The peer baseline: Hugging Face ``generate`` on the same models, measured like our own loops.

Mirrors :mod:`specbench.decoding.autoregressive` (plain ``generate``) and
:mod:`specbench.decoding.speculative` (assisted generation with ``assistant_model=`` at a constant
draft length k, or prompt lookup with ``prompt_lookup_num_tokens=k``) and returns the same
:class:`~specbench.decoding.generation.Generation`, so rows compare one for one.

Counting: hooks on each model's top-level module count one forward pass per call HF makes (the
assistant's drafting is a nested ``generate`` on the assistant, counted on the assistant); an
encoder-decoder's encoder is hooked apart and counted in ``encoder_passes``, as ``HFModel.start`` does.
TTFT is the end of the target's first forward pass (the prefill, which commits the first token).

Steps: every target call after the first starts from a cache cropped to the committed length
minus one (HF keeps the last committed token uncached and feeds it with the candidates), so call i
scores ``fed_i`` tokens = 1 + its candidates, and the committed length before it is
``cached_i + 1``. The first call feeds the prefix (prompt, or T5's decoder start) plus candidates.
Consecutive committed lengths, closed by the final length, give the tokens each step committed;
accepted = committed - 1. HF recounts a step's accepted drafts after cutting at EOS or max
length, so the steps always satisfy ``sum(accepted + 1) == len(tokens)``.

Where HF's counts differ from ours by design (tests/test_hf_generate.py pins each): its assistant
stops drafting at an EOS; after a rejected draft its assistant re-reads one token more than ours
(it always crops the assistant's cache to the committed length - 2); prompt lookup does not cap a
draft at the remaining budget (it scores drafts it then discards) and, for encoder-decoders, looks
up in the decoder's tokens only.
"""

from __future__ import annotations

import functools
import warnings
from contextlib import ExitStack, contextmanager

import torch
from transformers.utils import logging as hf_logging

from specbench.decoding.generation import Generation, Stopwatch, eos_set, truncate_at_eos
from specbench.methods import DRAFT_LENGTH, SPECULATIVE_PASSES, Method, ParamSpec, Request, always
from specbench.models.hf import HFModel
from specbench.models.sampling import SamplingParams

# A checkpoint's generation_config may turn on logits processors our loops never apply; None and
# neutral values passed to generate override it (omitted ones would be filled in from it).
_PLAIN = dict(
    repetition_penalty=1.0,
    no_repeat_ngram_size=0,
    min_length=0,
    min_new_tokens=None,
    bad_words_ids=None,
    suppress_tokens=None,
    begin_suppress_tokens=None,
    forced_bos_token_id=None,
    forced_eos_token_id=None,
)
_PLAIN_SAMPLING = dict(typical_p=1.0, min_p=None, epsilon_cutoff=0.0, eta_cutoff=0.0)
_ASSISTANT_FIELDS = (
    "num_assistant_tokens",
    "num_assistant_tokens_schedule",
    "assistant_confidence_threshold",
    "eos_token_id",
    "pad_token_id",
)


def generate(
    target: HFModel,
    prompt_ids: torch.Tensor,
    *,
    max_new_tokens: int,
    sampling: SamplingParams = SamplingParams(),
    eos_token_id=None,
    generator: torch.Generator | None = None,
    assistant: HFModel | None = None,
    k: int = 4,
    prompt_lookup: bool = False,
    max_ngram: int = 2,
    schedule: str = "constant",
    confidence_threshold: float = 0.0,
) -> Generation:
    """HF ``generate`` (plain, assisted by ``assistant`` with draft length k, or prompt lookup).

    Assisted generation's own adaptive draft lengths (the SpecDec++ paper's HF baselines):
    ``schedule`` is ``num_assistant_tokens_schedule`` — ``constant`` (k every step), ``heuristic``
    (k + 2 after a fully accepted draft, k - 1 otherwise, carried across requests on the assistant's
    config in HF; here it restarts at k every request) or ``heuristic_transient`` (restarts at k);
    ``confidence_threshold`` is ``assistant_confidence_threshold`` — the assistant stops drafting when
    its top token's probability falls below it (0 = off; with scikit-learn installed HF also re-tunes
    it during the request from an ROC curve of the assistant's confidences).
    """
    if assistant is not None and prompt_lookup:
        raise ValueError("pass either an assistant or prompt_lookup=True, not both")
    if assistant is not None and assistant.model is target.model:
        # one module cannot tell target calls from drafting calls apart; wrap a copy of the weights
        raise ValueError("the assistant must be a separate module from the target (copy.deepcopy it)")
    if k < 1:
        raise ValueError(f"draft length k must be >= 1, got {k}")
    eos = sorted(eos_set(eos_token_id))
    kwargs = dict(
        _PLAIN,
        max_new_tokens=max_new_tokens,
        # None (not omitted) so the checkpoint's own EOS does not apply when the caller gave none
        eos_token_id=eos or None,
        pad_token_id=eos[0] if eos else None,
        do_sample=not sampling.greedy,
    )
    if not sampling.greedy:
        # top_k=None would fall back to HF's default of 50; 0 disables it
        kwargs.update(
            _PLAIN_SAMPLING, temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p
        )
    if assistant is not None:
        kwargs["assistant_model"] = assistant.model
    if prompt_lookup:
        kwargs.update(prompt_lookup_num_tokens=k, max_matching_ngram_size=max_ngram)

    input_ids = prompt_ids.to(target.device)[None]
    masks = {"attention_mask": torch.ones_like(input_ids)}
    if target.is_encoder_decoder:
        # HFModel decodes from the model config's start token; generate reads its generation_config's
        kwargs["decoder_start_token_id"] = target.model.config.decoder_start_token_id
        # without a decoder mask an encoder-decoder assistant re-feeds its whole decoder sequence on
        # top of its cache each round (transformers 5.23 slices prefill inputs by the mask's length)
        masks["decoder_attention_mask"] = torch.ones_like(input_ids[:, :1])
    calls: list[tuple[int, int]] = []
    target.counter.reset()
    if assistant is not None:
        assistant.counter.reset()
    with ExitStack() as stack:
        stack.enter_context(_quiet())
        if generator is not None and not sampling.greedy:
            stack.enter_context(_seeded_from(generator, target.device))  # HF samples from the global RNG
        if assistant is not None:
            stack.enter_context(_assistant_settings(assistant, k, eos, schedule, confidence_threshold))
        watch = Stopwatch(target.device)
        stack.enter_context(_counted(target, calls, watch))
        if assistant is not None:
            stack.enter_context(_counted(assistant))
        stack.enter_context(torch.inference_mode())
        output = target.model.generate(input_ids=input_ids, **masks, **kwargs)
        walltime, ttft = watch.stop()

    prefix = 1 if target.is_encoder_decoder else input_ids.shape[1]  # T5 output starts with its start token
    tokens, stopped = truncate_at_eos(output[0, prefix:].tolist(), frozenset(eos))
    if assistant is not None or prompt_lookup:
        steps = _steps(calls, prefix, prefix + len(tokens))
    else:
        steps = [(0, 0)] * len(tokens)
    forwards = {target.name: target.counter.snapshot()}
    if assistant is not None:
        forwards[assistant.name] = assistant.counter.snapshot()
    return Generation(tokens, walltime, ttft, steps, forwards, stopped)


def _steps(calls: list[tuple[int, int]], prefix: int, final: int) -> list[tuple[int, int]]:
    """(drafted, accepted) per target call from its (cached, fed) lengths; see the module docstring."""
    committed = [prefix] + [cached + 1 for cached, _ in calls[1:]] + [final]
    return [
        (cached + fed - committed[i], committed[i + 1] - committed[i] - 1)
        for i, (cached, fed) in enumerate(calls)
    ]


@contextmanager
def _counted(model: HFModel, calls: list | None = None, watch: Stopwatch | None = None):
    """Count each top-level forward of ``model`` (and its encoder's) into ``model.counter``.

    With ``calls``, also record each call's (cached, fed) lengths; with ``watch``, mark the first token
    when the first call ends.
    """
    module, device, counter = model.model, model.device, model.counter
    pending: list[tuple[object, int]] = []

    def before(_module, args, kwargs):
        ids = kwargs.get("decoder_input_ids" if model.is_encoder_decoder else "input_ids")
        if ids is None:
            ids = kwargs.get("decoder_inputs_embeds" if model.is_encoder_decoder else "inputs_embeds")
            fed = 0 if ids is None else ids.shape[-2]
        else:
            fed = ids.shape[-1]
        cache = kwargs.get("past_key_values", kwargs.get("cache"))  # "cache" from transformers 5.24
        cached = 0 if cache is None else cache.get_seq_length()
        if calls is not None:
            calls.append((cached, fed))
        pending.append((counter.begin(device), fed, cached))

    def after(_module, args, kwargs, output):
        started, fed, cached = pending.pop()
        counter.end(started, fed, device, context=cached)
        if watch is not None and watch.first_token is None:
            if device.type == "cuda":  # once per request: the first token exists when the prefill has run
                torch.cuda.synchronize(device)
            watch.mark_first_token()

    handles = [
        module.register_forward_pre_hook(before, with_kwargs=True),
        module.register_forward_hook(after, with_kwargs=True),
    ]
    if model.is_encoder_decoder:
        encoder = module.get_encoder()
        encoder_started: list[object] = []

        def encoder_begins(_module, args, kwargs):
            ids = kwargs.get("input_ids", args[0] if args else None)
            encoder_started.append((counter.begin(device), 0 if ids is None else ids.shape[-1]))

        def encoder_done(*_):
            started, tokens = encoder_started.pop()
            counter.end_encoder(started, tokens, device)  # as HFModel.start: counted apart

        handles.append(encoder.register_forward_pre_hook(encoder_begins, with_kwargs=True))
        handles.append(encoder.register_forward_hook(encoder_done))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


@contextmanager
def _assistant_settings(
    assistant: HFModel, k: int, eos: list[int], schedule: str = "constant", confidence_threshold: float = 0.0
):
    """By default exactly k drafts per step (no heuristic schedule; a confidence threshold of 0 turns
    the early stop off), and the caller's EOS and pad ids.

    The assistant's nested ``generate`` fills ids left unset from the assistant's own config, and with a
    pad id that is not an EOS it masks every occurrence of that token in its input as padding.
    """
    config = assistant.model.generation_config
    saved = {name: getattr(config, name, None) for name in _ASSISTANT_FIELDS}
    config.num_assistant_tokens = k
    config.num_assistant_tokens_schedule = schedule
    config.assistant_confidence_threshold = confidence_threshold
    config.eos_token_id = eos or None
    config.pad_token_id = eos[0] if eos else None
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(config, name, value)


@contextmanager
def _seeded_from(generator: torch.Generator, device: torch.device):
    """Seed the global RNG from ``generator`` for the call, restoring the global state afterwards."""
    seed = int(torch.randint(0, 2**62, (1,), generator=generator, device=generator.device))
    devices = list(range(torch.cuda.device_count())) if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


@contextmanager
def _quiet():
    """Silence HF's warnings about settings chosen on purpose (e.g. the assistant overrides)."""
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        hf_logging.set_verbosity(verbosity)


def _run(params: dict, target: HFModel, drafter, r: Request, *, prompt_lookup: bool = False) -> Generation:
    return generate(
        target,
        r.prompt_ids,
        assistant=drafter,
        k=params["k"],
        prompt_lookup=prompt_lookup,
        max_ngram=params.get("max_ngram", 2),
        schedule=params.get("num_assistant_tokens_schedule", "constant"),
        confidence_threshold=params.get("assistant_confidence_threshold", 0.0),
        **r.decoding(),
    )


_CALLS_ITSELF = "HF generate calls the model itself"

METHODS = (
    Method(
        "hf_assisted",
        "transformers generate(assistant_model=...): k drafts, or HF's adaptive schedule / confidence stop",
        _run,
        {
            "k": DRAFT_LENGTH,
            "num_assistant_tokens_schedule": ParamSpec(
                str,
                "constant",
                "constant: k drafts every step; heuristic(_transient): k + 2 after a full accept, else k - 1",
                choices=("constant", "heuristic", "heuristic_transient"),
                added_later=True,
            ),
            "assistant_confidence_threshold": ParamSpec(
                float,
                0.0,
                "stop drafting when the assistant's top probability is below it; 0 = off",
                0,
                1,
                added_later=True,
            ),
        },
        needs_drafter=True,
        neural_drafter_only=True,
        lossless=always,
        no_replay=_CALLS_ITSELF,
        runs_engine=False,
        plan=SPECULATIVE_PASSES,
    ),
    Method(
        "hf_prompt_lookup",
        "transformers generate(prompt_lookup_num_tokens=k)",
        functools.partial(_run, prompt_lookup=True),
        {"k": DRAFT_LENGTH, "max_ngram": ParamSpec(int, 2, "longest n-gram prompt lookup matches", 1)},
        lossless=always,
        no_replay=_CALLS_ITSELF,
        runs_engine=False,
        plan=SPECULATIVE_PASSES,
    ),
)
