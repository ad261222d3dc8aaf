"""EAGLE-3 heads on llama.cpp: an ``eagle`` chain whose drafter is an EAGLE-3 head (``eagle3:``, a
published head or one ``specbench distill --size eagle3-layer`` trained) on an ``engine: llama.cpp`` target
runs as ``llama-server --spec-type draft-eagle3 -md <head.gguf> --spec-draft-n-max <depth>``, with
``--spec-draft-n-min 0 --spec-draft-p-min 0`` as for draft-simple (every step drafts ``depth`` tokens).

What this llama.cpp (the tree ``make install-llamacpp`` unpacks) takes, read from its source:

* ``-md`` names the head's own GGUF (``common/arg.cpp``); the target's GGUF stays ``--model``, and the
  head reads the target's token embeddings (and its LM head) when it carries none itself
  (``src/models/eagle3.cpp``, ``src/llama-context.cpp``).
* That GGUF has architecture ``eagle3`` with ``eagle3.target_layers`` (exactly 3 ids),
  ``eagle3.target_hidden_size`` and ``eagle3.norm_before_residual``; tensors ``fc``, ``d2t`` (int64,
  absolute target ids), ``output_norm``, ``output`` and one Llama block ``blk.0.*`` whose ``attn_norm_2``
  is EAGLE-3's ``hidden_norm``, with no biases and no q/k norms (``src/models/eagle3.cpp``,
  ``gguf-py/gguf/constants.py``). A target layer id i is the input of its decoder layer i, as
  specbench and vLLM count them, and the three states are concatenated in the order the file lists
  them (``common/speculative.cpp``), so the conversion writes them sorted: specbench's layer order.
* Its drafts are the head's greedy tokens, fed back with the layer's pre-norm output, a chain of at
  most ``--spec-draft-n-max`` (``common/speculative.cpp``); verification is draft-simple's.
* ``convert_hf_to_gguf.py --target-model-dir <target checkpoint>`` converts a head whose config has
  ``draft_vocab_size`` and one layer, registered as ``LlamaForCausalLMEagle3`` (also
  ``Eagle3LlamaForCausalLM``, ``Eagle3Speculator``, ``Eagle3DraftModel``): it reads
  ``eagle_aux_hidden_state_layer_ids`` (else 2, L // 2, L - 3 of the target), ``target_hidden_size``,
  ``norm_before_residual`` and ``norm_before_fc`` from the head's config, the tokenizer and vocabulary
  size from the target's folder, and renames ``midlayer.*`` (``conversion/llama.py``). Its speculators
  path reads ``num_hidden_layers`` before it unpacks ``transformer_layer_config``, so every head is
  first written in the EAGLE layout, with its aux ids and target width explicit.

The GGUF is converted once per head and target checkpoint into
``<cache>/gguf-eagle3/eagle3-<head digest>-<target digest>.gguf``, staged and checked as the BF16
conversions are (:mod:`specbench.engines.llamacpp_convert`), with a JSON record beside it. Heads
draft-eagle3 cannot run are refused when they load, naming the field: a decoder layer other than
Llama's, biases, other than 3 aux layers, or a target without a checkpoint folder to convert with.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from specbench.drafters import head_files, head_layouts
from specbench.engines import CellView, Problem
from specbench.engines import llamacpp_convert as convert
from specbench.engines.llamacpp_gguf import read_facts, vocabulary_problem
from specbench.errors import SpecbenchError
from specbench.models import cache

SPEC_TYPE = "draft-eagle3"
ARCHITECTURE = "eagle3"
AUX_LAYERS = 3  # llama.cpp's eagle3 loader and its speculative state both demand exactly three
FOLDER = "gguf-eagle3"
TARGET_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "tokenizer.model")
BLOCK = ("attn_norm", "attn_norm_2", "attn_q", "attn_k", "attn_v", "attn_output")
BLOCK += ("ffn_norm", "ffn_gate", "ffn_up", "ffn_down")
# what the eagle3 loader reads (token_embd.weight too where the head has its own embeddings)
LOADED = ("fc.weight", "d2t", "output_norm.weight", "output.weight", *(f"blk.0.{n}.weight" for n in BLOCK))
HEAD_FIX = "run this head in specbench's own eagle loop or on engine: vllm"


def speculation(cell: CellView) -> tuple[dict | None, Problem]:
    """A cell whose method is not ``speculative``: an ``eagle`` chain with an EAGLE-3 head as
    draft-eagle3, or the field that cannot map."""
    if cell.method != "eagle":
        return None, (
            "method",
            f"llama.cpp has no method {cell.method!r} mapped in specbench",
            "use autoregressive, speculative with a GGUF or prompt-lookup drafter, or eagle with an "
            "eagle3: head, on an engine: llama.cpp target",
        )
    if cell.drafter_kind != "eagle3":
        return None, (
            "drafter",
            f"llama.cpp's draft-eagle3 runs EAGLE-3 heads, and {cell.drafter!r} ({cell.drafter_kind}) is "
            "not one",
            "use an eagle3: head (a published one, or specbench distill --size eagle3-layer)",
        )
    params = cell.params
    if params["branch"] != 1 or params["frontier"] != 1:
        return None, (
            "params.branch",
            "llama.cpp's draft-eagle3 drafts one chain (the head's greedy token at each step), not a tree",
            "use branch: 1 and frontier: 1 (our eagle cell with the same params verifies that chain)",
        )
    return {
        "spec_type": SPEC_TYPE,
        "draft_source": cell.drafter_source,
        "n_max": params["depth"],
        "n_min": 0,
        "p_min": 0.0,
    }, None


def target_folder(source: str) -> Path | None:
    """The target's checkpoint folder (config and tokenizer) that the conversion reads, or None."""
    from specbench.sources.checkpoints import is_hub_id

    try:
        return convert.weights_dir(source, "source")
    except SpecbenchError:
        return convert._hub_snapshot(source) if is_hub_id(source) else None


def check_head(checkpoint, aux, folder: Path | None, where: str) -> None:
    """Refuse, in one line naming the field, a head (a :class:`head_layouts.HeadCheckpoint` reading
    ``aux``) that draft-eagle3 cannot load, or whose target has no checkpoint ``folder`` here."""
    config = checkpoint.folder / head_layouts.CONFIG
    layer = checkpoint.layer_fields
    if layer.get("model_type") != "llama":
        raise SpecbenchError(
            f"{where}.source",
            f"{config}: the head's decoder layer is model_type {layer.get('model_type')!r}; llama.cpp's "
            "draft-eagle3 runs a Llama layer (no q/k norms)",
            f"use a head whose layer is model_type llama, or {HEAD_FIX}",
        )
    for flag in ("attention_bias", "mlp_bias"):
        if layer.get(flag):
            raise SpecbenchError(
                f"{where}.source",
                f"{config}: {flag}: true; llama.cpp's draft-eagle3 layer has no biases",
                f"use a head without them, or {HEAD_FIX}",
            )
    if aux is not None and len(aux) != AUX_LAYERS:
        raise SpecbenchError(
            f"{where}.source",
            f"{config}: eagle_aux_hidden_state_layer_ids reads {len(aux)} target layers {list(aux)}; "
            f"llama.cpp's draft-eagle3 reads exactly {AUX_LAYERS}",
            f"use a head trained on {AUX_LAYERS} aux layers, or {HEAD_FIX}",
        )
    if folder is None:
        raise SpecbenchError(
            f"{where}.options.of",
            "llama.cpp's converter writes the head's GGUF with the target's tokenizer and config, and the "
            "target's source has no checkpoint folder here",
            "give the target a source with one (an alias, a local checkpoint folder, a cached Hub id) and "
            "its GGUF in engine_options.gguf",
        )
    if aux is None:
        raise SpecbenchError(
            f"{where}.options.of",
            f"the target's config in {folder} could not be read to check the head's aux layers against",
            "give the target a checkpoint folder whose config.json transformers reads",
        )


def gguf_path(head_digest: str, target_digest: str) -> Path:
    """Where the GGUF of the head with ``head_digest`` for the target checkpoint with ``target_digest``
    (its config and tokenizer files, which the GGUF's vocabulary comes from) is kept."""
    return cache.cache_dir() / FOLDER / f"eagle3-{head_digest}-{target_digest}.gguf"


def head_config(target, drafter, where: str, log=None) -> dict:
    """What the server's settings add for the EAGLE-3 ``drafter`` (an
    :class:`~specbench.drafters.eagle3_engine.Eagle3HeadForEngine`) on ``target`` (a
    :class:`~specbench.engines.llamacpp.LlamaCppTarget`): the head's GGUF, converted on first use from
    the target's checkpoint folder, its vocabulary checked against the served GGUF's, and the aux layers
    it was written with."""
    folder = target.weights_folder
    if folder is None or drafter.checkpoint["aux_layer_ids"] is None:  # check_head refused it on loading
        raise SpecbenchError(
            f"{where}.options.of", "the head was not checked against a target checkpoint folder", "run again"
        )
    target_digest = head_files.digest(*(folder / name for name in TARGET_FILES if (folder / name).is_file()))
    path = gguf_path(drafter.digest, target_digest)
    record = path.with_name(path.name + convert.RECORD_SUFFIX)
    if not (path.is_file() and record.is_file()):
        _convert(drafter, folder, path, where, log)
    facts = read_facts(path, f"{where}.source")
    problem = vocabulary_problem(target.gguf, facts)
    if problem:
        raise SpecbenchError(
            f"{where}.options.of",
            f"the head's GGUF, written with the tokenizer of {folder}, is not the served GGUF's vocabulary: "
            f"{problem}",
            "serve the GGUF of the checkpoint the head's target source names",
        )
    return {
        "model_draft": str(path),
        "draft_file_type": facts.file_type,
        "head_digest": drafter.digest,
        "aux_layer_ids": json.loads(record.read_text())["target_layers"],
    }


def _convert(drafter, folder: Path, path: Path, where: str, log) -> None:
    """The head as ``path``: staged in the EAGLE layout, converted, checked, then renamed into place."""
    checkpoint = head_layouts.read(drafter.folder, f"{where}.source")
    if checkpoint.digest != drafter.digest:
        raise SpecbenchError(
            f"{where}.source",
            f"the head in {drafter.folder} changed since it loaded (digest {checkpoint.digest}, loaded "
            f"{drafter.digest})",
            "run again (the head is read afresh)",
        )
    aux = sorted(drafter.checkpoint["aux_layer_ids"])
    script = convert.converter()
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in path.parent.glob(f"{convert.STAGING_PREFIX}*-{path.stem}*"):  # a killed conversion's
        if stale.is_dir():
            shutil.rmtree(stale)
        else:
            stale.unlink(missing_ok=True)
    staged = path.with_name(f"{convert.STAGING_PREFIX}{os.getpid()}-{path.stem}")
    staging = staged.with_name(staged.name + ".gguf")
    name = f"{path.stem} (head {drafter.folder.name}, target {folder.name})"
    (log or _stderr)(f"specbench: converting the EAGLE-3 head {drafter.folder} to GGUF {path} with {script}")
    started = time.perf_counter()
    try:
        head_layouts.write(checkpoint, head_layouts.build(checkpoint, where), staged, "eagle", None)
        config = json.loads((staged / head_layouts.CONFIG).read_text())
        config |= {
            "eagle_aux_hidden_state_layer_ids": aux,
            "target_hidden_size": checkpoint.target_hidden_size,
        }
        (staged / head_layouts.CONFIG).write_text(json.dumps(config, indent=2) + "\n")
        command = [sys.executable, "-c", convert.RUNNER, str(script), str(staged), "--outtype", convert.BF16]
        command += ["--outfile", str(staging), "--target-model-dir", str(folder), "--model-name", name]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0 or not staging.is_file():
            lines = [line for line in (done.stderr + done.stdout).splitlines() if line.strip()]
            raise SpecbenchError(
                f"{where}.source",
                f"llama.cpp's converter failed on the EAGLE-3 head {drafter.folder} (exit "
                f"{done.returncode}): {(lines or ['no output'])[-1][:300]}",
                "fix what it names, or run this head in specbench's own eagle loop or on engine: vllm",
            )
        facts = check_file(staging, checkpoint, aux, name, f"{where}.source")
        facts |= {
            "head": str(drafter.folder),
            "head_digest": checkpoint.digest,
            "layout": checkpoint.layout,
            "target_folder": str(folder),
            "converter": str(script),
            "outtype": convert.BF16,
            "bytes": staging.stat().st_size,
            "seconds": round(time.perf_counter() - started, 1),
        }
        record = path.with_name(path.name + convert.RECORD_SUFFIX)
        record.unlink(missing_ok=True)
        os.replace(staging, path)  # atomic: the file appears finished or not at all
        record.write_text(json.dumps(facts, indent=1) + "\n")
    finally:
        staging.unlink(missing_ok=True)
        shutil.rmtree(staged, ignore_errors=True)


def check_file(path: Path, checkpoint, aux: list[int], general_name: str, where: str) -> dict:
    """The converted head's facts, or one line: an ``eagle3`` GGUF of ``general_name`` with the aux
    layers, target width and residual rule of ``checkpoint``, every tensor the loader reads, and a
    ``d2t`` of the draft vocabulary's length."""
    reader, value = convert.read_converted(path, where)
    tensors = {tensor.name: tensor for tensor in reader.tensors}
    loaded = [*LOADED, *(["token_embd.weight"] if "embed_tokens.weight" in checkpoint.tensors else [])]
    found = {
        "architecture": value("general.architecture"),
        "general_name": value("general.name"),
        "target_layers": value(f"{ARCHITECTURE}.target_layers"),
        "target_hidden_size": value(f"{ARCHITECTURE}.target_hidden_size"),
        "norm_before_residual": bool(value(f"{ARCHITECTURE}.norm_before_residual")),
        "tensors": len(tensors),
    }
    wanted = {
        "architecture": ARCHITECTURE,
        "general_name": general_name,
        "target_layers": list(aux),
        "target_hidden_size": checkpoint.target_hidden_size,
        "norm_before_residual": checkpoint.norm_before_residual,
    }
    for key, want in wanted.items():
        if found[key] != want:
            raise SpecbenchError(
                where,
                f"{path} has {key} {found[key]!r}, not the head's {want!r}",
                "convert with llama.cpp's converter from the tree make install-llamacpp unpacked",
            )
    missing = [name for name in loaded if name not in tensors]
    if missing:
        raise SpecbenchError(
            where,
            f"{path} lacks {', '.join(missing[:3])}, which llama.cpp's draft-eagle3 loads",
            "convert again with llama.cpp's converter from the same tree",
        )
    if int(tensors["d2t"].n_elements) != checkpoint.draft_vocab_size:
        raise SpecbenchError(
            where,
            f"{path}: d2t has {int(tensors['d2t'].n_elements)} entries, not draft_vocab_size "
            f"{checkpoint.draft_vocab_size}",
            "convert again",
        )
    return found | {"draft_vocab_size": checkpoint.draft_vocab_size}


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
