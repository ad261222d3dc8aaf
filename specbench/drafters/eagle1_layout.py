"""Published EAGLE-1 and EAGLE-2 heads (Li, Wei, Zhang and Zhang, "EAGLE: Speculative Sampling Requires
Rethinking Feature Uncertainty", ICML 2024; EAGLE-2, EMNLP 2024, changed the draft tree, not the head)
as SafeAILab/EAGLE's ``eagle/model/cnets1.py`` defines and saves them, read into specbench's
:class:`~specbench.drafters.eagle.EagleHead`, the same computation.

The layout: ``config.json`` is a one-layer Llama config (the head's own rotary settings included) with,
optionally, ``bias`` (``fc``'s; EAGLE's code reads true when it is missing); the weights are one
``pytorch_model.bin`` or ``model.safetensors`` holding ``fc.weight`` [H, 2H] (and ``fc.bias`` [H]),
``layers.0.*`` (attention, ``post_attention_layernorm``, MLP; no ``input_layernorm``: the code's layer 0
skips it) and usually ``embed_tokens.weight``, a copy of the target's (EAGLE's code embeds with it). The
head has no norm or LM head of its own: at a committed position t it reads ``fc([embedding(x_{t+1});
f_t])``, f_t the target's final state after its final norm, and the target's own LM head scores the
layer's output. Where the head carries ``fc.bias`` it is used whatever ``bias`` says (the weights are
what was trained).

Refused by name, before any row: a head of EAGLE-3 (``draft_vocab_size``, ``midlayer.*``, ``lm_head``;
source ``eagle3:``), drafts of more than one layer, layer families other than Llama, ``qkv_bias``
(EAGLE's Qwen2 heads; not implemented), a hidden size or vocabulary other than the target's, and any
tensor the layout does not have.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from specbench.drafters import head_files
from specbench.drafters.eagle import EagleDrafter, EagleHead
from specbench.drafters.eagle3 import family
from specbench.drafters.heads import draft_head, follow_linear
from specbench.errors import SpecbenchError
from specbench.models.facts import config_from_dict

LAYOUT = "eagle1"
WEIGHTS = ("pytorch_model.bin", "model.safetensors")
WHAT = "a published EAGLE-1 or EAGLE-2 head (config.json and pytorch_model.bin)"
FIX = "use the EAGLE-1/2 head trained for this target, with the config.json it was saved with"


def _refuse_other_kinds(config: dict, tensors: dict, path: Path, where: str) -> None:
    if "draft_vocab_size" in config or any(n.startswith(("midlayer.", "lm_head.", "d2t")) for n in tensors):
        raise SpecbenchError(
            where, f"{path.parent} is an EAGLE-3 head, not EAGLE-1/2's layout", "load it with eagle3:<dir>"
        )
    layers = config.get("num_hidden_layers", 1)
    if layers != 1 or any(n.startswith("layers.") and not n.startswith("layers.0.") for n in tensors):
        raise SpecbenchError(
            where,
            f"{path}: num_hidden_layers {layers}: multi-layer drafts are not implemented",
            "use a one-layer EAGLE-1/2 head",
        )
    if config.get("model_type", "llama") != "llama":
        raise SpecbenchError(
            where,
            f"{path}: the head's layer is model_type {config.get('model_type')!r}; EAGLE-1/2's is Llama's",
            "use a head with a Llama layer (model_type: llama)",
        )
    if config.get("qkv_bias"):
        raise SpecbenchError(
            where,
            f"{path}: qkv_bias: true (EAGLE's Qwen2 heads) is not implemented",
            "use a head whose attention has no biases",
        )


def build_head(layer_fields: dict, fc_bias: bool, where: str) -> EagleHead:
    """An EAGLE-1 head on the meta device (its rotary embedding real) from the head's config fields."""
    try:
        config = config_from_dict({**layer_fields, "model_type": "llama", "num_hidden_layers": 1})
    except (ValueError, TypeError, KeyError) as error:
        raise SpecbenchError(
            where, f"the head's config is not valid ({str(error).splitlines()[0][:120]})", "fix the config"
        ) from None
    config._attn_implementation = "sdpa"
    layer_type, _, rotary_type = family("llama")
    hidden = config.hidden_size
    with torch.device("meta"):  # every weight comes from the checkpoint
        head = EagleHead(config, layer_type, rotary_type)
        if fc_bias:
            head.fc = nn.Linear(2 * hidden, hidden, bias=True)
    head.rotary = rotary_type(config=config)  # computed, not loaded
    return head


def published_names(head: EagleHead) -> dict[str, tuple[int, ...]]:
    """The checkpoint's tensor names (``layers.0.*`` for the module's ``layer.*``) -> their shapes."""
    return {
        name.replace("layer.", "layers.0.", 1) if name.startswith("layer.") else name: tuple(value.shape)
        for name, value in head.state_dict().items()
        if not name.startswith("rotary.")
    }


def load(
    folder: Path,
    name: str,
    target,
    where: str,
    cuda_graphs: bool = True,
    attn_implementation: str = "sdpa",
    step_graph: bool = False,
) -> EagleDrafter:
    """The head in ``folder`` drafting for ``target`` (an HFModel) in EAGLE's chain and tree loops, in
    the target's dtype and device, with the target's LM head over its whole vocabulary; the options as
    :func:`specbench.drafters.eagle.load`'s. Its ``checkpoint`` says what was read, for
    environment.json."""
    source = f"{where}.source"
    config = head_files.read_config(folder, source, WHAT)
    weights = head_files.weights_file(folder, WEIGHTS, source, WHAT)
    tensors = head_files.tensors(weights)
    path = folder / "config.json"
    _refuse_other_kinds(config, tensors, path, source)
    head_files.check_fields(config, ("hidden_size", "vocab_size"), path, source)
    text = target.model.config.get_text_config()
    for field, have, want in (
        ("hidden_size", config["hidden_size"], text.hidden_size),
        ("vocab_size", config["vocab_size"], target.vocab_size),
    ):
        if have != want:
            raise SpecbenchError(
                f"{where}.options.of",
                f"the head in {folder} has {field} {have}; expected {target.name}'s, {want}",
                "use a head trained for this target",
            )
    head = build_head(config, "fc.bias" in tensors, source)
    expected = published_names(head)
    own_embeddings = tensors.get("embed_tokens.weight")
    if own_embeddings is not None:
        expected["embed_tokens.weight"] = (target.vocab_size, text.hidden_size)
    head_files.check_names(tensors, expected, weights, source, FIX)
    module_names = {k: v for k, v in tensors.items() if k != "embed_tokens.weight"}
    state = {k.replace("layers.0.", "layer.", 1): v for k, v in module_names.items()}
    head.load_state_dict(state, strict=False, assign=True)
    weight = target.model.get_output_embeddings().weight.detach()
    head = head.to(device=weight.device, dtype=weight.dtype).eval()
    if own_embeddings is not None:
        embeddings = nn.Embedding.from_pretrained(own_embeddings.to(weight.device, weight.dtype))
    else:
        embeddings = target.model.get_input_embeddings()
    static = True if step_graph else None if cuda_graphs else False
    lm_head = draft_head(weight, None)  # the target's, every token
    drafter = EagleDrafter(
        name, head, embeddings, lm_head, target.name, static, attn_implementation, step_graph
    )
    follow_linear(target, drafter.head, drafter.lm_head)
    drafter.checkpoint = {
        "layout": LAYOUT,
        "path": str(folder),
        "digest": head_files.digest(path, weights),
        "reads": "the target's final state (after its final norm)",
        "fc_bias": "fc.bias" in tensors,
        "own_embeddings": own_embeddings is not None,
    }
    return drafter


def digest(folder: Path, where: str) -> str:
    """The digest :func:`load` records of the head in ``folder`` (its config and weights), alone."""
    return head_files.digest(folder / "config.json", head_files.weights_file(folder, WEIGHTS, where, WHAT))


def parameters(folder: Path, where: str) -> tuple[int, int]:
    """(the head's own parameters, the embedding rows' share of them) from the file's header."""
    import math

    shapes = head_files.shapes(head_files.weights_file(folder, WEIGHTS, where, WHAT))
    sizes = {k: math.prod(s) for k, s in shapes.items()}
    return sum(sizes.values()), sizes.get("embed_tokens.weight", 0)
