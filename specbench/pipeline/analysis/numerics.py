"""Classify a lossless method's divergence from the AR output: a numerical near-tie, or a mismatch.

Greedy speculative decoding scores k + 1 tokens in one pass; autoregressive decoding scores one
token a pass. In exact arithmetic both give the target's argmax, but a matmul over k + 1 rows
accumulates its sums in another order (another kernel, another split of the reduction) than k
one-row matmuls, so in bfloat16 and float16, and on GPUs in any dtype, the logits differ in their
last bits. Where the target's two best tokens are that close, a lossless method may legitimately
commit the other one, and everything after it differs.

At a row's first divergence i the outputs share the prefix y[:i] (the AR output's), so the target is
fed prompt + y[:i] twice, through the model interface (``start``, ``score``) so any target works:

* ``batch``: one pass over prompt and prefix (as a verification scores its block);
* ``incremental``: the prompt, then one token a pass with the KV cache (as AR decoding does).

From the logits predicting position i each gives the top-1 minus top-2 margin, its argmax, and the gap
from its top logit down to the lower of the AR and the method's tokens. The row is a ``tie`` when that
gap is below the tolerance of the target's dtype in either computation (both tokens are then within
rounding of the best, though a third near-tied token may sit between them), else a ``mismatch``: a
near-tie explains a choice among the near-tied tokens, not one further down. The extra passes run after
the generation and leave the target's counters as they found them, so the row's counts are the method's.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

# Relative tolerance of a top-2 margin, by the dtype of the target's weights:
#     tol = RELATIVE[dtype] * max(1, |top-1 logit|)
# Rounding error grows with the logit's magnitude, hence relative; max(1, .) keeps a floor for
# logits near 0. bfloat16 and float16 keep 8 and 11 significant bits (eps 2^-7 ~ 0.0078 and 2^-10 ~
# 0.00098): each computation rounds its logits to a spacing of eps * |logit| / 2 to eps * |logit|, and
# the hidden states feeding them were rounded the same way in each layer, so two computations of one
# logit routinely differ by one or two spacings. HALF_ULPS = 4 covers that with margin (a bfloat16
# logit of 20: tol 0.63) and still calls a margin of several spacings a mismatch. float32 (eps
# 1.2e-7) and float64 (2.2e-16) get fixed factors far above eps, because their differences come from
# a deep network's accumulated reduction-order error (and GPU kernels), not from one rounding, yet far
# below any margin a genuinely wrong token has.
HALF_ULPS = 4
RELATIVE = {
    torch.float64: 1e-9,
    torch.float32: 1e-4,
    torch.bfloat16: HALF_ULPS * torch.finfo(torch.bfloat16).eps,  # 0.03125
    torch.float16: HALF_ULPS * torch.finfo(torch.float16).eps,  # 0.00390625
}


def tolerance(dtype: torch.dtype, top1: float, device: torch.device | None = None) -> float:
    """The largest top-2 margin that a difference in rounding explains, for a target in ``dtype``."""
    if dtype == torch.float32 and device is not None and device.type == "cuda":
        if torch.get_float32_matmul_precision() != "highest":  # TF32 matmuls keep float16's 10 bits
            dtype = torch.float16
    relative = RELATIVE.get(dtype)
    if relative is None:  # another floating type (float8): a few of its own spacings
        relative = HALF_ULPS * torch.finfo(dtype).eps if dtype.is_floating_point else RELATIVE[torch.float32]
    return relative * max(1.0, abs(top1))


def counter_kept(counter):
    """Whatever passes run inside leave ``counter`` (a ForwardCounter) as it was before."""
    return counter.kept()


def next_token_logits(target, prompt_ids: torch.Tensor, prefix: torch.Tensor) -> dict[str, torch.Tensor]:
    """The target's logits predicting the token after ``prefix`` (generated ids), computed in one pass
    over prompt and prefix (``batch``) and a token a pass from the prompt on (``incremental``)."""
    with counter_kept(target.counter):
        target.start(prompt_ids)
        batch = target.score(prefix, 0).logits[-1]  # the cache is empty: one pass feeds prompt + prefix
        target.start(prompt_ids)
        for j in range(prefix.shape[0] + 1):  # the prompt's pass, then one token each, as AR decodes
            incremental = target.score(prefix[:j], 0).logits[-1]
    return {"batch": batch, "incremental": incremental}


def weights_dtype(target, logits: torch.Tensor) -> torch.dtype:
    """The dtype the target computes in: its first floating weight's, else its logits'."""
    module = getattr(target, "model", None)
    if isinstance(module, torch.nn.Module):
        for parameter in module.parameters():
            if parameter.is_floating_point():
                return parameter.dtype
    return logits.dtype


def classify(
    target, prompt_ids: torch.Tensor, reference: Sequence[int], tokens: Sequence[int], i: int
) -> dict:
    """The row fields of a divergence at ``i`` of ``tokens`` from the AR output ``reference``."""
    prefix = torch.as_tensor(list(reference[:i]), dtype=torch.long, device=prompt_ids.device)
    logits = next_token_logits(target, prompt_ids, prefix)
    ar = int(reference[i]) if i < len(reference) else None
    method = int(tokens[i]) if i < len(tokens) else None
    margins, best, pairs, gaps = {}, {}, [], {}
    for name, row in logits.items():
        top = row.double().topk(2)
        margins[name] = float(top.values[0] - top.values[1])
        best[name] = int(row.argmax())  # what greedy decoding takes: the first of tied maxima
        pairs.append(set(top.indices.tolist()))
        if ar is not None and method is not None:
            gaps[name] = float(top.values[0] - row[[ar, method]].double().min())
    top2 = ar is not None and method is not None and {ar, method} in pairs
    top1 = max(abs(float(row.double().max())) for row in logits.values())
    tol = tolerance(weights_dtype(target, logits["batch"]), top1, logits["batch"].device)
    return {
        "divergence_class": "tie" if gaps and min(gaps.values()) < tol else "mismatch",
        "divergence_margin": margins,
        "divergence_gap": gaps,
        "divergence_tolerance": tol,
        "divergence_tokens": {"ar": ar, "method": method, **best},
        "divergence_top2": top2,
    }


def is_tie(scorer, prompt_ids: torch.Tensor, reference: Sequence[int], tokens: Sequence[int], i: int) -> bool:
    """Whether ``tokens`` part from the AR output ``reference`` at ``i`` on a numerical tie
    (``classify``); False where no ``scorer`` can tell (an engine's target without specbench's twin).
    The replay check's rule (:mod:`specbench.pipeline.run.measure`)."""
    return (
        scorer is not None and classify(scorer, prompt_ids, reference, tokens, i)["divergence_class"] == "tie"
    )


def divergence_fields(
    target,
    prompt_ids: torch.Tensor,
    reference: Sequence[int],
    tokens: Sequence[int],
    first: int,
    *,
    single_turn: bool,
) -> dict:
    """``divergence_class`` (and at a divergence the margins) of a row the lossless check covers.

    A multi-turn row's later turns follow prompts this request does not hold: its divergence stays
    unclassified (no ``divergence_class``), as rows from before the classes are."""
    if first == -1:
        return {"divergence_class": "identical"}
    if not single_turn:
        return {}
    return classify(target, prompt_ids, reference, tokens, first)
