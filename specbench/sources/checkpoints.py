"""Loading a transformers checkpoint, shared by the sources that have one (a Hub id, a local directory,
a ``.gguf`` file, SmolLM2, a distilled drafter): ``from_pretrained`` with the recipe's loader options,
one-line errors for a folder transformers cannot read, and the size facts of a checkpoint found in the
local Hugging Face cache or in ``specbench/data/model_facts.yaml``."""

from __future__ import annotations

import contextlib
from pathlib import Path

from specbench.errors import SpecbenchError
from specbench.models.options import LOADER_OPTIONS


def loader_options(opts: dict) -> dict:
    """The recipe options that reach ``from_pretrained``."""
    return {name: opts[name] for name in LOADER_OPTIONS if name in opts}


def from_pretrained(path_or_id: str, dtype, loader: dict | None = None, **kwargs):
    """Config, model and tokenizer; ``loader`` (the recipe's loader options) reaches the model's
    from_pretrained, and trust_remote_code the config's and tokenizer's too."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer

    loader = dict(loader or {})
    if loader.get("trust_remote_code"):
        kwargs["trust_remote_code"] = True
    loader.pop("trust_remote_code", None)
    if "quantization" in loader:
        loader["quantization_config"] = _quantization(loader.pop("quantization"))
    with quiet_transformers():
        config = AutoConfig.from_pretrained(path_or_id, **kwargs)
        auto = AutoModelForSeq2SeqLM if config.is_encoder_decoder else AutoModelForCausalLM
        model = auto.from_pretrained(path_or_id, dtype=dtype, **kwargs, **loader)
        tokenizer = AutoTokenizer.from_pretrained(path_or_id, **kwargs)
    return model, tokenizer


def _quantization(settings: dict):
    try:
        import bitsandbytes  # noqa: F401
        from transformers import BitsAndBytesConfig
    except ImportError:
        raise SpecbenchError(
            "options.quantization",
            "needs the bitsandbytes package",
            "pip install bitsandbytes (a CUDA machine)",
        ) from None
    try:
        return BitsAndBytesConfig(**settings)
    except (TypeError, ValueError) as error:
        raise SpecbenchError(
            "options.quantization", str(error).splitlines()[0], "see BitsAndBytesConfig"
        ) from None


@contextlib.contextmanager
def quiet_transformers():
    """Our own progress display is enough: hide transformers' per-tensor loading bars."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


@contextlib.contextmanager
def unreadable(where: str, source: str, expected: str):
    """A local model that transformers cannot read is a one-line error, not its traceback."""
    try:
        yield
    except (OSError, ValueError, KeyError) as error:
        first = (str(error).strip().splitlines() or [type(error).__name__])[0][:160]
        raise SpecbenchError(where, f"cannot load {source}: {first}", f"give {expected}") from None


def config_facts(name: str, source: str, origin: str, dtype: str, config: Path, where: str):
    """Facts from a ``config.json`` on disk."""
    from specbench.models import facts

    return facts.from_config(name, source, origin, dtype, facts.read_json(config, where), path=config)


def hub_facts(name: str, source: str, hub_id: str, revision: str | None, dtype: str):
    """Facts of a Hub checkpoint: its ``config.json`` in the local Hugging Face cache (never the
    network), else the shipped public facts of the papers' models."""
    from specbench.models import facts

    where = f"models.{name}.source"
    cached = hub_cache_config(hub_id, revision)
    if cached is not None:
        return config_facts(name, source, "HF cache", dtype, cached, where)
    entry = facts.shipped_facts().get(hub_id)
    if entry is not None:
        return facts.from_config(name, source, facts.FACTS_FILE, dtype, entry["config"])
    raise SpecbenchError(
        where,
        f"no size facts for {hub_id!r}: not a local path, not in the local Hugging Face cache, not in "
        f"specbench/data/{facts.FACTS_FILE}",
        f"fetch its config.json on a connected machine (hf download {hub_id} config.json) or add its "
        f"config to specbench/data/{facts.FACTS_FILE}",
    )


def is_hub_id(source: str) -> bool:
    return not source.startswith((".", "/", "~")) and source.count("/") == 1


def hub_cache_config(repo_id: str, revision: str | None) -> Path | None:
    """``config.json`` of ``repo_id`` in the local Hugging Face cache, or None (never the network)."""
    if not is_hub_id(repo_id):
        return None
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(repo_id, "config.json", revision=revision)
    return Path(found) if isinstance(found, str) else None
