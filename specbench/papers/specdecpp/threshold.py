"""SpecDec++'s Theorem 3.1 checked numerically: the optimal stopping rule is a threshold on the chance
that a candidate gets rejected (``specbench theory threshold``).

Huang, Guo and Wang, "SpecDec++: Boosting Speculative Decoding via Adaptive Candidate Lengths"
(2024), Sec. 3.1 and Appendix D: candidate length as a Markov decision process. After each drafted
candidate the policy stops (the target verifies the round) or continues (one more draft pass). Here
the MDP is small enough to solve exactly: the i-th candidate of a round is accepted with chance p_i,
drawn i.i.d. from a finite set and seen when drafted (the acceptance head predicting perfectly); a
draft pass costs ``c`` and a target pass 1 (relative times); a round of n candidates commits A + 1
tokens, A the accepted prefix; the generation ends after ``tokens`` tokens and a round holds at most
``longest`` candidates. Value iteration (a DAG: continuing lengthens the round, stopping shortens the
remaining budget) gives the minimum expected time to finish from every state, and with it the
optimal action there.

Theorem 3.1 says that stopping is optimal once P(at least one candidate rejected) = 1 - prod p_i
exceeds a problem-specific constant. :func:`threshold_check` measures whether the optimal policy is
exactly such a threshold: at each remaining budget, the largest rejection chance among the states
where continuing is optimal against the smallest among those where stopping is (a threshold exists
iff the first is below the second). Far from the end of the generation it is; within about one
round of the end it need not be, since the theorem's argument assumes a time-homogeneous setting.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Problem:
    rates: tuple[float, ...] = (0.95, 0.7, 0.3)  # a candidate's acceptance chances
    weights: tuple[float, ...] = (0.5, 0.3, 0.2)  # how often each occurs
    c: float = 0.1  # a draft pass over a target pass
    tokens: int = 40  # tokens the generation needs
    longest: int = 6  # candidates a round may hold


def solve(problem: Problem) -> dict[tuple[int, tuple[int, ...]], tuple[float, bool]]:
    """(remaining tokens, the round's candidates as indices into ``rates``) -> (minimum expected time
    to finish, whether stopping is optimal there)."""
    rates = np.asarray(problem.rates, dtype=float)
    weights = np.asarray(problem.weights, dtype=float) / sum(problem.weights)

    @functools.cache
    def start(m: int) -> float:  # a new round: its first candidate is drafted
        if m <= 0:
            return 0.0
        return problem.c + sum(w * value(m, (k,)) for k, w in enumerate(weights))

    @functools.cache
    def stop(m: int, round_: tuple[int, ...]) -> float:
        p = rates[list(round_)]
        survive = np.concatenate([[1.0], np.cumprod(p)])  # all of the first a accepted
        fail = np.concatenate([1 - p, [1.0]])  # ... and the next rejected (or the round ends)
        return 1.0 + sum(survive[a] * fail[a] * start(m - a - 1) for a in range(len(round_) + 1))

    @functools.cache
    def go_on(m: int, round_: tuple[int, ...]) -> float:
        return problem.c + sum(w * value(m, (*round_, k)) for k, w in enumerate(weights))

    @functools.cache
    def value(m: int, round_: tuple[int, ...]) -> float:
        if len(round_) >= problem.longest:
            return stop(m, round_)
        return min(stop(m, round_), go_on(m, round_))

    policy = {}
    for m in range(1, problem.tokens + 1):
        for n in range(1, problem.longest + 1):
            for round_ in itertools.product(range(len(rates)), repeat=n):
                halt = n >= problem.longest or stop(m, round_) <= go_on(m, round_)
                policy[(m, round_)] = (value(m, round_), halt)
    return policy


def rejection_chance(problem: Problem, round_: tuple[int, ...]) -> float:
    """P(at least one candidate of the round is rejected) = 1 - prod p_i."""
    return 1.0 - float(np.prod([problem.rates[k] for k in round_]))


def threshold_check(problem: Problem) -> list[dict]:
    """Per remaining budget m: the largest rejection chance where continuing is optimal, the smallest
    where stopping is (rounds below the length cap), and whether a threshold separates them."""
    policy = solve(problem)
    rows = []
    for m in range(1, problem.tokens + 1):
        go, halt = [], []
        for (budget, round_), (_, stops) in policy.items():
            if budget != m or len(round_) >= problem.longest:
                continue
            (halt if stops else go).append(rejection_chance(problem, round_))
        highest_go = max(go, default=float("nan"))
        lowest_stop = min(halt, default=float("nan"))
        rows.append(
            {
                "tokens_left": m,
                "continue_up_to": highest_go,
                "stop_from": lowest_stop,
                "threshold": not go or not halt or highest_go < lowest_stop,
            }
        )
    return rows
