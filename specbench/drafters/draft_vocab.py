"""A drafter's LM head restricted to the most frequent tokens (FR-Spec, Zhao et al., 2025).

A small drafter of a large-vocabulary target spends most of each pass in its LM head: for
SmolLM2-135M's 49,152 tokens and a 576-wide drafter that is 28M multiply-adds, more than all of its
layers. The drafter only has to propose tokens the target is likely to accept, so its head scores
the ``N`` tokens the target emits most often and gives every other token probability 0. Drafting
stays lossless: the target verifies every proposal, and speculative sampling's residual covers the
tokens the drafter never proposes.

The draft vocabulary lives next to the drafter's weights in ``draft_vocab.json``. The weights stay a
standard full-vocabulary checkpoint (the head is tied to the embedding), so plain transformers
loads the folder as an ordinary model that scores every token.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from specbench.models import linear

DRAFT_VOCAB_FILE = "draft_vocab.json"


def frequent_tokens(counts: torch.Tensor, n: int, always: list[int] = ()) -> torch.Tensor:
    """The ``n`` most frequent token ids (ties by id), ``always`` included; sorted by id."""
    keep = torch.zeros(counts.shape[0], dtype=torch.bool)
    keep[list(always)] = True
    order = torch.sort(counts, descending=True, stable=True).indices
    ranked = order[~keep[order]]
    keep[ranked[: max(0, n - int(keep.sum()))]] = True
    return keep.nonzero().flatten()


def positions(ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """``[vocab_size]`` long: a token's row in the restricted head, or -1 when it has none."""
    where = torch.full((vocab_size,), -1, dtype=torch.long, device=ids.device)
    where[ids] = torch.arange(ids.shape[0], device=ids.device)
    return where


class DraftVocabHead(nn.Module):
    """Logits over the draft vocabulary, scattered into a full-vocabulary row (-inf elsewhere)."""

    def __init__(self, weight: torch.Tensor, ids: torch.Tensor, vocab_size: int):
        super().__init__()
        # [hidden, N] contiguous: on CPU, MKL's GEMV over a row-major [N, hidden] weight read through
        # a transpose (what nn.Linear does) ran ~2x slower than this layout on an AVX2 EPYC. A buffer,
        # not a parameter: it copies rows of the tied embedding, so the model's size (the MS cost)
        # must not count it twice.
        self.register_buffer("weight_t", weight[ids].T.contiguous(), persistent=False)
        self.register_buffer("ids", ids.clone(), persistent=False)
        self.vocab_size = vocab_size
        self.packed = None  # the rows in oneDNN's layout, once use_onednn ran (specbench.models.linear)

    def use_onednn(self) -> None:
        self.packed = linear.reorder(self.weight_t.T.contiguous())

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return full_vocabulary(self.subset(hidden), self.ids, self.vocab_size)

    def subset(self, hidden: torch.Tensor) -> torch.Tensor:
        """The logits of the draft vocabulary only (column i: token ``ids[i]``)."""
        if self.packed is None:
            return hidden @ self.weight_t
        return linear.apply(hidden, self.packed, None, self.ids.shape[0])


def full_vocabulary(subset: torch.Tensor, ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Logits over the draft vocabulary ``ids`` as full-vocabulary rows, -inf at every other token."""
    logits = subset.new_full((*subset.shape[:-1], vocab_size), float("-inf"))
    return logits.index_copy_(-1, ids, subset)


def save(folder: Path, ids: torch.Tensor) -> None:
    (folder / DRAFT_VOCAB_FILE).write_text(json.dumps({"token_ids": ids.tolist()}) + "\n")


def restrict_if_saved(model: nn.Module, folder: Path) -> int | None:
    """Replace ``model``'s LM head by the draft vocabulary saved in ``folder``; returns its size."""
    path = folder / DRAFT_VOCAB_FILE
    if not path.is_file():
        return None
    ids = torch.tensor(json.loads(path.read_text())["token_ids"], dtype=torch.long)
    weight = model.get_output_embeddings().weight.detach()
    model.lm_head = DraftVocabHead(weight, ids.to(weight.device), weight.shape[0])
    return ids.shape[0]
