"""A streamed completion's own speculative counts, where the server sends them per request.

- llama.cpp's ``llama-server`` ends every completion stream, its OpenAI route included, with a message
  whose ``timings`` carry ``draft_n`` (draft tokens proposed) and ``draft_n_accepted`` once the request
  drafted (absent before); it gives no count of drafting steps.
- vLLM 0.32 adds ``metrics.speculative_decoding`` (``num_draft_tokens``, ``num_accepted_draft_tokens``,
  ``num_spec_steps``, beside ``mean_acceptance_length``, ``draft_acceptance_rate``,
  ``acceptance_histogram`` and ``num_spec_tokens``) to the final usage chunk of a stream that asked for
  usage (and to the body of a response that does not stream) when the server runs with
  ``--per-request-spec-decode-metrics summary`` (or ``detailed``), which specbench passes to every
  speculating server it starts (:mod:`specbench.engines.vllm`). A server without it (one specbench did
  not start may lack it) sends none; its counts are then only its ``/metrics`` counters, per level.

Either becomes ``{"draft_tokens", "accepted", "steps"}`` (``steps`` None where the server gives none);
the last message that carries counts wins, as both servers send running totals.
"""

from __future__ import annotations


def request_counts(message: dict) -> dict | None:
    """The counts a streamed message carries, or None where it carries none."""
    timings = message.get("timings")
    if isinstance(timings, dict) and "draft_n" in timings:
        return {
            "draft_tokens": int(timings["draft_n"]),
            "accepted": int(timings.get("draft_n_accepted", 0)),
            "steps": None,
        }
    metrics = message.get("metrics")
    spec = metrics.get("speculative_decoding") if isinstance(metrics, dict) else None
    if isinstance(spec, dict) and "num_draft_tokens" in spec:
        steps = spec.get("num_spec_steps")
        return {
            "draft_tokens": int(spec["num_draft_tokens"]),
            "accepted": int(spec.get("num_accepted_draft_tokens", 0)),
            "steps": int(steps) if steps is not None else None,
        }
    return None
