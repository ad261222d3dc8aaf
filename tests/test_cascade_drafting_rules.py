"""CS Drafting: three rules of the 3-level cascade (target, BASE, SMALL, Max-Gram), each pinned by a
hand-traced generation whose exact drafts, reviews, passes and cache lengths are asserted.

(a) Max-Gram's budget at the level of reviewer r is K[r][n-1] + mag_tail, its row's last neural entry
    (the authors' csd.py: ``while len(draft) < sum(ks[:i + 1])`` over row r's increments, MaG last).
(b) ``mag_lenience: false`` makes SMALL's reviews of Max-Gram strict whatever the lenience; every
    other drafter's review keeps the lenience, on Max-Gram's tail tokens too.
(c) an inner review that keeps ``accepted`` of its drafts after out[:g] rolls every model back to
    g + accepted, by position: the next pass of each model reuses what lies before that point and
    feeds everything after it again, a token that a higher review restores too.

The models are scripted (``ScriptedModel``): the next-token law depends on the position only, so a
trace is a matter of positions. The target's greedy output is TRUTH; a drafter agrees with it except
where its script says otherwise; Max-Gram proposes a scripted sequence (``OracleMag``, k tokens a call).
"""

from __future__ import annotations

import pytest
import torch
from test_cascade_drafting import OracleMag

from specbench.decoding import autoregressive, cascade_drafting
from specbench.models.base import ForwardCounter, Pass

VOCAB = 8
PROMPT = torch.tensor([7, 7, 7])  # P = 3: a model's first pass feeds the prompt too
P = PROMPT.shape[0]
TRUTH = [1, 2, 3, 4, 5, 6] * 6  # the target's greedy continuation; 0 and 7 are nobody's first choice
K = [[1, 3], [0, 1]]  # the committed cs-base-small-mag cell's first K (cumulative: k11 = 1, k12 = 3, k22 = 1)


class ScriptedModel:
    """A language model whose law for generated position i depends on i only: its argmax ``best[i]``
    gets 0.5; ``second[i]``, where scripted, 0.4 (a lenience-3 review keeps it as a one-hot draft:
    3 x 0.4 >= 1); every other token an equal share of the rest (3 x share < 0.5: never kept by a
    lenience-3 review, even against a neural q of 0.5).

    Its cache bookkeeping is HFModel's: it holds ``cached`` positions of prompt + generation; a pass
    reuses min(cached, total - n - 1) of them (the committed prefix's last token is always fed again,
    for its logits) and feeds the rest; ``rollback(n)`` keeps at most P + n. ``passes`` lists each
    pass as (positions reused, positions fed)."""

    num_parameters = 1
    vocab_size = VOCAB
    device = torch.device("cpu")

    def __init__(self, name: str, best: list[int], second: dict[int, int] | None = None):
        self.name, self.best, self.second = name, best, second or {}
        self.counter = ForwardCounter()
        self.passes: list[tuple[int, int]] = []
        self.cached = 0

    def start(self, prompt_ids: torch.Tensor) -> None:
        self.passes, self.cached = [], 0

    def rollback(self, n_tokens: int) -> None:
        self.cached = min(self.cached, P + n_tokens)

    def score(self, tokens: torch.Tensor, n_candidates: int, hidden=()) -> Pass:
        total = P + tokens.shape[0]
        keep = min(self.cached, total - n_candidates - 1)
        self.counter.end(self.counter.begin(self.device), total - keep, self.device, context=keep)
        self.passes.append((keep, total - keep))
        self.cached = total
        first = tokens.shape[0] - n_candidates  # the generated position the first row predicts
        return Pass(torch.stack([self.logits(i) for i in range(first, tokens.shape[0] + 1)]))

    def logits(self, i: int) -> torch.Tensor:
        probs = torch.zeros(VOCAB, dtype=torch.float64)
        probs[self.best[i]] = 0.5
        rest = [t for t in range(VOCAB) if t != self.best[i] and t != self.second.get(i)]
        if i in self.second:
            probs[self.second[i]] = 0.4
        probs[rest] = (1.0 - probs.sum()) / len(rest)
        return probs.log()


def scripted(wrong: dict[int, int]) -> list[int]:
    """TRUTH with the tokens at some positions replaced."""
    return [wrong.get(i, t) for i, t in enumerate(TRUTH)]


def cascade(base: ScriptedModel, small: ScriptedModel, mag: list[int], max_new_tokens: int, **options):
    """One greedy CS Drafting generation over the target TRUTH, checked against its autoregressive
    output; returns it and the target."""
    target = ScriptedModel("target", TRUTH)
    gen = cascade_drafting.generate(
        target, [base, small], OracleMag(mag), PROMPT, K=K, max_new_tokens=max_new_tokens, **options
    )
    ar = autoregressive.generate(ScriptedModel("ar", TRUTH), PROMPT, max_new_tokens=max_new_tokens)
    assert gen.tokens == ar.tokens == TRUTH[:max_new_tokens]
    return gen, target


def counts(gen) -> dict:
    """Reviews (drafted, accepted) by reviewer, and each model's forward passes."""
    passes = {name: f["forward_passes"] for name, f in gen.forwards.items()}
    return {"target": gen.steps, **gen.inner_steps, "passes": passes}


# ---------------------------------------------------------------------------------------------
# (a) Max-Gram's budget: K[r][n-1] + mag_tail at the level of reviewer r

# Notation of the traces: positions are generated-token indices; "S@g" is SMALL reviewing its level's
# draft written after out[:g] (its level is Max-Gram alone: min(mag_tokens, room) tokens), "B@g" BASE
# reviewing its level (SMALL blocks while d < K[1][1] = 1, then Max-Gram while d < K[1][1] + mag_tail),
# "T@g" the target reviewing level 0 (a BASE block while d < K[0][0] = 1, SMALL blocks while
# d < K[0][1] = 3, then Max-Gram while d < K[0][1] + mag_tail). A review keeps a prefix of its d drafts
# and adds one token (a block); "room" is how many drafts fit before max_new_tokens.
BUDGET_CASES = {
    # The committed cell's parameters (mag_tokens = mag_tail = 10), every draft right, 30 tokens.
    # step 1, room 29: S@0: MaG drafts 10, S keeps 10 + 1 = 11. B's level: 11 >= 1 + 10, no MaG;
    #   B@0 keeps 11 + 1 = 12. Level 0: 12 >= 3 but < 3 + 10 = 13: one MaG call of 10 -> 22 drafts;
    #   T@0 keeps 22 + 1: 23 generated.
    # step 2, room 6: S@23: MaG drafts min(10, 4) = 4, S keeps 4 + 1 = 5; B's level: 5 = its room;
    #   B@23 keeps 5 + 1 = 6 = room; T@23 keeps 6 + 1: 30. MaG calls: 2 + 1.
    # The diagonal K[0][0] + 10 = 11 would let T review B's 12 alone; BASE's level under the top
    # row's K[0][1] + 10 = 13 would draft 10 more MaG tokens (B@0 reviewing 21).
    "committed": (
        dict(mag_tokens=10, mag_tail=10),
        {},
        30,
        {
            "target": [(22, 22), (6, 6)],
            "base": [(11, 11), (5, 5)],
            "small": [(10, 10), (4, 4)],
            "passes": {"target": 2, "base": 2, "small": 2, "mag": 3},
        },
    ),
    # mag_tokens 1, mag_tail 2, every draft right, 12 tokens. Budgets: B's level 1 + 2 = 3, level 0
    # 3 + 2 = 5. Each step: S@g reviews 1 MaG token -> 2; B's level: 2 < 3, one MaG call -> 3; B keeps
    # 3 + 1 = 4; level 0: 4 >= 3 but < 5, one MaG call -> 5; T keeps 5 + 1 = 6. Steps at g = 0 and 6
    # (room 11 and 5), 3 MaG calls each. With K[0][0] + 2 = 3 level 0 would stop at 4.
    "every draft right": (
        dict(mag_tokens=1, mag_tail=2),
        {},
        12,
        {
            "target": [(5, 5), (5, 5)],
            "base": [(3, 3), (3, 3)],
            "small": [(1, 1), (1, 1)],
            "passes": {"target": 2, "base": 2, "small": 2, "mag": 6},
        },
    ),
    # As above, but SMALL is wrong at position 1 (it adds 0 there), so BASE's block is short and
    # SMALL's column of level 0 runs. step 1, room 11: S@0 keeps MaG's 1 and adds its wrong 0 -> 2;
    #   B's level: 2 < 3, MaG drafts position 2 -> 3; B@0 keeps 1 (rejects the 0), adds 2 -> block of 2.
    #   Level 0: 2 < 3: S@2 keeps MaG's position 2 and adds 3 -> 4; 4 < 5: MaG drafts position 4 -> 5;
    #   T@0 keeps 5 + 1 = 6. MaG calls: 3 + 1 (positions 0, 2 for B, 2 for S@2, 4).
    # step 2, room 5: as above (positions 6-11), 3 MaG calls. With K[0][0] + 2 = 3, T would review 4.
    "small wrong once": (
        dict(mag_tokens=1, mag_tail=2),
        {1: 0},
        12,
        {
            "target": [(5, 5), (5, 5)],
            "base": [(3, 1), (3, 3)],
            "small": [(1, 1), (1, 1), (1, 1)],
            "passes": {"target": 2, "base": 2, "small": 3, "mag": 7},
        },
    ),
}


@pytest.mark.parametrize("case", list(BUDGET_CASES))
def test_max_gram_budget_is_the_rows_last_neural_entry_plus_its_tail(case):
    """Max-Gram drafts at reviewer r's level while the draft is shorter than K[r][n-1] + mag_tail (the
    authors' csd.py sums row r's increments through Max-Gram's column): K = [[1, 3], [0, 1]], the
    committed cs-base-small-mag cell, is where K[0][0] + mag_tail or K[0][1] + mag_tail at BASE's
    level would change every count."""
    options, small_wrong, max_new_tokens, expected = BUDGET_CASES[case]
    base, small = ScriptedModel("base", TRUTH), ScriptedModel("small", scripted(small_wrong))
    gen, _ = cascade(base, small, TRUTH, max_new_tokens, **options)
    assert counts(gen) == expected


# ---------------------------------------------------------------------------------------------
# (b) mag_lenience: false keeps SMALL's reviews of Max-Gram strict at lenience 3

# lenience 3, mag_tokens 1, mag_tail 2, 12 tokens (budgets as in "every draft right" above). Max-Gram
# drafts 6 at position 0 and 0 at position 2 (TRUTH has 1 and 3). SMALL ranks 6 second at position 0
# and BASE ranks 0 second at position 2 (probability 0.4: a lenience-3 review keeps either as a
# one-hot draft). BASE gives SMALL's 6 only 0.5 / 7 against SMALL's q = 0.4: 3 x 0.071 < 0.4, rejected.
LENIENCE_CASES = {
    # step 1, room 11: S@0 strict: rejects 6, adds 1 -> 1; B's level: 1 < 3: MaG drafts positions 1, 2
    #   (2, 0) -> 3; B@0 lenient keeps 1, 2 and MaG's 0 (its second choice), adds 4 -> 4; level 0:
    #   MaG drafts position 4 -> 5; T@0 strict keeps 2 (rejects the 0 at position 2), adds 3.
    # step 2, g 3, room 8: S@3 keeps MaG's 4, adds 5; MaG drafts position 5; B@3 keeps 3 + 1;
    #   MaG drafts position 7; T@3 keeps 5 + 1: 9 generated.
    # step 3, g 9, room 2: S@9 has no room for MaG (an empty review, adds 4); B's level is full at 1;
    #   B@9 keeps it, adds 5 -> 2 = room; T@9 keeps 2 + 1: 12. MaG calls: 4 + 3.
    False: {
        "target": [(5, 2), (5, 5), (2, 2)],
        "base": [(3, 3), (3, 3), (1, 1)],
        "small": [(1, 0), (1, 1), (0, 0)],
        "passes": {"target": 3, "base": 3, "small": 3, "mag": 7},
    },
    # step 1, room 11: S@0 lenient keeps 6, adds 2 -> 2; MaG drafts position 2 (0) -> 3; B@0 rejects
    #   SMALL's 6 at once, adds 1 -> 1; level 0: 1 < 3: S@1 keeps MaG's 2 (position 1), adds 3 -> 3;
    #   MaG drafts positions 3, 4 -> 5; T@0 keeps 5 + 1: 6 generated.
    # step 2, g 6, room 5: as in "every draft right" (S@6, MaG, B@6, MaG, T@6): 12. MaG calls: 5 + 3.
    True: {
        "target": [(5, 5), (5, 5)],
        "base": [(3, 0), (3, 3)],
        "small": [(1, 1), (1, 1), (1, 1)],
        "passes": {"target": 2, "base": 2, "small": 3, "mag": 8},
    },
}


@pytest.mark.parametrize("mag_lenience", [False, True])
def test_mag_lenience_false_makes_smalls_reviews_of_max_gram_strict(mag_lenience):
    """Appendix B ("we also avoid lenience between MaG and its reviewer"): with mag_lenience false the
    smallest drafter reviews Max-Gram strictly at any lenience, while BASE's review stays lenient, on
    Max-Gram's tail tokens too (the False trace keeps MaG's wrong 0 at position 2 until the target)."""
    base = ScriptedModel("base", TRUTH, second={2: 0})
    small = ScriptedModel("small", TRUTH, second={0: 6})
    gen, _ = cascade(
        base,
        small,
        scripted({0: 6, 2: 0}),
        12,
        mag_tokens=1,
        mag_tail=2,
        lenience=3.0,
        mag_lenience=mag_lenience,
    )
    assert counts(gen) == LENIENCE_CASES[mag_lenience]


# ---------------------------------------------------------------------------------------------
# (c) how far an inner review rolls the caches back


def test_inner_review_rolls_every_model_back_to_its_kept_prefix():
    """S@g or B@g keeping a of its drafts rolls every model back to g + a: the next pass of each model
    feeds exactly what changed. Rolling back to g re-scores kept tokens; to g + a + 1, or the
    reviewer alone, reuses a replaced token's cache; both change the (reused, fed) pairs below.

    mag_tokens 3, mag_tail 2, strict, 20 tokens (budgets: BASE's level 3, level 0 5). SMALL believes
    0 at positions 2 and 15, BASE 0 at position 15; Max-Gram drafts 0 at positions 2, 9 and 15.
    Caches are counted in positions of prompt (P = 3) + generation; a pass reuses
    min(cache, P + g - 1) (the committed prefix's last token is always fed again).

    step 1, g 0, room 19:
      S@0: MaG drafts 0-2 (1 2 0); S passes (0, 6); keeps 3 (its 0 too), adds 4; back to 0 + 3: S 6.
      B's level: 4 >= 3. B@0 passes (0, 7); keeps 2, adds 3; back to 2: B 5, S 5.
      Level 0: 3 >= 3; 3 < 5: MaG drafts 3-5 -> 6. T@0 passes (0, 9); keeps 6, adds 1; T 9.
    step 2, g 7, room 12:
      S@7: MaG drafts 7-9 (2 3 0); S passes (min(5, 9), 13 - 5) = (5, 8); keeps 2, adds 4; back to
        7 + 2: S 12.
      B's level: 3 >= 3. B@7 passes (5, 8); keeps 3, adds 5; back to 10: B 13, S 12.
      Level 0: 4 < 5: MaG drafts 11-13 -> 7. T@7 passes (9, 8); keeps 7, adds 3: 15 generated; T 17.
    step 3, g 15, room 4:
      S@15: MaG drafts min(3, 2) = 2: 15-16 (0 5); S passes (min(12, 17), 20 - 12) = (12, 8); keeps 2,
        adds 6; S 20.
      B's level: 3 = its room. B@15 passes (13, 8); keeps 3 (its 0 at 15 too), adds 1 -> 4 = room.
      T@15 passes (17, 5); keeps 0 (the 0 at 15), adds 4; back to 15: T 18, B 18, S 18.
    step 4, g 16, room 3:
      S@16: MaG drafts 1: 16 (5); S passes (18, 2); keeps 1, adds 6. B@16 passes (18, 3); keeps 2,
      adds 1 -> 3 = room. T@16 passes (18, 4); keeps 3, adds 2: 20. MaG calls: 2 + 2 + 1 + 1.
    """
    base = ScriptedModel("base", scripted({15: 0}))
    small = ScriptedModel("small", scripted({2: 0, 15: 0}))
    gen, target = cascade(base, small, scripted({2: 0, 9: 0, 15: 0}), 20, mag_tokens=3, mag_tail=2)
    assert counts(gen) == {
        "target": [(6, 6), (7, 7), (4, 0), (3, 3)],
        "base": [(4, 2), (3, 3), (3, 3), (2, 2)],
        "small": [(3, 3), (3, 2), (2, 2), (1, 1)],
        "passes": {"target": 4, "base": 4, "small": 4, "mag": 6},
    }
    assert target.passes == [(0, 9), (9, 8), (17, 5), (18, 4)]
    assert base.passes == [(0, 7), (5, 8), (13, 8), (18, 3)]
    assert small.passes == [(0, 6), (5, 8), (12, 8), (18, 2)]
    scored = {name: f["tokens_scored"] for name, f in gen.forwards.items() if name != "mag"}
    assert scored == {"target": 26, "base": 26, "small": 24}


def test_a_token_a_higher_review_restores_is_scored_again():
    """Rollback goes by position, not by content: SMALL rejects Max-Gram's right token at position 2,
    BASE restores it, and SMALL's next pass feeds position 2 again. (The authors' KV cache, model.py
    ``prepare_input``, reuses the longest common prefix of the ids it last scored: it would reuse
    position 2 there, passing (6, 7) instead of (5, 8).)

    mag_tokens 3, mag_tail 2, strict, 14 tokens; SMALL believes 0 at position 2, Max-Gram is right.
    step 1, g 0, room 13: S@0: MaG drafts 0-2 (1 2 3); S passes (0, 6); keeps 2, adds its 0; back to
      2: S 5. B's level: 3 >= 3. B@0 passes (0, 6); keeps 2, adds 3 (MaG's token again); B 5, S 5.
      Level 0: 3 < 5: MaG drafts 3-5 -> 6. T@0 passes (0, 9); keeps 6, adds 1: 7 generated; T 9.
    step 2, g 7, room 6: S@7: MaG drafts 7-9; S passes (min(5, 9), 13 - 5) = (5, 8); keeps 3, adds 5
      -> 4 >= 3. B@7 passes (5, 9); keeps 4, adds 6 -> 5; 5 >= 5. T@7 passes (9, 6); keeps 5, adds 1.
    step 3, g 13, room 0: T@13 passes (15, 1) and adds 2: 14. MaG calls: 2 + 1.
    """
    base, small = ScriptedModel("base", TRUTH), ScriptedModel("small", scripted({2: 0}))
    gen, target = cascade(base, small, TRUTH, 14, mag_tokens=3, mag_tail=2)
    assert counts(gen) == {
        "target": [(6, 6), (5, 5), (0, 0)],
        "base": [(3, 2), (4, 4)],
        "small": [(3, 2), (3, 3)],
        "passes": {"target": 3, "base": 2, "small": 2, "mag": 3},
    }
    assert (target.passes, base.passes, small.passes) == (
        [(0, 9), (9, 6), (15, 1)],
        [(0, 6), (5, 9)],
        [(0, 6), (5, 8)],
    )
