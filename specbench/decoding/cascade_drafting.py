"""Cascade Speculative Drafting (Chen et al., NeurIPS 2024, Algorithm 1), greedy and sampled.

Models: the target M_t, neural drafters M_d1 (largest) ... M_dn (smallest), and a statistical
drafter MaG at the bottom (Max-Gram, Sec. 3.3: q is one-hot, cost 0). Level r is the draft that
``models[r]`` reviews (r = 0: M_t, r >= 1: M_dr); M_d(r+1) ... M_dn draft it, and MaG alone drafts
level n, the one M_dn reviews.

K is n x n and upper-triangular, in the paper's cumulative convention: row r belongs to the level
of reviewer r, and K[r][c] (c >= r) is the draft length up to which M_d(c+1) drafts there (the paper's
k_(r+1)(c+1)). The reference code stores increments instead (its K[0][1] is k12 - k11); see
``cumulative_from_increments``. Stopping rule of a level with reviewer r whose draft may hold at most
``room`` tokens:

    x = []
    for c = r .. n-1:                            # horizontal cascade (Sec. 3.2)
        while len(x) < min(K[r][c], room):
            x += block of M_d(c+1)               # vertical cascade (Sec. 3.1)
    while len(x) < min(K[r][n-1] + mag_tail, room):
        x += min(mag_tokens, room - len(x)) MaG tokens   # MaG, the last column
    reviewer r scores x in ONE forward pass, keeps an accepted prefix and adds one token

A block of M_d(c+1) is M_d(c+1) reviewing the draft of its own level (room: room - len(x) - 1), so
it adds accepted + 1 tokens; the level of M_dn drafts min(mag_tokens, room) MaG tokens (the reference
always asks for 10; its Max-Gram, ``variant: reference``, returns 10 to 19, which are taken while they
fit in room). ``mag_tail`` is the budget of the reference code's Max-Gram column of K (10 there):
Algorithm 1's horizontal loop runs over every drafter, MaG last, with the same rule as every other
column (lfsszd/CS-Drafting, csd.py: ``while len(draft) < sum(ks[:i + 1])``). So MaG tokens that no
neural drafter reviewed end a level's draft only while it is shorter than K[r][n-1] + mag_tail; neural
blocks that overshoot that budget skip MaG (0 switches MaG's column off). Budgets K may therefore be
overshot, as in the reference code; ``room`` never is (the reference has no such cap and drafts past
max_length): the target's draft holds at most max_new_tokens - generated - 1 tokens (its own +1 must
fit), so the output never exceeds max_new_tokens and no model scores a position past it.

Lenience l >= 1 (Sec. 3.1, CS convention of ``acceptance``) loosens every review but the target's,
which is strict. ``mag_lenience=False`` also keeps M_dn's review of MaG's drafts strict, as Appendix
B's text says ("we also avoid lenience between MaG and its reviewer"); the authors' code applies
lenience there too, as the default ``True`` does. MaG tail tokens of upper levels share their level's
lenience (tests/test_cascade_drafting_rules.py pins both readings);
greedy output is therefore the target's greedy output token for token. Each review
returns, with its tokens, the exact distribution each token was drawn from, which the level above
tests as its q (MaG's is one-hot): the reviewer's p at l = 1, and at l > 1 the lenient rule's output

    L = min(q, l p) + (1 - sum min(q, l p)) * norm(max(0, p - q / l))       (``review_law``)

at a drafted position, p at the bonus position. So the target's strict review reproduces its own
distribution exactly whatever the inner lenience. Greedy decoding passes the reviewer's softmax
instead (as ``ModelDrafter`` does); only lenient greedy tests read it.

``reference_compat=True`` (greedy only, for comparison) reproduces what the reference code
(lfsszd/CS-Drafting, csd.py and model.py) hands the lenient test. ``_csd_iteration`` passes its
reviewer ``new_probs``, the rows returned by the LAST block only, and ``review`` returns the rows it
was given up to the block's first token followed by its own rows one position late
(``probs[:, :review_index]`` + ``target_probs[:, :i + 1]``). Every token of a level is thus tested
as if one-hot (q(x) = 1: kept iff it is the argmax or l p(x) >= 1), except token j >= 1 of the last
block, tested against that block's reviewer's distribution at position j - 1. The reference decodes
greedily only; sampled, these rows depend on the drafted tokens themselves (and on the blocks after
them), so no exact law could be passed up, and ``generate`` refuses the combination.

**Tree attention** (``tree_children`` > 1; the paper's "CS Drafting + Tree Attention", Table 3 and
Appendix B): :mod:`specbench.decoding.cascade_tree`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specbench.decoding import theory, tree_speculative
from specbench.decoding.acceptance import greedy_accept, speculative_accept
from specbench.decoding.cascade_roles import cascade_roles_problem
from specbench.decoding.cascade_tree import chain_prefix, sibling_tree
from specbench.decoding.generation import Generation, Stopwatch, commit, eos_set, truncate_at_eos
from specbench.methods import Method, ParamSpec, PassRule, Request, always, chain_passes
from specbench.models.base import Drafter, LanguageModel
from specbench.models.sampling import SamplingParams


def cumulative_from_increments(K: Sequence[Sequence[int]]) -> list[list[int]]:
    """The reference code's K (row r: increments from the diagonal on) in the paper's cumulative form."""
    return [[sum(row[r : c + 1]) if c >= r else 0 for c in range(len(row))] for r, row in enumerate(K)]


def increments_from_cumulative(K: Sequence[Sequence[int]]) -> list[list[int]]:
    """The paper's cumulative K in the reference code's increment form (inverse of the above)."""
    return [
        [row[c] - (row[c - 1] if c > r else 0) if c >= r else 0 for c in range(len(row))]
        for r, row in enumerate(K)
    ]


def review_law(q: torch.Tensor, p: torch.Tensor, lenience: float) -> torch.Tensor:
    """Row-wise law of the token a lenient review (``speculative_accept``) emits at a drafted position:

        min(q, l p) + (1 - sum min(q, l p)) * norm(max(0, p - q / l))

    The draft x ~ q is kept with probability min(1, l p(x) / q(x)), which gives the first term; a
    rejection, of probability 1 - sum min(q, l p), draws from the residual (p where it is empty, as
    ``speculative_accept`` does). At l = 1 it is p: sum max(0, p - q) = 1 - sum min(q, p).
    """
    q = q.to(p.dtype)
    kept = torch.minimum(q, lenience * p)
    residual = (p - q / lenience).clamp(min=0.0)
    total = residual.sum(-1, keepdim=True)
    residual = torch.where(total > 0, residual / total.clamp(min=torch.finfo(p.dtype).tiny), p)
    return kept + (1.0 - kept.sum(-1, keepdim=True)) * residual


def generate(
    target: LanguageModel,
    drafters: Sequence[LanguageModel],
    mag: Drafter,
    prompt_ids: torch.Tensor,
    *,
    K: Sequence[Sequence[int]],
    max_new_tokens: int,
    sampling: SamplingParams = SamplingParams(),
    eos_token_id=None,
    generator: torch.Generator | None = None,
    lenience: float = 1.0,
    mag_tokens: int = 10,
    mag_tail: int = 10,
    mag_lenience: bool = True,
    reference_compat: bool = False,
    tree_children: int = 1,
    tree_nodes: int = 32,
) -> Generation:
    """CS Drafting with neural ``drafters`` (largest first), the statistical ``mag`` at the bottom and
    the cumulative budget matrix ``K``; ``lenience`` (l >= 1) applies to the drafters' reviews only;
    ``tree_children`` > 1 verifies the target's draft as a tree (module docstring).

    ``Generation.steps`` holds the target's reviews; ``inner_steps`` every drafter's, by name.
    """
    n = len(drafters)
    _check(K, n, lenience, mag_tokens, reference_compat, sampling, mag_tail)
    if tree_children > 1 and (reference_compat or tree_nodes < 1):
        raise ValueError("tree attention needs tree_nodes >= 1 and reference_compat off")
    models = [target, *drafters]  # models[r] reviews level r
    everyone = (*models, mag)
    eos = eos_set(eos_token_id)
    for model in everyone:
        model.counter.reset()
    watch = Stopwatch(target.device)
    for model in everyone:
        model.start(prompt_ids)

    out = torch.empty(max_new_tokens, dtype=torch.long, device=target.device)
    inner_steps: dict[str, list[tuple[int, int]]] = {model.name: [] for model in drafters}

    def rollback(length: int) -> None:
        # a review keeps out[:length]; lower levels may have cached the rejected tokens after it
        for model in everyone:
            model.rollback(length)

    def past_k(room: int) -> dict:
        # the reference Max-Gram's drafts run past k (up to 2k - 1 tokens): take them while they fit
        return {"limit": room} if getattr(mag, "drafts_past_k", False) else {}

    def draft(r: int, g: int, room: int):
        """Level r's draft written to out[g : g + d], d <= room: (d, q rows or None for one-hot, last
        block as (offset, its reviewer's rows at its accepted tokens) for ``reference_compat``)."""
        if r == n:  # the statistical drafter alone
            if room == 0:
                return 0, None, None
            x = mag.propose(out[:g], min(mag_tokens, room), sampling, generator, **past_k(room))
            out[g : g + len(x)] = x.tokens
            return len(x), None, None
        d, qs, last = 0, [], None
        for c in range(r, n):
            while d < min(K[r][c], room):
                m, rows, p_accepted = review(c + 1, g + d, room - d)
                qs.append(rows)
                last = (d, p_accepted)
                d += m
        # Max-Gram is the last column of the horizontal cascade, with its own budget: it drafts only
        # while the level's draft is shorter than K[r][n-1] + mag_tail, so neural blocks that already
        # overshot that budget leave no room for it (the reference's loop over every column of K)
        budget = min(K[r][n - 1] + mag_tail, room) if mag_tail else 0
        while d < budget:
            x = mag.propose(out[: g + d], min(mag_tokens, room - d), sampling, generator, **past_k(room - d))
            if not len(x):
                break
            out[g + d : g + d + len(x)] = x.tokens
            qs.append(_one_hot(x.tokens, qs[-1]))
            d, last = d + len(x), None
        return d, (torch.cat(qs) if qs else None), last

    def review(r: int, g: int, room: int):
        """Drafter models[r] reviews its level's draft after out[:g] and writes accepted + 1 <= room
        tokens: (accepted + 1, their q rows, its rows at the accepted tokens)."""
        d, q, last = draft(r, g, room - 1)
        drafts = out[g : g + d]
        p = sampling.probs(models[r].score(out[: g + d], d).logits)
        rows = p  # the law of each emitted token (module docstring)
        l_r = lenience if (mag_lenience or r < n) else 1.0
        if sampling.greedy:
            tested = _reference_rows(drafts, p, last) if reference_compat else q
            verdict = greedy_accept(drafts, tested, p, lenience=l_r)
        else:
            verdict = speculative_accept(drafts, q, p, generator, lenience=l_r)
            if l_r != 1.0:  # before out[] changes below: drafts is a view of it
                q = _one_hot(drafts, p) if q is None else q
                rows = torch.cat([review_law(q, p[:d], l_r), p[d:]])
        accepted = int(verdict.n_accepted)  # the one host sync of an inner review
        out[g + accepted] = verdict.next_token
        rollback(g + accepted)
        inner_steps[models[r].name].append((d, accepted))
        return accepted + 1, rows[: accepted + 1], p[:accepted]

    tokens: list[int] = []
    steps: list[tuple[int, int]] = []
    generated = 0
    stopped = False
    while generated < max_new_tokens and not stopped:
        d, q, _ = draft(0, generated, max_new_tokens - generated - 1)
        drafts = out[generated : generated + d]
        if tree_children > 1:
            tree = sibling_tree(drafts, q, tree_children, tree_nodes, sampling, generator)
            _, path, next_token = tree_speculative.verify(target, out[:generated], tree, sampling, generator)
            new = [*tree.token_list(path), next_token]
            out[generated : generated + len(new)] = torch.tensor(new, device=out.device)
            d, accepted = tree.depth, len(path)
            for model in everyone[1:]:  # the drafters cached the chain up to where the path left it
                model.rollback(generated + chain_prefix(tree, path))
        else:
            logits = target.score(out[: generated + d], d).logits
            if sampling.greedy:  # strict, on raw logits: its argmax is exactly autoregressive greedy's
                verdict = greedy_accept(drafts, None, logits)
            else:  # strict: the output follows the target's own distribution
                verdict = speculative_accept(drafts, q, sampling.probs(logits), generator)
            accepted, new = commit(verdict, drafts, out, generated)
            rollback(generated + accepted)
        new, stopped = truncate_at_eos(new, eos)
        steps.append((d, accepted))
        tokens.extend(new)
        generated += accepted + 1
        watch.mark_first_token()
    walltime, ttft = watch.stop()
    forwards = {model.name: model.counter.snapshot() for model in everyone}
    return Generation(tokens, walltime, ttft, steps, forwards, stopped, inner_steps)


def _reference_rows(drafts: torch.Tensor, p: torch.Tensor, last) -> torch.Tensor:
    """The rows the reference code's lenient test reads (module docstring): one-hot on the drafts,
    but token j >= 1 of the last block gets that block's reviewer's row j - 1."""
    rows = _one_hot(drafts, p)
    if last is not None:
        start, p_block = last
        rows[start + 1 : start + 1 + p_block.shape[0]] = p_block
    return rows


def _one_hot(tokens: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """One-hot rows like p's (F.one_hot would check the ids' range: a host sync on CUDA)."""
    return torch.zeros(tokens.shape[0], p.shape[-1], dtype=p.dtype, device=p.device).scatter_(
        1, tokens[:, None], 1.0
    )


def _check(
    K, n: int, lenience: float, mag_tokens: int, reference_compat: bool, sampling, mag_tail: int
) -> None:
    if n < 1:
        raise ValueError("CS Drafting needs at least one neural drafter above the statistical one")
    if len(K) != n or any(len(row) != n for row in K):
        raise ValueError(f"K must be {n} x {n} (one row and column per neural drafter), got {K}")
    for r, row in enumerate(K):
        budgets = list(row[r:])
        if budgets[0] < 1 or any(b < a for a, b in zip(budgets, budgets[1:], strict=False)):
            raise ValueError(f"row {r} of the cumulative K must be >= 1 and non-decreasing, got {row}")
    if lenience < 1.0:
        raise ValueError(f"CS Drafting lenience must be >= 1, got {lenience}")
    if mag_tokens < 1 or mag_tail < 0:
        raise ValueError(f"mag_tokens must be >= 1 and mag_tail >= 0, got {mag_tokens}, {mag_tail}")
    if reference_compat and not sampling.greedy:
        raise ValueError("reference_compat reproduces the reference code, which decodes greedily only")


def _check_K(params: dict, spec, generation) -> tuple[str, str, str] | None:
    """reference_compat decodes greedily only; K is n x n for the n neural drafters, upper-triangular,
    budgets >= 1 on the diagonal, and cumulative rows never decrease (so increments past the diagonal
    are >= 0)."""
    if params["tree_children"] > 1 and params["reference_compat"]:
        return (
            "tree_children",
            "tree attention changes what the target reviews, which reference_compat reproduces as chains",
            "set tree_children: 1, or reference_compat: false",
        )
    if params["reference_compat"] and generation.temperature > 0:
        return (
            "reference_compat",
            "reference_compat reproduces the reference code, which decodes greedily only",
            "set generation.temperature: 0, or reference_compat: false",
        )
    K, cumulative = params["K"], params["k_convention"] == "cumulative"
    n = len(spec.drafters) - 1
    example = [[0] * r + [2 * (c - r + 1) if cumulative else 2 for c in range(r, n)] for r in range(n)]
    shape = f"write {n} rows of {n} integers, one row and column per neural drafter, e.g. {example}"
    if K is None:
        return "K", "cs_drafting needs K, the budget matrix of its cascade", shape
    if not all(isinstance(row, list) and all(type(x) is int for x in row) for row in K):
        return "K", f"K = {K} is not a list of rows of integers", shape
    if len(K) != n or any(len(row) != n for row in K):
        neural = ", ".join(spec.drafters[:-1])
        return "K", f"K = {K} is not {n} x {n}, for {n} neural drafters ({neural})", shape
    for r, row in enumerate(K):
        for c, value in enumerate(row):
            at = f"K[{r}][{c}] = {value} (k{r + 1}{c + 1})"
            if c < r and value != 0:
                return "K", f"{at} lies below the diagonal of K = {K}", "K is upper-triangular: write 0 there"
            least = 1 if cumulative or c == r else 0
            if c >= r and value < least:
                fix = (
                    "use budgets >= 1"
                    if cumulative
                    else "use >= 1 on the diagonal and increments >= 0 after it"
                )
                return "K", f"{at} is below {least} in K = {K}", fix
            if cumulative and c > r and value < row[c - 1]:
                return (
                    "K",
                    f"{at} < K[{r}][{c - 1}] = {row[c - 1]}: row {r} of the cumulative K = {K} decreases",
                    "make each row non-decreasing, or set k_convention: increment if the rows are increments",
                )
    return None


def _run(params: dict, target: LanguageModel, drafters: list, r: Request) -> Generation:
    *neural, mag = drafters
    K = params["K"]
    if params["k_convention"] == "increment":
        K = cumulative_from_increments(K)
    return generate(
        target,
        neural,
        mag,
        r.prompt_ids,
        K=K,
        lenience=params["lenience"],
        mag_tokens=params["mag_tokens"],
        mag_tail=params["mag_tail"],
        mag_lenience=params["mag_lenience"],
        reference_compat=params["reference_compat"],
        tree_children=params["tree_children"],
        tree_nodes=params["tree_nodes"],
        **r.decoding(),
    )


def _draft_lengths(params: dict) -> tuple[int, ...]:
    """Each level's budget (its row of K, in the paper's cumulative convention) plus Max-Gram's tail:
    the longest draft a review usually holds (an overshooting Max-Gram call may exceed it)."""
    rows = params["K"] or []
    if params["k_convention"] == "increment":
        budgets = [sum(row) for row in rows]
    else:
        budgets = [max(row, default=0) for row in rows]
    return tuple(sorted({b + params["mag_tail"] for b in budgets if b + params["mag_tail"] > 0}))


def _passes(params: dict, tokens: float, alpha: float) -> tuple[list, int]:
    row = list(params["K"][0])
    budgets = row if params["k_convention"] != "increment" else [sum(row[: i + 1]) for i in range(len(row))]
    return chain_passes(tokens, alpha, budgets[-1], tuple(budgets)), budgets[-1]


PASSES = PassRule(
    "target as speculative with k = K[0][-1]; neural drafter c: K[0][c] passes per "
    "target pass (an upper bound: the vertical cascade writes part of them); with tree_children > 1 each "
    "target pass is over up to `tree_nodes` tokens",
    _passes,
)


def _theory(rows: list[dict], iid: bool) -> theory.Expectation | None:
    """Theorems 4.3/4.5 for the K-matrix rule, from the acceptance of every reviewer the cell measured;
    None for a cell that verifies trees (the theorems price chains)."""
    first = rows[0]
    params = first["params"]
    if not first.get("drafters") or int(params.get("tree_children", 1)) > 1:
        return None
    K = params["K"]
    if params.get("k_convention") == "increment":
        K = cumulative_from_increments(K)
    names = first["drafters"]
    steps = [s for r in rows for s in r["steps"]]
    inner = {m: [s for r in rows for s in r.get("inner_steps", {}).get(m, [])] for m in names[:-1]}
    reviewers = [theory.rates(steps, iid), *(theory.rates(inner[name], iid) for name in names[:-1])]
    mag_draft = theory.drafted_pmf(inner[names[-2]])  # the smallest neural drafter reviews Max-Gram alone
    return theory.cascade(K, reviewers, names, mag_draft, int(params.get("mag_tail", 10)))


METHODS = (
    Method(
        "cs_drafting",
        "CS Drafting (Chen et al. 2024): vertical and horizontal cascades over drafters, greedy or sampled",
        _run,
        {
            "K": ParamSpec(
                list,
                None,
                "budget matrix, one row and column per neural drafter, e.g. [[2, 4], [0, 3]]",
            ),
            "k_convention": ParamSpec(
                str,
                "cumulative",
                "cumulative: the paper's K; increment: the reference code's (k12 = K[0][0] + K[0][1])",
                choices=("cumulative", "increment"),
            ),
            "lenience": ParamSpec(
                float, 1.0, "lenience l of the drafters' reviews (the target's is strict)", 1
            ),
            "mag_tokens": ParamSpec(int, 10, "tokens the statistical drafter proposes per call", 1, 64),
            "mag_tail": ParamSpec(
                int,
                10,
                "budget of Max-Gram's column of K: it drafts while a level's draft is < K[r][-1] + mag_tail",
                0,
                64,
            ),
            "mag_lenience": ParamSpec(
                bool, True, "false: the smallest drafter reviews Max-Gram strictly (paper, Appendix B)"
            ),
            "reference_compat": ParamSpec(
                bool,
                False,
                "test lenient reviews against the rows the reference code passes (for comparison)",
            ),
            "tree_children": ParamSpec(
                int,
                1,
                "children of each chain token in the target's tree: the chain's next token and the "
                "rest from its reviewer's law (Appendix B's tree attention: 8); 1 verifies the chain",
                1,
                64,
                added_later=True,
            ),
            "tree_nodes": ParamSpec(
                int,
                32,
                "with tree_children > 1: nodes the target verifies at most (the chain first, then "
                "siblings from the first position on); the compiled engine compiles this one tree pass "
                "and pads every tree up to it, so keep it tight",
                1,
                256,
                added_later=True,
            ),
        },
        drafter_list=True,
        check_roles=cascade_roles_problem,
        check=_check_K,
        # the lenience loosens only the drafters' reviews; the target's stays strict
        lossless=always,
        draft_lengths=_draft_lengths,
        tree_sizes=lambda params: (params["tree_nodes"],) if params["tree_children"] > 1 else (),
        # 2: Max-Gram drafts within its column's budget K[r][n-1] + mag_tail (before: always mag_tail more)
        revision=2,
        plan=PASSES,
        theory=_theory,
    ),
)
