"""Turning logits into next-token distributions (temperature, top-k, top-p) and choosing tokens."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 means greedy (argmax)
    top_k: int = 0  # 0 disables
    top_p: float = 1.0  # 1 disables

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """The distribution the method samples from, row-wise over the last dimension.

        Greedy decoding returns the plain softmax (T = 1): it only feeds lenient acceptance rules.
        """
        if self.greedy:
            return torch.softmax(logits, dim=-1)
        logits = logits / self.temperature
        if self.top_k > 0 and self.top_k < logits.shape[-1]:
            kth = torch.topk(logits, self.top_k, dim=-1).values[..., -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        if self.top_p < 1.0:
            sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
            sorted_probs = torch.softmax(sorted_logits, dim=-1)
            # keep the smallest prefix whose mass reaches top_p (always at least the top token)
            mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
            drop_sorted = mass_before >= self.top_p
            drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
            logits = logits.masked_fill(drop, float("-inf"))
        return torch.softmax(logits, dim=-1)

    def choose(
        self, probs: torch.Tensor, logits: torch.Tensor, generator: torch.Generator | None
    ) -> torch.Tensor:
        """One token (0-d long tensor) from a single row: argmax when greedy, else a sample."""
        if self.greedy:
            return greedy_token(logits)
        return sample(probs, generator)


def greedy_token(logits: torch.Tensor) -> torch.Tensor:
    """The argmax over the last dimension (the first of tied maxima, as ``argmax``). ``max`` gives
    the same index but is vectorized where ATen's CPU ``argmax`` is not for bfloat16: 40 µs against
    180 µs on a 49k-token row, which made ~5% of a compiled SD step on CPU."""
    return logits.max(-1).indices


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Draw one token from a single probability row (0-d long tensor); no host sync."""
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
