"""Grouped-query attention over several query rows on the CPU without copying the KV cache.

transformers' SDPA path copies every key and value head ``num_key_value_groups`` times (``repeat_kv``)
whenever a pass feeds more than one query row under an explicit mask, as a tree verification, a chain
verification and a head's tree level all do; it passes ``enable_gqa`` to torch only when there is no
mask, because on CUDA a mask with ``enable_gqa`` falls back to the math kernel. On the CPU torch's
kernel takes both and reads each KV head in place, with the same result bit for bit: for SmolLM2-135M
(9 query heads on 3 KV heads) the copy is a third of the attention's time in a 9-row pass at a few
hundred positions. :func:`install` routes exactly that case (CPU, a mask, several rows, grouped heads,
no gradients, not under ``torch.compile``) to torch with ``enable_gqa=True`` and every other call to
transformers' own function, unchanged.
"""

from __future__ import annotations

import torch
from transformers.utils import import_utils

_installed = False


def install() -> None:
    """Register :func:`grouped_sdpa` as transformers' ``sdpa`` attention (idempotent)."""
    global _installed
    if _installed:
        return
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    def grouped_sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
        if not takes_grouped_path(module, query, attention_mask, kwargs):
            return sdpa_attention_forward(
                module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
            )
        out = torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, enable_gqa=True
        )
        return out.transpose(1, 2).contiguous(), None

    AttentionInterface.register("sdpa", grouped_sdpa)
    _installed = True


def takes_grouped_path(module, query: torch.Tensor, attention_mask, kwargs: dict) -> bool:
    """Whether a call is the case :func:`install` reroutes (module docstring)."""
    return (
        query.device.type == "cpu"
        and query.shape[2] > 1
        and attention_mask is not None
        and getattr(module, "num_key_value_groups", 1) > 1
        and kwargs.get("position_bias") is None
        and kwargs.get("softcap") is None
        and not kwargs.get("output_attentions", False)
        and not import_utils.is_torchdynamo_compiling()
        and not torch.is_grad_enabled()  # training (a head's) keeps transformers' gradients
    )
