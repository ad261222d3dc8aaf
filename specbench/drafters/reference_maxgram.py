"""Max-Gram exactly as the CS Drafting authors' code runs it (lfsszd/CS-Drafting, ``mag.py`` at commit
05b22e1), for per-model forward counts that agree with theirs (Chen et al., "Cascade Speculative
Drafting for Even Faster LLM Inference", NeurIPS 2024). Recipes select it with
``source: maxgram, options: {bigram: TABLE, variant: reference}``.

One search (:func:`reference_search`): in the corpus ``C = corpus ++ query[:-1]``, find the longest
suffix of ``query`` that occurs in ``C`` (any length, leftmost occurrence) and copy the up to k tokens
that follow it in ``C``; nothing when the query's last token is not in ``C``. One draft
(:func:`reference_draft`) of ``sequence`` for k:

1. search ``sequence`` in ``corpus``; if k tokens came back, they are the draft;
2. otherwise search the extended sequence ``y`` (sequence + the first copy) in ``y[:-1]``, whose
   corpus is therefore ``y[:-1] ++ y[:-1]``; if the two copies reach k tokens, both are the draft;
3. otherwise a greedy bigram chain from the last token fills the draft up to exactly k.

What the two inputs are, and the quirks that follow (each pinned in tests/test_maxgram_bigram.py):

* decoder-only targets: ``corpus`` is the prompt P and ``sequence`` is P + generation G, so the prompt
  stands twice in the first search's corpus. At an empty generation the whole prompt matches itself at
  the start, and the draft is the prompt's first k tokens;
* the first search's corpus ends one token before the sequence does, so a copy out of the generation
  stops one token early; the second search then continues it, and because its corpus is doubled a copy
  can run past the end of ``y[:-1]`` into its start (the prompt's first tokens). A draft is thus k to
  2k - 1 tokens long (step 2), never shorter than k (given a bigram table);
* encoder-decoder targets (``decoder_start`` set, FLAN-T5: 0): ``corpus`` is the encoder input and
  ``sequence`` is the decoder start token + G, so the decoder start token sits in the query and, from
  the second search on, in the corpus. With CS Drafting's T5 bigram table (token 0 -> 0) the first
  draft of a generation is k decoder-start (pad) tokens.

specbench's own Max-Gram (:mod:`specbench.drafters.maxgram`) searches prompt + generation once, copies
up to ``max_copy`` tokens from anywhere before the last token, and fills to exactly k: the behaviour the
paper describes (Sec. 3.3, Appendix A) without the quirks. The search runs on the host (one transfer of
the context per call; Max-Gram costs 0 in every cost table).
"""

from __future__ import annotations

import torch

from specbench.drafters.bigram import BigramTable
from specbench.models.base import Draft, ForwardCounter
from specbench.models.sampling import SamplingParams


def reference_search(query: torch.Tensor, corpus: torch.Tensor, n: int) -> torch.Tensor | None:
    """The up to ``n`` tokens after the leftmost occurrence, in ``C = corpus ++ query[:-1]``, of the
    longest suffix of ``query`` found there; None when ``query[-1]`` is nowhere in ``C``."""
    C = torch.cat([corpus, query[:-1]])
    starts = C == query[-1]  # starts[s]: C[s : s + m] == query[-m:], for m = 1
    if not bool(starts.any()):
        return None
    m = 1
    while m < query.shape[0]:
        # one token longer: C[s] == query[-(m + 1)] and C[s + 1 : s + 1 + m] == query[-m:]
        longer = (C[: C.shape[0] - m] == query[-(m + 1)]) & starts[1:]
        if not bool(longer.any()):
            break
        starts, m = longer, m + 1
    s = int(starts.nonzero()[0])
    return C[s + m : s + m + n]


def reference_draft(
    next_token: torch.Tensor, corpus: torch.Tensor, sequence: torch.Tensor, k: int
) -> torch.Tensor:
    """The draft that follows ``sequence`` (k to 2k - 1 tokens; see the module docstring)."""
    t0, y = sequence.shape[0], sequence
    if t0 == 0:
        return sequence
    for searched_in in (corpus, None):
        copy = reference_search(y, y[:-1] if searched_in is None else searched_in, k)
        if copy is not None:
            y = torch.cat([y, copy])
            if y.shape[0] >= t0 + k:
                return y[t0:]
    fill, current, size = [], y[-1], next_token.shape[0]
    for _ in range(t0 + k - y.shape[0]):
        current = next_token[current] if current < size else current  # unknown ids map to themselves
        fill.append(current)
    return torch.cat([y[t0:], torch.stack(fill)]) if fill else y[t0:]


class ReferenceMaxGramDrafter:
    """The reference Max-Gram as a drafter: one-hot q, cost 0, one counted call per ``propose``.

    ``propose(tokens, k)`` returns at most k tokens, as every drafter does; a caller that takes the
    reference's longer drafts (CS Drafting's cascade) passes ``limit``, the most tokens it has room for,
    and gets up to ``min(limit, 2k - 1)``.
    """

    num_parameters = 0
    drafts_past_k = True

    def __init__(self, table: BigramTable, name: str = "maxgram", decoder_start: int | None = None):
        self.table, self.name, self.decoder_start = table, name, decoder_start
        self.counter = ForwardCounter()
        self._prompt = torch.empty(0, dtype=torch.long)

    def start(self, prompt_ids: torch.Tensor) -> None:
        self._prompt = prompt_ids.detach().reshape(-1).cpu()

    def rollback(self, n_tokens: int) -> None:
        pass  # stateless beyond the prompt

    def propose(
        self,
        tokens: torch.Tensor,
        k: int,
        sampling: SamplingParams,
        generator: torch.Generator | None,
        limit: int | None = None,
    ) -> Draft:
        if k == 0:
            return Draft(tokens[:0], None)
        self.counter.forward_passes += 1  # a drafting call, cost 0; counted for completeness
        generated = tokens.detach().cpu()
        if self.decoder_start is None:
            sequence = torch.cat([self._prompt, generated])
        else:
            sequence = torch.cat([torch.tensor([self.decoder_start]), generated])
        draft = reference_draft(self.table.next_token, self._prompt, sequence, k)
        return Draft(draft[: k if limit is None else limit].to(tokens.device), None)
