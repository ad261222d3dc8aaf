"""What heads on a target's states share (Medusa's, EAGLE's): the target's LM head over a draft
vocabulary, and a manifest checked against the target they are loaded on."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from specbench.drafters.draft_vocab import DraftVocabHead
from specbench.errors import SpecbenchError
from specbench.models.linear import use_onednn


def draft_head(lm_head_weight: torch.Tensor, ids: torch.Tensor | None) -> nn.Module:
    """The target's LM head over the draft vocabulary ``ids`` (all tokens when None)."""
    vocab = lm_head_weight.shape[0]
    ids = torch.arange(vocab, device=lm_head_weight.device) if ids is None else ids
    return DraftVocabHead(lm_head_weight, ids.to(lm_head_weight.device), vocab)


def follow_linear(target, *modules: nn.Module) -> None:
    """Heads run their linear layers on their target's library (specbench.models.linear): after the
    drafter has counted its parameters, since oneDNN's reordered copies are none."""
    if getattr(target, "linear", "aten") == "onednn":
        for module in modules:
            use_onednn(module)


def target_facts(target) -> dict[str, int]:
    """The target's sizes a head's manifest records (and must match to be loaded on it)."""
    config = target.model.config.get_text_config()
    return {
        "hidden_size": config.hidden_size,
        "vocab_size": target.vocab_size,
        "num_hidden_layers": config.num_hidden_layers,
    }


def read_manifest(folder: Path, files: tuple[str, str], kind: str, what: str, target, where: str) -> dict:
    """The manifest of the heads ``what`` (e.g. "Medusa heads") in ``folder`` (``files``: manifest,
    weights), refused with one line when a file is missing or they were trained for a target of
    another size (every field of :func:`target_facts` the manifest records)."""
    manifest_path, weights = folder / files[0], folder / files[1]
    if not manifest_path.is_file() or not weights.is_file():
        raise SpecbenchError(
            f"{where}.source",
            f"no {what} in {folder}",
            f"train them with `specbench distill --size {kind}`, or set SPECBENCH_CACHE to where they are",
        )
    manifest = json.loads(manifest_path.read_text())
    for field, have in target_facts(target).items():
        if field in manifest and manifest[field] != have:
            raise SpecbenchError(
                f"{where}.options.of",
                f"the {what} in {folder} were trained for a {field} of {manifest[field]}, "
                f"{target.name} has {have}",
                f"train them for this target (specbench distill --target ... --size {kind})",
            )
    return manifest


def draft_vocab_head(target, manifest: dict) -> nn.Module:
    """The target's LM head over the manifest's draft vocabulary."""
    weight = target.model.get_output_embeddings().weight.detach()
    ids = torch.tensor(manifest["draft_vocab"], dtype=torch.long) if manifest.get("draft_vocab") else None
    return draft_head(weight, ids)
