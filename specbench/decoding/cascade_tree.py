"""CS Drafting's tree attention (Chen et al., NeurIPS 2024, "CS Drafting + Tree Attention", Table 3 and
Appendix B: "we limit it to only the lead node with the highest probability of having children ...
the number of children for each leading node being 8, while the other nodes have no children"). The
target's draft stays the cascade's chain (the leading nodes); before the target's review every chain
token gets up to ``tree_children`` - 1 siblings, the next candidates of the distribution it was drawn
from (the law its reviewer passes up: M_d1's row at that position), which are leaves. The target
scores chain and siblings in one pass under tree attention (:mod:`specbench.models.tree`) and keeps
the longest path its greedy walk (or recursive rejection sampling, for sampled drafts) accepts, plus
one token: a rejected chain token may so be replaced by a sibling. Greedy siblings are the next most
probable tokens; sampled ones are drawn without replacement after the chain token (Gumbel top-k over
the law without it), which is what the sampled walk needs to keep the target's law. Max-Gram's
tokens have a one-hot law, hence no siblings. At most ``tree_nodes`` nodes are verified: the chain
first (cut there if longer), then siblings from the first position on. Decoder-only targets only.
"""

from __future__ import annotations

import torch

from specbench.models.sampling import SamplingParams
from specbench.models.tree import ROOT, TokenTree


def sibling_tree(
    drafts: torch.Tensor,
    q: torch.Tensor | None,
    children: int,
    nodes: int,
    sampling: SamplingParams,
    generator: torch.Generator | None,
) -> TokenTree:
    """The target's chain ``drafts`` with up to ``children`` - 1 sibling leaves per chain token, drawn
    from the token's law ``q`` (module docstring), in at most ``nodes`` nodes. Node order: chain token
    i, then its siblings, for i = 0, 1, ...: the chain token of each depth is its first node."""
    chain = drafts[:nodes]
    c = chain.shape[0]
    if c == 0 or q is None:
        return TokenTree.chain(chain, None if sampling.greedy else q)
    laws = q[:c]
    rest = laws.scatter(1, chain[:, None], 0.0)  # the law without the chain token
    width = min(children - 1, rest.shape[-1] - 1)
    if sampling.greedy:
        ranked = torch.topk(rest, width, dim=-1).indices
    else:  # Gumbel top-k: draws without replacement from the law, after the chain token
        noise = -torch.log(-torch.log(torch.rand(rest.shape, generator=generator, device=rest.device)))
        ranked = torch.topk(torch.log(rest) + noise, width, dim=-1).indices
    drawable = (rest.gather(1, ranked) > 0).tolist()  # the tree's one host sync
    spare = nodes - c
    order, parents = [], []  # (row, column) of each node: column -1 is the chain token
    extra = [[j for j in range(width) if drawable[i][j]] for i in range(c)]
    for i in range(c):
        take = extra[i][:spare]
        spare -= len(take)
        extra[i] = take
    for i in range(c):
        parent = ROOT if i == 0 else len(order) - 1 - len(extra[i - 1])
        order.append((i, -1))
        parents.append(parent)
        for j in extra[i]:
            order.append((i, j))
            parents.append(parent)
    rows = torch.tensor([i for i, _ in order], device=chain.device)
    picked = torch.tensor([j for _, j in order], device=chain.device)
    tokens = torch.where(picked < 0, chain[rows], ranked[rows, picked.clamp(min=0)])
    return TokenTree(tokens, tuple(parents), None if sampling.greedy else laws[rows])


def chain_prefix(tree: TokenTree, path: list[int]) -> int:
    """How many nodes of the accepted ``path`` are chain tokens: a path leaves the chain at most once,
    into a sibling leaf, and the chain token of each depth is that depth's first node."""
    return sum(1 for node in path if tree.depths.index(tree.depths[node]) == node)
