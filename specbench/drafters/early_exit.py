"""Early-exit self-drafts: the first N layers of the target, then its final norm and LM head.

The drafter shares the target's weights (no copy, no extra memory); it is a model of its own only
in that it keeps its own KV cache (N layers) and its own forward counter. Its cost per pass is
roughly N / L of the target's transformer layers plus the full LM head. An optional *exit head*
(a residual linear map on the N-th layer's hidden state, trained by ``specbench distill
--exit-layers N``) adapts the intermediate state to the shared final norm and head.

Works for the Llama family of transformers models (Llama, Mistral, Qwen2/3, SmolLM, Gemma …),
whose decoder keeps ``model.embed_tokens``, ``model.layers``, ``model.norm`` and ``lm_head``.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from torch import nn

from specbench.errors import SpecbenchError, expand_home

EXIT_HEAD_FILE = "exit_head.safetensors"


class ExitHead(nn.Module):
    """h -> h + W h: starts as the identity (W = 0), so an untrained head is the plain early exit."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.proj = nn.Linear(hidden_size, hidden_size, bias=False)
        nn.init.zeros_(self.proj.weight)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden + self.proj(hidden)


class _ExitNorm(nn.Module):
    """The target's final norm, preceded by the exit head."""

    def __init__(self, exit_head: ExitHead, norm: nn.Module):
        super().__init__()
        self.exit_head = exit_head
        self.norm = norm

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.norm(self.exit_head(hidden))


def early_exit_model(target: nn.Module, layers: int, exit_head: ExitHead | None = None) -> nn.Module:
    """A causal LM running the first ``layers`` decoder layers of ``target``, sharing its weights."""
    decoder = getattr(target, "model", None)
    if target.config.is_encoder_decoder or not all(
        hasattr(decoder, name) for name in ("embed_tokens", "layers", "norm")
    ):
        raise SpecbenchError(
            "early-exit",
            f"{type(target).__name__} is not a Llama-family decoder (model.embed_tokens/layers/norm)",
            "use a Llama-family target (Llama, Mistral, Qwen, SmolLM …) or a distilled drafter",
        )
    total = len(decoder.layers)
    if not 1 <= layers < total:
        raise SpecbenchError(
            "early-exit.options.layers",
            f"{layers} layers requested from a {total}-layer target",
            f"use 1 to {total - 1}",
        )
    config = copy.deepcopy(target.config)
    config.num_hidden_layers = layers
    if getattr(config, "layer_types", None):
        config.layer_types = config.layer_types[:layers]
    with torch.device("meta"):  # built empty, then every module is the target's own
        draft = type(target)(config)
    draft.model.embed_tokens = decoder.embed_tokens
    draft.model.layers = nn.ModuleList(decoder.layers[:layers])
    draft.model.norm = decoder.norm if exit_head is None else _ExitNorm(exit_head, decoder.norm)
    if hasattr(decoder, "rotary_emb"):
        draft.model.rotary_emb = decoder.rotary_emb
    draft.lm_head = target.lm_head
    draft.generation_config = target.generation_config
    leftovers = [name for name, p in draft.named_parameters() if p.is_meta]
    leftovers += [name for name, b in draft.named_buffers() if b.is_meta]
    if leftovers:
        raise SpecbenchError(
            "early-exit", f"could not share {leftovers[0]} with the target", "use a distilled drafter"
        )
    return draft.eval()


def load_exit_head(path: str | Path, hidden_size: int, like: torch.Tensor) -> ExitHead:
    from safetensors.torch import load_file

    file = expand_home(path, "early-exit.options.exit_head")
    file = file / EXIT_HEAD_FILE if file.is_dir() else file
    if not file.is_file():
        raise SpecbenchError(
            "early-exit.options.exit_head",
            f"no exit head at {file}",
            "train one with `specbench distill --exit-layers N`, or leave exit_head out",
        )
    head = ExitHead(hidden_size)
    head.load_state_dict(load_file(str(file)))
    return head.to(device=like.device, dtype=like.dtype).eval()
