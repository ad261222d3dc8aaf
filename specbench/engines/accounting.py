"""One metric dictionary across engines: an engine's counters around one request, in specbench's terms.

A serving engine does not hand out its verification steps; it keeps cumulative counters (vLLM:
``vllm:spec_decode_num_drafts``, ``..._num_draft_tokens``, ``..._num_accepted_tokens`` and the vector
``..._num_accepted_tokens_per_pos``). The backend snapshots them just before and just after a request
that runs alone, and times every engine step that grew the request's output. From those:

- **target passes** are the engine steps that committed tokens (one forward of the target each, at
  batch 1; the prefill is the first), so the acceptance length is committed tokens / target passes,
  the definition of specbench's own loops (:attr:`Generation.accepted_per_step`);
- **accepted per step** is each step's growth minus one; the last step's is the counters' remainder,
  because an engine (like our loops) counts a step's accepted drafts before it cuts at a stop token;
- **drafted per step**: every step that accepted a draft drafted; the counters' remaining drafts went
  to steps that accepted none. Which of those zero-accept steps drafted cannot be told from counters,
  so they are taken in order (acceptance by position and the histogram do not depend on the order).

llama.cpp's server instead reports, with every output token it streams, its running counters of the
request (``timings.draft_n``, draft tokens, and ``timings.draft_n_accepted``), which locate each step
exactly (:func:`steps_from_marks`): the counters grow where a step verified a draft, and that step
committed its accepted drafts and one token more; a token whose counters did not grow is a step that
drafted nothing.

The engine's own figures stay beside ours under their own names: vLLM's mean acceptance length is
``1 + accepted / num_drafts`` over the steps that drafted only, and its per-position rates are
unconditional (accepted at position i / drafts); llama.cpp's draft acceptance rate is accepted / draft
tokens, and its mean acceptance length (its log's ``mean len``) is vLLM's definition.
"""

from __future__ import annotations

from dataclasses import dataclass


class AccountingError(ValueError):
    """Counters that do not fit the steps the engine reported (another request ran in between)."""


def counters(snapshot: list[dict]) -> dict[str, float | list[int]]:
    """Metric name -> value summed over label sets (vectors element-wise)."""
    out: dict[str, float | list[int]] = {}
    for metric in snapshot:
        name = metric["name"]
        if "values" in metric:
            before = out.get(name) or []
            values = list(metric["values"])
            width = max(len(before), len(values))
            before = list(before) + [0] * (width - len(before))
            out[name] = [a + b for a, b in zip(before, values + [0] * (width - len(values)), strict=True)]
        else:
            out[name] = out.get(name, 0) + metric["value"]
    return out


def difference(before: list[dict], after: list[dict]) -> dict[str, float | list[int]]:
    """What the counters grew by between two snapshots; a counter that shrank means the engine
    restarted in between, which no difference can span."""
    start, end = counters(before), counters(after)
    out: dict[str, float | list[int]] = {}
    for name, value in end.items():
        old = start.get(name, [] if isinstance(value, list) else 0)
        if isinstance(value, list):
            old = list(old) + [0] * (len(value) - len(old))
            grown = [a - b for a, b in zip(value, old, strict=True)]
            if any(g < 0 for g in grown):
                raise AccountingError(f"counter {name} went down between the snapshots")
        else:
            grown = value - old
            if grown < 0:
                raise AccountingError(f"counter {name} went down between the snapshots")
        out[name] = grown
    return out


@dataclass(frozen=True)
class SpecCounters:
    """A request's speculative counters, engine-neutral."""

    drafts: int  # steps that proposed at least one token
    draft_tokens: int
    accepted: int
    accepted_by_position: tuple[int, ...]  # drafts whose position i (from 1) was accepted

    @classmethod
    def from_vllm(cls, grown: dict) -> SpecCounters:
        return cls(
            int(grown.get("vllm:spec_decode_num_drafts", 0)),
            int(grown.get("vllm:spec_decode_num_draft_tokens", 0)),
            int(grown.get("vllm:spec_decode_num_accepted_tokens", 0)),
            tuple(int(v) for v in grown.get("vllm:spec_decode_num_accepted_tokens_per_pos", []) or []),
        )

    @classmethod
    def from_llamacpp(cls, timings: dict, steps: list[tuple[int, int]]) -> SpecCounters:
        """llama.cpp's request timings (draft tokens and accepted tokens) with the drafting steps and the
        acceptance by position of ``steps`` (:func:`steps_from_marks`), which its counters located."""
        return cls(
            sum(1 for drafted, _ in steps if drafted),
            int(timings.get("draft_n", 0)),
            int(timings.get("draft_n_accepted", 0)),
            tuple(accepted_by_position(steps)),
        )


def steps_from_marks(
    marks: list[tuple[int, int] | None], final: tuple[int, int] | None = None, k: int | None = None
) -> tuple[list[tuple[int, int]], list[int]]:
    """(drafted, accepted) per target pass, and the output's length after each pass, from the running
    counters (draft tokens, accepted tokens) an engine reported with each output token in order.

    The first token is the prefill's. A token whose counters grew by (d, a) begins a step that verified
    d drafted tokens and committed its a accepted ones and one more, all reported with those counters;
    the last step may be cut short at a stop. A token whose counters did not grow is a step that drafted
    nothing. ``None`` marks a token the engine did not report alone (llama.cpp holds back a token that
    ends inside a UTF-8 character and sends it with the next): it belongs to the step before it while
    that step is short of its tokens, else to the step of the next reported token (after the last one,
    to the request's ``final`` counters). When that step's counters grew by more than ``k`` (the most a
    step drafts) the held token hid a whole step of its own, whose counters nobody saw: it is taken as a
    step that drafted ``k`` and accepted none (the totals stay exact; which of the hidden steps accepted
    what cannot be told)."""
    steps: list[tuple[int, int]] = []
    ends: list[int] = []
    counted, left = (0, 0), 0  # the counters after the last step; tokens its step still commits
    for i, mark in enumerate(marks):
        if i == 0:  # the prefill: no draft can be verified before the first token
            if mark not in (None, (0, 0)):
                raise AccountingError(f"the first token came with counters {mark}, before any step drafted")
            steps.append((0, 0))
            ends.append(1)
            continue
        if mark is None:
            later = next((m for m in marks[i + 1 :] if m is not None), final or counted)
            mark = counted if left else later
            if not left and k is not None and mark[0] - counted[0] > k:
                counted = (counted[0] + k, counted[1])
                steps.append((k, 0))
                ends.append(ends[-1] + 1)
                continue
        if left:
            if mark != counted:
                raise AccountingError(
                    f"token {i} came with counters {mark} inside a step that counted {counted}"
                )
            left -= 1
            ends[-1] += 1
            continue
        drafted, accepted = mark[0] - counted[0], mark[1] - counted[1]
        if (drafted, accepted) == (0, 0):
            steps.append((0, 0))
        elif drafted <= 0 or not 0 <= accepted <= drafted:
            raise AccountingError(f"counters went from {counted} to {mark}: not one step's draft")
        else:
            steps.append((drafted, accepted))
            counted, left = mark, accepted
        ends.append(ends[-1] + 1)
    return steps, ends


def step_growth(step_lengths: list[int]) -> list[int]:
    """Tokens each engine step added to the output (steps that added none are not passes that
    committed, and are dropped)."""
    growth, before = [], 0
    for length in step_lengths:
        if length > before:
            growth.append(length - before)
        before = max(before, length)
    return growth


def steps_from_counters(step_lengths: list[int], spec: SpecCounters) -> list[tuple[int, int]]:
    """(drafted, accepted) per target pass, from the output's growth per step and the counters."""
    growth = step_growth(step_lengths)
    if not growth:
        return []
    accepted = [g - 1 for g in growth]
    if spec.drafts == 0:
        if spec.accepted or any(accepted):
            raise AccountingError("tokens were accepted while the counters show no draft")
        return [(0, 0)] * len(accepted)
    accepted[-1] = spec.accepted - sum(accepted[:-1])  # the last step may have been cut at a stop
    if accepted[-1] < growth[-1] - 1 or accepted[-1] < 0:
        raise AccountingError(
            f"counters give {spec.accepted} accepted tokens; the steps show at least "
            f"{sum(growth) - len(growth)}"
        )
    drafting = [i for i, a in enumerate(accepted) if a > 0]
    if len(drafting) > spec.drafts:
        raise AccountingError(f"{len(drafting)} steps accepted drafts; the counters give {spec.drafts}")
    # the prefill (step 0) never drafts; the remaining drafts went to steps that accepted nothing
    idle = [i for i, a in enumerate(accepted) if a == 0 and i > 0]
    missing = spec.drafts - len(drafting)
    if missing > len(idle):
        raise AccountingError(f"{spec.drafts} drafts counted over {len(growth) - 1} decode steps")
    drafted = set(drafting) | set(idle[:missing])
    lengths = _draft_lengths(spec, sorted(drafted), accepted)
    return [(lengths.get(i, 0), a) for i, a in enumerate(accepted)]


def _draft_lengths(spec: SpecCounters, drafted: list[int], accepted: list[int]) -> dict[int, int]:
    """Each drafting step's draft length: the engine's k (the per-position vector's length) where the
    counters' draft tokens allow, shorter drafts (n-gram near the end of its budget) taken from the
    steps that accepted least."""
    k = len(spec.accepted_by_position) or max(accepted, default=0)
    lengths = {i: k for i in drafted}
    short = k * len(drafted) - spec.draft_tokens
    for i in sorted(drafted, key=lambda i: (accepted[i], -i)):
        if short <= 0:
            break
        cut = min(short, k - max(accepted[i], 1))
        lengths[i] -= cut
        short -= cut
    if short > 0 or any(lengths[i] < accepted[i] for i in drafted):
        raise AccountingError(
            f"{spec.draft_tokens} draft tokens over {len(drafted)} drafts of at most {k} cannot hold the "
            "accepted tokens"
        )
    return lengths


def accepted_by_position(steps: list[tuple[int, int]]) -> list[int]:
    """Drafts whose position i (from 1) was accepted: what vLLM's per-position vector counts."""
    width = max((d for d, _ in steps), default=0)
    return [sum(1 for d, a in steps if d > i and a > i) for i in range(width)]


def engine_figures(spec: SpecCounters, name: str) -> dict:
    """The engine's own acceptance figures, under its own names (``<engine>_...``)."""
    figures = {
        f"{name}_num_drafts": spec.drafts,
        f"{name}_num_draft_tokens": spec.draft_tokens,
        f"{name}_num_accepted_tokens": spec.accepted,
        f"{name}_accepted_per_pos": list(spec.accepted_by_position),
    }
    if spec.drafts:
        # vLLM's "mean acceptance length": over the steps that drafted only
        figures[f"{name}_mean_acceptance_length"] = 1 + spec.accepted / spec.drafts
    return figures


def target_forwards(steps: list[tuple[int, int]], prompt: int, seconds: float) -> dict:
    """An engine request's target passes in the row's ``forwards`` form: the first pass over the prompt,
    then one over each step's drafts + 1 after the context committed so far (``shapes``: tokens fed ->
    [passes, summed context]), ``seconds`` the engine's whole time (drafting included)."""
    shapes: dict[str, list[int]] = {}
    committed = 0
    for i, (drafted, accepted) in enumerate(steps):
        fed, context = (prompt, 0) if i == 0 else (drafted + 1, prompt + committed - 1)
        before = shapes.get(str(fed), [0, 0])
        shapes[str(fed)] = [before[0] + 1, before[1] + context]
        committed += accepted + 1
    return {
        "forward_passes": len(steps),
        "tokens_scored": sum(int(k) * v[0] for k, v in shapes.items()),
        "encoder_passes": 0,
        "seconds": seconds,
        "shapes": shapes,
    }


def inter_token_latencies(step_times: list[float], step_lengths: list[int]) -> tuple[float, list[float]]:
    """(TTFT, ITLs): the first committing step's time, and the gaps between committing steps (a step
    that commits several tokens is one gap, as streaming clients see it)."""
    times, before = [], 0
    for time, length in zip(step_times, step_lengths, strict=True):
        if length > before:
            times.append(time)
        before = max(before, length)
    if not times:
        return 0.0, []
    return times[0], [b - a for a, b in zip(times, times[1:], strict=False)]
