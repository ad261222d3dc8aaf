"""SmolLM2-135M-Instruct's shape, for a random-weight Llama: a pass costs what its shapes cost, so the
GPU measurements (scripts/heads/gpu_head_graphs.py, scripts/compile/gpu_pass_shapes.py and
gpu_ar_step_profile.py) need no weights, GGUF or trained head to travel to the GPU."""

SMOLLM2 = {  # HuggingFaceTB/SmolLM2-135M-Instruct's config.json
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "vocab_size": 49152,
    "max_position_embeddings": 8192,
    "rope_theta": 100000.0,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": True,
}
TINY = SMOLLM2 | {  # two narrow layers: the plumbing, on a CPU, in seconds
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 512,
}
