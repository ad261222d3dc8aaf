"""Medusa (Cai et al., ICML 2024): K heads on the target's last hidden state propose the next K tokens
at once, as a token tree the target verifies in one pass (:mod:`specbench.decoding.tree_speculative`).

Head k's distribution is the same for every node at depth k (Medusa-1's heads read only the state
that gave the last committed token), so the tree is the cartesian product of each head's top
``branch`` tokens, expanded at the ``frontier`` most probable nodes of each level and, greedy, cut to
the ``nodes`` most probable by the product of the heads' probabilities (Medusa's tree, with the
paths ranked by the heads' own probabilities instead of a calibration run). Greedy output is the
target's; sampled trees draw each node's children without replacement from the head's distribution
and are verified by recursive rejection sampling, so the target's law is kept (Medusa's own typical
acceptance is lossy, and not used here).

The heads' states come from the target's previous verification pass (the row of the last accepted
node), so the first step, which has none, verifies an empty tree (the prefill).
"""

from __future__ import annotations

import torch

from specbench.decoding import tree_speculative
from specbench.decoding.generation import Generation
from specbench.drafters.medusa import MedusaDrafter
from specbench.errors import SpecbenchError
from specbench.methods import Method, ParamSpec, Request, always
from specbench.models.base import LAST, Pass
from specbench.models.tree import TokenTree


class MedusaTreeDrafter:
    target_layers = (LAST,)
    fed_hidden = False

    def __init__(self, heads: MedusaDrafter):
        self.heads = heads
        self.name, self.counter = heads.name, heads.counter
        self._logits: torch.Tensor | None = None

    def start(self, prompt_ids: torch.Tensor) -> None:
        self.heads.start(prompt_ids)

    def root(self, tokens: torch.Tensor, last: Pass | None, accepted: list[int]) -> torch.Tensor | None:
        if last is None:
            return None
        started = self.counter.begin(self.heads.device)
        self._logits = self.heads.logits(last.hidden[LAST][accepted[-1]]).to(tokens.device)  # [K, V]
        self.counter.end(started, 1, self.heads.device)
        return self._logits[:1]

    def level(self, tokens: torch.Tensor, level: int, tree: TokenTree, expand: list[int]) -> torch.Tensor:
        return self._logits[level].expand(len(expand), -1)

    def rollback(self, n_tokens: int) -> None:
        pass


def _run(params: dict, target, drafter: MedusaDrafter, r: Request) -> Generation:
    heads = len(drafter.heads.blocks)
    if params["depth"] > heads:
        raise SpecbenchError(
            "params.depth",
            f"depth {params['depth']} needs {params['depth']} Medusa heads; {drafter.name} has {heads}",
            f"use depth <= {heads}, or train more heads",
        )
    return tree_speculative.run(params, target, MedusaTreeDrafter(drafter), r)


METHODS = (
    Method(
        "medusa",
        "Medusa (Cai et al. 2024): heads on the target's last hidden state propose a token tree, "
        "verified in one target pass",
        _run,
        {
            "depth": ParamSpec(int, 3, "levels of the tree: heads used (at most the heads trained)", 1, 16),
            "branch": ParamSpec(int, 3, "each head's candidates per node", 1, 32),
            "frontier": ParamSpec(int, 3, "nodes expanded at each level, the most probable paths", 1, 32),
            "nodes": ParamSpec(int, 24, "nodes the target verifies at most (greedy)", 1, 256),
        },
        needs_drafter=True,
        takes_heads="medusa",
        check=tree_speculative.check_tree,
        lossless=always,
        no_replay="the target scores token trees and hands its hidden states to the heads",
        draft_lengths=lambda params: (),
        tree_sizes=lambda params: tree_speculative.tree_sizes(params)[-1:],
        plan=tree_speculative.tree_passes(
            "target as speculative with k = depth (a lower bound, as for trees), each pass over up to "
            "`nodes` tokens; the heads: one evaluation per target pass",
            "one",
        ),
    ),
)
