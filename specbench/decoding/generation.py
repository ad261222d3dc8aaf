"""What every decoding method returns, and the bookkeeping all of them share."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from specbench.decoding import verification_rules


@dataclass
class Generation:
    """One request's output and the measurements taken while producing it.

    ``steps`` holds one (drafted, accepted) pair per verification step; acceptance by draft
    position and the mean accepted length are derived from it. ``forwards`` maps each model's
    name to its counter snapshot (forward passes, tokens scored, encoder passes, seconds).
    ``inner_steps`` holds the (drafted, accepted) pairs of reviews by drafters (cascades), by reviewer.
    ``deferrals`` counts the tokens a cascade took from the large model's distribution instead of the
    small one's (a speculative cascade's rejections, a sequential cascade's deferred tokens); None
    for methods that never defer. ``expected_rejections`` (speculative cascades): the sum over
    reviewed drafts of their chance of rejection, D_TV(π, q) (Narasimhan et al., Lemma 5), beside
    the rejections that happened, and ``rejection_variance`` the sum of each such chance c times
    (1 - c): the variance of rejections minus chances were Lemma 5 true. ``rule_acceptance`` (sampled
    speculative decoding): what each engine's verification rule would accept of the same drafts
    (:mod:`specbench.decoding.verification_rules`).
    """

    tokens: list[int]
    walltime: float
    ttft: float
    steps: list[tuple[int, int]] = field(default_factory=list)
    forwards: dict[str, dict[str, float]] = field(default_factory=dict)
    stopped_by_eos: bool = False
    inner_steps: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    deferrals: int | None = None
    expected_rejections: float | None = None
    rejection_variance: float | None = None
    # a serving engine's own record of the request (specbench.engines): version, settings, its
    # acceptance figures under its own names, inter-token latencies; None for specbench's loops
    engine_record: dict | None = None
    rule_acceptance: dict | None = None

    @property
    def accepted_per_step(self) -> float:
        """Tokens committed per target verification (accepted drafts + 1), the paper's 'acceptance length'."""
        if not self.steps:
            return 1.0 if self.tokens else 0.0
        return len(self.tokens) / len(self.steps)

    @property
    def draft_acceptance_rate(self) -> float | None:
        drafted = sum(d for d, _ in self.steps)
        return None if drafted == 0 else sum(a for _, a in self.steps) / drafted

    @classmethod
    def joined(cls, turns: list[Generation]) -> Generation:
        """The turns of one conversation as one generation (Spec-Bench's multi-turn questions): the
        tokens, steps and counts of all turns, their summed time, the first turn's TTFT."""
        forwards: dict[str, dict[str, float]] = {}
        for turn in turns:
            for model, counts in turn.forwards.items():
                total = forwards.setdefault(model, {})
                for name, value in counts.items():
                    if name == "shapes":  # tokens fed -> [passes, context sum]: summed per size
                        merged = total.setdefault(name, {})
                        for size, (passes, context) in value.items():
                            before = merged.get(size, [0, 0])
                            merged[size] = [before[0] + passes, before[1] + context]
                    else:
                        total[name] = total.get(name, 0) + value
        inner: dict[str, list[tuple[int, int]]] = {}
        for turn in turns:
            for name, steps in turn.inner_steps.items():
                inner.setdefault(name, []).extend(steps)
        deferrals = [t.deferrals for t in turns if t.deferrals is not None]
        expected = [t.expected_rejections for t in turns if t.expected_rejections is not None]
        variance = [t.rejection_variance for t in turns if t.rejection_variance is not None]
        rules = verification_rules.merged([t.rule_acceptance for t in turns if t.rule_acceptance])
        return cls(
            tokens=[token for turn in turns for token in turn.tokens],
            walltime=sum(turn.walltime for turn in turns),
            ttft=turns[0].ttft,
            steps=[step for turn in turns for step in turn.steps],
            forwards=forwards,
            stopped_by_eos=turns[-1].stopped_by_eos,
            inner_steps=inner,
            deferrals=sum(deferrals) if deferrals else None,
            expected_rejections=sum(expected) if expected else None,
            rejection_variance=sum(variance) if variance else None,
            rule_acceptance=rules,
        )

    def accepted_by_position(self) -> list[tuple[int, int]]:
        """(proposed, accepted) counts for draft positions 1, 2, ...: the CS Drafting Figure 2 data."""
        longest = max((d for d, _ in self.steps), default=0)
        counts = [[0, 0] for _ in range(longest)]
        for drafted, accepted in self.steps:
            for i in range(drafted):
                counts[i][0] += 1
                counts[i][1] += i < accepted
        return [tuple(c) for c in counts]


class Stopwatch:
    """Wall time of a request, with the time of its first committed token (TTFT)."""

    def __init__(self, device: torch.device):
        self.device = device
        self._sync()
        self.started = time.perf_counter()
        self.first_token: float | None = None

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def mark_first_token(self) -> None:
        if self.first_token is None:
            self.first_token = time.perf_counter() - self.started

    def stop(self) -> tuple[float, float]:
        self._sync()
        total = time.perf_counter() - self.started
        return total, self.first_token if self.first_token is not None else total


def truncate_at_eos(tokens: list[int], eos_ids: frozenset[int]) -> tuple[list[int], bool]:
    """Cut after the first EOS token, keeping it (as HF generate does)."""
    for i, token in enumerate(tokens):
        if token in eos_ids:
            return tokens[: i + 1], True
    return tokens, False


def eos_set(eos_token_id) -> frozenset[int]:
    if eos_token_id is None:
        return frozenset()
    if isinstance(eos_token_id, int):
        return frozenset({eos_token_id})
    return frozenset(int(t) for t in eos_token_id)


def commit(verdict, drafts: torch.Tensor, out: torch.Tensor, generated: int) -> tuple[int, list[int]]:
    """Write a target verdict after ``out[:generated + n]``: (n accepted, the n + 1 new tokens).

    The one host sync of a speculative step: the accepted count and the tokens in a single transfer.
    """
    packed = torch.cat([verdict.n_accepted.view(1), drafts, verdict.next_token.view(1)]).tolist()
    n = packed[0]
    out[generated + n] = verdict.next_token
    return n, packed[1 : 1 + n] + [packed[-1]]


def first_difference(replayed: Generation, live: Generation) -> str | None:
    """The first count, step or token in which two generations of one request differ, in words."""
    for model in sorted(live.forwards.keys() | replayed.forwards.keys()):
        for count in ("forward_passes", "tokens_scored", "encoder_passes", "shapes"):
            a = replayed.forwards.get(model, {}).get(count)
            b = live.forwards.get(model, {}).get(count)
            if a != b:
                return f"{model} {count}: replayed {a}, live {b}"
    steps = [("target step", replayed.steps, live.steps)]
    steps += [
        (f"{name} review", replayed.inner_steps.get(name, []), live.inner_steps.get(name, []))
        for name in sorted(live.inner_steps.keys() | replayed.inner_steps.keys())
    ]
    for what, a, b in [*steps, ("output token", replayed.tokens, live.tokens)]:
        a, b = [_plain(x) for x in a], [_plain(x) for x in b]
        if a != b:
            i = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
            mine, theirs = (a[i] if i < len(a) else "none"), (b[i] if i < len(b) else "none")
            return f"{what} {i}: replayed {mine}, live {theirs}"
    return None


def _plain(value):
    return tuple(value) if isinstance(value, (list, tuple)) else value
