"""A BF16 GGUF of the weights specbench itself runs, so that llama.cpp computes on the same numbers in
the same dtype as specbench's and vLLM's bf16 cells (its own files are quantized: SmolLM2's Q4_1, the
Qwen2.5-Coder pair's Q4_K_M).

The weights are the checkpoint folder specbench loads: the de-quantised copy in the specbench cache
(the Qwen pair's bfloat16 folders, SmolLM2's float32 one, whose values round to the same bfloat16 as
specbench's own cast), or the Hub snapshot, or a local directory. llama.cpp's ``convert_hf_to_gguf.py``
from the source tree ``make install-llamacpp`` unpacked writes ``--outtype bf16`` into
``<cache>/gguf-bf16/<name>-bf16.gguf``, once: the file is written under a staging name, checked (the GGUF
magic, a BF16 file type, a ``general.name``, as many tensors as the checkpoint holds) and only then
renamed into place, so a killed or failed conversion never leaves a file a run would take for finished.
A JSON record beside it says what it was made from.

``engine_options: {gguf: bf16, draft_gguf: bf16}`` serve these files (converted on first use);
``python -m specbench.engines.llamacpp_convert ALIAS...`` (``make gguf-bf16``) converts ahead of a run.
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import subprocess
import sys
import time
from pathlib import Path

from specbench.errors import SpecbenchError, expand_home
from specbench.models import cache

BF16 = "bf16"  # the engine_options value that asks for this conversion
LOCAL_TREE = Path(".llamacpp/src")
CONVERTER_NAME = "convert_hf_to_gguf.py"
RECORD_SUFFIX = ".json"
STAGING_PREFIX = ".partial-"
DISTILLED = "distilled:"  # a drafter specbench distill made: its folder in the cache
CONVERT_FIX = "run make install-llamacpp (it unpacks llama.cpp's tree), or set SPECBENCH_LLAMACPP_CONVERTER"
# llama.cpp's converter imports sentencepiece before it looks for a tokenizer.model, so a model with only a
# tokenizer.json (SmolLM2, Qwen2.5) fails without the package though it never uses it; the stub lets such
# a model through and stops, with the fix, any model that does have a tokenizer.model.
RUNNER = """
import importlib.machinery, importlib.util, runpy, sys, types
converter = sys.argv[1]
if importlib.util.find_spec("sentencepiece") is None:
    class SentencePieceProcessor:
        def __init__(self, *args, **kwargs):
            raise SystemExit("error: this model's tokenizer.model needs sentencepiece (pip install it)")
    stub = types.ModuleType("sentencepiece")
    stub.SentencePieceProcessor = SentencePieceProcessor
    stub.__spec__ = importlib.machinery.ModuleSpec("sentencepiece", None)
    sys.modules["sentencepiece"] = stub
sys.path.insert(0, converter.rpartition("/")[0])
sys.argv = sys.argv[1:]
runpy.run_path(converter, run_name="__main__")
"""


def converter() -> Path:
    """llama.cpp's ``convert_hf_to_gguf.py``: ``$SPECBENCH_LLAMACPP_CONVERTER``, else the one in the tree
    ``make install-llamacpp`` unpacked into ``.llamacpp/src``."""
    named = os.environ.get("SPECBENCH_LLAMACPP_CONVERTER")
    if named:
        path = Path(named).expanduser()
        if not path.is_file():
            raise SpecbenchError("SPECBENCH_LLAMACPP_CONVERTER", f"{named} is not a file", CONVERT_FIX)
        return path.absolute()
    found = sorted(LOCAL_TREE.glob(f"*/vendor/llama.cpp/{CONVERTER_NAME}"))
    if not found:
        raise SpecbenchError(
            "engine_options.gguf", f"llama.cpp's {CONVERTER_NAME} is not in {LOCAL_TREE}", CONVERT_FIX
        )
    return found[-1].absolute()


def weights_dir(source: str, where: str) -> Path:
    """The checkpoint folder specbench loads for ``source``: a packaged model's de-quantised copy in the
    cache, a Hub snapshot in the local HF cache, or a local directory holding a config.json."""
    from specbench.sources import packaged_gguf, qwen_coder, smollm2

    if source in qwen_coder.MODELS:
        folder = packaged_gguf.converted_dir(qwen_coder.MODELS[source], "bfloat16")
        hub_id = qwen_coder.HUB_IDS[source]
    elif source == smollm2.ALIAS:
        folder, hub_id = smollm2.converted_dir(), smollm2.HUB_ID
    elif source.startswith(DISTILLED):
        folder, hub_id = cache.distilled_dir(source.removeprefix(DISTILLED)), None
    else:
        folder, hub_id = expand_home(source, where), None
    if (folder / "config.json").is_file():
        return folder
    if hub_id is not None:
        snapshot = _hub_snapshot(hub_id)
        if snapshot is not None:
            return snapshot
    raise SpecbenchError(
        where,
        f"no checkpoint folder of {source} to convert to BF16 GGUF ({folder} holds no config.json)",
        "load the model once first (make models, or any run with it), or give a local checkpoint folder",
    )


def _hub_snapshot(hub_id: str) -> Path | None:
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(hub_id, local_files_only=True))
    except Exception:  # not in the local cache (huggingface_hub's errors differ by version)
        return None


def gguf_path(source: str) -> Path:
    """Where the BF16 GGUF of ``source`` is kept in the specbench cache."""
    local = source.startswith(("/", "~", "."))
    name = Path(source).name if local else source.replace(":", "-").replace("/", "-")
    return cache.cache_dir() / "gguf-bf16" / f"{name}-bf16.gguf"


def checkpoint_tensors(folder: Path) -> int:
    """How many tensors the checkpoint's safetensors files hold (their headers only)."""
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise SpecbenchError(
            str(folder), "holds no .safetensors file", "give a safetensors checkpoint folder"
        )
    count = 0
    for path in files:
        with open(path, "rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            header = json.loads(handle.read(length))
        names = [name for name in header if name != "__metadata__"]
        count += sum(1 for name in names if not name.endswith("rotary_emb.inv_freq"))
    return count


def read_converted(path: Path, where: str):
    """A converted file's GGUF reader and a ``value(key)`` of its metadata (None where absent), or one
    line: the file does not start with the GGUF magic, or does not parse."""
    from gguf import GGUFReader

    with open(path, "rb") as handle:
        if handle.read(4) != b"GGUF":
            raise SpecbenchError(where, f"{path} does not start with the GGUF magic", "convert again")
    try:
        reader = GGUFReader(path)
    except (ValueError, OSError, IndexError) as error:
        raise SpecbenchError(
            where, f"{path} is not a readable GGUF file ({error})", "convert again"
        ) from None

    def value(key: str):
        field = reader.get_field(key)
        return None if field is None else field.contents()

    return reader, value


def check_file(path: Path, tensors: int, general_name: str, where: str) -> dict:
    """The converted file's facts, or a one-line error: the GGUF magic, file type BF16, the
    ``general.name`` it was given, and ``tensors`` tensors (the checkpoint's; none dropped)."""
    from gguf import LlamaFileType

    reader, value = read_converted(path, where)
    name, file_type = value("general.name"), value("general.file_type")
    if file_type != LlamaFileType.MOSTLY_BF16:
        raise SpecbenchError(
            where, f"{path} has file type {file_type}, not BF16", "convert with --outtype bf16"
        )
    if name != general_name:
        raise SpecbenchError(
            where, f"{path} has general.name {name!r}, not {general_name!r}", "convert again"
        )
    if len(reader.tensors) != tensors:
        raise SpecbenchError(
            where,
            f"{path} holds {len(reader.tensors)} tensors and the checkpoint {tensors}",
            "convert again with llama.cpp's converter from the same tree",
        )
    return {"general_name": name, "architecture": value("general.architecture"), "tensors": tensors}


def bf16_gguf(source: str, where: str, log=None) -> Path:
    """The BF16 GGUF of ``source``'s weights in the specbench cache, converted once (minutes for 1.5B
    parameters) and checked; a finished file is read again only for its record's presence."""
    target = gguf_path(source)
    record = target.with_name(target.name + RECORD_SUFFIX)
    if target.is_file() and record.is_file():
        return target
    folder = weights_dir(source, where)
    script = converter()
    tensors = checkpoint_tensors(folder)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.with_name(f"{STAGING_PREFIX}{os.getpid()}-{target.name}")
    for stale in target.parent.glob(f"{STAGING_PREFIX}*-{target.name}"):  # left by a killed conversion
        stale.unlink(missing_ok=True)
    (log or _stderr)(f"specbench: converting {folder} to BF16 GGUF {target} with {script}")
    command = [sys.executable, "-c", RUNNER, str(script), str(folder), "--outtype", "bf16"]
    name = f"{gguf_path(source).stem} (from {folder.name})"  # the header says what it was made from
    command += ["--outfile", str(staging), "--model-name", name]
    started = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0 or not staging.is_file():
            lines = [line for line in (done.stderr + done.stdout).splitlines() if line.strip()]
            raise SpecbenchError(
                where,
                f"llama.cpp's converter failed on {folder} (exit {done.returncode}): "
                f"{(lines or ['no output'])[-1][:300]}",
                "fix what it names (a missing Python package: install it where specbench runs; a "
                "tokenizer it does not know: a newer llama.cpp, make install-llamacpp LLAMACPP_SPEC=...)",
            )
        facts = check_file(staging, tensors, name, where)
        facts |= {
            "source": source,
            "from": str(folder),
            "converter": str(script),
            "outtype": BF16,
            "bytes": staging.stat().st_size,
            "seconds": round(time.perf_counter() - started, 1),
        }
        record.unlink(missing_ok=True)
        os.replace(staging, target)  # atomic: the file appears finished or not at all
        record.write_text(json.dumps(facts, indent=1) + "\n")
    finally:
        staging.unlink(missing_ok=True)
    return target


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> None:  # pragma: no cover - `make gguf-bf16`
    parser = argparse.ArgumentParser(description="Convert models' checkpoints to BF16 GGUF with llama.cpp.")
    parser.add_argument("sources", nargs="+", help="recipe sources: aliases or local checkpoint folders")
    args = parser.parse_args(argv)
    for source in args.sources:
        try:
            path = bf16_gguf(source, source)
        except SpecbenchError as error:
            raise SystemExit(f"error: {error}") from None
        record = json.loads(path.with_name(path.name + RECORD_SUFFIX).read_text())
        print(
            f"{source}: {path} ({record['bytes'] / 1e9:.3f} GB, general.name {record['general_name']!r}, "
            f"{record['tensors']} tensors)"
        )


if __name__ == "__main__":  # pragma: no cover
    main()
