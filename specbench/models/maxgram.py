"""Max-Gram / prompt lookup: a statistical drafter that copies from the context (cost 0).

Find the longest suffix of (prompt + generation) that occurred earlier in it, and propose the
tokens that followed its leftmost earlier occurrence (CS Drafting, Appendix A; prompt lookup
decoding). ``max_ngram`` caps the suffix length (HF's prompt lookup uses 2); ``None`` means
unbounded, as in Max-Gram. When nothing matches, or the copy is shorter than ``k``, an optional
``fill`` drafter completes the proposal (CS Drafting fills with a greedy bigram chain).
"""

from __future__ import annotations

import torch

from specbench.decoding.sampling import SamplingParams
from specbench.models.base import Draft, ForwardCounter


def longest_suffix_match(sequence: torch.Tensor, max_ngram: int | None = None) -> tuple[int, int]:
    """(match length m, start j) of the longest suffix ``s[L-m:]`` that also occurs at ``s[j:j+m]``
    with ``j + m < L`` (so a continuation exists), taking the leftmost such ``j``; (0, -1) if none.
    """
    length = sequence.shape[0]
    if length < 2:
        return 0, -1
    # candidates: end positions e < L-1 (e is the last index of the earlier occurrence)
    ends = torch.arange(length - 1, device=sequence.device)
    alive = sequence[:-1] == sequence[-1]
    best_m, best_end = 0, -1
    m = 1
    while bool(alive.any()):
        best_m, best_end = m, int(ends[alive][0])
        if max_ngram is not None and m >= max_ngram:
            break
        # extend the match one token to the left: s[e-m] == s[L-1-m], needs e-m >= 0
        if m >= length - 1:
            break
        shifted = torch.full_like(alive, False)
        shifted[m:] = sequence[: length - 1 - m] == sequence[length - 1 - m]
        alive = alive & shifted
        m += 1
    return best_m, (best_end - best_m + 1 if best_m else -1)


class MaxGramDrafter:
    """Copy-from-context drafter; ``q`` is one-hot, and it costs nothing in every cost table."""

    num_parameters = 0

    def __init__(
        self,
        name: str = "prompt-lookup",
        max_ngram: int | None = None,
        max_copy: int | None = None,
        fill=None,
    ):
        self.name = name
        self.max_ngram = max_ngram
        self.max_copy = max_copy  # Max-Gram copies at most 10 tokens per call
        self.fill = fill
        self.counter = ForwardCounter()
        self._prompt = torch.empty(0, dtype=torch.long)

    def start(self, prompt_ids: torch.Tensor) -> None:
        self._prompt = prompt_ids.detach().to("cpu")
        if self.fill is not None:
            self.fill.start(prompt_ids)

    def rollback(self, n_tokens: int) -> None:
        if self.fill is not None:
            self.fill.rollback(n_tokens)

    def propose(
        self, tokens: torch.Tensor, k: int, sampling: SamplingParams, generator: torch.Generator | None
    ) -> Draft:
        sequence = torch.cat([self._prompt, tokens.to("cpu")])
        m, start = longest_suffix_match(sequence, self.max_ngram)
        take = k if self.max_copy is None else min(k, self.max_copy)
        copied = sequence[start + m : start + m + take] if m else sequence[:0]
        if self.fill is not None and copied.shape[0] < k:
            rest = self.fill.propose(
                torch.cat([tokens.to("cpu"), copied]), k - copied.shape[0], sampling, generator
            )
            copied = torch.cat([copied, rest.tokens.to("cpu")])
        self.counter.forward_passes += 1  # a drafting call, cost 0; counted for completeness
        return Draft(copied.to(tokens.device), None)
