"""A tiny Llama whose greedy output is known in advance, for tests that need heads that draft right.

Each token's successor is the next one in its group of four (:func:`successor`, a cycle), whatever came
before: the token embeddings live in the first half of the hidden dimensions (rows of equal norm), the
LM head scores token u by the embedding of its predecessor, and no decoder layer writes there (every
attention output projection is zero, and every MLP's down projection but ``junk_layer``'s). That layer
writes a token-dependent vector into the other half only, which the LM head does not read (the final
norm only rescales the first half), so the target's states before and after it differ while its output
does not. A head that scores token u by the embedding of ``successor^-s(u)`` predicts s tokens ahead.
"""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

GROUP = 4


def successor(vocab: int, steps: int = 1) -> torch.Tensor:
    """[vocab]: each token ``steps`` places on in its group's cycle."""
    ids = torch.arange(vocab)
    return GROUP * (ids // GROUP) + (ids + steps) % GROUP


def token_rows(vocab: int, hidden: int, seed: int = 0) -> torch.Tensor:
    """[vocab, hidden]: the embeddings, random directions of norm 4 in the first half, zero after."""
    generator = torch.Generator().manual_seed(seed)
    half = torch.randn(vocab, hidden // 2, generator=generator, dtype=torch.float64)
    rows = torch.zeros(vocab, hidden, dtype=torch.float64)
    rows[:, : hidden // 2] = 4 * half / half.norm(dim=-1, keepdim=True)
    return rows


def scorer(rows: torch.Tensor, steps: int) -> torch.Tensor:
    """[vocab, hidden]: an LM head whose argmax on a state along token v's row is successor^steps(v)."""
    back = successor(rows.shape[0], -steps)
    return rows[back].clone()


def counter_target(
    vocab: int = 64, hidden: int = 32, layers: int = 8, junk_layer: int | None = None, seed: int = 0
) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        pad_token_id=256 if vocab > 259 else 0,
        eos_token_id=257 if vocab > 259 else 1,
        bos_token_id=258 if vocab > 259 else 2,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.float64).eval()
    rows = token_rows(vocab, hidden, seed)
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        model.model.embed_tokens.weight.copy_(rows)
        model.lm_head.weight.copy_(scorer(rows, 1))
        for index, layer in enumerate(model.model.layers):
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
            if index == junk_layer:
                for projection in (layer.mlp.gate_proj, layer.mlp.up_proj):
                    shape = projection.weight.shape
                    projection.weight.copy_(torch.randn(shape, generator=generator, dtype=torch.float64))
                down = layer.mlp.down_proj.weight
                noise = torch.randn(hidden - hidden // 2, down.shape[1], generator=generator)
                down[hidden // 2 :] = noise.double() / down.shape[1] ** 0.5
    return model
