"""An EAGLE-3 head (``eagle3:`` source) whose target runs on a serving engine: the engine loads the head
itself, from an export in the speculators layout (vLLM's ``speculative_config`` ``{"method": "eagle3",
"model": <export>}``), so this process only reads the head once, checks it against the target's config,
and writes the export where the specbench cache keeps it by the head's digest
(``<cache>/exports/eagle3-speculators/<digest>``): the same head is exported once, and a changed head
is another folder, so another engine setting. A target whose engine has its own limits on heads (its
``check_head``: llama.cpp's draft-eagle3, which converts the head to GGUF itself) refuses one as it loads."""

from __future__ import annotations

import math
import shutil
from pathlib import Path
from types import SimpleNamespace

from specbench.drafters import head_layouts
from specbench.models import cache

EXPORTS = Path("exports") / "eagle3-speculators"


def export_folder(digest: str) -> Path:
    """Where the speculators export of the head with ``digest`` is kept."""
    return cache.cache_dir() / EXPORTS / digest


class Eagle3HeadForEngine:
    """A published (or distilled) EAGLE-3 head in ``folder`` for a target ``served`` by an engine (its
    ``directory``: where the engine reads the target's weights, whose config the head is checked
    against when it can be read here)."""

    method = "eagle3"  # the engine's speculative method for it

    def __init__(self, name: str, folder: Path, served, where: str):
        checkpoint = head_layouts.read(folder, f"{where}.source")
        # llama.cpp serves a GGUF file: its target's checkpoint folder holds the config
        config = _target_config(getattr(served, "weights_folder", getattr(served, "directory", None)))
        aux = None
        if config is not None:
            stand_in = SimpleNamespace(
                model=SimpleNamespace(config=config),
                vocab_size=config.get_text_config().vocab_size,
                name=served.name,
            )
            aux = list(head_layouts.check_target(checkpoint, stand_in, where))
        engine_check = getattr(served, "check_head", None)  # the engine's own limits on a head
        if engine_check is not None:
            engine_check(checkpoint, aux, where)
        self.name, self.folder, self.verifier = name, folder, getattr(served, "directory", None)
        self._checkpoint = checkpoint
        self.digest = checkpoint.digest
        counted = {k: v for k, v in checkpoint.tensors.items() if k not in ("d2t", "t2d")}
        self.num_parameters = sum(math.prod(v.shape) for v in counted.values())
        self.origin = f"EAGLE-3 head ({checkpoint.layout} layout) {folder}, loaded by the engine"
        self.checkpoint = {
            "layout": checkpoint.layout,
            "path": str(folder),
            "digest": checkpoint.digest,
            "aux_layer_ids": aux or (list(checkpoint.aux_layer_ids or ()) or None),
            "draft_vocab_size": checkpoint.draft_vocab_size,
            "norm_before_residual": checkpoint.norm_before_residual,
            "export": str(export_folder(checkpoint.digest)),
        }

    def vllm_folder(self) -> Path:
        """The head in the speculators layout, written on first use and read from the cache after."""
        out = export_folder(self.digest)
        if (out / head_layouts.CONFIG).is_file():
            return out
        staging = out.with_name(f".{out.name}.partial")
        if staging.exists():
            shutil.rmtree(staging)
        checkpoint = self._checkpoint
        head = head_layouts.build(checkpoint, f"models.{self.name}.source")
        head_layouts.write(checkpoint, head, staging, "speculators", self.verifier)
        if out.exists():  # another run wrote it meanwhile
            shutil.rmtree(staging)
        else:
            staging.rename(out)
        return out


def _target_config(directory: str | None):
    """The transformers config of the served target, or None where it cannot be read here."""
    if not directory:
        return None
    try:
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(directory, local_files_only=True)
    except (OSError, ValueError):
        return None
