"""A transformers model behind the :class:`~specbench.models.base.LanguageModel` interface.

Decoder-only models keep the prompt in front of the generation; encoder-decoder models (T5)
encode the prompt once per request and decode from the decoder start token. The KV cache holds
exactly ``self._cached`` positions of (prompt + generation); ``score`` feeds only the positions
the cache lacks and crops whatever it holds past the committed prefix.

``score(..., hidden=layers)`` also returns those layers' hidden states at the scored positions, from
the same forward pass; a pass that asks for none takes the default path.
"""

from __future__ import annotations

import inspect

import torch
from transformers import DynamicCache, EncoderDecoderCache, PreTrainedModel

from specbench.models import attention
from specbench.models.base import ForwardCounter, Layer, Pass, pick_hidden
from specbench.models.tree import TokenTree, move_path_entries, tree_attention, tree_positions


class HFModel:
    def __init__(self, model: PreTrainedModel, name: str, tokenizer=None):
        self.model = model.eval()
        self.name = name
        attention.install()  # multi-row passes on the CPU read grouped KV heads in place
        self.tokenizer = tokenizer
        self.counter = ForwardCounter()
        self.device = input_device(model)
        self.num_parameters = sum(p.numel() for p in model.parameters())
        self.vocab_size = model.config.get_text_config().vocab_size
        self.is_encoder_decoder = bool(model.config.is_encoder_decoder)
        forward_parameters = inspect.signature(model.forward).parameters
        self._keeps_logits = "logits_to_keep" in forward_parameters
        # transformers 5.24 renamed forward's past_key_values to cache (the old name goes in 5.40)
        self._cache_argument = "cache" if "cache" in forward_parameters else "past_key_values"
        self._prefix = torch.empty(0, dtype=torch.long, device=self.device)
        self._encoder_outputs = None
        self._cache = None
        self._cached = 0
        self._tree: tuple[int, int] = (0, 0)  # (first position, nodes) of the last scored tree
        # the linear layers' library (specbench.models.linear; sources set it), and what auto timed
        self.linear, self.linear_probe = "aten", {}

    def eos_token_ids(self) -> list[int]:
        """Every id that ends a generation: the generation config's and the tokenizer's EOS."""
        ids = set()
        for value in (
            self.model.generation_config.eos_token_id,
            getattr(self.tokenizer, "eos_token_id", None),
        ):
            if isinstance(value, int):
                ids.add(value)
            elif value:
                ids.update(int(v) for v in value)
        return sorted(ids)

    @torch.inference_mode()
    def start(self, prompt_ids: torch.Tensor) -> None:
        prompt_ids = prompt_ids.to(self.device)
        if prompt_ids.ndim != 1 or (prompt_ids.shape[0] == 0 and not self.is_encoder_decoder):
            raise ValueError(f"{self.name}: the prompt must be a non-empty 1-D tensor of token ids")
        if self.is_encoder_decoder:
            started = self.counter.begin(self.device)
            self._encoder_outputs = self.model.get_encoder()(input_ids=prompt_ids[None])
            self.counter.end_encoder(started, prompt_ids.shape[0], self.device)
            start_id = self.model.config.decoder_start_token_id
            self._prefix = torch.tensor([start_id], dtype=torch.long, device=self.device)
            self._cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
        else:
            self._prefix = prompt_ids
            self._cache = DynamicCache()
        self._cached = 0

    def _unseen(self, tokens: torch.Tensor, keep: int) -> torch.Tensor:
        """Prefix + generated ``tokens`` from position ``keep`` on: what a pass must feed when the cache
        holds ``keep`` positions (the prefix is copied only while the cache lacks part of it)."""
        prefix_len = self._prefix.shape[0]
        if keep >= prefix_len:
            return tokens[keep - prefix_len :]
        return torch.cat([self._prefix[keep:], tokens])

    def rollback(self, n_tokens: int) -> None:
        self._cached = min(self._cached, self._prefix.shape[0] + n_tokens)

    @torch.inference_mode()
    def score(self, tokens: torch.Tensor, n_candidates: int, hidden: tuple[Layer, ...] = ()) -> Pass:
        tokens = tokens.to(self.device)  # token ids from a caller on another device (no-op otherwise)
        prefix_len = self._prefix.shape[0]
        total = prefix_len + tokens.shape[0]
        keep = min(self._cached, total - n_candidates - 1)
        held = self._cache.get_seq_length()
        if held > keep:
            self._cache.crop(keep - held)  # transformers 5 crops by a negative count
        new = self._unseen(tokens, keep)
        kwargs = {self._cache_argument: self._cache, "use_cache": True}
        if self._keeps_logits:
            kwargs["logits_to_keep"] = n_candidates + 1
        if self.is_encoder_decoder:
            kwargs["encoder_outputs"] = self._encoder_outputs
            kwargs["decoder_input_ids"] = new[None]
        else:
            kwargs["input_ids"] = new[None]
        if hidden:
            kwargs["output_hidden_states"] = True
        started = self.counter.begin(self.device)
        output = self.model(**kwargs)
        logits = output.logits[0, -(n_candidates + 1) :]
        self.counter.end(started, new.shape[0], self.device, context=keep)
        states = {}
        if hidden:
            every = output.decoder_hidden_states if self.is_encoder_decoder else output.hidden_states
            states = pick_hidden(every, hidden, slice(-(n_candidates + 1), None), self.name)
        self._cached = total
        return Pass(logits, states)

    @torch.inference_mode()
    def score_tree(
        self, tokens: torch.Tensor, tree: TokenTree, hidden: tuple[Layer, ...] = (), fed_hidden: bool = False
    ) -> Pass:
        """One forward pass over the committed tokens the cache lacks and every node of ``tree`` under
        tree attention: logits ``[len(tree) + 1, V]``, row 0 after ``tokens``, row i + 1 after node i
        (and the ``hidden`` layers' states at the same positions; ``fed_hidden``: at every position the
        pass fed, the committed ones the cache lacked first, so the last ``len(tree) + 1`` rows are the
        logits' rows). The nodes' entries stay in the cache until :meth:`keep_path` keeps one path."""
        if self.is_encoder_decoder:
            raise ValueError(f"{self.name}: tree verification serves decoder-only models")
        tokens, nodes = tokens.to(self.device), tree.tokens.to(self.device)
        total = self._prefix.shape[0] + tokens.shape[0]
        keep = min(self._cached, total - 1)
        held = self._cache.get_seq_length()
        if held > keep:
            self._cache.crop(keep - held)
        committed = self._unseen(tokens, keep)
        fed = committed.shape[0] + len(tree)
        dtype = self.model.get_input_embeddings().weight.dtype
        kwargs = {
            self._cache_argument: self._cache,
            "use_cache": True,
            "input_ids": torch.cat([committed, nodes])[None],
            "attention_mask": tree_attention(committed.shape[0], keep, tree, dtype, self.device),
            "position_ids": tree_positions(total, committed.shape[0], tree, self.device),
        }
        if self._keeps_logits:
            kwargs["logits_to_keep"] = len(tree) + 1
        if hidden:
            kwargs["output_hidden_states"] = True
        started = self.counter.begin(self.device)
        output = self.model(**kwargs)
        self.counter.end(started, fed, self.device, context=keep)
        rows = slice(-(len(tree) + 1), None)
        fed_rows = slice(-fed, None) if fed_hidden else rows
        states = pick_hidden(output.hidden_states, hidden, fed_rows, self.name) if hidden else {}
        self._cached = total
        self._tree = (total, len(tree))
        return Pass(output.logits[0, rows], states)

    @torch.inference_mode()
    def keep_path(self, path: list[int]) -> None:
        """After :meth:`score_tree`: keep the entries of the tree nodes ``path`` (root to leaf) as the
        positions after the committed tokens, and forget the other nodes'."""
        start, _ = self._tree
        move_path_entries(self._cache.layers, start, path, self.device)
        extra = self._cache.get_seq_length() - (start + len(path))
        if extra:
            self._cache.crop(-extra)
        self._cached = start + len(path)


def input_device(model: PreTrainedModel) -> torch.device:
    """Where a model takes its input ids: its parameters' device, or for a model that accelerate
    placed across devices (``device_map``) the execution device of its input embeddings. Its
    dispatch hooks return the outputs there, so our loops keep token ids and probability rows on
    this one device and never move a cache."""
    placement = getattr(model, "hf_device_map", None)
    if not placement or len(set(placement.values())) == 1 and "disk" not in placement.values():
        return next(model.parameters()).device
    embeddings = model.get_input_embeddings()
    name = next((n for n, m in model.named_modules() if m is embeddings), "")
    where = next(
        (d for module, d in placement.items() if name == module or name.startswith(module + ".")), None
    )
    if where is None:  # the map names a parent of the embeddings, or none: the first entry leads
        where = next(iter(placement.values()))
    if isinstance(where, int):
        return torch.device("cuda", where)
    return torch.device("cpu" if where == "disk" else where)
