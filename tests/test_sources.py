"""Model sources declare themselves: the registry finds every kind in its package, recognises a source
string by the kinds' order, checks options against each kind's declaration, and stays light to import."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from specbench import sources
from specbench.errors import SpecbenchError
from specbench.sources import SOURCES, option_problem, source_of

RECOGNISED = {
    "prompt-lookup": "statistical",
    "maxgram": "statistical",
    "tiny-llama": "tiny",
    "tiny-t5": "tiny",
    "smollm2-135m-instruct": "smollm2",
    "qwen2.5-coder-1.5b-instruct": "qwen-coder",
    "distilled:smollm2-135m-instruct/small": "distilled",
    "early-exit": "early-exit",
    "medusa:smollm2-135m-instruct/medusa": "medusa",
    "eagle:smollm2-135m-instruct/eagle": "eagle",
    "eagle3:yuhuili/EAGLE3-LLaMA3.1-Instruct-8B": "eagle3",
    "eagle3:/heads/eagle3-qwen3": "eagle3",
    "eagle1:yuhuili/EAGLE-Vicuna-7B-v1.3": "eagle1",
    "medusa-heads:FasterDecoding/medusa-vicuna-7b-v1.3": "medusa-heads",
    "/models/x.gguf": "gguf",
    "org/name": "hub",
    "not-a-model": "hub",  # the hub kind takes the rest, and says why it cannot load it
}


def test_every_kind_is_declared_once_and_recognised_in_order(tmp_path):
    assert list(SOURCES) == [
        "statistical", "tiny", "smollm2", "qwen-coder", "distilled", "medusa", "eagle", "eagle3", "eagle1",
        "medusa-heads", "early-exit", "gguf", "local", "hub",
    ]  # fmt: skip
    for source, kind in RECOGNISED.items():
        assert source_of(source).kind == kind, source
    assert source_of(str(tmp_path)).kind == "local"
    for kind in SOURCES.values():
        assert kind.help and callable(kind.load) and callable(kind.facts)


def test_a_new_module_with_a_source_is_found_without_touching_the_registry(tmp_path, monkeypatch):
    package = tmp_path / "more_sources"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "helper.py").write_text("X = 1\n")  # a module without SOURCE is not a kind
    (package / "medusa.py").write_text(
        textwrap.dedent(
            """
            from specbench.sources import Source

            SOURCE = Source("medusa", "heads", lambda s: s.startswith("medusa:"), load=None, facts=None,
                            options=("heads",), bounds={"heads": (int, 1, 8)}, order=5)
            """
        )
    )
    (package / "everything.py").write_text(
        "from specbench.sources import Source\n"
        "SOURCE = Source('everything', 'rest', lambda s: True, load=None, facts=None, order=99)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    registry = SOURCES.over("more_sources")
    assert list(registry) == ["medusa", "everything"]
    assert source_of("medusa:x", registry).kind == "medusa" and source_of("x", registry).kind == "everything"


def test_a_kind_declared_twice_is_refused(tmp_path, monkeypatch):
    package = tmp_path / "twice"
    package.mkdir()
    (package / "__init__.py").write_text("")
    line = "from specbench.sources import Source\nSOURCE = Source('k', 'h', bool, load=None, facts=None)\n"
    (package / "a.py").write_text(line)
    (package / "b.py").write_text(line)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(RuntimeError, match="declared twice"):
        list(SOURCES.over("twice"))


@pytest.mark.parametrize("source", ["prompt-lookup", "tiny-llama", "smollm2-135m-instruct", "org/name"])
def test_options_are_checked_against_the_kind_declaration(source):
    kind = source_of(source)
    option, text, fix = option_problem(source, {"no_such_option": 1})
    assert option == "no_such_option" and "takes no option" in text
    assert fix == f"use {', '.join(kind.options)}"
    for name, (_, low, high) in kind.bounds.items():
        assert option_problem(source, {name: high + 1})[0] == name
        assert option_problem(source, {name: low - 1})[0] == name


def test_each_kind_rule_is_its_own():
    assert option_problem("prompt-lookup", {"variant": "other"})[0] == "variant"
    assert option_problem("maxgram", {"variant": "reference", "max_copy": 3})[0] == "max_copy"
    assert option_problem("smollm2-135m-instruct", {"prefer": "nowhere"})[0] == "prefer"
    assert option_problem("tiny-llama", {"hidden_size": 30, "heads": 4})[0] == "heads"
    assert option_problem("org/name", {"device_map": "everywhere"})[0] == "device_map"
    cpu = torch.device("cpu")
    assert source_of("tiny-llama").dtype_rule == "float32" and source_of("org/name").dtype_rule == "auto"
    assert source_of("prompt-lookup").dtype_rule is None and source_of("early-exit").dtype_rule is None
    assert sources.dtype_choice("auto", cpu, "tiny-llama") == ("float32", "auto: float32 here")


def test_the_registry_loads_through_the_declared_loader_and_facts():
    request = sources.ModelRequest("m", "tiny-llama", "float64", "cpu", options=(("seed", 1),))
    model = sources.load(request)
    assert model.origin == "tiny-llama (random init, seed 1)" and model.dtype_reason == "set in the recipe"

    class Spec:
        source, options, revision = "tiny-llama", {"seed": 1}, None

    facts = sources.model_facts("m", {"m": Spec()}, "float64")
    assert facts.params == model.num_parameters and facts.origin == "in-process tiny model"
    with pytest.raises(SpecbenchError, match=r"models\.m\.options\.bigram"):
        sources.load(sources.ModelRequest("m", "maxgram", options=(("bigram", "/no/such/table.json"),)))


def test_validating_sources_imports_neither_torch_nor_transformers():
    code = (
        "import sys\n"
        "from specbench.sources import SOURCES, option_problem\n"
        "list(SOURCES)\n"
        "option_problem('org/name', {'device_map': 'auto'})\n"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
