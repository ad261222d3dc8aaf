"""Sequential cascades of a small model q and a large model p (Narasimhan et al. 2025, Sec. 2-3, 5).

* :func:`token_cascade` — Algorithm 2: per token, the small model's q_t decides δ(q_t, ∅) (Chow,
  Eq. 2, or its entropy form, Eq. 24); on deferral the large model produces x_t. The small model
  predicts at most ``max_small_tokens`` tokens in a row (10 in App. E.1) before the large model
  produces the next one.
* :func:`seq_cascade` — sequence-level Chow (Eq. 1): the small model writes the whole response;
  if q(x_m..x_{m+n} | x_<m) < 1 − α the large model writes a new one.
* :func:`oracle_cascade` — Algorithm 3: both models score every position and δ(q_t, p_t) picks the
  model that produces x_t (Diff, Eq. 5, by default: the oracle of Remark 2).
* :func:`bild` — the original Big Little Decoder (Kim et al. 2023; Sec. 5, App. E.5): the small
  model drafts until max q < 1 − α_f (fallback) or k tokens; the large model scores the drafts in
  one pass, rolls back deterministically at the first D(q, p) > α and produces the next token.

The rows are those of specbench.decoding.spec_cascades: at T > 0 the tempered distributions,
sampled from and read by the decision; at T = 0 greedy tokens and the T = 1 softmax for the decision.
``Generation.deferrals`` counts the tokens the large model produced. Each model's forward passes are
counted by its own counter; a model called after a gap feeds the missing positions in that pass.
"""

from __future__ import annotations

import math

import torch

from specbench.decoding.acceptance import Verdict
from specbench.decoding.deferral import (
    CASCADE_ALPHA,
    DISCREPANCY,
    ORACLE_RULES,
    RULES,
    check_rule_params,
    decision,
    discrepancy,
    resolve_discrepancy,
    tv_distance,
)
from specbench.decoding.generation import Generation, Stopwatch, commit, eos_set, truncate_at_eos
from specbench.decoding.spec_cascades import one_hot
from specbench.methods import SPECULATIVE_PASSES, TARGET, Method, ParamSpec, PassRule, Request
from specbench.models.base import LanguageModel
from specbench.models.sampling import SamplingParams


def _begin(*models: LanguageModel, prompt_ids: torch.Tensor) -> Stopwatch:
    for model in models:
        model.counter.reset()
    watch = Stopwatch(models[0].device)
    for model in models:
        model.start(prompt_ids)
    return watch


def _finish(watch: Stopwatch, models, tokens, steps, stopped, deferrals) -> Generation:
    walltime, ttft = watch.stop()
    forwards = {model.name: model.counter.snapshot() for model in models}
    return Generation(tokens, walltime, ttft, steps, forwards, stopped, deferrals=deferrals)


def token_cascade(
    large: LanguageModel,
    small: LanguageModel,
    prompt_ids: torch.Tensor,
    *,
    rule: str,
    alpha: float,
    max_small_tokens: int,
    max_new_tokens: int,
    sampling: SamplingParams = SamplingParams(),
    eos_token_id=None,
    generator: torch.Generator | None = None,
) -> Generation:
    """Algorithm 2 with δ(q_t, ∅) = ``rule`` (chow or chow_log); ``max_small_tokens`` 0: no cap."""
    if not RULES[rule].needs_only_q:
        raise ValueError(f"rule {rule!r} reads p, which a sequential token cascade does not have")
    eos = eos_set(eos_token_id)
    watch = _begin(large, small, prompt_ids=prompt_ids)
    out = torch.empty(max_new_tokens, dtype=torch.long, device=large.device)
    tokens: list[int] = []
    run = deferrals = 0  # run: tokens the small model produced since the large model last did
    for i in range(max_new_tokens):
        defer = max_small_tokens > 0 and run == max_small_tokens
        if not defer:
            logits = small.score(out[:i], 0).logits[-1]
            q = sampling.probs(logits)
            x = sampling.choose(q, logits, generator)
            # one sync for the decision and the small model's token
            defer, token = torch.stack([decision(rule, q, None, {"alpha": alpha}).long(), x]).tolist()
        if defer:
            logits = large.score(out[:i], 0).logits[-1]
            x = sampling.choose(sampling.probs(logits), logits, generator)
            token = int(x)
            deferrals += 1
        run = 0 if defer else run + 1
        out[i] = token
        tokens.append(token)
        watch.mark_first_token()
        if token in eos:
            break
    stopped = bool(tokens) and tokens[-1] in eos
    return _finish(watch, (large, small), tokens, [(0, 0)] * len(tokens), stopped, deferrals)


def oracle_cascade(
    large: LanguageModel,
    small: LanguageModel,
    prompt_ids: torch.Tensor,
    *,
    rule: str,
    params: dict,
    max_new_tokens: int,
    sampling: SamplingParams = SamplingParams(),
    eos_token_id=None,
    generator: torch.Generator | None = None,
) -> Generation:
    """Algorithm 3: one pass of each model per token, x_t from q_t or from p_t as δ(q_t, p_t) says."""
    if RULES[rule].kind != "mixture":
        raise ValueError(f"rule {rule!r} is not a deferral decision δ(q, p)")
    params = dict(params)
    if rule == "bild":
        params["discrepancy"] = resolve_discrepancy(params.get("discrepancy", "auto"), sampling.greedy)
    eos = eos_set(eos_token_id)
    watch = _begin(large, small, prompt_ids=prompt_ids)
    out = torch.empty(max_new_tokens, dtype=torch.long, device=large.device)
    tokens: list[int] = []
    deferrals = 0
    for i in range(max_new_tokens):
        q_logits = small.score(out[:i], 0).logits[-1]
        p_logits = large.score(out[:i], 0).logits[-1]
        q_conf, p_conf = sampling.probs(q_logits), sampling.probs(p_logits)
        x_q = sampling.choose(q_conf, q_logits, generator)
        x_p = sampling.choose(p_conf, p_logits, generator)
        q, p = (one_hot(x_q, q_conf), one_hot(x_p, p_conf)) if sampling.greedy else (q_conf, p_conf)
        defer = decision(rule, q_conf, p_conf, params, tv=tv_distance(p, q))
        defer, token = torch.stack([defer.long(), torch.where(defer, x_p, x_q)]).tolist()
        deferrals += defer
        out[i] = token
        tokens.append(token)
        watch.mark_first_token()
        if token in eos:
            break
    stopped = bool(tokens) and tokens[-1] in eos
    return _finish(watch, (large, small), tokens, [(0, 0)] * len(tokens), stopped, deferrals)


def _respond(model, out, max_new_tokens, sampling, generator, eos, watch=None):
    """Autoregressive response of one model: (tokens, Σ log prob of the decision rows, stopped)."""
    tokens: list[int] = []
    log_prob = torch.zeros((), dtype=torch.float64, device=out.device)
    for i in range(max_new_tokens):
        logits = model.score(out[:i], 0).logits[-1]
        probs = sampling.probs(logits)
        out[i] = sampling.choose(probs, logits, generator)
        log_prob = log_prob + torch.log(probs[out[i]]).double()
        tokens.append(int(out[i]))
        if watch is not None:
            watch.mark_first_token()
        if tokens[-1] in eos:
            return tokens, log_prob, True
    return tokens, log_prob, False


def seq_cascade(
    large: LanguageModel,
    small: LanguageModel,
    prompt_ids: torch.Tensor,
    *,
    alpha: float,
    max_new_tokens: int,
    sampling: SamplingParams = SamplingParams(),
    eos_token_id=None,
    generator: torch.Generator | None = None,
) -> Generation:
    """Eq. 1: keep the small model's response unless q(response) < 1 − α; then the large model's.

    q(response) is the product of the rows the decision reads: the tempered probabilities of the
    sampled tokens (T > 0), the T = 1 softmax probabilities of the greedy tokens (T = 0).
    """
    eos = eos_set(eos_token_id)
    watch = _begin(large, small, prompt_ids=prompt_ids)
    out = torch.empty(max_new_tokens, dtype=torch.long, device=large.device)
    tokens, log_q, stopped = _respond(small, out, max_new_tokens, sampling, generator, eos)
    threshold = math.log(1 - alpha) if alpha < 1 else -math.inf
    deferrals = 0
    if tokens and float(log_q) < threshold:
        tokens, _, stopped = _respond(large, out, max_new_tokens, sampling, generator, eos, watch)
        deferrals = len(tokens)
    watch.mark_first_token()
    return _finish(watch, (large, small), tokens, [(0, 0)] * len(tokens), stopped, deferrals)


def bild(
    large: LanguageModel,
    small: LanguageModel,
    prompt_ids: torch.Tensor,
    *,
    alpha: float,
    fallback_alpha: float,
    k: int,
    discrepancy_metric: str,
    max_new_tokens: int,
    sampling: SamplingParams = SamplingParams(),
    eos_token_id=None,
    generator: torch.Generator | None = None,
) -> Generation:
    """BiLD: fallback when max q < 1 − ``fallback_alpha`` or after ``k`` drafts; rollback at the first
    D(q, p) > ``alpha``; the large model's token follows the kept drafts (its argmax, or a draw from p).

    The fallback test needs the host after every draft (the window is dynamic): one sync per draft
    and one per step. ``discrepancy_metric``: auto, greedy or sampling (App. E.1).
    """
    if k < 1:
        raise ValueError(f"maximum block size k must be >= 1, got {k}")
    metric = resolve_discrepancy(discrepancy_metric, sampling.greedy)
    eos = eos_set(eos_token_id)
    watch = _begin(large, small, prompt_ids=prompt_ids)
    out = torch.empty(max_new_tokens + 1, dtype=torch.long, device=large.device)
    tokens: list[int] = []
    steps: list[tuple[int, int]] = []
    generated = 0
    stopped = False
    while generated < max_new_tokens and not stopped:
        budget = min(k, max_new_tokens - generated - 1)
        rows = []
        while len(rows) < budget:  # fallback phase
            logits = small.score(out[: generated + len(rows)], 0).logits[-1]
            q = sampling.probs(logits)
            x = sampling.choose(q, logits, generator)
            unsure, token = torch.stack([(q.max() < 1 - fallback_alpha).long(), x]).tolist()
            if unsure:
                break
            out[generated + len(rows)] = token
            rows.append(q)
        d = len(rows)
        drafts = out[generated : generated + d].clone()
        p_logits = large.score(out[: generated + d], d).logits
        p = sampling.probs(p_logits)
        keep = torch.ones(0, dtype=torch.bool, device=out.device)
        if d:
            keep = ~(discrepancy(torch.stack(rows).to(p.dtype), p[:d], metric) > alpha)
        n = torch.cumprod(keep.long(), 0).sum()  # rollback phase: up to the first discrepancy
        verdict = Verdict(n, sampling.choose(p[n], p_logits[n], generator))
        n, new = commit(verdict, drafts, out, generated)
        large.rollback(generated + n)
        small.rollback(generated + n)
        new, stopped = truncate_at_eos(new, eos)
        steps.append((d, n))
        tokens.extend(new)
        generated += n + 1
        watch.mark_first_token()
    return _finish(watch, (large, small), tokens, steps, stopped, len(steps))


def _run_token_cascade(params: dict, target: LanguageModel, drafter: LanguageModel, r: Request) -> Generation:
    return token_cascade(
        target,
        drafter,
        r.prompt_ids,
        rule=params["rule"],
        alpha=params["alpha"],
        max_small_tokens=params["max_small_tokens"],
        **r.decoding(),
    )


def _run_seq_cascade(params: dict, target: LanguageModel, drafter: LanguageModel, r: Request) -> Generation:
    return seq_cascade(target, drafter, r.prompt_ids, alpha=params["alpha"], **r.decoding())


def _run_oracle_cascade(
    params: dict, target: LanguageModel, drafter: LanguageModel, r: Request
) -> Generation:
    return oracle_cascade(target, drafter, r.prompt_ids, rule=params["rule"], params=params, **r.decoding())


def _run_bild(params: dict, target: LanguageModel, drafter: LanguageModel, r: Request) -> Generation:
    return bild(
        target,
        drafter,
        r.prompt_ids,
        alpha=params["alpha"],
        fallback_alpha=params["fallback_alpha"],
        k=params["k"],
        discrepancy_metric=params["discrepancy"],
        **r.decoding(),
    )


def _small_then_large(share: str) -> PassRule:
    return PassRule(
        f"small model T passes, large model T (1-α) (α read as the share of {share} kept)",
        lambda params, tokens, alpha: ([(0, tokens), (TARGET, tokens * (1 - alpha))], None),
    )


METHODS = (
    Method(
        "token_cascade",
        "sequential token-level cascade (Algorithm 2): the drafter's confidence defers single tokens",
        _run_token_cascade,
        {
            "rule": ParamSpec(
                str,
                "chow",
                "δ(q): chow (max q < 1 - α) or chow_log (entropy > α)",
                choices=("chow", "chow_log"),
            ),
            "alpha": CASCADE_ALPHA,
            "max_small_tokens": ParamSpec(
                int, 10, "most drafter tokens in a row before the large model's (0: no cap)", 0
            ),
        },
        needs_drafter=True,
        neural_drafter_only=True,
        check=lambda params, spec, generation: check_rule_params(
            params, spec, ("alpha",), ("chow", "chow_log")
        ),
        plan=_small_then_large("tokens"),
    ),
    Method(
        "seq_cascade",
        "sequence-level cascade, Chow's rule (Eq. 1): the drafter's response, or the target's when unsure",
        _run_seq_cascade,
        {"alpha": ParamSpec(float, 0.0, "defer the whole response when q(response) < 1 - α", 0, 1)},
        needs_drafter=True,
        neural_drafter_only=True,
        plan=_small_then_large("answers"),
    ),
    Method(
        "oracle_cascade",
        "oracle token cascade (Algorithm 3): both models at every token, δ(q, p) picks the one that speaks",
        _run_oracle_cascade,
        {
            "rule": ParamSpec(str, "diff", "δ(q, p), default diff (Eq. 5)", choices=ORACLE_RULES),
            "alpha": CASCADE_ALPHA,
            "discrepancy": DISCREPANCY,
        },
        needs_drafter=True,
        neural_drafter_only=True,
        check=lambda params, spec, generation: check_rule_params(
            params, spec, ("alpha", "discrepancy"), ORACLE_RULES
        ),
        plan=PassRule(
            "both models score every position: T passes each",
            lambda params, tokens, alpha: ([(0, tokens), (TARGET, tokens)], None),
        ),
    ),
    Method(
        "bild",
        "original Big Little Decoder (Kim et al. 2023): fallback window, deterministic rollback",
        _run_bild,
        {
            "alpha": ParamSpec(float, 1.0, "rollback threshold on D(q, p) (paper: 0 to 10)", 0),
            "fallback_alpha": ParamSpec(
                float, 0.5, "the drafter drafts while max q >= 1 - fallback_alpha", 0, 1
            ),
            "k": ParamSpec(int, 10, "maximum draft window (App. E.5: 10)", 1, 64),
            "discrepancy": DISCREPANCY,
        },
        needs_drafter=True,
        neural_drafter_only=True,
        plan=SPECULATIVE_PASSES,
    ),
)
