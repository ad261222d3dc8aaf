"""What a recipe model costs before it loads: parameters, weight bytes at its dtype and KV-cache bytes
per token, from its configuration alone (a model instantiated on the meta device holds no storage, so
even a 70B configuration builds in a fraction of a second and no weight is read).

Each kind of source says where its configuration comes from (its ``facts`` in :mod:`specbench.sources`;
``ModelFacts.origin`` names it): a local ``config.json``, the model built in-process, the local Hugging
Face cache (never the network), or ``specbench/data/model_facts.yaml``, the public ``config.json`` facts
of the papers' models. This module holds what they share.

KV-cache bytes per token, at batch 1: decoder-only 2 (K and V) x layers x KV heads x head dim x dtype
bytes; encoder-decoder (T5) 2 x decoder layers x heads x d_kv x dtype bytes, per prompt position (the
cross-attention cache) and per output position (the self-attention cache).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import torch
import yaml

from specbench.errors import SpecbenchError

DTYPE_BYTES = {"float32": 4, "float64": 8, "bfloat16": 2, "float16": 2}
FACTS_FILE = "model_facts.yaml"


@dataclass
class ModelFacts:
    name: str  # the recipe's name for the model
    source: str
    origin: str  # where the facts came from, e.g. "HF cache", "model_facts.yaml", "gguf file size"
    dtype: str
    params: int | None  # None: unknown (a .gguf file)
    weight_bytes: int
    kv_bytes_per_token: int
    architecture: str | None = None
    layers: int | None = None  # decoder layers
    shares: str | None = None  # early-exit: the recipe model whose weights it runs
    pass_fraction: float = 1.0  # early-exit: its layers / the base's layers
    # heads on a target: the bytes one pass reads (their weights and the LM head rows they share)
    pass_bytes: int | None = None
    # parameter name -> number of elements (an explicit device_map places modules by these)
    numels: dict[str, int] = field(default_factory=dict, repr=False)
    meta: object = field(default=None, repr=False)  # the model on the meta device (accelerate's splits)
    config_path: str | None = None  # the config.json read, when one was

    def as_dict(self) -> dict:
        keys = ("name", "source", "origin", "config_path", "architecture", "dtype", "params", "weight_bytes")
        return {key: getattr(self, key) for key in keys} | {
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "layers": self.layers,
            "shares": self.shares,
        }


@functools.lru_cache(maxsize=1)
def shipped_facts() -> dict[str, dict]:
    """The entries of ``specbench/data/model_facts.yaml`` by Hub id."""
    text = (resources.files("specbench") / "data" / FACTS_FILE).read_text(encoding="utf-8")
    return yaml.safe_load(text)


def config_from_dict(raw: dict):
    """A transformers config from ``config.json`` contents (``model_type`` picks the class)."""
    from transformers import CONFIG_MAPPING

    model_type = raw.get("model_type")
    if model_type not in CONFIG_MAPPING:
        raise ValueError(f"unknown model_type {model_type!r}")
    return CONFIG_MAPPING[model_type].from_dict(dict(raw))


def meta_model(config):
    """The model ``config`` describes, instantiated on the meta device (shapes, no storage)."""
    from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM

    auto = AutoModelForSeq2SeqLM if config.is_encoder_decoder else AutoModelForCausalLM
    with torch.device("meta"):
        return auto.from_config(config)


def parameter_numels(model, untied_head: bool = False) -> dict[str, int]:
    """Every distinct parameter's size by name (tied weights once). ``untied_head``: the checkpoint
    stores its own output head (config.json says ``tie_word_embeddings: false``) although this
    transformers ties it (transformers 5 always ties T5's), so the head counts as one more matrix."""
    numels = {name: p.numel() for name, p in model.named_parameters()}
    head, embedding = model.get_output_embeddings(), model.get_input_embeddings()
    if untied_head and head is not None and head.weight is embedding.weight:
        numels["lm_head.weight"] = head.weight.numel()
    return numels


def kv_bytes_per_token(config, dtype_bytes: int) -> int:
    """KV-cache bytes per position at batch 1 (module docstring)."""
    if config.is_encoder_decoder:  # T5: decoder self-attention and cross-attention caches
        return 2 * config.num_decoder_layers * config.num_heads * config.d_kv * dtype_bytes
    text = config.get_text_config()
    heads = text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    return 2 * text.num_hidden_layers * kv_heads * head_dim * dtype_bytes


def decoder_layers(config) -> int:
    return (
        config.num_decoder_layers if config.is_encoder_decoder else config.get_text_config().num_hidden_layers
    )


def from_config(
    name: str, source: str, origin: str, dtype: str, raw: dict, config=None, path: Path | None = None
) -> ModelFacts:
    """Facts of a model described by ``config.json`` contents ``raw`` (or an already built ``config``)."""
    config = config if config is not None else config_from_dict(raw)
    model = meta_model(config)
    numels = parameter_numels(model, untied_head=raw.get("tie_word_embeddings") is False)
    params = sum(numels.values())
    size = DTYPE_BYTES[dtype]
    return ModelFacts(
        name,
        source,
        origin,
        dtype,
        params,
        params * size,
        kv_bytes_per_token(config, size),
        architecture=config.model_type,
        layers=decoder_layers(config),
        numels=numels,
        meta=model,
        config_path=None if path is None else str(path),
    )


def weights_by_device(fact: ModelFacts, strategy: str, max_memory: dict) -> dict:
    """Weight bytes per device (GPU index, "cpu", "disk") where transformers would put ``fact``'s model
    under ``device_map: strategy`` and ``max_memory`` (bytes per device): accelerate's own
    ``get_balanced_memory`` (all strategies but sequential cap every GPU but the last at an even share plus a
    layer) and ``infer_auto_device_map``, as ``from_pretrained`` calls them, on the meta-device model."""
    import logging

    from accelerate import infer_auto_device_map
    from accelerate.utils import get_balanced_memory

    dtype = getattr(torch, fact.dtype)
    model, no_split = fact.meta, fact.meta._no_split_modules
    quiet = logging.getLogger("accelerate.utils.modeling")  # "Device 0 is not available" on this machine
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        caps = dict(max_memory)
        if strategy != "sequential":
            low_zero = strategy == "balanced_low_0"
            caps = get_balanced_memory(model, caps, no_split, dtype=dtype, low_zero=low_zero)
        device_map = infer_auto_device_map(
            model, max_memory=caps, no_split_module_classes=no_split, dtype=dtype
        )
    finally:
        quiet.setLevel(level)
    return bytes_by_device(fact, device_map)


def bytes_by_device(fact: ModelFacts, device_map: dict) -> dict:
    """Weight bytes per device of a module -> device map (the longest matching module name wins)."""
    size = DTYPE_BYTES[fact.dtype]
    placed: dict = {}
    for name, numel in fact.numels.items():
        owners = [key for key in device_map if key == "" or name == key or name.startswith(f"{key}.")]
        if not owners:
            raise ValueError(f"no device for {name}")
        device = device_map[max(owners, key=len)]
        placed[device] = placed.get(device, 0) + numel * size
    return placed


def read_json(path: Path, where: str) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise SpecbenchError(
            where, f"cannot read {path} ({type(error).__name__})", "give a readable config.json"
        ) from None
