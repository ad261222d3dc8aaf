"""Max-Gram / prompt lookup: a statistical drafter that copies from the context (cost 0).

Find the longest suffix of (prompt + generation) that occurred earlier in it, and propose the
tokens that followed its leftmost earlier occurrence (CS Drafting, Appendix A; prompt lookup
decoding). ``max_ngram`` caps the suffix length (HF's prompt lookup uses 2); ``None`` means
unbounded, as in Max-Gram. When nothing matches, or the copy is shorter than ``k``, an optional
``fill`` drafter completes the proposal (CS Drafting fills with a greedy bigram chain, see
``specbench.drafters.bigram.cs_drafting_maxgram``); the fill continues from the last copied token
(it sees the generation plus the copy), or from the last context token when nothing matched.

``longest_suffix_match`` extends the match one token per step (a loop per match length);
``longest_suffix_match_vectorised`` compares blocks of match lengths at once on the device and
is used on CUDA or with ``MaxGramDrafter(vectorised=True)``.
"""

from __future__ import annotations

import torch

from specbench.models.base import Draft, ForwardCounter
from specbench.models.sampling import SamplingParams


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


def longest_suffix_match_vectorised(
    sequence: torch.Tensor, max_ngram: int | None = None, block: int = 64
) -> tuple[int, int]:
    """Same result as ``longest_suffix_match``, computed without a Python loop per match length.

    For candidate end positions ``e < L-1`` and offsets ``t`` the comparison matrix
    ``s[e-t] == s[L-1-t]`` (``[candidates, block]``) is reduced with a cumulative product to the run
    length of equality with the reversed suffix. Offsets are taken ``block`` at a time and only
    candidates whose run spans the whole block go on, so memory stays O(L * block).
    """
    length = sequence.shape[0]
    if length < 2:
        return 0, -1
    cap = length - 1 if max_ngram is None else max(1, min(max_ngram, length - 1))
    device = sequence.device
    ends = torch.arange(length - 1, device=device)
    runs = torch.zeros(length - 1, dtype=torch.long, device=device)
    for first in range(0, cap, block):
        offsets = torch.arange(first, min(first + block, cap), device=device)
        left = ends[:, None] - offsets[None, :]
        equal = (sequence[left.clamp(min=0)] == sequence[length - 1 - offsets][None, :]) & (left >= 0)
        prefix = equal.to(torch.int32).cumprod(dim=1)
        runs[ends] += prefix.sum(dim=1).to(torch.long)
        ends = ends[prefix[:, -1].bool()]
        if ends.numel() == 0:
            break
    best = int(runs.max())
    if best == 0:
        return 0, -1
    end = int((runs == best).nonzero()[0, 0])  # the leftmost occurrence of the longest match
    return best, end - best + 1


class MaxGramDrafter:
    """Copy-from-context drafter; ``q`` is one-hot, and it costs nothing in every cost table."""

    num_parameters = 0

    def __init__(
        self,
        name: str = "prompt-lookup",
        max_ngram: int | None = None,
        max_copy: int | None = None,
        fill=None,
        vectorised: bool = False,
    ):
        self.name = name
        self.max_ngram = max_ngram
        self.max_copy = max_copy  # Max-Gram copies at most 10 tokens per call
        self.fill = fill
        self.vectorised = vectorised  # also used whenever the tokens live on CUDA
        self.counter = ForwardCounter()
        self._prompt = torch.empty(0, dtype=torch.long)

    def start(self, prompt_ids: torch.Tensor) -> None:
        self._prompt = prompt_ids.detach().reshape(-1)
        if self.fill is not None:
            self.fill.start(prompt_ids)

    def rollback(self, n_tokens: int) -> None:
        if self.fill is not None:
            self.fill.rollback(n_tokens)

    def propose(
        self, tokens: torch.Tensor, k: int, sampling: SamplingParams, generator: torch.Generator | None
    ) -> Draft:
        if k == 0:
            return Draft(tokens[:0], None)
        device = tokens.device
        vectorised = self.vectorised or device.type == "cuda"
        if vectorised:
            sequence = torch.cat([self._prompt.to(device), tokens])
            m, start = longest_suffix_match_vectorised(sequence, self.max_ngram)
        else:
            sequence = torch.cat([self._prompt.to("cpu"), tokens.to("cpu")])
            m, start = longest_suffix_match(sequence, self.max_ngram)
        take = k if self.max_copy is None else min(k, self.max_copy)
        copied = sequence[start + m : start + m + take] if m else sequence[:0]
        if self.fill is not None and copied.shape[0] < k:
            # the fill continues from the last copied token: it sees the generation plus the copy
            rest = self.fill.propose(
                torch.cat([tokens, copied.to(device)]), k - copied.shape[0], sampling, generator
            )
            copied = torch.cat([copied, rest.tokens.to(copied.device)])
        self.counter.forward_passes += 1  # a drafting call, cost 0; counted for completeness
        return Draft(copied.to(device), None)
