"""The peer baseline: Hugging Face ``generate`` on the same models, measured like our own loops.

Runs plain ``generate``, assisted generation (``assistant_model=``, with a constant draft length k:
``num_assistant_tokens_schedule="constant"`` and the confidence stop disabled) or prompt lookup
(``prompt_lookup_num_tokens=k``). Forward passes are counted by hooks on the models' top-level
modules (the encoder of an encoder-decoder model is hooked apart and counted as encoder passes).

Verification steps are read off the target's calls: HF asks each verification call for
``logits_to_keep = candidates + 1`` logits, so the call's sequence length minus its candidates is
the committed length before it, and consecutive committed lengths give the accepted counts. Models
without ``logits_to_keep`` (T5) report forward counts but no steps.
"""

from __future__ import annotations

import time
from contextlib import contextmanager

import torch
from transformers.utils import logging as hf_logging

from specbench.decoding.generation import Generation, Stopwatch, eos_set, truncate_at_eos
from specbench.decoding.sampling import SamplingParams
from specbench.models.hf import HFModel


@contextmanager
def _counted(model: HFModel, calls: list | None = None, watch: Stopwatch | None = None):
    """Count every top-level forward of ``model`` into its counter (and record (length, candidates))."""
    module, device, counter = model.model, model.device, model.counter
    pending = []

    def before(_module, args, kwargs):
        ids = kwargs.get("decoder_input_ids") if model.is_encoder_decoder else kwargs.get("input_ids")
        ids = ids if ids is not None else (args[0] if args else None)
        fed = ids.shape[-1] if ids is not None else 0
        if calls is not None:
            cache = kwargs.get("past_key_values")
            past = cache.get_seq_length() if cache is not None else 0
            keep = kwargs.get("logits_to_keep")
            calls.append((past + fed, keep - 1 if isinstance(keep, int) and keep > 0 else None))
        pending.append((counter.begin(device), fed))

    def after(_module, args, kwargs, output):
        started, fed = pending.pop()
        counter.end(started, fed, device)
        if watch is not None:
            watch.mark_first_token()

    handles = [
        module.register_forward_pre_hook(before, with_kwargs=True),
        module.register_forward_hook(after, with_kwargs=True),
    ]
    if model.is_encoder_decoder:
        encoder_started = []
        encoder = module.get_encoder()
        handles.append(
            encoder.register_forward_pre_hook(lambda *_: encoder_started.append(time.perf_counter()))
        )

        def encoder_done(*_):
            counter.encoder_passes += 1
            counter._seconds += time.perf_counter() - encoder_started.pop()

        handles.append(encoder.register_forward_hook(encoder_done))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


@contextmanager
def _constant_draft_length(assistant: HFModel | None, k: int):
    if assistant is None:
        yield
        return
    config = assistant.model.generation_config
    saved = {
        name: getattr(config, name, None)
        for name in (
            "num_assistant_tokens",
            "num_assistant_tokens_schedule",
            "assistant_confidence_threshold",
        )
    }
    config.num_assistant_tokens = k
    config.num_assistant_tokens_schedule = "constant"
    config.assistant_confidence_threshold = 0.0
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(config, name, value)


def _steps(calls: list[tuple[int, int | None]], final_len: int) -> list[tuple[int, int]]:
    if not calls or any(candidates is None for _, candidates in calls):
        return []
    committed = [length - candidates for length, candidates in calls] + [final_len]
    return [(candidates, committed[i + 1] - committed[i] - 1) for i, (_, candidates) in enumerate(calls)]


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
) -> Generation:
    eos = sorted(eos_set(eos_token_id))
    kwargs = dict(
        max_new_tokens=max_new_tokens,
        eos_token_id=eos or None,
        pad_token_id=eos[0] if eos else None,
        do_sample=not sampling.greedy,
    )
    if not sampling.greedy:
        kwargs.update(temperature=sampling.temperature, top_k=sampling.top_k or None, top_p=sampling.top_p)
    if assistant is not None:
        kwargs["assistant_model"] = assistant.model
    if prompt_lookup:
        kwargs.update(prompt_lookup_num_tokens=k, max_matching_ngram_size=max_ngram)
    if generator is not None and not sampling.greedy:  # HF samples from the global RNG
        torch.manual_seed(int(torch.randint(0, 2**62, (1,), generator=generator, device=generator.device)))

    input_ids = prompt_ids.to(target.device)[None]
    calls: list[tuple[int, int | None]] = []
    target.counter.reset()
    if assistant is not None:
        assistant.counter.reset()
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # assisted generation warns about settings we chose on purpose
    watch = Stopwatch(target.device)
    try:
        with (
            _counted(target, calls, watch),
            _counted(assistant) if assistant is not None else _nothing(),
            _constant_draft_length(assistant, k),
            torch.inference_mode(),
        ):
            output = target.model.generate(
                input_ids=input_ids, attention_mask=torch.ones_like(input_ids), **kwargs
            )
    finally:
        hf_logging.set_verbosity(verbosity)
    walltime, ttft = watch.stop()
    start = 0 if target.is_encoder_decoder else input_ids.shape[1]
    new = output[0, start:].tolist()
    if target.is_encoder_decoder and new and new[0] == target.model.config.decoder_start_token_id:
        new = new[1:]
    tokens, stopped = truncate_at_eos(new, eos_set(eos))
    prefix = 1 if target.is_encoder_decoder else input_ids.shape[1]
    speculative = assistant is not None or prompt_lookup
    steps = _steps(calls, prefix + len(tokens)) if speculative else [(0, 0)] * len(tokens)
    forwards = {target.name: target.counter.snapshot()}
    if assistant is not None:
        forwards[assistant.name] = assistant.counter.snapshot()
    return Generation(tokens, walltime, ttft, steps, forwards, stopped)


@contextmanager
def _nothing():
    yield
