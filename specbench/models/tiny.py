"""Random-init tiny models and a byte-level tokenizer, built in-process (tests and CI recipes).

The tokenizer maps every byte to a token (ids 0-255) plus four specials, so any text round-trips
and a model with ``vocab_size >= 260`` can run real prompts. Tests that need a tiny vocabulary
(exact distribution checks) build the model with a small ``vocab_size`` and feed ids directly.
"""

from __future__ import annotations

import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    T5Config,
    T5ForConditionalGeneration,
)

BYTE_SPECIALS = ["<pad>", "</s>", "<s>", "<unk>"]
BYTE_VOCAB = 256 + len(BYTE_SPECIALS)
CHAT_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}\n{{ m['content'] }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant\n{% endif %}"
)


def byte_tokenizer() -> PreTrainedTokenizerFast:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel

    alphabet = ByteLevel.alphabet()
    byte_to_char = sorted(alphabet, key=lambda c: _byte_of(c))
    vocab = {ch: i for i, ch in enumerate(byte_to_char)}
    for i, special in enumerate(BYTE_SPECIALS):
        vocab[special] = 256 + i
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", eos_token="</s>", bos_token="<s>", unk_token="<unk>"
    )
    tokenizer.add_special_tokens({"additional_special_tokens": []})
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def _byte_of(char: str) -> int:
    """Inverse of GPT-2's bytes_to_unicode for one character."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    code = ord(char)
    if code in printable:
        return code
    others = [b for b in range(256) if b not in printable]
    return others[code - 256]


def build_tiny(
    kind: str,
    *,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    vocab_size: int = BYTE_VOCAB,
    hidden_size: int = 32,
    layers: int = 2,
    heads: int = 4,
    init_std: float = 0.02,
    **unknown,
):
    """(model, tokenizer) for ``tiny-llama`` or ``tiny-t5``; same seed, same weights."""
    if unknown:
        raise TypeError(f"unknown tiny-model options: {', '.join(sorted(unknown))}")
    torch.manual_seed(seed)
    common = dict(vocab_size=vocab_size, initializer_range=init_std)
    if kind == "tiny-llama":
        config = LlamaConfig(
            hidden_size=hidden_size,
            intermediate_size=2 * hidden_size,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=max(1, heads // 2),
            max_position_embeddings=4096,
            tie_word_embeddings=False,
            pad_token_id=0,
            eos_token_id=1,
            bos_token_id=2,
            **common,
        )
        model = LlamaForCausalLM(config)
    elif kind == "tiny-t5":
        config = T5Config(
            d_model=hidden_size,
            d_kv=hidden_size // heads,
            d_ff=2 * hidden_size,
            num_layers=layers,
            num_decoder_layers=layers,
            num_heads=heads,
            decoder_start_token_id=0,
            pad_token_id=0,
            eos_token_id=1,
            initializer_factor=init_std / 0.02 if init_std else 1.0,
            **common,
        )
        model = T5ForConditionalGeneration(config)
    else:
        raise ValueError(f"unknown tiny model {kind!r}")
    tokenizer = byte_tokenizer() if vocab_size >= BYTE_VOCAB else None
    if tokenizer is not None:
        for config in (model.config, model.generation_config):
            config.eos_token_id = tokenizer.eos_token_id
            config.pad_token_id = tokenizer.pad_token_id
            if kind == "tiny-t5":
                config.decoder_start_token_id = tokenizer.pad_token_id
    return model.to(dtype).eval(), tokenizer
