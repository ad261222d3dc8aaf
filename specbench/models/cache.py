"""Where specbench keeps what it builds or converts (the specbench cache), how it writes a file there
(atomically), and whether the Hugging Face Hub answers. Every layer uses these, so they live at the
bottom, next to the model interface."""

from __future__ import annotations

import errno
import functools
import hashlib
import json
import os
import socket
import tempfile
from pathlib import Path

from specbench.errors import SpecbenchError

DISTILLED_PREFIX = "distilled:"


def cache_dir() -> Path:
    """``$SPECBENCH_CACHE``, else ``~/.cache/specbench``."""
    root = os.environ.get("SPECBENCH_CACHE") or Path.home() / ".cache" / "specbench"
    return Path(root)


def distilled_dir(name: str) -> Path:
    """Where ``specbench distill`` saves the drafter ``<target>/<size>``."""
    return cache_dir() / "drafters" / name


def trained_record(folder: Path) -> dict | None:
    """The ``distill.json`` of the drafter trained in ``folder`` (how it was trained), or None where
    there is none or it cannot be read."""
    record = folder / "distill.json"
    if not record.is_file():
        return None
    try:
        manifest = json.loads(record.read_text())
    except (ValueError, UnicodeDecodeError):
        return None
    return manifest if isinstance(manifest, dict) else None


def trained_identity(folder: Path) -> str | None:
    """A digest of how the drafter in ``folder`` was trained (its ``distill.json``: the teacher data's
    key and settings, the student's configuration and, where its trainer records one, the trainer's
    revision), or None where there is none. Deterministic training makes it stand for the weights;
    the machine-specific data path is left out."""
    manifest = trained_record(folder)
    if manifest is None:
        return None
    teacher = {k: v for k, v in (manifest.get("teacher") or {}).items() if k != "data_dir"}
    how = {"teacher": teacher, "student": manifest.get("student")}
    if "trainer_revision" in manifest:  # absent: the first revision, digested as before revisions
        how["trainer_revision"] = manifest["trainer_revision"]
    payload = json.dumps(how, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def umask() -> int:
    """The process's umask (read from /proc where it can be, since setting it to read it back is not
    safe while other threads create files)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


class UnwritableFile(SpecbenchError, OSError):
    """A file :func:`write_atomic` could not write: a one-line error naming it, and still an OSError
    (with the cause's errno and strerror) for callers that name it in their own words."""

    __str__ = BaseException.__str__  # the one line, not OSError's "[Errno 28] ..."

    def __init__(self, path: Path, cause: OSError):
        if cause.errno in (errno.ENOSPC, errno.EDQUOT):
            fix = "free space on its disk and run the command again (finished work is kept)"
        elif isinstance(cause, IsADirectoryError):
            fix = "it is a folder: name a file"
        else:
            fix = "make its folder writable, or write somewhere else"
        super().__init__(str(path), f"cannot be written ({cause.strerror or cause})", fix)
        self.errno, self.strerror, self.filename = cause.errno, cause.strerror, str(path)


def write_atomic(path: Path, content: str | bytes) -> None:
    """Write ``path`` so that a reader meanwhile sees the old file or the new one, never a part, with
    the mode a plain ``open`` gives (mkstemp's 0600 would hide run files from the user's colleagues);
    a full disk or a missing permission is a one-line error naming ``path``, leaving no temporary file."""
    path = Path(path)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        with os.fdopen(fd, "wb" if isinstance(content, bytes) else "w") as handle:
            os.fchmod(handle.fileno(), 0o666 & ~umask())
            handle.write(content)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
        tmp = None
    except OSError as error:
        raise UnwritableFile(path, error) from None
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)


@functools.lru_cache(maxsize=1)
def hub_reachable() -> bool:
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
        return False
    try:
        socket.create_connection(("huggingface.co", 443), timeout=3).close()
        return True
    except OSError:
        return False
