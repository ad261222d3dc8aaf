"""Grouped-query attention over several rows on the CPU (specbench.models.attention): the rerouted calls
give transformers' own result bit for bit, and only the calls it names are rerouted."""

from __future__ import annotations

import pytest
import torch
from transformers.integrations import sdpa_attention

from specbench.models import attention
from specbench.models.hf import HFModel
from specbench.models.tree import TokenTree

pytestmark = pytest.mark.usefixtures("one_thread")


class Spy:
    """Records the enable_gqa flag of every SDPA kernel call."""

    def __init__(self, monkeypatch):
        self.flags: list[bool] = []
        kernel = torch.nn.functional.scaled_dot_product_attention

        def spied(*args, **kwargs):
            self.flags.append(bool(kwargs.get("enable_gqa", False)))
            return kernel(*args, **kwargs)

        monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spied)


def tree_pass(weights) -> torch.Tensor:
    model = HFModel(weights, "m")
    model.start(torch.tensor([5, 6, 7, 8]))
    tree = TokenTree(torch.arange(20, 26), (-1, -1, 0, 0, 2, 1))
    return model.score_tree(torch.tensor([9, 10]), tree, hidden=("last",)).logits


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_a_tree_pass_on_grouped_heads_equals_transformers_own_bit_for_bit(dtype, tiny_model, monkeypatch):
    weights = tiny_model("tiny-llama", 3, vocab_size=300, layers=2).to(dtype)
    assert weights.config.num_key_value_heads < weights.config.num_attention_heads
    spy = Spy(monkeypatch)
    ours = tree_pass(weights)
    assert spy.flags and all(spy.flags)  # every layer's call took the grouped path
    monkeypatch.setattr(attention, "takes_grouped_path", lambda *args: False)
    spy.flags.clear()
    theirs = tree_pass(weights)
    assert spy.flags and not any(spy.flags)  # transformers' path: the KV heads copied
    assert torch.equal(ours, theirs)


def test_only_masked_multi_row_passes_on_the_cpu_are_rerouted():
    class Module:
        num_key_value_groups = 2

    rows, one = torch.zeros(1, 4, 3, 8), torch.zeros(1, 4, 1, 8)
    mask = torch.zeros(1, 1, 3, 5)
    assert not attention.takes_grouped_path(Module(), rows, mask, {})  # gradients on: training
    torch.set_grad_enabled(False)
    try:
        rerouted_only_where_named(Module, rows, one, mask)
    finally:
        torch.set_grad_enabled(True)


def rerouted_only_where_named(Module, rows, one, mask):
    assert attention.takes_grouped_path(Module(), rows, mask, {})
    assert not attention.takes_grouped_path(Module(), one, mask[..., :1, :], {})  # decoding: pack_gqa
    assert not attention.takes_grouped_path(Module(), rows, None, {})  # transformers passes enable_gqa
    assert not attention.takes_grouped_path(Module(), rows, mask, {"position_bias": mask})
    assert not attention.takes_grouped_path(Module(), rows, mask, {"softcap": 30.0})
    assert not attention.takes_grouped_path(Module(), rows, mask, {"output_attentions": True})
    Module.num_key_value_groups = 1
    assert not attention.takes_grouped_path(Module(), rows, mask, {})


def test_compiled_graphs_keep_transformers_path(monkeypatch):
    class Module:
        num_key_value_groups = 2

    import transformers.utils.import_utils as import_utils

    rows, mask = torch.zeros(1, 4, 3, 8), torch.zeros(1, 1, 3, 5)
    with torch.no_grad():
        assert attention.takes_grouped_path(Module(), rows, mask, {})
        monkeypatch.setattr(import_utils, "is_torchdynamo_compiling", lambda: True)
        assert not attention.takes_grouped_path(Module(), rows, mask, {})


def test_the_installed_function_gives_transformers_result_for_every_other_call():
    from transformers import AttentionInterface

    class Module:
        num_key_value_groups = 2
        is_causal = True
        training = False

    attention.install()
    function = AttentionInterface._global_mapping["sdpa"]
    assert function is not sdpa_attention.sdpa_attention_forward
    torch.manual_seed(0)
    key, value = torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)
    for query, mask in ((torch.randn(1, 4, 1, 8), None), (torch.randn(1, 4, 3, 8), None)):
        ours, _ = function(Module(), query, key, value, mask, scaling=0.3)
        theirs, _ = sdpa_attention.sdpa_attention_forward(Module(), query, key, value, mask, scaling=0.3)
        assert torch.equal(ours, theirs)
