"""Speculative decoding with token trees: the drafter proposes a tree, the target verifies every node
in ONE forward pass under tree attention, and the longest accepted path plus one token is committed.

* **Drafting** (:func:`draft_tree`): a neural drafter grows the tree a depth at a time, one drafter
  pass per depth over the tree so far (tree attention in the drafter too). Every expanded node gets
  ``branch`` children; of the new depth's nodes, the ``frontier`` most probable by path probability
  (the product of the draft probabilities along the path, EAGLE-2's "value", Li et al., EMNLP 2024)
  are expanded next. Greedy: a node's children are its ``branch`` most probable tokens, and at the end
  the ``nodes`` most probable nodes are kept (EAGLE-2's reranking; the kept set holds every ancestor of
  a kept node). A child's path probability is at most its parent's, so once the best node to expand
  scores below the ``nodes``-th best node drafted, no deeper node can be kept and drafting stops: the
  same tree, without the drafter passes whose nodes the reranking would drop. Sampled: the children
  are drawn *without replacement* from the drafter's distribution (Gumbel top-k, in draw order) and
  no node is dropped afterwards, which is what the sampled rule below needs to be exact.
* **Greedy verification** (:func:`verify_greedy`): from the root, follow the child whose token is the
  target's greedy choice while one exists; the target's choice after the last followed node is the
  bonus. The output is the target's greedy output token for token.
* **Sampled verification** (:func:`verify_sampled`): recursive rejection sampling (Jeon et al.,
  "Recursive Speculative Decoding", 2024; SpecInfer's multi-step speculative sampling, Miao et al.,
  ASPLOS 2024, is the same walk for children drawn with replacement): at a node with target
  distribution p and children x_1, x_2, ... drawn without replacement from q, accept x_i with
  probability min(1, p(x_i) / q(x_i)); on rejection p <- norm(max(0, p - q)) and q <- q without x_i,
  renormalised; when no child is accepted, draw from p. The committed tokens follow the target's law.

Counts: a step is one target pass over the tree's nodes (plus the committed token the cache lacks);
``steps`` record (the tree's depth, the accepted path's length), the chain methods' (k, n).
"""

from __future__ import annotations

import torch

from specbench.decoding.generation import Generation, Stopwatch, eos_set, truncate_at_eos
from specbench.drafters.draft_vocab import full_vocabulary
from specbench.methods import Method, ParamSpec, PassRule, Request, always, chain_passes
from specbench.models.base import Pass
from specbench.models.hf import HFModel
from specbench.models.sampling import SamplingParams, greedy_token, sample
from specbench.models.tree import ROOT, TokenTree

RULE_GREEDY = "greedy tree walk"
RULE_SAMPLED = "recursive rejection sampling (Jeon et al. 2024)"


class ModelTreeDrafter:
    """A drafter model grows the tree: one pass at the root, then one tree pass per level."""

    target_layers: tuple = ()  # the target's hidden states it reads (none)
    fed_hidden = False  # whether it reads them at every position a pass fed (the prefill's too)

    def __init__(self, model: HFModel):
        self.model = model
        self.name, self.counter = model.name, model.counter

    def start(self, prompt_ids: torch.Tensor) -> None:
        self.model.start(prompt_ids)

    def root(self, tokens: torch.Tensor, last: Pass | None, accepted: list[int]) -> torch.Tensor:
        return self.model.score(tokens, 0).logits[-1:].to(tokens.device)

    def level(self, tokens: torch.Tensor, level: int, tree: TokenTree, expand: list[int]) -> torch.Tensor:
        logits = self.model.score_tree(tokens, tree).logits.to(tokens.device)
        self.model.rollback(tokens.shape[0])
        return logits[[i + 1 for i in expand]]

    def rollback(self, n_tokens: int) -> None:
        self.model.rollback(n_tokens)


def draft_tree(
    drafter,
    tokens: torch.Tensor,
    last: Pass | None,
    accepted: list[int],
    *,
    depth: int,
    branch: int,
    frontier: int,
    nodes: int,
    sampling: SamplingParams,
    generator: torch.Generator | None,
    stop_early: bool = True,
) -> TokenTree:
    """A draft tree of at most ``depth`` levels continuing the committed ``tokens`` (module docstring).

    ``drafter`` gives the next-token logits at the root (``root``: from the committed tokens, or from
    the target's ``last`` pass, whose hidden-state rows ``accepted`` are those of the positions it
    committed) and at the nodes it expands (``level``); None from ``root`` means it has nothing to
    draft from yet (an empty tree). ``stop_early=False`` drafts every level even where no deeper node
    can be kept (the same tree; the tests' reference)."""
    device = tokens.device
    empty = TokenTree(tokens[:0], ())
    if depth > 0 and sampling.greedy and getattr(drafter, "step_graph", False):  # the same tree in one go
        tree = drafter.greedy_tree(
            tokens, last, accepted, depth=depth, branch=branch, frontier=frontier, nodes=nodes
        )
        return empty if tree is None else tree
    root = drafter.root(tokens, last, accepted) if depth > 0 else None
    if root is None:
        return empty
    # A drafter with a draft vocabulary (``vocabulary``: the token of each logits column) scores only
    # those tokens; a greedy tree ranks them as they are (their softmax is the full row's, the others
    # being -inf), a sampled one needs full rows, the laws its children were drawn from.
    vocabulary = getattr(drafter, "vocabulary", None)

    def distributions(logits: torch.Tensor) -> torch.Tensor:
        if vocabulary is not None and not sampling.greedy:
            logits = full_vocabulary(logits, vocabulary, drafter.vocab_size)
        return sampling.probs(logits)

    # A level's nodes are kept as tensors (tokens, path probabilities, and the laws they were drawn
    # from), so a level costs a few kernels on a GPU rather than a few per node; the parents are Python.
    # [F, V]: the laws of the nodes being expanded (greedy: V is the draft vocabulary)
    rows = distributions(root)
    expand = [ROOT]
    path_probability = torch.ones(1, dtype=rows.dtype, device=device)  # of each node in expand
    parents: list[int] = []
    level_tokens: list[torch.Tensor] = []
    level_scores: list[torch.Tensor] = []
    level_laws: list[torch.Tensor] = []
    for level in range(depth):
        width = min(branch, rows.shape[-1])
        if sampling.greedy:
            picked = torch.topk(rows, width, dim=-1).indices  # [F, b], most probable first
        else:  # Gumbel top-k: b draws without replacement, in draw order
            noise = -torch.log(-torch.log(torch.rand(rows.shape, generator=generator, device=device)))
            picked = torch.topk(torch.log(rows) + noise, width, dim=-1).indices
        drawn = rows.gather(-1, picked)  # [F, b]
        children = [parent for parent in expand for _ in range(width)]
        new_tokens, scores = picked.flatten(), (path_probability[:, None] * drawn).flatten()
        if vocabulary is not None and sampling.greedy:
            new_tokens = vocabulary[new_tokens]
        laws = None if sampling.greedy else rows.repeat_interleave(width, dim=0)
        if not sampling.greedy:  # children a distribution cannot draw (probability 0) are no draws
            drawable = (drawn > 0).flatten().tolist()  # one transfer for the level
            if not all(drawable):
                keep = [i for i, ok in enumerate(drawable) if ok]
                children = [children[i] for i in keep]
                index = torch.tensor(keep, device=device)
                new_tokens, scores, laws = new_tokens[index], scores[index], laws[index]
        first = len(parents)
        parents.extend(children)
        level_tokens.append(new_tokens)
        level_scores.append(scores)
        if laws is not None:
            level_laws.append(laws)
        if level == depth - 1 or not children:
            break
        ranked = scores.topk(min(frontier, len(children))).indices
        path_probability = scores[ranked]
        if (
            stop_early
            and sampling.greedy
            and len(parents) >= nodes
            and bool(path_probability[0] < torch.cat(level_scores).topk(nodes).values[-1])
        ):
            break  # every deeper node scores below the nodes kept already: the same tree, fewer passes
        expand = [first + i for i in ranked.tolist()]
        tree = TokenTree(torch.cat(level_tokens), tuple(parents))
        rows = distributions(drafter.level(tokens, level + 1, tree, expand))
    if not parents:
        return empty
    node_tokens = torch.cat(level_tokens)
    laws = torch.cat(level_laws) if level_laws else None
    if sampling.greedy and len(parents) > nodes:
        best = set(torch.cat(level_scores).topk(nodes).indices.tolist())
        keep = sorted(best | {a for i in best for a in _ancestors(parents, i)})
        index = {old: new for new, old in enumerate(keep)}
        parents = [ROOT if parents[i] == ROOT else index[parents[i]] for i in keep]
        node_tokens = node_tokens[torch.tensor(keep, device=device)]
    return TokenTree(node_tokens, tuple(parents), laws)


def _ancestors(parents: list[int], node: int) -> list[int]:
    found = []
    while parents[node] != ROOT:
        node = parents[node]
        found.append(node)
    return found


def verify_greedy(tree: TokenTree, logits: torch.Tensor) -> tuple[list[int], int]:
    """(accepted path, next token): the target's greedy walk down the tree (one host sync)."""
    choice = greedy_token(logits).tolist()  # row 0 after the root, row i + 1 after node i
    tokens = tree.host_tokens
    path, node = [], ROOT
    while True:
        want = choice[node + 1]
        follow = next((c for c in tree.children(node) if tokens[c] == want), None)
        if follow is None:
            return path, want
        path.append(follow)
        node = follow


def verify_sampled(
    tree: TokenTree, p: torch.Tensor, generator: torch.Generator | None
) -> tuple[list[int], int]:
    """(accepted path, next token) by recursive rejection sampling (module docstring); ``p``: the
    target's distributions ``[N + 1, V]``, rows as in :meth:`score_tree`."""
    tokens = tree.host_tokens
    path, node = [], ROOT
    while True:
        target = p[node + 1]
        children = tree.children(node)
        if not children:
            return path, int(sample(target, generator))
        q = tree.q[children[0]]  # every child of a node was drawn from the node's one distribution
        accepted = None
        for child in children:
            x = tokens[child]
            u = torch.rand((), generator=generator, device=p.device)
            if bool(u * q[x] < target[x]):  # u < min(1, p(x) / q(x))
                accepted = child
                break
            residual = (target - q).clamp_min(0)
            target = residual / residual.sum() if residual.sum() > 0 else target
            q = q.clone()
            q[x] = 0
            if q.sum() <= 0:
                break
            q = q / q.sum()
        if accepted is None:
            return path, int(sample(target, generator))
        path.append(accepted)
        node = accepted


def verify(
    target: HFModel,
    committed: torch.Tensor,
    tree: TokenTree,
    sampling: SamplingParams,
    generator: torch.Generator | None,
    hidden: tuple = (),
    fed_hidden: bool = False,
) -> tuple[Pass, list[int], int]:
    """The target scores ``tree`` after the ``committed`` tokens in one pass (with the ``hidden``
    layers' states), walks it (greedy, or recursive rejection sampling) and keeps the accepted path's
    cache: (the pass, the accepted path, the next token)."""
    last = target.score_tree(committed, tree, hidden, fed_hidden)
    if sampling.greedy:
        path, next_token = verify_greedy(tree, last.logits)
    else:
        path, next_token = verify_sampled(tree, sampling.probs(last.logits), generator)
    target.keep_path(path)
    return last, path, next_token


def generate(
    target: HFModel,
    drafter,
    prompt_ids: torch.Tensor,
    *,
    depth: int,
    branch: int,
    frontier: int,
    nodes: int,
    max_new_tokens: int,
    sampling: SamplingParams = SamplingParams(),
    eos_token_id=None,
    generator: torch.Generator | None = None,
) -> Generation:
    """Tree speculative decoding; ``drafter``: an HFModel, or a tree drafter (:class:`ModelTreeDrafter`,
    Medusa's heads) that may read the target's hidden states (``target_layers``)."""
    if isinstance(drafter, HFModel):
        drafter = ModelTreeDrafter(drafter)
    eos = eos_set(eos_token_id)
    target.counter.reset()
    drafter.counter.reset()
    watch = Stopwatch(target.device)
    target.start(prompt_ids)
    drafter.start(prompt_ids)
    out = torch.empty(max_new_tokens + depth + 1, dtype=torch.long, device=target.device)
    tokens: list[int] = []
    steps: list[tuple[int, int]] = []
    generated, stopped = 0, False
    last, accepted = None, []  # the target's previous pass, and its rows at the positions it committed
    while generated < max_new_tokens and not stopped:
        budget = min(depth, max_new_tokens - generated - 1)  # the step's +1 token must fit too
        committed = out[:generated]
        tree = draft_tree(
            drafter,
            committed,
            last,
            accepted,
            depth=budget,
            branch=branch,
            frontier=frontier,
            nodes=nodes,
            sampling=sampling,
            generator=generator,
        )
        last, path, next_token = verify(
            target, committed, tree, sampling, generator, drafter.target_layers, drafter.fed_hidden
        )
        accepted = accepted_rows(last, tree, path)
        if path:
            out[generated : generated + len(path)] = tree.tokens[path]
        out[generated + len(path)] = next_token
        new = [*tree.token_list(path), next_token]
        drafter.rollback(generated)
        new, stopped = truncate_at_eos(new, eos)
        steps.append((tree.depth, len(path)))
        tokens.extend(new)
        generated += len(path) + 1
        watch.mark_first_token()
    walltime, ttft = watch.stop()
    forwards = {target.name: target.counter.snapshot(), drafter.name: drafter.counter.snapshot()}
    return Generation(tokens, walltime, ttft, steps, forwards, stopped)


def accepted_rows(last: Pass, tree: TokenTree, path: list[int]) -> list[int]:
    """The rows of ``last``'s hidden states at the positions it committed: the committed tokens the
    pass fed (one, or the prefill's), then the accepted path's nodes."""
    rows = next(iter(last.hidden.values())).shape[0] if last.hidden else len(tree) + 1
    committed = rows - len(tree)
    return [*range(committed), *(committed + node for node in path)]


def run(params: dict, target: HFModel, drafter, r: Request) -> Generation:
    """A tree cell's run: ``drafter`` a model or a tree drafter (Medusa's or EAGLE's heads)."""
    return generate(
        target,
        drafter,
        r.prompt_ids,
        depth=params["depth"],
        branch=params["branch"],
        frontier=params["frontier"],
        nodes=params["nodes"],
        **r.decoding(),
    )


def tree_sizes(params: dict) -> tuple[int, ...]:
    """The node counts of a step's tree passes: the drafter's at each level (every node so far), the
    target's (at most ``nodes`` when greedy; a sampled tree keeps all)."""
    sizes, total = [], 0
    for level in range(params["depth"]):
        total += params["branch"] * (1 if level == 0 else params["frontier"])
        sizes.append(total)
    return (*sizes[:-1], min(params["nodes"], total)) if len(sizes) > 1 else (min(params["nodes"], total),)


def check_tree(params: dict, spec, generation) -> tuple[str, str, str] | None:
    """``nodes`` bounds every tree the target verifies (the compiled engine compiles that pass size):
    at least one path of ``depth`` nodes, and, sampled, every node drafted (no node is dropped)."""
    if params["nodes"] < params["depth"]:
        return "nodes", f"nodes {params['nodes']} is below depth {params['depth']}", "use nodes >= depth"
    drafted = tree_sizes(params | {"nodes": 10**9})[-1]
    if generation.temperature > 0 and drafted > params["nodes"]:
        return (
            "nodes",
            f"a sampled tree keeps all {drafted} nodes it drafts (depth {params['depth']}, branch "
            f"{params['branch']}, frontier {params['frontier']}), more than nodes {params['nodes']}",
            f"use nodes >= {drafted}, or a smaller branch, frontier or depth",
        )
    return None


def tree_passes(text: str, drafter_passes: str) -> PassRule:
    """A tree method's plan: the target as speculative decoding with k = depth (a tree accepts at least
    what its best chain would, so E is a lower bound), and its drafter's passes per target pass:
    ``"depth"`` or ``"one"``."""

    def passes(params: dict, tokens: float, alpha: float) -> tuple[list, int]:
        k = params["depth"]
        return chain_passes(tokens, alpha, k, (k if drafter_passes == "depth" else 1,)), k

    return PassRule(text, passes)


METHODS = (
    Method(
        "tree_speculative",
        "speculative decoding with a token tree from a neural drafter, verified in one target pass "
        "(greedy: EAGLE-2's dynamic tree; sampled: recursive rejection sampling)",
        run,
        {
            "depth": ParamSpec(int, 4, "levels of the tree (the longest draft)", 1, 32),
            "branch": ParamSpec(int, 2, "children of each expanded node", 1, 16),
            "frontier": ParamSpec(int, 2, "nodes expanded at each level, the most probable paths", 1, 16),
            "nodes": ParamSpec(
                int,
                16,
                "nodes the target verifies at most (greedy: the most probable; sampled trees "
                "keep every node, so nodes must cover them)",
                1,
                256,
            ),
        },
        needs_drafter=True,
        neural_drafter_only=True,
        check=check_tree,
        lossless=always,
        no_replay="the target scores token trees, which a replay of its output cannot",
        draft_lengths=lambda params: (),
        tree_sizes=tree_sizes,
        # 2: a greedy tree stops drafting once no deeper node can be kept (the same trees, fewer passes)
        revision=2,
        plan=tree_passes(
            "target as speculative with k = depth (a tree accepts at least what its best "
            "chain would: E is a lower bound), each pass over up to `nodes` tokens; drafter: depth "
            "passes per target pass, over the tree so far",
            "depth",
        ),
    ),
)
