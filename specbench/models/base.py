"""The one small interface every verifier and drafter speaks.

A *language model* scores: given the tokens generated so far, the last ``n`` of which are
candidates, one forward pass returns a :class:`Pass`: the ``n + 1`` next-token logits (after the
committed prefix, after each candidate) and, when the caller asks, the hidden states of named layers
at those same positions (heads such as SpecDec++'s acceptance head, Medusa and EAGLE read them). It
keeps a KV cache and rolls it back on request.

A *drafter* proposes: given the tokens generated so far, it returns up to ``k`` candidate
tokens and the distributions ``q`` they were drawn from (``None`` for deterministic drafters
such as prompt lookup, whose ``q`` is one-hot).

Token sequences are 1-D ``LongTensor`` s of *generated* tokens only; each model receives the
prompt once in ``start`` and places it (decoder-only: before the generation; encoder-decoder:
in the encoder) itself.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import torch

from specbench.models.sampling import SamplingParams


@dataclass
class ForwardCounter:
    """Forward passes, tokens scored and wall time spent inside one model.

    It also keeps the passes' shapes, which a pass's cost depends on: for each number of tokens a
    pass fed, how many passes fed that many and the sum of the context (cached positions) they read
    (``specbench.pipeline.analysis.cost_model`` predicts walltime from them). An encoder pass is kept apart,
    under the key ``"encoder:<tokens>"``.

    The prompt's processing is timed apart too, so a pass's decoding cost can be read without it (on a
    730-token prompt the prefill is worth several decoding passes): ``prefill_passes`` counts the decoder
    passes that read no cache and fed more than one token, and ``prefill_seconds`` is their time plus
    the encoder's. A one-token pass on no cache (Medusa's heads, a one-token prompt) costs as a decoding
    pass and is not counted as prefill.

    On CUDA the time is taken with CUDA events and only read (synchronised) in ``snapshot``,
    so counting never adds a host-device sync to the decoding loop.
    """

    forward_passes: int = 0
    tokens_scored: int = 0
    encoder_passes: int = 0
    prefill_passes: int = 0
    _seconds: float = 0.0
    _prefill_seconds: float = 0.0
    _events: list = field(default_factory=list)
    shapes: dict = field(default_factory=dict)  # tokens fed (or "encoder:<tokens>") -> [passes, context sum]

    def reset(self) -> None:
        self.forward_passes = self.tokens_scored = self.encoder_passes = self.prefill_passes = 0
        self._seconds = self._prefill_seconds = 0.0
        self._events.clear()
        self.shapes = {}

    @contextlib.contextmanager
    def kept(self):
        """Passes run inside leave the counter as it was (measurements that are not the method's)."""
        saved = dataclasses.replace(
            self, _events=list(self._events), shapes={k: list(v) for k, v in self.shapes.items()}
        )
        try:
            yield
        finally:
            vars(self).update(vars(saved))

    def begin(self, device: torch.device) -> object:
        if device.type == "cuda":
            start = torch.cuda.Event(enable_timing=True)
            start.record()
            return start
        return time.perf_counter()

    def end(self, started: object, tokens: int, device: torch.device, context: int = 0) -> None:
        """A decoder pass that fed ``tokens`` after ``context`` cached positions has ended."""
        self.end_all(started, [(tokens, context)], device)

    def end_all(self, started: object, passes: list[tuple[int, int]], device: torch.device) -> None:
        """Decoder passes run as one unit (a replayed graph of several), each ``(tokens, context)``,
        have ended: their time is the unit's."""
        prefills = sum(1 for tokens, context in passes if context == 0 and tokens > 1)
        for tokens, context in passes:
            self.forward_passes += 1
            self.tokens_scored += tokens
            self._shape(tokens, context)
        self.prefill_passes += prefills
        self._stop(started, device, prefill=prefills > 0)

    def end_encoder(self, started: object | None, tokens: int, device: torch.device) -> None:
        """An encoder pass over ``tokens`` prompt positions has ended (counted apart from decoding;
        ``started`` None: a pass that took no time, a replayed one)."""
        self.encoder_passes += 1
        self._shape(f"encoder:{tokens}", 0)
        if started is not None:
            self._stop(started, device, prefill=True)

    def _shape(self, key, context: int) -> None:
        entry = self.shapes.setdefault(key, [0, 0])
        entry[0] += 1
        entry[1] += int(context)

    def _stop(self, started: object, device: torch.device, prefill: bool = False) -> None:
        if device.type == "cuda":
            stop = torch.cuda.Event(enable_timing=True)
            stop.record()
            self._events.append((started, stop, prefill))
        else:
            elapsed = time.perf_counter() - started
            self._seconds += elapsed
            self._prefill_seconds += elapsed if prefill else 0.0

    def _read_events(self) -> None:
        if self._events:
            self._events[-1][1].synchronize()
            for a, b, prefill in self._events:
                elapsed = a.elapsed_time(b) / 1000.0
                self._seconds += elapsed
                self._prefill_seconds += elapsed if prefill else 0.0
            self._events.clear()

    @property
    def seconds(self) -> float:
        self._read_events()
        return self._seconds

    @property
    def prefill_seconds(self) -> float:
        self._read_events()
        return self._prefill_seconds

    def snapshot(self) -> dict[str, float]:
        return {
            "forward_passes": self.forward_passes,
            "tokens_scored": self.tokens_scored,
            "encoder_passes": self.encoder_passes,
            "seconds": self.seconds,
            **(
                {"prefill_passes": self.prefill_passes, "prefill_seconds": self.prefill_seconds}
                if self.forward_passes or self.encoder_passes
                else {}
            ),
            **({"shapes": {str(k): list(v) for k, v in self.shapes.items()}} if self.shapes else {}),
        }


# A layer whose hidden states a pass returns: LAST, the final state the LM head reads (after the final
# norm), or i, the output of the first i decoder layers (0: the embeddings), as transformers'
# ``hidden_states[i]``; EAGLE-3 asks for a low, a middle and a high one.
Layer = int | str
LAST = "last"


@dataclass(frozen=True)
class Pass:
    """What one forward pass returns: ``logits[i]`` after the i-th scored position (the committed
    prefix's last token, then each candidate) and, for each layer the caller asked for, the hidden
    states at the same positions."""

    logits: torch.Tensor  # [n_candidates + 1, V]
    hidden: Mapping[Layer, torch.Tensor] = field(default_factory=dict)  # layer -> [n_candidates + 1, H]


def pick_hidden(states: Sequence[torch.Tensor], layers: Sequence[Layer], rows: slice, name: str) -> dict:
    """The requested layers' rows of a forward pass's ``hidden_states`` (embeddings, then each layer's
    output, the last one after the final norm)."""
    picked = {}
    for layer in layers:
        if layer == LAST:
            picked[layer] = states[-1][0, rows]
        elif isinstance(layer, int) and not isinstance(layer, bool) and 0 <= layer < len(states) - 1:
            picked[layer] = states[layer][0, rows]
        else:
            highest = len(states) - 2
            raise ValueError(
                f"{name}: no hidden layer {layer!r}; ask for {LAST!r} or a layer from 0 to {highest}"
            )
    return picked


@dataclass(frozen=True)
class Draft:
    """Candidate tokens ``x_1..x_k`` and, for sampled drafts, the rows ``q_1..q_k`` they came from."""

    tokens: torch.Tensor  # [k] long
    # [k, V] probabilities the tokens were drawn from (for greedy drafting: the softmax at T=1, used
    # only by lenient rules), or None when q is one-hot on ``tokens`` (statistical drafters).
    q: torch.Tensor | None

    def __len__(self) -> int:
        return self.tokens.shape[0]


@runtime_checkable
class LanguageModel(Protocol):
    name: str
    counter: ForwardCounter
    num_parameters: int
    vocab_size: int
    device: torch.device

    def start(self, prompt_ids: torch.Tensor) -> None:
        """Begin a new request (resets the cache; encoder-decoder models encode the prompt here)."""

    def score(self, tokens: torch.Tensor, n_candidates: int, hidden: Sequence[Layer] = ()) -> Pass:
        """One forward pass: logits ``[n_candidates + 1, V]`` after ``tokens[:-n]`` and each candidate,
        and the hidden states of the ``hidden`` layers at the same positions."""

    def rollback(self, n_tokens: int) -> None:
        """Forget cached state for generated positions ``>= n_tokens`` (they may be replaced)."""


@runtime_checkable
class Drafter(Protocol):
    name: str
    counter: ForwardCounter
    num_parameters: int  # 0 for statistical drafters (cost 0 in every cost table)

    def start(self, prompt_ids: torch.Tensor) -> None: ...

    def propose(
        self, tokens: torch.Tensor, k: int, sampling: SamplingParams, generator: torch.Generator | None
    ) -> Draft:
        """Up to ``k`` candidates continuing ``tokens`` (possibly fewer, possibly none).

        ``k`` may be 0 (one token left to generate): then an empty draft, and no pass is counted.
        """

    def rollback(self, n_tokens: int) -> None: ...


class ModelDrafter:
    """A neural drafter: a language model run autoregressively for ``k`` steps."""

    def __init__(self, model: LanguageModel):
        self.model = model
        self.name = model.name
        self.counter = model.counter
        self.num_parameters = model.num_parameters

    def start(self, prompt_ids: torch.Tensor) -> None:
        self.model.start(prompt_ids)

    def rollback(self, n_tokens: int) -> None:
        self.model.rollback(n_tokens)

    def propose(
        self, tokens: torch.Tensor, k: int, sampling: SamplingParams, generator: torch.Generator | None
    ) -> Draft:
        if k == 0:
            return Draft(tokens[:0], None)
        generated = tokens.shape[0]
        context = torch.empty(generated + k, dtype=torch.long, device=tokens.device)
        context[:generated] = tokens
        rows = []
        for i in range(k):
            # on another device than the caller's (a drafter on its own GPU), one row comes back per
            # token; the cache stays where the drafter is
            logits = self.model.score(context[: generated + i], 0).logits[-1].to(tokens.device)
            if sampling.greedy:  # the argmax needs no q: one softmax over all rows after the loop
                context[generated + i] = sampling.choose(None, logits, generator)
                rows.append(logits)
                continue
            q = sampling.probs(logits)
            context[generated + i] = sampling.choose(q, logits, generator)
            rows.append(q)
        q = torch.stack(rows)
        return Draft(context[generated:], sampling.probs(q) if sampling.greedy else q)
