"""Whether an engine's sampled output (T > 0) follows the target's distribution: a randomized
probability integral transform (PIT) of every output token, tested for uniformity.

At each output position t the target gives a distribution p_t (after the request's temperature, top-k
and top-p). Order the vocabulary by p_t, most likely first (ties by id), and let F_t(x−) be the mass
ranked before x. For the token x_t the engine emitted, u_t = F_t(x_t−) + U_t · p_t(x_t), with U_t ~
Uniform(0, 1) independent of everything else. Any order fixed before the draw keeps u uniform; this one
puts the usual faults at one end: a sampler too flat (a temperature too high, top-k or top-p left out)
picks unlikely tokens and pushes u up, one too sharp pushes it down.
When every x_t is drawn from p_t given the tokens before it (what a lossless speculative engine
promises), the u_t are independent and Uniform(0, 1) (the randomized PIT of discrete forecasts: Czado,
Gneiting and Held, "Predictive Model Assessment for Count Data", Biometrics 2009; its sequential form,
Diebold, Gunther and Tay, "Evaluating Density Forecasts", International Economic Review 1998). A cell's
u values over all its rows are tested with the one-sample Kolmogorov–Smirnov test against the uniform
law, and the cell is flagged when the test rejects at :data:`LEVEL`.

The target's p_t come from re-scoring: one teacher-forced forward of specbench's own copy of the target
over the prompt and the engine's output (``engine_options.audit_sampling: true`` keeps that copy). The
engines' own log-probabilities cannot stand in: llama.cpp's server returns none for tokens that came
from a verified draft (tools/server/server-context.cpp leaves ``result.probs`` unset on that path), and
vLLM returns the raw model's, before temperature, unless started with ``logprobs_mode`` set otherwise.
The copy computes in specbench's dtype; an engine serving other weights (llama.cpp's quantized GGUF)
differs from it by its quantization, which a long enough output will show too: for such cells the flag
says "differs from specbench's copy", not "wrong sampler", unless the GGUF is a BF16/F16 conversion.
"""

from __future__ import annotations

import math

import torch

from specbench.models.sampling import SamplingParams

LEVEL = 0.001  # a cell is flagged when the KS test's p-value is below this
MIN_TOKENS = 20  # fewer u values than this test nothing


def randomized_pit(
    probs: torch.Tensor, tokens: torch.Tensor, generator: torch.Generator | None
) -> torch.Tensor:
    """[n] u values of ``tokens`` [n] under the rows of ``probs`` [n, V], tokens ranked by probability
    (float64 throughout; no sort, no per-token Python)."""
    probs = probs.double()
    tokens = tokens.view(-1, 1).to(probs.device)
    at = probs.gather(-1, tokens)
    ids = torch.arange(probs.shape[-1], device=probs.device)
    ahead = (probs > at) | ((probs == at) & (ids < tokens))
    below = (probs * ahead).sum(-1)
    at = at.squeeze(-1)
    noise = torch.rand(at.shape[0], generator=generator, dtype=torch.float64, device=probs.device)
    return (below + noise * at).clamp(0.0, 1.0)


@torch.no_grad()
def rescored_pit(
    module, prompt_ids: torch.Tensor, output_ids: list[int], sampling: SamplingParams, seed: int
) -> list[float]:
    """u values of an engine's output under ``module`` (a causal LM whose call returns ``.logits``) at
    the request's sampling settings: one teacher-forced forward over prompt + output."""
    if not output_ids:
        return []
    device = next(module.parameters()).device
    prompt = prompt_ids.to(device).view(-1)
    output = torch.tensor(output_ids, dtype=torch.long, device=device)
    logits = module(torch.cat([prompt, output]).view(1, -1)).logits[0]
    start = prompt.shape[0] - 1  # the logits at position i predict token i + 1
    probs = sampling.probs(logits[start : start + output.shape[0]].double())
    generator = torch.Generator(device=device).manual_seed(seed)
    return [round(u, 9) for u in randomized_pit(probs, output, generator).tolist()]


def attach(generation, reference, request) -> None:
    """Add the output's u values to an engine generation's record (``pit_u``) when the request samples
    and the engine keeps specbench's copy of the target; untimed, after the request."""
    if reference is None or request.sampling.greedy or generation.engine_record is None:
        return
    seed = int(request.generator.initial_seed()) % (2**63)
    generation.engine_record["pit_u"] = rescored_pit(
        reference, request.prompt_ids, list(generation.tokens), request.sampling, seed
    )


def uniformity(values: list[float]) -> tuple[float, float]:
    """(KS statistic, p-value) of ``values`` against Uniform(0, 1)."""
    from scipy import stats  # only summaries of audited cells need it

    result = stats.kstest(values, "uniform")
    return float(result.statistic), float(result.pvalue)


def cell_check(records: list[dict]) -> dict:
    """An engine cell's audit columns from its rows' records: tokens tested, the KS statistic and
    p-value, and ``sampling_flagged`` (1 when p < LEVEL); empty when no row was audited."""
    values = [u for record in records for u in record.get("pit_u") or []]
    if not any("pit_u" in record for record in records):
        return {}
    out = {"sampling_pit_tokens": len(values), "sampling_pit_level": LEVEL}
    if len(values) < MIN_TOKENS:
        return {**out, "sampling_pit_ks": math.nan, "sampling_pit_p": math.nan, "sampling_flagged": 0}
    statistic, p_value = uniformity(values)
    return {
        **out,
        "sampling_pit_ks": statistic,
        "sampling_pit_p": p_value,
        "sampling_flagged": int(p_value < LEVEL),
    }
