"""Target replay: the target's recorded greedy output stands in for the target.

Under greedy decoding the target's output for a prompt is fixed: its autoregressive tokens
y_0 .. y_(L-1). A method whose target review is strict (speculative decoding with lenience 1, CS
Drafting, whose inner lenience never reaches the target) commits exactly these tokens, and the
review reads only argmax p at positions of that output. A grid of such cells therefore needs the
target once, as the CS Drafting authors counted target reviews without running the target:
:class:`ReplayTarget` answers each review with logits whose argmax at position i is y_i, and counts
the forward pass and the tokens a live :class:`~specbench.models.hf.HFModel` would have computed.
Counts, steps, output and so SWI equal a live run's; walltime does not (the target never runs).

Only a strict review is exact: a lenient one reads p beyond its argmax, and replayed (one-hot p) it
would silently act strict, so recipes allow ``replay`` only where the method declares its cell ``lossless``.

Past the end of y: when the AR output stopped at max_new_tokens, a lossless method never scores
there (each draft leaves room for the target's own token), so a request for it means the method was
not lossless, and it is an error, as is a committed prefix that is not y's. When the AR output
ended with an EOS y_(L-1), drafts may run on past it: the rows after the EOS then decide only how
many of those drafts count as accepted in ``steps`` (the output stops at the EOS), and only the
target knows them, so that review (the request's last: it accepts the EOS) runs the real target,
counted in ``live_passes``. Every other row past y is never read (a bonus token after the EOS, rows
after a rejected draft) and is left zero.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specbench.errors import SpecbenchError
from specbench.models.base import ForwardCounter, Pass
from specbench.models.hf import HFModel

# the logit of y_i in its row (the rest are 0): argmax y_i, and softmax one-hot even in float16
REPLAY_LOGIT = 1e4


class ReplayError(SpecbenchError):
    """The method asked the replayed target for something only a non-lossless method asks for."""


class ReplayTarget:
    """The live target ``live`` replayed from its greedy AR output ``reference`` for one prompt."""

    def __init__(self, live: HFModel, reference: Sequence[int], stopped_by_eos: bool):
        self.live = live
        self.name = live.name
        self.tokenizer = live.tokenizer
        self.num_parameters = live.num_parameters
        self.vocab_size = live.vocab_size
        self.device = live.device
        self.is_encoder_decoder = live.is_encoder_decoder
        self.counter = ForwardCounter()
        self.reference = torch.as_tensor(list(reference), dtype=torch.long, device=self.device)
        self.stopped_by_eos = stopped_by_eos
        self.live_passes = 0  # real target passes, for drafts past an EOS (module docstring)
        self.live_tie: int | None = None  # where a replay check's live run parted at a tie (measure.py)
        self._dtype = next(live.model.parameters()).dtype
        self._shadow: HFModel | None = None
        self._prompt: torch.Tensor | None = None
        self._prefix_len = 0  # positions in front of the generation: the prompt, or T5's start token
        self._cached = 0  # positions a live KV cache would hold (HFModel._cached)
        self._verified = 0  # generated positions checked against the reference

    def eos_token_ids(self) -> list[int]:
        return self.live.eos_token_ids()

    def start(self, prompt_ids: torch.Tensor) -> None:
        if prompt_ids.ndim != 1 or (prompt_ids.shape[0] == 0 and not self.is_encoder_decoder):
            raise ValueError(f"{self.name}: the prompt must be a non-empty 1-D tensor of token ids")
        if self.is_encoder_decoder:
            # HFModel encodes the prompt here, apart from decoder passes (no time: nothing runs)
            self.counter.end_encoder(None, prompt_ids.shape[0], self.device)
            self._prefix_len = 1
        else:
            self._prefix_len = prompt_ids.shape[0]
        self._prompt = prompt_ids
        self._cached = self._verified = 0

    def rollback(self, n_tokens: int) -> None:
        self._cached = min(self._cached, self._prefix_len + n_tokens)
        self._verified = min(self._verified, n_tokens)

    def score(self, tokens: torch.Tensor, n_candidates: int, hidden=()) -> Pass:
        """Logits ``[n_candidates + 1, V]``: row i is zero but for y at position ``first + i``."""
        if hidden:  # a replayed target computes no states; no method reads the target's
            raise ReplayError(
                f"replay of {self.name}",
                "the method reads the target's hidden states",
                "run it live (remove replay:)",
            )
        started = self.counter.begin(self.device)
        first = tokens.shape[0] - n_candidates  # the position row 0 predicts: the committed length
        self._check_prefix(tokens, first)
        rows = n_candidates + 1
        known = max(0, min(rows, self.reference.shape[0] - first))
        logits = torch.zeros(rows, self.vocab_size, dtype=self._dtype, device=self.device)
        logits[:known].scatter_(1, self.reference[first : first + known, None], REPLAY_LOGIT)
        if known < rows:
            logits = self._past_the_end(logits, tokens, n_candidates, first + known)
        # what HFModel.score feeds: the positions its cache lacks, up to the end of ``tokens``
        total = self._prefix_len + tokens.shape[0]
        keep = min(self._cached, total - n_candidates - 1)
        self.counter.end(started, total - keep, self.device, context=keep)
        self._cached = total
        return Pass(logits)

    def _check_prefix(self, tokens: torch.Tensor, first: int) -> None:
        """The committed tokens must be y's: replayed rows depend on the position, not the tokens."""
        end = self.reference.shape[0]
        if first > end or not torch.equal(
            tokens[self._verified : first], self.reference[self._verified : first]
        ):
            committed = tokens[:first].tolist()
            at = next(
                (
                    i
                    for i, (a, b) in enumerate(zip(committed, self.reference.tolist(), strict=False))
                    if a != b
                ),
                end,
            )
            raise ReplayError(
                f"replay of {self.name}",
                f"the method committed a token at position {at} that the target's greedy output does not "
                "have: it is not lossless, so the target cannot be replayed",
                "run this method live (remove replay:)",
            )
        self._verified = first

    def _past_the_end(
        self, logits: torch.Tensor, tokens: torch.Tensor, n_candidates: int, end: int
    ) -> torch.Tensor:
        if not self.stopped_by_eos:
            raise ReplayError(
                f"replay of {self.name}",
                f"the method scored position {end}, past the target's {end}-token output, which stopped "
                "at max_new_tokens: no lossless method does that",
                "run this method live (remove replay:)",
            )
        drafted_past_eos = tokens.shape[0] - end
        first = tokens.shape[0] - n_candidates
        if drafted_past_eos <= 0 or not torch.equal(tokens[first:end], self.reference[first:end]):
            return logits  # rows never read: a bonus token after the EOS, or rows after a rejection
        # the review accepts the EOS and goes on testing drafts after it: only the target knows how far
        if self._shadow is None:  # own cache and counter, shared weights: the live model is untouched
            self._shadow = HFModel(self.live.model, self.name, self.tokenizer)
        self._shadow.start(self._prompt)
        live = self._shadow.score(tokens, n_candidates).logits
        self.live_passes += 1
        replayed = live.clone()  # rows up to the EOS replayed as everywhere else, the rest the target's
        replayed[: end - first] = 0
        replayed[: end - first].scatter_(1, self.reference[first:end, None], REPLAY_LOGIT)
        return replayed
