"""Published Medusa heads (Cai et al., "Medusa: Simple LLM Inference Acceleration Framework with
Multiple Decoding Heads", ICML 2024) as FasterDecoding/Medusa's ``medusa_model.py`` defines and saves
them, drafting in specbench's ``medusa`` loop (:mod:`specbench.drafters.medusa`'s drafter).

The layout: ``config.json`` holds ``medusa_num_heads`` (K), ``medusa_num_layers`` (n; Medusa's
default 1 where it is missing) and ``base_model_name_or_path`` (the target they were trained on);
``medusa_lm_head.safetensors`` (or the older ``medusa_lm_head.pt``) holds ``medusa_head``'s state:
for head k, ``{k}.{l}.linear.weight`` [H, H] and ``.bias`` [H] of its residual blocks l < n and
``{k}.{n}.weight`` [V, H], its own LM head (names saved from the whole model carry a ``medusa_head.``
prefix, read the same). Head k reads the target's final state after its final norm at the last
accepted position and scores the token k + 1 places after the one that state predicts:
``lm_head_k(block_{n-1}(... block_0(f)))``, each block ``x + SiLU(W x + b)``. Medusa builds the n
blocks of a head as one module repeated, so their saved copies are equal; they are applied in order,
which is the same computation either way.

Checked against the target before any row, one line each: H against its hidden size, V against its
vocabulary, every tensor's shape and name against the config.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from specbench.drafters import head_files
from specbench.drafters.heads import follow_linear
from specbench.drafters.medusa import MedusaDrafter, ResBlock
from specbench.errors import SpecbenchError

LAYOUT = "medusa"
WEIGHTS = ("medusa_lm_head.safetensors", "medusa_lm_head.pt")
WHAT = "published Medusa heads (config.json and medusa_lm_head.safetensors)"
PREFIX = "medusa_head."


class PublishedHeads(nn.Module):
    """K heads of n residual blocks each: ``forward(f) -> [K, ..., H]``, what each head's LM head reads."""

    def __init__(self, hidden_size: int, heads: int, layers: int):
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.Sequential(*(ResBlock(hidden_size) for _ in range(layers))) for _ in range(heads)
        )

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.stack([block(hidden) for block in self.blocks])


class HeadsLMHeads(nn.Module):
    """Each head's own LM head: ``forward([K, ..., H]) -> [K, ..., V]``, row k by head k's weight."""

    def __init__(self, weight: torch.Tensor):
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)  # [K, V, H]

    def forward(self, states: torch.Tensor) -> torch.Tensor:
        flat = states.reshape(states.shape[0], -1, states.shape[-1])  # [K, N, H]
        logits = torch.bmm(flat, self.weight.transpose(1, 2))
        return logits.reshape(*states.shape[:-1], self.weight.shape[1])


def read(folder: Path, where: str) -> tuple[dict, dict[str, torch.Tensor], Path]:
    """(config, tensors under their unprefixed names, the weights file) of the heads in ``folder``."""
    config = head_files.read_config(folder, where, WHAT)
    path = folder / "config.json"
    if "medusa_num_heads" not in config:
        raise SpecbenchError(
            where, f"{path} has no medusa_num_heads: not Medusa heads", f"point at the folder of {WHAT}"
        )
    config = {"medusa_num_layers": 1, **config}
    head_files.check_fields(config, ("medusa_num_heads", "medusa_num_layers"), path, where)
    weights = head_files.weights_file(folder, WEIGHTS, where, WHAT)
    tensors = {name.removeprefix(PREFIX): t for name, t in head_files.tensors(weights).items()}
    return config, tensors, weights


def expected_shapes(heads: int, layers: int, hidden: int, vocab: int) -> dict[str, tuple[int, ...]]:
    shapes = {}
    for k in range(heads):
        for layer in range(layers):
            shapes[f"{k}.{layer}.linear.weight"] = (hidden, hidden)
            shapes[f"{k}.{layer}.linear.bias"] = (hidden,)
        shapes[f"{k}.{layers}.weight"] = (vocab, hidden)
    return shapes


def load(folder: Path, name: str, target, where: str) -> MedusaDrafter:
    """The heads in ``folder`` on ``target`` (an HFModel), in its dtype and device; their ``checkpoint``
    says what was read, for environment.json."""
    source = f"{where}.source"
    config, tensors, weights = read(folder, source)
    heads, layers = config["medusa_num_heads"], config["medusa_num_layers"]
    text = target.model.config.get_text_config()
    hidden, vocab = text.hidden_size, target.vocab_size
    lm_weight = tensors.get(f"0.{layers}.weight")
    if lm_weight is not None and lm_weight.dim() == 2 and tuple(lm_weight.shape) != (vocab, hidden):
        raise SpecbenchError(
            f"{where}.options.of",
            f"the heads in {folder} score {lm_weight.shape[0]} tokens from states {lm_weight.shape[1]} "
            f"wide; expected {target.name}'s {vocab} tokens and hidden size {hidden}",
            "use Medusa heads trained for this target",
        )
    head_files.check_names(
        tensors,
        expected_shapes(heads, layers, hidden, vocab),
        weights,
        source,
        "use the config.json these heads were saved with (medusa_num_heads, medusa_num_layers)",
    )
    with torch.device("meta"):
        module = PublishedHeads(hidden, heads, layers)
    state = {
        f"blocks.{k}.{layer}.linear.{part}": tensors[f"{k}.{layer}.linear.{part}"]
        for k in range(heads)
        for layer in range(layers)
        for part in ("weight", "bias")
    }
    module.load_state_dict(state, assign=True)
    weight = target.model.get_output_embeddings().weight
    module = module.to(device=weight.device, dtype=weight.dtype)
    own = torch.stack([tensors[f"{k}.{layers}.weight"] for k in range(heads)])
    lm_heads = HeadsLMHeads(own.to(device=weight.device, dtype=weight.dtype))
    drafter = MedusaDrafter(name, module, lm_heads, target.name)
    drafter.num_parameters += own.numel()  # each head's LM head is its own
    follow_linear(target, drafter.heads)
    drafter.checkpoint = {
        "layout": LAYOUT,
        "path": str(folder),
        "digest": head_files.digest(folder / "config.json", weights),
        "heads": heads,
        "layers_per_head": layers,
        "reads": "the target's final state (after its final norm)",
        **(
            {"verifier": config["base_model_name_or_path"]}
            if isinstance(config.get("base_model_name_or_path"), str)
            else {}
        ),
    }
    return drafter


def digest(folder: Path, where: str) -> str:
    """The digest :func:`load` records of the head in ``folder`` (its config and weights), alone."""
    return head_files.digest(folder / "config.json", head_files.weights_file(folder, WEIGHTS, where, WHAT))


def parameters(folder: Path, where: str) -> int:
    """The heads' parameters (their LM heads included) from the file's header."""
    import math

    shapes = head_files.shapes(head_files.weights_file(folder, WEIGHTS, where, WHAT))
    return sum(math.prod(shape) for shape in shapes.values())
