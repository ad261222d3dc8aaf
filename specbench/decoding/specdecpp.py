"""SpecDec++ (Huang et al. 2024): adaptive candidate lengths from a trained acceptance head.

The acceptance prediction head reads the draft model's final hidden state of a candidate token Y_i
(fed with its prefix, Eq. 3.1) and predicts the probability p̂_i that the target accepts Y_i. A
speculation round stops when the predicted probability that at least one candidate is rejected,
``1 - Π_i p̂_i``, exceeds the threshold h (Algorithm 2; Theorem 3.1 motivates the threshold policy),
or when the round holds ``max_length`` candidates. The round is then verified by the unchanged
speculative-decoding loop (:mod:`specbench.decoding.speculative`): the length decision depends on the
draft side only, so verification stays lossless, greedy or sampled.

Timing follows the authors' release (``specdec_pp/hf_generation.py``): the draft pass that feeds
candidate Y_i yields both p̂_i (from its hidden state) and q_{i+1}; Y_{i+1} is always sampled from
it, and *then* the rule ``1 - Π_{j<=i} p̂_j > h`` decides whether to stop. So a round of n candidates
costs n draft passes and the last candidate comes for free with the pass that decided to stop. The
bounds [min_length, max_length] count candidates and are inclusive: no stop before ``min_length``
candidates, always a stop at ``max_length`` (the release's ``--bound 2 20``). A candidate that is an
EOS token also ends the round (the paper's MDP, footnote 1).

Host-device syncs: one per drafted token from ``min_length`` on (or every token when an EOS set is
given), reading the stop decision ``(1 - Π p̂ > h) | (Y is EOS)`` as a Python bool; it is the only one.
The product, the head and the sampling stay on the device.

The greedy oracle of Lemma 2.1 (:class:`OracleDrafter`) drafts exactly the draft model's greedy tokens
that agree with the target's greedy output, stopping right before the first disagreement.
"""

from __future__ import annotations

import math

import torch

from specbench.decoding import speculative
from specbench.decoding.generation import Generation
from specbench.drafters.acceptance_head import AcceptanceHead, check_reference, load_head
from specbench.methods import TARGET, Method, ParamSpec, PassRule, Request, always, chain_passes
from specbench.models.base import LAST, Draft, ModelDrafter, Pass
from specbench.models.hf import HFModel
from specbench.models.sampling import SamplingParams


class SpecDecPPDrafter(ModelDrafter):
    """The draft model plus its acceptance head, stopping each round by Algorithm 2's threshold rule.

    Run it through ``speculative.generate`` with ``k = max_length``.
    """

    def __init__(
        self,
        model: HFModel,
        head: AcceptanceHead,
        *,
        threshold: float,
        min_length: int = 2,
        eos_token_id: list[int] | None = None,
    ):
        if head.hidden_size != model.model.config.get_text_config().hidden_size:
            raise ValueError(
                f"the acceptance head reads {head.hidden_size}-wide hidden states, but {model.name}'s are "
                f"{model.model.config.get_text_config().hidden_size}-wide"
            )
        super().__init__(model)
        self.head = head
        self.threshold, self.min_length = threshold, min_length
        self.num_parameters = model.num_parameters + sum(p.numel() for p in head.parameters())
        self._eos = None
        if eos_token_id:
            self._eos = torch.tensor(sorted(eos_token_id), dtype=torch.long, device=model.device)

    @torch.inference_mode()
    def acceptance(self, scored: Pass) -> torch.Tensor:
        """p̂ of the last token a draft pass was fed, from that pass's final hidden state (0-d tensor,
        on the device)."""
        return self.head.probability(scored.hidden[LAST][-1])

    @torch.inference_mode()
    def propose(
        self, tokens: torch.Tensor, k: int, sampling: SamplingParams, generator: torch.Generator | None
    ) -> Draft:
        if k == 0:
            return Draft(tokens[:0], None)
        generated = tokens.shape[0]
        context = torch.empty(generated + k, dtype=torch.long, device=tokens.device)
        context[:generated] = tokens
        rows = []
        all_accepted = None  # Π_{j<=i} p̂_j over the candidates fed so far
        n = 0
        for i in range(k):
            scored = self.model.score(context[: generated + i], 0, hidden=(LAST,))  # p̂ reads its state
            logits = scored.logits[-1]
            if i > 0:  # this pass fed candidate Y_i: its hidden state gives p̂_i
                p_hat = self.acceptance(scored)
                all_accepted = p_hat if all_accepted is None else all_accepted * p_hat
            q = sampling.probs(logits)
            token = sampling.choose(q, logits, generator)
            context[generated + i] = token
            rows.append(q)
            n = i + 1
            if n >= k:
                break
            stop = None
            if n >= self.min_length and all_accepted is not None:
                stop = (1 - all_accepted) > self.threshold
            if self._eos is not None:
                is_eos = (self._eos == token).any()
                stop = is_eos if stop is None else stop | is_eos
            if stop is not None and bool(stop):  # the loop's one host sync: stop or draft on
                break
        return Draft(context[generated : generated + n], torch.stack(rows))


def should_stop(predicted: list[float], threshold: float, min_length: int, max_length: int) -> int:
    """The round length Algorithm 2 (release timing) gives for per-candidate predictions p̂_1, p̂_2, ...

    A plain-Python mirror of :meth:`SpecDecPPDrafter.propose`'s rule (no EOS), for reading and tests:
    after drafting candidate n, stop if n == max_length, or n >= min_length and 1 - Π_{j<n} p̂_j > h.
    """
    product = 1.0
    for n in range(1, max_length + 1):
        if n >= 2:
            product *= predicted[n - 2]
        if n == max_length or (n >= min_length and n >= 2 and 1 - product > threshold):
            return n
    return max_length


class OracleDrafter(ModelDrafter):
    """Lemma 2.1's oracle for greedy decoding: draft exactly up to the first disagreement.

    ``references``: the target's greedy output, then the outputs of earlier oracle runs (see
    ``_run_oracle``). Before decoding, one teacher-forced draft pass over prompt + reference finds where
    the draft's greedy token differs from the target's (the set D of Lemma 2.1); those hindsight passes
    are not counted (the counters reset when decoding starts). Each round then runs the draft model
    greedily for the agreement length from the committed position, on the latest reference the
    committed text matches (those passes are counted, like any drafter's), so the round's candidates
    are all accepted and the target supplies the disagreeing token itself. The pass that would
    produce the first disagreeing draft token is never run: the oracle knows it in hindsight.
    """

    def __init__(self, model: HFModel, prompt_ids: torch.Tensor, *references: list[int]):
        super().__init__(model)
        # the latest first: each round follows the first reference the committed text still matches
        self.references = [list(r) for r in reversed(references)]
        self.agreements = [agreement_lengths(model, prompt_ids, r) for r in self.references]
        self.lengths: list[int] = []  # draft length of each round (tests)

    def propose(
        self, tokens: torch.Tensor, k: int, sampling: SamplingParams, generator: torch.Generator | None
    ) -> Draft:
        if k == 0:
            return Draft(tokens[:0], None)
        g = tokens.shape[0]
        committed = tokens.tolist()
        i = next((i for i, r in enumerate(self.references) if r[:g] == committed), None)
        reference, agreement = (self.references[i], self.agreements[i]) if i is not None else ([], [])
        length = min(k, agreement[g]) if g < len(agreement) else 0
        drafted, rows = tokens[:0], []
        # token by token: in reduced precision a one-token draft pass can part from the teacher-forced
        # pass the lengths come from at a near-tie, and a draft past that token is wasted
        while drafted.shape[0] < length:
            step = super().propose(torch.cat([tokens, drafted]), 1, sampling, generator)
            if int(step.tokens[0]) != reference[g + drafted.shape[0]]:
                break
            drafted, rows = torch.cat([drafted, step.tokens]), rows + [step.q]
        self.lengths.append(drafted.shape[0])
        return Draft(drafted, torch.cat(rows) if rows else None)


@torch.inference_mode()
def agreement_lengths(model: HFModel, prompt_ids: torch.Tensor, reference: list[int]) -> list[int]:
    """For each position t of ``reference``, how many tokens from t on the draft's greedy choice (given
    the prompt and reference[:t]) matches the reference: Lemma 2.1's distance to the next disagreement."""
    m = len(reference)
    if m == 0:
        return []
    ref = torch.tensor(reference, dtype=torch.long, device=model.device)
    model.start(prompt_ids)
    logits = model.score(ref, m).logits  # [m + 1, V]: after the prompt, then after each reference token
    agree = (logits[:m].argmax(-1) == ref).tolist()
    lengths = [0] * (m + 1)
    for t in range(m - 1, -1, -1):
        lengths[t] = lengths[t + 1] + 1 if agree[t] else 0
    return lengths[:m]


def _check_specdecpp(params: dict, spec, generation) -> tuple[str, str, str] | None:
    if params["head"] is None:
        return (
            "head",
            "specdecpp needs head:, its trained acceptance prediction head",
            "train one with `specbench specdecpp train --target T --drafter D` and set the head: it prints",
        )
    if params["min_length"] > params["max_length"]:
        return (
            "min_length",
            f"min_length {params['min_length']} exceeds max_length {params['max_length']}",
            "use min_length <= max_length (the paper's bounds are 2 and 20)",
        )
    return None


def _check_oracle(params: dict, spec, generation) -> tuple[str, str, str] | None:
    if generation.temperature > 0:
        return (
            "method",
            f"oracle_sd is Lemma 2.1's greedy oracle, but generation.temperature is {generation.temperature}",
            "set generation.temperature: 0, or drop the oracle from this recipe",
        )
    return None


def _run_specdecpp(params: dict, target, drafter: HFModel, r: Request) -> Generation:
    """The SD loop with k = max_length and a head-stopped drafter."""
    head = load_head(params["head"], drafter.device)
    adaptive = SpecDecPPDrafter(
        drafter,
        head,
        threshold=params["threshold"],
        min_length=params["min_length"],
        eos_token_id=r.eos_token_id,
    )
    return speculative.generate(target, adaptive, r.prompt_ids, k=params["max_length"], **r.decoding())


ORACLE_TRIES = 3


def _run_oracle(params: dict, target, drafter: HFModel, r: Request) -> Generation:
    """Draft lengths from the target's own greedy output (Request.reference_ids, its AR row).

    In reduced precision the target's multi-token verification passes can pick another token than its
    one-token AR passes at a near-tie, and which one can depend on the pass's length: drafting through
    the tie gives one token, stopping before it the other, so no single reference need be its own
    output. Hindsight then grows: the loop runs again holding every output so far as a reference
    (each round follows the latest one the committed text matches), until the output is one of them
    (at most ORACLE_TRIES runs; each run times and counts itself, so the earlier ones are hindsight and
    only the last is the row)."""
    references = [list(r.reference_ids or [])]
    for _ in range(ORACLE_TRIES):
        oracle = OracleDrafter(drafter, r.prompt_ids, *references)
        generation = speculative.generate(target, oracle, r.prompt_ids, k=r.max_new_tokens, **r.decoding())
        if generation.tokens in references:
            break
        references.append(generation.tokens)
    return generation


def _passes(params: dict, tokens: float, alpha: float) -> tuple[list, int]:
    k = min(max(math.floor(1 / max(1 - alpha, 1e-9) + 0.5), params["min_length"]), params["max_length"])
    return chain_passes(tokens, alpha, k, (k,)), k


METHODS = (
    Method(
        "specdecpp",
        "SpecDec++ (Huang et al. 2024): adaptive candidate length from a trained acceptance head",
        _run_specdecpp,
        {
            "head": ParamSpec(
                str,
                None,
                "acceptance head: specdecpp:<target>/<drafter>[/<name>] or a folder",
                validator=check_reference,
            ),
            "threshold": ParamSpec(
                float, 0.3, "stop when the predicted P(some candidate rejected) exceeds h", 0, 1
            ),
            "min_length": ParamSpec(int, 2, "fewest candidates per round (inclusive)", 1, 64),
            "max_length": ParamSpec(int, 20, "most candidates per round (inclusive)", 1, 64),
        },
        needs_drafter=True,
        neural_drafter_only=True,
        check=_check_specdecpp,
        lossless=always,
        draft_lengths=lambda params: (params["max_length"],),
        plan=PassRule(
            "as speculative with k = 1/(1-α), the mean draft up to a rejection, within "
            "[min_length, max_length]",
            _passes,
        ),
    ),
    Method(
        "oracle_sd",
        "Lemma 2.1 of SpecDec++: greedy SD that stops each round right before the draft's first disagreement",
        _run_oracle,
        {},
        needs_drafter=True,
        neural_drafter_only=True,
        needs_reference=True,
        check=_check_oracle,
        lossless=always,
        plan=PassRule(
            "T (1-α) target passes (E with k unbounded), T drafter passes",
            lambda params, tokens, alpha: ([(TARGET, tokens * (1 - alpha)), (0, tokens)], None),
        ),
    ),
)
