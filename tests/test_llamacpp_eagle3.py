"""EAGLE-3 heads on llama.cpp (specbench.engines.llamacpp_eagle3): an eagle chain with an ``eagle3:`` head
on an ``engine: llama.cpp`` target maps to ``--spec-type draft-eagle3`` with the head's GGUF as ``-md``,
converted once by llama.cpp's converter (here its stand-in, tests/fixtures/stub_convert, which writes the
eagle3 GGUF llama.cpp's conversion/llama.py writes) and served by the stand-in llama-server
(tests/fixtures/stub_llamacpp, which stops on a draft GGUF that is no 3-layer EAGLE-3 head, as llama.cpp
does). Heads draft-eagle3 cannot run are one line before any row. The real converter and server run in
the slow test named in docs/engines.md."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import tiny_recipes
from test_eagle3_layouts import head_tensors, write_head
from test_llamacpp_backend import STUB, _rows, _run, _servers_left, write_gguf

from specbench.drafters import head_layouts
from specbench.engines import CellView
from specbench.engines import llamacpp_server as servers
from specbench.engines.llamacpp import _speculation
from specbench.engines.llamacpp_eagle3 import check_head
from specbench.errors import SpecbenchError

STUB_CONVERTER = Path(__file__).parent / "fixtures" / "stub_convert" / "convert_hf_to_gguf.py"
LAYERS = 4
AUX = (3, 0, 1)  # as a config may list them; llama.cpp concatenates in the listed order, specbench sorted
CHAIN = {"depth": 3, "branch": 1, "frontier": 1}


# -- the cell mapping and the command line ----------------------------------------------------------


def test_an_eagle_chain_with_an_eagle3_head_maps_to_draft_eagle3():
    chain = CellView("eagle", dict(CHAIN), "head", "eagle3", {}, True, "eagle3:/h")
    assert _speculation(chain) == (
        {"spec_type": "draft-eagle3", "draft_source": "eagle3:/h", "n_max": 3, "n_min": 0, "p_min": 0.0},
        None,
    )


@pytest.mark.parametrize(
    ("view", "field", "says"),
    [
        (CellView("eagle", CHAIN | {"branch": 2}, "h", "eagle3", {}, True), "params.branch", "not a tree"),
        (CellView("eagle", dict(CHAIN), "h", "eagle", {}, True), "drafter", "use an eagle3: head"),
        (CellView("eagle", dict(CHAIN), "h", "eagle1", {}, True), "drafter", "runs EAGLE-3 heads"),
        (CellView("medusa", {"depth": 3}, "h", "medusa", {}, True), "method", "no method 'medusa'"),
    ],
)
def test_eagle_cells_draft_eagle3_cannot_run_name_the_field(view, field, says):
    spec, problem = _speculation(view)
    assert spec is None and problem[0] == field and says in problem[1] + problem[2]


def test_the_server_command_names_the_heads_gguf_and_k():
    spec = {"spec_type": "draft-eagle3", "model_draft": "/c/h.gguf", "n_max": 3, "n_min": 0, "p_min": 0.0}
    line = servers.command("llama-server", "/m/t.gguf", spec, {"threads": 2}, 8080, 1)
    assert line[:3] == ["llama-server", "--model", "/m/t.gguf"]
    flags = {line[i]: line[i + 1] for i in range(1, len(line) - 1) if line[i].startswith("-")}
    assert flags["--spec-type"] == "draft-eagle3" and flags["-md"] == "/c/h.gguf"
    assert flags["--spec-draft-n-max"] == "3" and flags["--spec-draft-n-min"] == "0"
    assert flags["--spec-draft-p-min"] == "0.0" and flags["--threads"] == "2"
    assert "--spec-ngram-simple-size-n" not in line


# -- whole runs through the stand-in converter and server -------------------------------------------------


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> Path:
    """A tiny 4-layer target (its checkpoint folder and a GGUF the stand-in serves, seed 0)."""
    from specbench.models.tiny import build_tiny

    root = tmp_path_factory.mktemp("llamacpp-eagle3")
    model, tokenizer = build_tiny("tiny-llama", seed=3, layers=LAYERS)
    model.save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "model")
    write_gguf(root / "model" / "model.gguf", seed=0, layers=LAYERS)
    return root / "model"


@pytest.fixture
def stand_ins(tmp_path, monkeypatch) -> Path:
    """The stand-in server and converter as the ones specbench runs, a fresh cache, and their logs."""
    wrapper = tmp_path / "llama-server"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{STUB}" "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("SPECBENCH_LLAMA_SERVER", str(wrapper))
    monkeypatch.setenv("SPECBENCH_LLAMACPP_CONVERTER", str(STUB_CONVERTER))
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("SPECBENCH_DATA_DIR", str(tmp_path / "no-data"))
    monkeypatch.setenv("STUB_LLAMA_LOG", str(tmp_path / "requests.jsonl"))
    monkeypatch.setenv("STUB_LLAMA_PIDS", str(tmp_path / "pids"))
    monkeypatch.setenv("STUB_CONVERT_LOG", str(tmp_path / "conversions.jsonl"))
    monkeypatch.setenv("STUB_CONVERT_SEED", "1")  # the head drafts by another rule than the target's
    return tmp_path


def _head(target: Path, folder: Path, aux=AUX, model_type="llama", **fields) -> Path:
    """A random EAGLE-3 head in the EAGLE layout for ``target``, reading the aux layers ``aux``."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(target)
    stand_in = SimpleNamespace(config=config)
    tensors = head_tensors(stand_in, range(0, config.vocab_size, 3), model_type=model_type, seed=1)
    tensors["fc.weight"] = tensors["fc.weight"][:, : len(aux) * config.hidden_size].contiguous()
    fields["eagle_aux_hidden_state_layer_ids"] = list(aux)
    return write_head(folder, "eagle", stand_in, tensors, model_type=model_type, **fields)


def _recipe(target: Path, head: Path) -> dict:
    options = {"start_timeout_s": 30, "request_timeout_s": 60}
    models = {
        "served": {
            "source": str(target),
            "dtype": "float32",
            "engine": "llama.cpp",
            "engine_options": options,
        },
        "head": {"source": f"eagle3:{head}", "options": {"of": "served"}},
    }
    eagle = {"name": "e3", "method": "eagle", "target": "served", "drafter": "head", "params": dict(CHAIN)}
    return tiny_recipes.recipe(
        "llamacpp-eagle3", models, [tiny_recipes.ar("ar", "served"), eagle], max_new_tokens=24
    )


def _conversions(root: Path) -> list[dict]:
    path = root / "conversions.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_an_eagle3_head_runs_in_draft_eagle3_from_one_conversion(target, stand_ins):
    from gguf import GGUFReader

    root = stand_ins
    head = _head(target, root / "head")
    result = _run(root, _recipe(target, head))
    assert result.exit_code == 0, result.output
    digest = head_layouts.read(head, "head").digest
    converted = sorted((root / "cache" / "gguf-eagle3").iterdir())
    assert [p.suffix for p in converted] == [".gguf", ".json"]  # no staging folder or file left
    gguf = converted[0]
    assert gguf.name.startswith(f"eagle3-{digest}-")
    rows = _rows(root)
    by = {(r["cell"], r["example_id"]): r for r in rows}
    e3 = [r for r in rows if r["cell"].startswith("e3")]
    assert len(e3) == 2 and len(rows) == 4
    for row in e3:
        record = row["engine_record"]
        assert record["speculative_config"] == {
            "spec_type": "draft-eagle3",
            "n_max": 3,
            "n_min": 0,
            "p_min": 0.0,
            "model_draft": str(gguf),
            "draft_file_type": "BF16",
            "head_digest": digest,
            "aux_layer_ids": [0, 1, 3],
        }
        command = record["settings"]["command"]
        assert command[command.index("--spec-type") + 1] == "draft-eagle3"
        assert command[command.index("-md") + 1] == str(gguf)
        assert command[command.index("--spec-draft-n-max") + 1] == "3"
        assert row["forwards"]["head"]["forward_passes"] == sum(d for d, _ in row["steps"])
        ar = by["ar", row["example_id"]]  # lossless: its own AR on the same GGUF
        assert row["output_ids"] == ar["output_ids"] and row["divergence_class"] == "identical"
    logged = [json.loads(line) for line in (root / "requests.jsonl").read_text().splitlines()]
    steps = [s for line in logged if line["spec_type"] == "draft-eagle3" for s in line["steps"]]
    assert 0 < sum(a for _, a in steps) < sum(d for d, _ in steps)  # drafts partly accepted
    # what the conversion was given and wrote: the EAGLE layout with sorted aux ids, the target's folder
    (conversion,) = _conversions(root)
    assert conversion["target"] == str(target) and conversion["outtype"] == "bf16"
    assert Path(conversion["model"]).name.startswith(".partial-")
    reader = GGUFReader(gguf)
    assert reader.get_field("general.architecture").contents() == "eagle3"
    assert reader.get_field("eagle3.target_layers").contents() == [0, 1, 3]
    d2t = next(t for t in reader.tensors if t.name == "d2t")
    assert [int(i) for i in d2t.data] == list(range(0, 260, 3))  # absolute target ids
    written = json.loads(gguf.with_name(gguf.name + ".json").read_text())
    assert written["head_digest"] == digest and written["target_folder"] == str(target)
    assert written["target_layers"] == [0, 1, 3] and written["layout"] == "eagle"
    environment = json.loads((root / "out" / "environment.json").read_text())
    assert environment["models"]["head"]["checkpoint"]["digest"] == digest
    assert _servers_left(root) == []
    # converted once: a second run reads the cached file
    shutil.rmtree(root / "out")
    assert _run(root, _recipe(target, head)).exit_code == 0
    assert len(_conversions(root)) == 1 and gguf.is_file()
    assert _servers_left(root) == []


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (
            {"aux": (0, 1)},
            "eagle_aux_hidden_state_layer_ids reads 2 target layers [0, 1]; llama.cpp's draft-eagle3 reads "
            "exactly 3",
        ),
        ({"model_type": "qwen3"}, "the head's decoder layer is model_type 'qwen3'"),
        ({"attention_bias": True}, "attention_bias: true; llama.cpp's draft-eagle3 layer has no biases"),
    ],
)
def test_a_head_draft_eagle3_cannot_run_is_one_line_before_any_row(target, stand_ins, change, says):
    root = stand_ins
    head = _head(target, root / "head", **change)
    result = _run(root, _recipe(target, head))
    assert result.exit_code == 2, result.output
    (line,) = [line for line in result.output.splitlines() if says in line]
    assert "models.head" in line and "fix: " in line
    assert _rows(root) == [] and _conversions(root) == [] and not (root / "cache" / "gguf-eagle3").exists()
    assert _servers_left(root) == []


def test_a_target_without_a_checkpoint_folder_cannot_convert_its_head(target, tmp_path):
    checkpoint = head_layouts.read(_head(target, tmp_path / "head"), "head")
    with pytest.raises(SpecbenchError, match="the target's source has no checkpoint folder here") as error:
        check_head(checkpoint, [0, 1, 3], None, "models.head")
    assert str(error.value).startswith("models.head.options.of") and "engine_options.gguf" in str(error.value)
    check_head(checkpoint, [0, 1, 3], target, "models.head")  # the same head with its target's folder


@pytest.mark.parametrize(
    ("mode", "says"),
    [
        ("fail", "converter failed on the EAGLE-3 head .* \\(exit 1\\): RuntimeError: the stand-in"),
        ("drop", "lacks .*, which llama.cpp's draft-eagle3 loads"),
    ],
)
def test_a_failed_or_short_conversion_is_one_line_and_leaves_no_file(
    target, stand_ins, monkeypatch, mode, says
):
    import re

    root = stand_ins
    monkeypatch.setenv("STUB_CONVERT_MODE", mode)
    result = _run(root, _recipe(target, _head(target, root / "head")))
    assert result.exit_code == 2, result.output
    assert re.search(says, result.output) and "models.head" in result.output, result.output
    assert list((root / "cache" / "gguf-eagle3").iterdir()) == []  # neither file, record nor staging
    assert not [r for r in _rows(root) if r["cell"].startswith("e3")]
    assert _servers_left(root) == []
