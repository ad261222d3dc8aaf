"""Medusa heads (Cai et al., "Medusa: Simple LLM Inference Acceleration Framework with Multiple
Decoding Heads", ICML 2024), Medusa-1: heads on the frozen target's last hidden state.

Head k (k = 1..K) reads the target's final hidden state f_t at the last accepted position, the state
whose LM-head row gave the next token x_{t+1}, and predicts x_{t+k+1}: a residual block
``f + SiLU(W_k f + b_k)`` (W_k = 0 at the start, so an untrained head is the target's own head), then
the target's LM head. Medusa-1 gives each head its own copy of the LM head; here the heads share the
target's, frozen and restricted to a draft vocabulary (FR-Spec, :mod:`specbench.drafters.draft_vocab`),
since for a 135M target K full copies of a 49k-token head would cost more than the target's layers.
The heads run no pass of their own: drafting costs K small matrix products per step.

Saved as ``medusa_heads.safetensors`` + ``medusa.json`` (sizes, the draft vocabulary, the target it
was trained for) in ``<cache>/drafters/<target>/medusa``; loaded by the ``medusa:`` source.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from specbench.drafters.heads import draft_vocab_head, follow_linear, read_manifest
from specbench.errors import SpecbenchError
from specbench.models.base import ForwardCounter

HEADS_FILE = "medusa_heads.safetensors"
MANIFEST = "medusa.json"


class ResBlock(nn.Module):
    def __init__(self, hidden_size: int):
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden + nn.functional.silu(self.linear(hidden))


class MedusaHeads(nn.Module):
    """K residual blocks; ``forward(f) -> [K, ..., hidden]`` the states the shared LM head reads."""

    def __init__(self, hidden_size: int, heads: int):
        super().__init__()
        self.blocks = nn.ModuleList(ResBlock(hidden_size) for _ in range(heads))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.stack([block(hidden) for block in self.blocks])


class MedusaDrafter:
    """The heads of one target: ``propose(f)`` gives each head's next-token distribution row."""

    def __init__(self, name: str, heads: MedusaHeads, lm_head: nn.Module, target_name: str):
        self.name = name
        self.heads = heads.eval()
        self.lm_head = lm_head
        self.target_name = target_name
        self.counter = ForwardCounter()  # the heads run no model pass: it stays at 0
        self.num_parameters = sum(p.numel() for p in heads.parameters())
        self.device = next(heads.parameters()).device
        self.dtype = next(heads.parameters()).dtype  # the target's: the heads read its features

    def start(self, prompt_ids: torch.Tensor) -> None:
        self.counter.reset()

    def rollback(self, n_tokens: int) -> None:
        pass

    @torch.inference_mode()
    def logits(self, feature: torch.Tensor) -> torch.Tensor:
        """``[K, V]``: head k's logits for the token k + 1 places after the one ``feature`` predicts."""
        return self.lm_head(self.heads(feature.to(self.device)))


def save(folder: Path, heads: MedusaHeads, manifest: dict) -> None:
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in heads.state_dict().items()}, str(folder / HEADS_FILE))
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")


def save_vllm(
    folder: Path, heads: MedusaHeads, lm_head_weight: torch.Tensor, vocab: torch.Tensor | None
) -> None:
    """The heads in vLLM's Medusa checkpoint layout (``vllm/model_executor/models/medusa.py``):
    ``config.json`` (model_type medusa, one residual layer per head with bias, the target's LM head as
    ``original_lm_head``, the draft vocabulary as ``truncated_vocab_size``) and ``model.safetensors``
    with ``blocks.{k}.layers.0.{weight,bias}``, ``lm_heads.0.weight`` (the full head, which vLLM cuts
    down with ``token_map``) and ``token_map``. Pass the folder as vLLM's draft ``model`` with
    ``method: medusa``."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    vocab_size, hidden_size = lm_head_weight.shape
    tensors = {"lm_heads.0.weight": lm_head_weight.detach().float().contiguous()}
    for k, block in enumerate(heads.blocks):
        tensors[f"blocks.{k}.layers.0.weight"] = block.linear.weight.detach().float().contiguous()
        tensors[f"blocks.{k}.layers.0.bias"] = block.linear.bias.detach().float().contiguous()
    if vocab is not None:
        tensors["token_map"] = vocab.to(torch.long).contiguous()
    save_file(tensors, str(folder / "model.safetensors"))
    config = {
        "model_type": "medusa",
        "architectures": ["MedusaModel"],
        "hidden_size": hidden_size,
        "vocab_size": vocab_size,
        "truncated_vocab_size": vocab_size if vocab is None else int(vocab.shape[0]),
        "num_heads": len(heads.blocks),
        "num_hidden_layers": 1,
        "medusa_fc_bias": True,
        "original_lm_head": True,
        "torch_dtype": "float32",
    }
    (folder / "config.json").write_text(json.dumps(config, indent=1) + "\n")


def load(folder: Path, name: str, target, where: str) -> MedusaDrafter:
    """The heads in ``folder`` on ``target`` (an HFModel): refused with one line when they were
    trained for another hidden size or vocabulary."""
    from safetensors.torch import load_file

    manifest = read_manifest(folder, (MANIFEST, HEADS_FILE), "medusa", "Medusa heads", target, where)
    heads = MedusaHeads(manifest["hidden_size"], manifest["heads"])
    heads.load_state_dict(load_file(str(folder / HEADS_FILE)))
    weight = target.model.get_output_embeddings().weight.detach()
    heads = heads.to(device=weight.device, dtype=weight.dtype)
    drafter = MedusaDrafter(name, heads, draft_vocab_head(target, manifest), target.name)
    follow_linear(target, drafter.heads, drafter.lm_head)
    return drafter


class HeadsForEngine:
    """Medusa heads whose target runs on a serving engine: the engine loads them itself, so this
    process keeps only where they are and their size (for SWI's cost tables)."""

    def __init__(self, name: str, folder: Path):
        manifest = json.loads((folder / MANIFEST).read_text())
        self.name, self.folder = name, folder
        self.heads = manifest["heads"]
        self.num_parameters = manifest["heads"] * (manifest["hidden_size"] ** 2 + manifest["hidden_size"])
        self.origin = f"medusa heads {folder}, loaded by the engine"

    def vllm_folder(self) -> Path:
        """The heads in vLLM's layout with the full vocabulary (no ``token_map``): vLLM 0.32's Medusa
        loader sets ``token_map`` without reporting it loaded, so its weight check refuses any
        checkpoint with a draft vocabulary. Written once, beside the heads."""
        from safetensors.torch import load_file, save_file

        source, out = self.folder / "vllm", self.folder / "vllm-full-vocabulary"
        if (out / "config.json").is_file():
            return out
        if not (source / "config.json").is_file():
            raise SpecbenchError(
                f"models.{self.name}.source",
                f"no vLLM layout of the heads in {source}",
                "train them again with `specbench distill --size medusa` (it writes the vLLM layout)",
            )
        tensors = {k: v for k, v in load_file(str(source / "model.safetensors")).items() if k != "token_map"}
        config = json.loads((source / "config.json").read_text())
        config["truncated_vocab_size"] = config["vocab_size"]
        staging = out.with_name(out.name + ".tmp")
        staging.mkdir(parents=True, exist_ok=True)
        save_file(tensors, str(staging / "model.safetensors"))
        (staging / "config.json").write_text(json.dumps(config, indent=1) + "\n")
        staging.rename(out)
        return out
