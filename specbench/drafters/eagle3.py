"""The EAGLE-3 draft head as its authors publish it (Li, Wei, Zhang and Zhang, "EAGLE-3: Scaling up
Inference Acceleration of Large Language Models via Training-Time Test", 2025; the layer of SafeAILab/
EAGLE's ``eagle/model/cnets.py``, vllm-project/speculators' ``Eagle3FirstLayerMixin`` and vLLM's
``llama_eagle3.py``), beside :mod:`specbench.drafters.eagle`'s EAGLE-1 layer.

At a committed position t the head reads the target's states at its aux layers (:attr:`Eagle3Head.reads`:
the inputs of the target's decoder layers 2, L // 2 and L - 3 unless its config names others),
concatenated in layer order and projected by ``fc`` (``[H, 3 H_target]``, no bias) to a feature g_t.
Its one decoder layer (``midlayer``) RMS-normalises the next token's embedding (``input_layernorm``) and
the feature (``hidden_norm``) separately, attends over their concatenation (its q, k and v projections
take 2H inputs), and adds the attention output to the feature as it came in (``norm_before_residual``:
to the normalised one); then ``post_attention_layernorm`` and the MLP with their residual. The head's
own final ``norm`` and ``lm_head`` (``[draft vocabulary, H]``) score the draft vocabulary, whose draft id
i is the target's token i + ``d2t[i]`` (``t2d``: the target tokens it holds). A tree's deeper levels feed
the layer's output *before* ``norm`` back as the next node's feature, without ``fc`` (the reference
skips it once the feature is H wide; vLLM feeds back its ``hidden_prenorm``).

The decoder layer's parts (attention, MLP, norms, rotary embedding) are transformers' own for the head's
``model_type`` (:data:`LAYER_FAMILIES`), built from the head's config: its rotary settings are the
head's, not the target's. :class:`Eagle3Head` has the interface of :class:`~specbench.drafters.eagle.
EagleHead` plus the draft vocabulary's (``ids``, ``vocab_size``, ``subset``), so
:class:`~specbench.drafters.eagle.EagleDrafter` drafts chains and trees with it, taking the head itself
as its LM head. Reading and writing the published files is :mod:`specbench.drafters.head_layouts`.
"""

from __future__ import annotations

import copy
import importlib

import torch
from torch import nn

# the decoder layer families a head's config may name (its model_type) -> transformers' class prefix
LAYER_FAMILIES = {"llama": "Llama", "qwen3": "Qwen3"}


def family(model_type: str) -> tuple[type, type, type]:
    """(decoder layer, RMS norm, rotary embedding) classes of transformers' ``model_type`` family."""
    prefix = LAYER_FAMILIES[model_type]
    module = importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
    return tuple(
        getattr(module, f"{prefix}{part}") for part in ("DecoderLayer", "RMSNorm", "RotaryEmbedding")
    )


class Eagle3Layer(nn.Module):
    """EAGLE-3's decoder layer: [input_layernorm(embedding); hidden_norm(feature)] (2H) into attention,
    the feature itself (or, ``norm_before_residual``, its norm) the residual."""

    def __init__(self, config, norm_before_residual: bool):
        super().__init__()
        layer_type, norm_type, _ = family(config.model_type)
        built = layer_type(config, layer_idx=0)
        self.self_attn, self.mlp = built.self_attn, built.mlp
        self.input_layernorm = built.input_layernorm
        self.post_attention_layernorm = built.post_attention_layernorm
        self.hidden_norm = norm_type(config.hidden_size, eps=config.rms_norm_eps)
        for name in ("q_proj", "k_proj", "v_proj"):
            narrow = getattr(self.self_attn, name)
            wide = nn.Linear(2 * config.hidden_size, narrow.out_features, bias=narrow.bias is not None)
            setattr(self.self_attn, name, wide)
        self.norm_before_residual = norm_before_residual

    def forward(self, embeddings, features, position_embeddings, mask, cache=None) -> torch.Tensor:
        normed = self.hidden_norm(features)
        residual = normed if self.norm_before_residual else features
        joint = torch.cat([self.input_layernorm(embeddings), normed], dim=-1)
        attended, _ = self.self_attn(
            joint, position_embeddings=position_embeddings, attention_mask=mask, cache=cache
        )
        hidden = residual + attended
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class Eagle3Head(nn.Module):
    """``forward(embeddings, features, positions, mask, cache) -> the layer's output before norm``.

    ``config``: the head's one-layer decoder config (its ``vocab_size`` the target's vocabulary);
    ``fc_inputs``: the width of the concatenated aux states (their count x the target's hidden size);
    ``own_embeddings``: the checkpoint carries its own ``embed_tokens`` (else the target's are used).
    Its parameters and buffers are named as the EAGLE layout names them (``fc``, ``midlayer``, ``norm``,
    ``lm_head``, ``d2t``, ``t2d``, ``embed_tokens``). :attr:`aux_layers` is set once the target is known."""

    def __init__(
        self,
        config,
        fc_inputs: int,
        draft_vocab_size: int,
        norm_before_residual: bool = False,
        own_embeddings: bool = False,
    ):
        super().__init__()
        config = copy.deepcopy(config)
        config._attn_implementation = "sdpa"  # the portable kernel that takes a tree's boolean mask
        hidden = config.hidden_size
        _, norm_type, rotary_type = family(config.model_type)
        self.fc = nn.Linear(fc_inputs, hidden, bias=False)
        self.midlayer = Eagle3Layer(config, norm_before_residual)
        self.norm = norm_type(hidden, eps=config.rms_norm_eps)
        self.lm_head = nn.Linear(hidden, draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(config.vocab_size, dtype=torch.bool))
        self.embed_tokens = nn.Embedding(config.vocab_size, hidden) if own_embeddings else None
        with torch.device("cpu"):  # computed, not loaded: real even when the weights are built on meta
            self.rotary = rotary_type(config=config)
        self.config = config
        self.aux_layers: tuple[int, ...] = ()

    @property
    def layer(self) -> Eagle3Layer:
        """The decoder layer (where :class:`~specbench.drafters.eagle.EagleDrafter` sets the attention)."""
        return self.midlayer

    @property
    def reads(self) -> tuple[int, ...]:
        """The target layers whose states the head reads at committed positions (their inputs)."""
        return self.aux_layers

    def read(self, states: torch.Tensor) -> torch.Tensor:
        """The feature at committed positions from the aux states concatenated in layer order."""
        return self.fc(states)

    @property
    def ids(self) -> torch.Tensor:
        """The target token of each draft-vocabulary row: draft id + ``d2t``."""
        return torch.arange(self.d2t.shape[0], device=self.d2t.device) + self.d2t

    @property
    def vocab_size(self) -> int:
        """The target's vocabulary (``t2d`` spans it)."""
        return self.t2d.shape[0]

    def subset(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits over the draft vocabulary (column i: target token ``ids[i]``) of pre-norm outputs."""
        return self.lm_head(self.norm(hidden))

    def forward(self, embeddings, features, positions, mask, cache=None) -> torch.Tensor:
        """``embeddings``, ``features``: [B, T, H]; ``positions``: [B, T]; ``mask``: bool or additive
        [B, 1, T, cached + T] (True / 0: attend)."""
        return self.midlayer(embeddings, features, self.rotary(embeddings, positions), mask, cache)
