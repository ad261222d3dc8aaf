"""Argmax bigram tables and the greedy bigram drafter (CS Drafting's fallback statistical model).

CS Drafting publishes, for the T5 (32100) and LLaMA (32000) vocabularies, a JSON list whose entry
``i`` is the most likely token after token ``i`` (counted on Wikipedia). ``BigramTable`` holds
such a table as a 1-D ``LongTensor`` ``next_token[v]``; ``BigramDrafter`` proposes the greedy
chain ``x1 = next_token[last]``, ``x2 = next_token[x1]``, ... (one-hot q, cost 0).
``cs_drafting_maxgram`` builds the CS Drafting Max-Gram: copy from the context, fill with a bigram.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from specbench.drafters.maxgram import MaxGramDrafter
from specbench.errors import SpecbenchError
from specbench.models.base import Draft, ForwardCounter
from specbench.models.sampling import SamplingParams


class BigramTable:
    """``next_token[v]``: the argmax next token after ``v`` (a 1-D LongTensor of length V)."""

    def __init__(self, next_token: torch.Tensor):
        if next_token.dim() != 1:
            raise ValueError(f"a bigram table is 1-D, got shape {tuple(next_token.shape)}")
        self.next_token = next_token.to(torch.long)

    @property
    def vocab_size(self) -> int:
        return self.next_token.shape[0]

    def __len__(self) -> int:
        return self.vocab_size

    @classmethod
    def load(cls, path: str | Path) -> BigramTable:
        """Read the published format: a JSON list of ints, entry i the argmax successor of token i."""
        where = str(path)
        fix = "point at a JSON list of token ids, e.g. CS Drafting's wiki_bigram_*_next_token.json"
        try:
            with open(path, encoding="utf-8") as handle:
                data = json.load(handle)
        except FileNotFoundError:
            raise SpecbenchError(where, "bigram table file not found", fix) from None
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise SpecbenchError(where, f"not valid JSON ({error})", fix) from None
        if not isinstance(data, list) or not data:
            raise SpecbenchError(where, "a bigram table must be a non-empty JSON list", fix)
        bad = next((i for i, x in enumerate(data) if type(x) is not int), None)
        if bad is not None:
            raise SpecbenchError(where, f"entry {bad} is {data[bad]!r}, not an integer token id", fix)
        table = torch.tensor(data, dtype=torch.long)
        out = ((table < 0) | (table >= len(data))).nonzero()
        if out.numel():
            i = int(out[0])
            raise SpecbenchError(
                where, f"entry {i} is {data[i]}, outside the vocabulary [0, {len(data)})", fix
            )
        return cls(table)

    def save(self, path: str | Path) -> None:
        try:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            with open(path, "w", encoding="utf-8") as handle:
                json.dump(self.next_token.tolist(), handle)
        except OSError as error:
            raise SpecbenchError(
                str(path), f"cannot write the table ({error.strerror or error})", "choose a writable --out"
            ) from None

    @classmethod
    def build(cls, token_id_sequences, vocab_size: int) -> BigramTable:
        """Count bigrams ``(v, w)`` over a corpus of token-id sequences and keep each ``v``'s argmax.

        Ties go to the smallest ``w``; a token never seen as a predecessor maps to itself.
        Sort-based (``torch.unique`` over ``v * V + w``), so memory is O(number of bigrams), never V*V.
        """
        firsts, seconds = [], []
        for seq in token_id_sequences:
            seq = torch.as_tensor(seq, dtype=torch.long).reshape(-1)
            if seq.numel() >= 2:
                firsts.append(seq[:-1])
                seconds.append(seq[1:])
        next_token = torch.arange(vocab_size, dtype=torch.long)
        if not firsts:
            return cls(next_token)
        v, w = torch.cat(firsts), torch.cat(seconds)
        if bool(((v < 0) | (v >= vocab_size) | (w < 0) | (w >= vocab_size)).any()):
            raise ValueError(f"token ids must lie in [0, {vocab_size})")
        keys, counts = torch.unique(v * vocab_size + w, return_counts=True)
        pv, pw = keys // vocab_size, keys % vocab_size
        best = torch.zeros(vocab_size, dtype=counts.dtype).scatter_reduce(0, pv, counts, "amax")
        top = counts == best[pv]  # every (v, w) reaching v's maximum count
        smallest = torch.full((vocab_size,), vocab_size, dtype=torch.long)
        smallest = smallest.scatter_reduce(0, pv[top], pw[top], "amin")
        seen = smallest < vocab_size
        next_token[seen] = smallest[seen]
        return cls(next_token)


def corpus_texts(paths) -> list[str]:
    """Texts of a corpus: every string field of every JSONL row, or every non-empty line of a text file."""
    texts = []
    for path in paths:
        path = Path(path)
        if not path.is_file():
            raise SpecbenchError(str(path), "corpus file not found", "give existing .jsonl or text files")
        try:
            raw = path.read_bytes().decode("utf-8-sig")
        except UnicodeDecodeError as error:
            line = path.read_bytes()[: error.start].count(b"\n") + 1
            raise SpecbenchError(
                f"{path}:{line}", "is not UTF-8 text (a binary file?)", "give .jsonl or text files"
            ) from None
        for number, line in enumerate(raw.split("\n"), 1):  # not splitlines(): texts may hold U+2028
            if not line.strip():
                continue
            if path.suffix != ".jsonl":
                texts.append(line)
                continue
            try:
                texts.extend(_strings(json.loads(line)))
            except json.JSONDecodeError:
                raise SpecbenchError(
                    f"{path}:{number}", "not a JSON object", "one JSON object a line"
                ) from None
    return texts


def _strings(value) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


class BigramDrafter:
    """Greedy bigram chain from the last token of prompt + generation; q is one-hot, cost 0.

    A token outside the table (a larger model vocabulary) maps to itself. Each ``propose`` counts
    one call in ``counter.forward_passes``.
    """

    num_parameters = 0

    def __init__(self, table: BigramTable, name: str = "bigram"):
        self.table = table
        self.name = name
        self.counter = ForwardCounter()
        self._last_prompt_token: torch.Tensor | None = None
        self._tables: dict[torch.device, torch.Tensor] = {}

    def _on(self, device: torch.device) -> torch.Tensor:
        if device not in self._tables:
            self._tables[device] = self.table.next_token.to(device)
        return self._tables[device]

    def start(self, prompt_ids: torch.Tensor) -> None:
        prompt_ids = prompt_ids.reshape(-1)
        self._last_prompt_token = prompt_ids[-1].detach() if prompt_ids.numel() else None

    def rollback(self, n_tokens: int) -> None:
        pass  # stateless beyond the prompt

    def propose(
        self, tokens: torch.Tensor, k: int, sampling: SamplingParams, generator: torch.Generator | None
    ) -> Draft:
        if k == 0:
            return Draft(tokens[:0], None)
        self.counter.forward_passes += 1
        if tokens.shape[0]:
            current = tokens[-1]
        elif self._last_prompt_token is not None:
            current = self._last_prompt_token.to(tokens.device)
        else:
            return Draft(tokens[:0].to(torch.long), None)
        table = self._on(tokens.device)
        size = table.shape[0]
        out = torch.empty(max(k, 0), dtype=torch.long, device=tokens.device)
        for i in range(k):  # k <= ~10: a few tiny indexing ops, no host sync
            current = torch.where(current < size, table[current.clamp(max=size - 1)], current)
            out[i] = current
        return Draft(out, None)


def cs_drafting_maxgram(table: BigramTable, max_copy: int = 10, name: str = "maxgram") -> MaxGramDrafter:
    """CS Drafting's Max-Gram: unbounded longest suffix match, copy up to ``max_copy`` tokens from the
    leftmost occurrence, fill the rest with a greedy bigram chain from the last copied token."""
    return MaxGramDrafter(name=name, max_ngram=None, max_copy=max_copy, fill=BigramDrafter(table))
