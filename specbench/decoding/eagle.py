"""EAGLE (Li et al., ICML 2024) with EAGLE-2's dynamic draft tree (Li et al., EMNLP 2024): a head on the
target's features drafts a tree a level at a time, the target verifies it in one pass
(:mod:`specbench.decoding.tree_speculative`), and the head re-reads the committed positions with the
target's features from that pass.

The tree is EAGLE-2's: every expanded node gets its ``branch`` most probable children, the ``frontier``
nodes of highest path probability (the product of the head's probabilities along the path, EAGLE-2's
"value") are expanded at the next level, and, greedy, the ``nodes`` most valuable nodes are verified.
``branch: 1, frontier: 1`` is a chain (EAGLE-1's chain draft). Sampled trees draw children without
replacement and are verified by recursive rejection sampling, so the target's law is kept.

The head reads the target's features of the previous pass, so the first step, which has none,
verifies an empty tree (the prefill, whose features the head then reads whole).
"""

from __future__ import annotations

from specbench.decoding import tree_speculative
from specbench.methods import Method, ParamSpec, always

METHODS = (
    Method(
        "eagle",
        "EAGLE (Li et al. 2024): a head on the target's features drafts EAGLE-2's dynamic token tree "
        "(branch 1, frontier 1: a chain), verified in one target pass",
        tree_speculative.run,
        {
            "depth": ParamSpec(int, 5, "levels of the tree (the longest draft)", 1, 32),
            "branch": ParamSpec(int, 4, "children of each expanded node (1: a chain)", 1, 32),
            "frontier": ParamSpec(int, 4, "nodes expanded at each level, the most valuable paths", 1, 32),
            "nodes": ParamSpec(int, 16, "nodes the target verifies at most (greedy)", 1, 256),
        },
        needs_drafter=True,
        takes_heads="eagle",
        check=tree_speculative.check_tree,
        lossless=always,
        no_replay="the target scores token trees and hands its features to the head",
        draft_lengths=lambda params: (),
        tree_sizes=lambda params: tree_speculative.tree_sizes(params)[-1:],
        # 2: a greedy tree stops drafting once no deeper node can be kept (the same trees, fewer passes),
        # and ranks the head's draft vocabulary without full-vocabulary rows (the same trees up to rounding)
        revision=2,
        plan=tree_speculative.tree_passes(
            "target as speculative with k = depth (a lower bound, as for trees), each pass over up to "
            "`nodes` tokens; the head: depth passes per target pass (the committed positions, then a "
            "level each)",
            "depth",
        ),
    ),
)
