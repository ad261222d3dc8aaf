"""Published EAGLE-3 heads on disk: the two layouts engines load, read into an
:class:`~specbench.drafters.eagle3.Eagle3Head` with every shape checked against the target, and written
back out (``specbench export``).

* **EAGLE / SpecForge** (SafeAILab/EAGLE's ``eagle/model/cnets.py``; SpecForge writes the same):
  ``config.json`` is a one-layer decoder config (Llama's) plus ``draft_vocab_size`` and, where the head
  is narrower or wider than its target, ``target_hidden_size``; the weights are ``model.safetensors``
  or ``pytorch_model.bin``: ``fc.weight``, ``midlayer.*``, ``norm.weight``, ``lm_head.weight``, ``d2t``,
  ``t2d`` and, where the head has its own, ``embed_tokens.weight``. Its aux layers are implicit: the
  inputs of the target's decoder layers 2, L // 2 and L - 3.
* **speculators** (vllm-project/speculators; vLLM loads it by its config alone): ``config.json`` holds
  ``speculators_model_type: eagle3``, ``speculators_config`` (algorithm, proposal methods, verifier),
  ``transformer_layer_config`` (the decoder layer's config; its ``model_type`` picks Llama or Qwen3
  layers, Qwen3 when it names none, as speculators reads it), ``draft_vocab_size``,
  ``target_hidden_size``, ``eagle_aux_hidden_state_layer_ids`` and ``norm_before_residual``; the
  tensors are the same with ``layers.0.`` for ``midlayer.``.

Aux layer ids count as vLLM's do: id i is the input of decoder layer i (transformers'
``hidden_states[i]``), and the states are concatenated in layer order. ``norm_before_residual`` defaults
to false in speculators and to true in vLLM when a config leaves it out, so a speculators config without
it is refused rather than guessed. Variants specbench does not implement (``norm_before_fc``,
``fc_norm``, ``norm_output``, drafts of more than one layer, layer families other than
:data:`~specbench.drafters.eagle3.LAYER_FAMILIES`) are refused by name. Sharded checkpoints are not
read. An export carries the head's explicit aux ids and ``norm_before_residual`` in either layout
(vLLM and specbench read them; the EAGLE code itself always uses its default layers and residual).
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

import torch

from specbench.drafters import head_files, head_metadata
from specbench.drafters.eagle import EagleDrafter
from specbench.drafters.eagle3 import LAYER_FAMILIES, Eagle3Head
from specbench.drafters.heads import follow_linear
from specbench.errors import SpecbenchError
from specbench.models.facts import config_from_dict

CONFIG = "config.json"
WEIGHTS = ("model.safetensors", "pytorch_model.bin")  # read in this order; shards are not
LAYOUTS = ("speculators", "eagle")
EAGLE_ARCHITECTURE = "LlamaForCausalLMEagle3"  # what vLLM maps to its EAGLE-3 Llama head
# the head's own fields in a config (the rest describe its decoder layer)
HEAD_FIELDS = (
    "draft_vocab_size",
    "target_hidden_size",
    "eagle_aux_hidden_state_layer_ids",
    "eagle_config",  # SpecForge's: {"eagle_aux_hidden_state_layer_ids": [...], ...}
    "norm_before_residual",
    "architectures",
)
VARIANTS = ("norm_before_fc", "fc_norm", "norm_output")  # flags of heads specbench does not implement
# speculators' training-only copies of the target's final norm and LM head, never saved by it since
IGNORED = ("verifier_lm_head.weight", "verifier_norm.weight")


@dataclass(frozen=True)
class HeadCheckpoint:
    """A published EAGLE-3 head as read: its configuration and its tensors under the EAGLE layout's
    names (``midlayer.*``), ``d2t`` and ``t2d`` included."""

    folder: Path
    layout: str  # "eagle" or "speculators"
    layer_fields: dict  # the decoder layer's config, as the file gives it
    layer_config: object  # the same as a transformers config
    draft_vocab_size: int
    target_hidden_size: int
    aux_layer_ids: tuple[int, ...] | None  # None: EAGLE's default for the target
    norm_before_residual: bool
    tensors: dict
    digest: str  # of config.json and the weights file
    speculators_config: dict | None = None
    aux_layer_ids_from: str = "default"  # the field that named them (head_metadata.aux_ids)
    aux_layer_ids_elsewhere: tuple[int, ...] | None = None  # other ids eagle_config names

    def aux_layers(self, num_layers: int) -> tuple[int, ...]:
        """The target layers it reads: its own ids, else EAGLE's 2, L // 2, L - 3."""
        return self.aux_layer_ids or (2, num_layers // 2, num_layers - 3)


def _weights_file(folder: Path, where: str) -> Path:
    return head_files.weights_file(folder, WEIGHTS, where, "an EAGLE-3 head")


def _read_config(folder: Path, where: str) -> dict:
    path = folder / CONFIG
    if not path.is_file():
        fix = "point at a published EAGLE-3 head (config.json and its weights)"
        if (folder / "eagle.json").is_file():
            fix = "this is specbench's own EAGLE head: load it with source eagle:<target>/<name>"
        raise SpecbenchError(where, f"{folder} holds no {CONFIG}", fix)
    return head_files.read_config(folder, where, "a published EAGLE-3 head")


def _flags(config: dict, layer: dict, path: Path, where: str) -> None:
    """Refuse by name the variants specbench does not implement."""
    for flag in VARIANTS:
        if config.get(flag):
            raise SpecbenchError(
                where,
                f"{path}: {flag}: true is an EAGLE-3 variant specbench does not implement",
                "use a head without it (a plain EAGLE-3 head)",
            )
    layers = layer.get("num_hidden_layers", 1)
    if layers != 1:
        raise SpecbenchError(
            where,
            f"{path}: num_hidden_layers {layers}: multi-layer drafts are not implemented",
            "use a one-layer EAGLE-3 head (num_hidden_layers: 1)",
        )
    if layer.get("model_type") not in LAYER_FAMILIES:
        raise SpecbenchError(
            where,
            f"{path}: the head's decoder layer is model_type {layer.get('model_type')!r}",
            f"use a head whose layer is {' or '.join(LAYER_FAMILIES)}",
        )


def _layout(config: dict, path: Path, where: str) -> tuple[str, dict, dict | None]:
    """(layout, the decoder layer's fields, speculators_config)."""
    if "speculators_model_type" in config:
        kind = config["speculators_model_type"]
        if kind != "eagle3":
            raise SpecbenchError(
                where,
                f"{path}: speculators_model_type {kind!r} is not read; expected 'eagle3'",
                "use an EAGLE-3 speculator",
            )
        layer = config.get("transformer_layer_config")
        if not isinstance(layer, dict):
            raise SpecbenchError(
                where, f"{path}: no transformer_layer_config", "write the decoder layer's config there"
            )
        if "norm_before_residual" not in config:
            raise SpecbenchError(
                where,
                f"{path} leaves norm_before_residual out (speculators then reads false, vLLM true)",
                "write norm_before_residual: true or false",
            )
        return "speculators", {"model_type": "qwen3", **layer}, config.get("speculators_config")
    if "draft_vocab_size" not in config:
        raise SpecbenchError(
            where,
            f"{path} has no draft_vocab_size: not an EAGLE-3 head (an EAGLE-1 or -2 head?)",
            "point at an EAGLE-3 head in the EAGLE or speculators layout (EAGLE-1/2 heads: eagle1:<dir>)",
        )
    layer = {k: v for k, v in config.items() if k not in HEAD_FIELDS and k not in VARIANTS}
    return "eagle", {"model_type": "llama", **layer}, None


def _tensors(path: Path, where: str) -> dict:
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        raw = load_file(str(path))
    else:
        raw = torch.load(path, map_location="cpu", weights_only=True)
    tensors = {}
    for name, tensor in raw.items():
        if name in IGNORED:
            continue
        for prefix in ("layers.0.", "midlayer."):  # vLLM reads either; the EAGLE layout's names here
            if name.startswith(prefix):
                name = "midlayer." + name.removeprefix(prefix)
        tensors[name] = tensor
    known = ("fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d", "embed_tokens.weight")
    unknown = sorted(n for n in tensors if n not in known and not n.startswith("midlayer."))
    if unknown:
        named = {"layers.": "a multi-layer draft", "input_norm": "norm_before_fc", "fc_norm": "fc_norm"}
        variant = next((v for p, v in named.items() if unknown[0].startswith(p)), None)
        what = f"{variant}, not implemented" if variant else "tensors no EAGLE-3 head has"
        raise SpecbenchError(
            where, f"{path} holds {', '.join(unknown[:3])} ({what})", "use a one-layer EAGLE-3 head"
        )
    return tensors


def _vocabulary(tensors: dict, draft: int, vocab: int, path: Path, where: str) -> None:
    """``d2t`` and ``t2d`` present (identity maps where the draft vocabulary is the whole one) and
    consistent: d2t maps the draft ids to distinct target ids, exactly those t2d marks."""
    if "d2t" not in tensors:
        if draft != vocab:
            raise SpecbenchError(
                where,
                f"{path} has no d2t; expected d2t [{draft}] (draft_vocab_size), mapping its draft ids "
                "to the target's tokens",
                "use the head's complete checkpoint (with d2t and t2d)",
            )
        tensors["d2t"] = torch.zeros(draft, dtype=torch.long)
    d2t = tensors["d2t"]
    if d2t.dim() != 1 or d2t.shape[0] != draft:
        raise SpecbenchError(
            where,
            f"{path}: d2t has shape {list(d2t.shape)}; expected [{draft}] (draft_vocab_size)",
            "use the d2t this head was trained with",
        )
    ids = torch.arange(draft) + d2t.long()
    if draft and (ids.min() < 0 or ids.max() >= vocab or ids.unique().shape[0] != draft):
        raise SpecbenchError(
            where,
            f"{path}: d2t maps draft ids outside the target's {vocab} tokens or two to one",
            "use the d2t this head was trained with",
        )
    if "t2d" not in tensors:
        tensors["t2d"] = torch.zeros(vocab, dtype=torch.bool).index_fill_(0, ids, True)
    t2d = tensors["t2d"].bool()
    if t2d.dim() == 1 and t2d.shape[0] == vocab and not (int(t2d.sum()) == draft and t2d[ids].all()):
        raise SpecbenchError(
            where, f"{path}: t2d marks other tokens than d2t maps to", "use the head's own d2t and t2d"
        )
    tensors["d2t"], tensors["t2d"] = d2t.long(), t2d


def digest(folder: Path, where: str) -> str:
    """The digest :func:`read` records of the head in ``folder`` (its config and weights), alone."""
    return head_files.digest(folder / CONFIG, _weights_file(folder, where))


def read(folder: Path, where: str) -> HeadCheckpoint:
    """The head in ``folder`` (either layout), its own shapes checked; the target's come later."""
    config = _read_config(folder, where)
    path = folder / CONFIG
    layout, layer, speculators_config = _layout(config, path, where)
    _flags(config, layer, path, where)
    weights = _weights_file(folder, where)
    tensors = _tensors(weights, where)
    draft = config.get("draft_vocab_size")
    hidden = layer.get("hidden_size")
    for field, value in (
        ("draft_vocab_size", draft),
        ("hidden_size", hidden),
        ("vocab_size", layer.get("vocab_size")),
    ):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise SpecbenchError(
                where, f"{path}: {field} is {value!r}; expected a positive integer", "fix the config"
            )
    aux, aux_from, elsewhere = head_metadata.aux_ids(config, path, where)
    _vocabulary(tensors, draft, layer["vocab_size"], weights, where)
    for name in ("fc.weight", "lm_head.weight"):
        if name not in tensors:
            raise SpecbenchError(where, f"{weights} has no {name}", "use the head's complete checkpoint")
    if tensors["lm_head.weight"].shape[0] != draft:
        raise SpecbenchError(
            where,
            f"{weights}: lm_head.weight has {tensors['lm_head.weight'].shape[0]} rows; "
            f"expected {draft} (draft_vocab_size)",
            "use the config this head was trained with",
        )
    try:
        layer_config = config_from_dict(layer)
    except (ValueError, TypeError, KeyError) as error:
        raise SpecbenchError(
            where,
            f"{path}: the head's decoder layer config is not valid ({str(error).splitlines()[0][:120]})",
            "fix the config",
        ) from None
    return HeadCheckpoint(
        folder=folder,
        layout=layout,
        layer_fields=layer,
        layer_config=layer_config,
        draft_vocab_size=draft,
        target_hidden_size=config.get("target_hidden_size") or hidden,
        aux_layer_ids=tuple(aux) if aux else None,
        norm_before_residual=bool(config.get("norm_before_residual", False)),
        tensors=tensors,
        digest=head_files.digest(path, weights),
        speculators_config=speculators_config,
        aux_layer_ids_from=aux_from,
        aux_layer_ids_elsewhere=elsewhere,
    )


def build(checkpoint: HeadCheckpoint, where: str) -> Eagle3Head:
    """The head module holding the checkpoint's tensors (on the CPU, in their dtype); a tensor that is
    missing or of another shape than the config makes is one line."""
    tensors = checkpoint.tensors
    with torch.device("meta"):  # every weight comes from the checkpoint
        head = Eagle3Head(
            checkpoint.layer_config,
            tensors["fc.weight"].shape[-1],
            checkpoint.draft_vocab_size,
            checkpoint.norm_before_residual,
            own_embeddings="embed_tokens.weight" in tensors,
        )
    expected = head.state_dict()
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    if missing or unexpected:
        problem = f"missing {', '.join(missing[:3])}" if missing else f"{', '.join(unexpected[:3])} unused"
        raise SpecbenchError(
            where,
            f"the head in {checkpoint.folder} does not fit its config: {problem}",
            "use the config.json its weights were saved with",
        )
    for name, want in expected.items():
        if tensors[name].shape != want.shape:
            raise SpecbenchError(
                where,
                f"the head in {checkpoint.folder}: {name} is {list(tensors[name].shape)}; its "
                f"config makes it {list(want.shape)}",
                "use the config its weights were saved with",
            )
    head.load_state_dict(tensors, assign=True)
    return head.eval()


def check_target(checkpoint: HeadCheckpoint, target, where: str) -> tuple[int, ...]:
    """The aux layers the head reads on ``target`` (an HFModel), once every shape fits it."""
    config = target.model.config.get_text_config()
    hidden, layers, folder = config.hidden_size, config.num_hidden_layers, checkpoint.folder
    fix = "use a head trained for this target"
    if checkpoint.target_hidden_size != hidden:
        raise SpecbenchError(
            f"{where}.options.of",
            f"the head in {folder} reads states of target_hidden_size "
            f"{checkpoint.target_hidden_size}; expected {target.name}'s hidden size {hidden}",
            fix,
        )
    aux = checkpoint.aux_layers(layers)
    if len(set(aux)) != len(aux) or not all(0 <= i < layers for i in aux):
        raise SpecbenchError(
            f"{where}.options.of",
            f"the head in {folder} reads aux layers {list(aux)}"
            + (
                " (EAGLE's 2, L // 2, L - 3: its config names none)"
                if checkpoint.aux_layer_ids is None
                else ""
            )
            + f"; expected distinct ids from 0 to {layers - 1} ({target.name} has {layers} layers)",
            fix,
        )
    fc = list(checkpoint.tensors["fc.weight"].shape)
    width = len(aux) * hidden
    if fc[-1] != width:
        raise SpecbenchError(
            f"{where}.options.of",
            f"the head in {folder}: fc.weight is {fc}; expected [{fc[0]}, "
            f"{width}] ({len(aux)} aux layers x hidden size {hidden})",
            fix,
        )
    vocab = checkpoint.tensors["t2d"].shape[0]
    if vocab != target.vocab_size:
        raise SpecbenchError(
            f"{where}.options.of",
            f"the head in {folder}: t2d has {vocab} entries; expected "
            f"{target.name}'s vocabulary, {target.vocab_size}",
            fix,
        )
    own = checkpoint.layer_fields["hidden_size"]
    if "embed_tokens.weight" not in checkpoint.tensors and own != hidden:
        raise SpecbenchError(
            f"{where}.options.of",
            f"the head in {folder} is {own} wide and carries no "
            f"embed_tokens.weight to read tokens with ({target.name}'s are {hidden} wide)",
            fix,
        )
    return tuple(sorted(aux))


def load(
    folder: Path,
    name: str,
    target,
    where: str,
    cuda_graphs: bool = True,
    attn_implementation: str = "sdpa",
    step_graph: bool = False,
) -> EagleDrafter:
    """The published head in ``folder`` drafting for ``target`` (an HFModel) in EAGLE's chain and tree
    loops, in the target's dtype and device; the options as :func:`specbench.drafters.eagle.load`'s.
    Its ``checkpoint`` attribute says what was read (layout, digest, aux layers) for environment.json."""
    checkpoint = read(folder, f"{where}.source")
    aux = check_target(checkpoint, target, where)
    head = build(checkpoint, f"{where}.source")
    head.aux_layers = aux
    weight = target.model.get_output_embeddings().weight
    head = head.to(device=weight.device, dtype=weight.dtype)
    embeddings = head.embed_tokens if head.embed_tokens is not None else target.model.get_input_embeddings()
    static = True if step_graph else None if cuda_graphs else False
    drafter = EagleDrafter(name, head, embeddings, head, target.name, static, attn_implementation, step_graph)
    follow_linear(target, drafter.head)
    drafter.checkpoint = head_metadata.record(checkpoint, aux)
    return drafter


def write(checkpoint: HeadCheckpoint, head: Eagle3Head, out: Path, layout: str, verifier: str | None) -> None:
    """``head`` (as :func:`build` made it from ``checkpoint``) in ``layout``: config.json and
    model.safetensors in ``out``."""
    from safetensors.torch import save_file

    tensors = {k: v.detach().contiguous() for k, v in head.state_dict().items()}
    fields = {
        "draft_vocab_size": checkpoint.draft_vocab_size,
        "norm_before_residual": checkpoint.norm_before_residual,
    }
    if checkpoint.aux_layer_ids is not None:
        fields["eagle_aux_hidden_state_layer_ids"] = list(checkpoint.aux_layer_ids)
    hidden = checkpoint.layer_fields["hidden_size"]
    if layout == "speculators":
        tensors = {k.replace("midlayer.", "layers.0.", 1): v for k, v in tensors.items()}
        speculation = dict(checkpoint.speculators_config or _speculators_config())
        if verifier is not None:
            speculation["verifier"] = {**speculation.get("verifier", {}), "name_or_path": verifier}
        config = {
            "architectures": ["Eagle3Speculator"],
            "speculators_model_type": "eagle3",
            "speculators_config": speculation,
            "transformer_layer_config": checkpoint.layer_fields,
            "target_hidden_size": checkpoint.target_hidden_size,
            "eagle_aux_hidden_state_layer_ids": None,
            **{flag: False for flag in VARIANTS},
            **fields,
        }
    else:
        config = {**checkpoint.layer_fields, "architectures": [EAGLE_ARCHITECTURE], **fields}
        if checkpoint.target_hidden_size != hidden:
            config["target_hidden_size"] = checkpoint.target_hidden_size
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / WEIGHTS[0]))
    (out / CONFIG).write_text(json.dumps(config, indent=2) + "\n")


def _speculators_config() -> dict:
    """speculators' own defaults for a converted EAGLE-3 head: greedy proposals of 3 tokens."""
    return {
        "algorithm": "eagle3",
        "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
        "default_proposal_method": "greedy",
        "verifier": {"name_or_path": None, "architectures": []},
    }


def export(folder: Path, out: Path, layout: str, verifier: str | None = None) -> HeadCheckpoint:
    """The published head in ``folder`` written in ``layout`` (:data:`LAYOUTS`) to ``out``; loading the
    export gives the same head, tensor for tensor. ``verifier``: the target named in a speculators
    config (kept from the source's own where it has one). Returns the head as read."""
    if layout not in LAYOUTS:
        raise SpecbenchError("--format", f"no layout {layout!r}", f"use {' or '.join(LAYOUTS)}")
    if out.resolve() == folder.resolve() or (out / CONFIG).exists():
        raise SpecbenchError("--output", f"{out} already holds a head", "name a new folder")
    checkpoint = read(folder, "HEAD_DIR")
    write(checkpoint, build(checkpoint, "HEAD_DIR"), out, layout, verifier)
    return checkpoint


def tensor_shapes(folder: Path, where: str) -> dict[str, list[int]]:
    """Name -> shape of the head's tensors, from the file's header alone (safetensors) or a memory map."""
    path = _weights_file(folder, where)
    if path.suffix == ".safetensors":
        with path.open("rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            header = json.loads(handle.read(length))
        return {name: entry["shape"] for name, entry in header.items() if name != "__metadata__"}
    state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    return {name: list(tensor.shape) for name, tensor in state.items()}
