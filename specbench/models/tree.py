"""Token trees: drafts that branch, verified by the target in one forward pass.

A :class:`TokenTree` holds ``N`` candidate tokens; node ``i`` continues its parent ``parents[i]``
(``-1``: the last committed token, the root), and parents come before their children. A model scores a
tree in one pass (:meth:`~specbench.models.hf.HFModel.score_tree`) with *tree attention*: node ``i``
attends to every committed position, to its ancestors and to itself, and sits at position
``committed + depth(i) - 1`` (SpecInfer, Miao et al., ASPLOS 2024; Medusa, Cai et al., ICML 2024).
The pass returns ``N + 1`` logits rows: row 0 after the root, row ``i + 1`` after node ``i``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import torch

ROOT = -1


@dataclass(frozen=True)
class TokenTree:
    tokens: torch.Tensor  # [N] long
    parents: tuple[int, ...]  # N parent indices, each < its node's index; ROOT for the root's children
    # [N, V] the distribution node i's token was drawn from (its parent's draft distribution), for
    # sampled trees; None for trees built greedily
    q: torch.Tensor | None = None
    depths: tuple[int, ...] = field(init=False, repr=False)

    def __post_init__(self):
        depths: list[int] = []
        for i, parent in enumerate(self.parents):
            if not ROOT <= parent < i:
                raise ValueError(f"node {i}: parent {parent} must be {ROOT} or an earlier node")
            depths.append(1 if parent == ROOT else depths[parent] + 1)
        if self.tokens.shape != (len(self.parents),):
            raise ValueError(f"{self.tokens.shape[0]} tokens for {len(self.parents)} parents")
        object.__setattr__(self, "depths", tuple(depths))

    def __len__(self) -> int:
        return len(self.parents)

    @property
    def depth(self) -> int:
        """The longest path's length (0 for an empty tree)."""
        return max(self.depths, default=0)

    @cached_property
    def host_tokens(self) -> list[int]:
        """The tokens as Python ints, read from the device once per tree."""
        return self.tokens.tolist()

    def token_list(self, nodes: list[int]) -> list[int]:
        return [self.host_tokens[i] for i in nodes]

    def children(self, node: int) -> list[int]:
        return [i for i, parent in enumerate(self.parents) if parent == node]

    def path(self, node: int) -> list[int]:
        """The nodes from the root's child down to ``node``."""
        path = []
        while node != ROOT:
            path.append(node)
            node = self.parents[node]
        return path[::-1]

    def visible(self, device=None) -> torch.Tensor:
        """``[N, N]`` bool: node i sees node j (j is i or one of its ancestors)."""
        n = len(self)
        seen = torch.eye(n, dtype=torch.bool)
        for i, parent in enumerate(self.parents):
            if parent != ROOT:
                seen[i] |= seen[parent]
        return seen.to(device)

    @classmethod
    def from_host(cls, tokens: list[int], parents: tuple[int, ...], device) -> TokenTree:
        """A tree built on the host (its tokens as Python ints, kept: no read back)."""
        tree = cls(torch.tensor(tokens, dtype=torch.long, device=device), parents)
        tree.__dict__["host_tokens"] = list(tokens)  # the cached_property's slot
        return tree

    @classmethod
    def chain(cls, tokens: torch.Tensor, q: torch.Tensor | None = None) -> TokenTree:
        """A chain draft as a tree (each token the child of the one before)."""
        return cls(tokens, tuple(range(-1, tokens.shape[0] - 1)), q)


def tree_attention(committed_new: int, cached: int, tree: TokenTree, dtype, device) -> torch.Tensor:
    """The additive 4D mask ``[1, 1, q, cached + q]`` of a pass that feeds ``committed_new`` committed
    tokens (causal) and then the tree's nodes (tree attention), after ``cached`` cached positions."""
    n = len(tree)
    q = committed_new + n
    allowed = torch.zeros(q, cached + q, dtype=torch.bool, device=device)
    allowed[:, :cached] = True
    block = slice(cached, cached + committed_new)
    allowed[:committed_new, block] = torch.ones(committed_new, committed_new, dtype=torch.bool).tril()
    allowed[committed_new:, block] = True  # every node sees every committed token
    allowed[committed_new:, cached + committed_new :] = tree.visible(device)
    return additive_mask(allowed, dtype)[None, None]


def additive_mask(allowed: torch.Tensor, dtype) -> torch.Tensor:
    """A boolean attention mask as the additive one every attention implementation reads (transformers'
    eager attention adds its mask to the scores; SDPA takes either): 0 where allowed, else dtype's
    lowest value."""
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(
        ~allowed, torch.finfo(dtype).min
    )


def tree_positions(committed_total: int, committed_new: int, tree: TokenTree, device) -> torch.Tensor:
    """``[1, q]`` position ids: the committed tokens' own, then ``committed_total - 1 + depth``."""
    first = committed_total - committed_new
    own = torch.arange(first, committed_total, device=device)
    depths = torch.tensor(tree.depths, dtype=torch.long, device=device)
    return torch.cat([own, committed_total - 1 + depths])[None]


def move_path_entries(layers, start: int, path: list[int], device) -> None:
    """Copy the KV entries of the tree nodes ``path`` (at ``start + node``) to ``start, start + 1, ...``
    in place, in every cache layer: the accepted path then follows the committed positions."""
    # a path that begins with nodes 0, 1, ... (a chain's, or the first children's) is already in place
    # that far: only the rest moves, and a path wholly in place costs no kernel at all
    moved = next((i for i, node in enumerate(path) if node != i), len(path))
    if moved == len(path):
        return
    where = torch.tensor([start + node for node in path[moved:]], device=device)
    for layer in layers:
        layer.keys[..., start + moved : start + len(path), :] = layer.keys.index_select(-2, where)
        layer.values[..., start + moved : start + len(path), :] = layer.values.index_select(-2, where)
