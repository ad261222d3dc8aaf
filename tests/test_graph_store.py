"""Compiled passes kept on disk (specbench/models/graph_store.py): a model of the same architecture loads
them instead of compiling, with its own weights; a file that cannot be read is compiled again; a pass
that cannot be stored falls back to torch.compile, still before the clock."""

from __future__ import annotations

import pytest
import torch

from specbench.models import graph_store
from specbench.models.compiled import QUICK_OPTIONS, CompiledHFModel
from specbench.models.graph_store import GraphStore
from specbench.models.hf import HFModel
from specbench.models.tiny import build_tiny


@pytest.fixture
def store_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_COMPILE_CACHE", str(tmp_path / "compile"))
    return tmp_path / "compile" / "graphs"


def _new_process() -> None:
    """Forget the graphs this process holds, as a new process would not have them."""
    graph_store._IN_PROCESS.clear()


def _weights(seed: int, **options):
    weights, _ = build_tiny("tiny-llama", dtype=torch.float32, seed=seed, vocab_size=40, **options)
    return weights


def _passes(model) -> list[torch.Tensor]:
    """Logits of a prefill, a pass of 3 tokens (k = 2) and one of 1, on a fixed prompt."""
    model.start(torch.tensor([3, 4, 5, 6]))
    out = [model.score(torch.tensor([7]), 0).logits]
    out.append(model.score(torch.tensor([7, 8, 9, 10]), 2).logits)
    out.append(model.score(torch.tensor([7, 8, 9, 10, 11]), 0).logits)
    return out


def test_a_second_model_loads_the_stored_passes_and_runs_its_own_weights(store_folder):
    first = CompiledHFModel(_weights(1), "a", quick=True)
    first.prepare(32, (2,))
    assert first.compile_cache == {"miss": 2} and len(list(store_folder.glob("*.graph"))) == 2
    other = _weights(2)  # same architecture, other weights: the weights are inputs of the graphs
    for reads_the_files in (False, True):  # held by this process, then read back as a new one would
        if reads_the_files:
            _new_process()
        second = CompiledHFModel(other, "b", quick=True)
        second.prepare(32, (2,))
        assert second.compile_cache == {"hit": 2}
    for compiled, eager in zip(_passes(second), _passes(HFModel(other, "e")), strict=True):
        torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-5)


def test_a_graph_file_that_cannot_be_read_is_compiled_again(store_folder):
    CompiledHFModel(_weights(1), "a", quick=True).prepare(32, (2,))
    for file in store_folder.glob("*.graph"):
        file.write_bytes(b"torn")
    _new_process()
    again = CompiledHFModel(_weights(1), "a", quick=True)
    again.prepare(32, (2,))
    assert again.compile_cache == {"miss": 2}
    for compiled, eager in zip(_passes(again), _passes(HFModel(_weights(1), "e")), strict=True):
        torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-5)


def test_a_pass_that_cannot_be_stored_falls_back_before_the_clock(store_folder, monkeypatch):
    """The second pass cannot be compiled whole: every pass is then compiled by torch.compile, the one
    loaded before it too, all inside prepare(), so the timed passes compile nothing."""
    real = GraphStore._compile

    def refuse_bucket_3(self, kwargs):
        if kwargs["input_ids"].shape[1] == 3:
            raise RuntimeError("a graph break")
        return real(self, kwargs)

    monkeypatch.setattr(GraphStore, "_compile", refuse_bucket_3)
    weights = _weights(1)
    model = CompiledHFModel(weights, "a", quick=True)
    model.prepare(32, (2,))
    assert model.compile_cache["bypass"] == 1 and model._store is None
    assert model._compiled == {(1, model.capacity, False), (3, model.capacity, False)}
    eager = HFModel(weights, "e")
    for compiled, reference in zip(_passes(model), _passes(eager), strict=True):
        torch.testing.assert_close(compiled, reference, rtol=1e-5, atol=1e-5)
    assert model.counter.snapshot()["tokens_scored"] == eager.counter.snapshot()["tokens_scored"]
    # the next process does not pay for the failed attempt again: the refusal is on disk
    (refusal,) = store_folder.glob("*.bypass")
    assert refusal.read_text() == "RuntimeError: a graph break\n"
    monkeypatch.setattr(GraphStore, "_compile", lambda self, kwargs: pytest.fail("compiled again"))
    _new_process()
    again = CompiledHFModel(weights, "b", quick=True)
    again.prepare(32, (2,))
    assert again.compile_cache["bypass"] == 1 and again._store is None


def test_graph_files_are_named_by_what_the_graph_depends_on(tmp_path):
    def path(weights, options=QUICK_OPTIONS, key=(1, 256, False)):
        return GraphStore(weights, "past_key_values", tmp_path, options).path(key)

    base = path(_weights(1))
    assert path(_weights(2)) == base  # weights are inputs, not part of the graph
    assert path(_weights(1, layers=3)) != base
    assert path(_weights(1).to(torch.float64)) != base
    assert path(_weights(1), {"freezing": False}) != base
    assert path(_weights(1), key=(3, 256, False)) != base
    assert path(_weights(1), key=(1, 512, False)) != base
    assert path(_weights(1), key=(1, 256, True)) != base
