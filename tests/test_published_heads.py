"""Published EAGLE-1/2 and Medusa heads (specbench.drafters.eagle1_layout, specbench.drafters.
medusa_layout): checkpoints the test writes in SafeAILab/EAGLE's and FasterDecoding/Medusa's layouts
load as ``eagle1:<dir>`` and ``medusa-heads:<dir>``, draft exactly what a forward written here from
the layouts' definition computes, run lossless in the loops (drafting right on a target whose output
is known, counter_target.py), run in a recipe with what was read recorded, and every bad head is one
line before any row."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tiny_recipes
import torch
import yaml
from counter_target import counter_target, scorer, successor
from safetensors.torch import load_file, save_file
from test_eagle3_layouts import Recording, rms, rotate, tiny_target
from typer.testing import CliRunner

from specbench import sources
from specbench.cli import app
from specbench.decoding import autoregressive, tree_speculative
from specbench.decoding.medusa import MedusaTreeDrafter
from specbench.errors import SpecbenchError
from specbench.models.hf import HFModel

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPT = torch.tensor([3, 4, 5, 2, 9, 1])
VOCAB = 64


def _normal(generator, *shape, std):
    return std * torch.randn(*shape, generator=generator) / shape[-1] ** 0.5


# -- EAGLE-1/2 -----------------------------------------------------------------------------------------


def eagle1_tensors(target, *, own_embeddings=True, bias=True, seed=0) -> dict:
    """An EAGLE-1 head under the layout's names (float32, as heads ship): ``fc`` passes the next
    token's embedding through (plus noise), so on a counter target the target's LM head scores the token
    after it: the head drafts right, and every part of the layer still moves the logits."""
    generator = torch.Generator().manual_seed(seed)
    hidden, vocab = target.config.hidden_size, target.config.vocab_size
    heads, kv_heads, head_dim, width = 4, 2, hidden // 4, 2 * hidden
    fc = torch.zeros(hidden, 2 * hidden)
    fc[:, :hidden] = torch.eye(hidden)
    layer = {
        "self_attn.q_proj.weight": _normal(generator, heads * head_dim, hidden, std=1.0),
        "self_attn.k_proj.weight": _normal(generator, kv_heads * head_dim, hidden, std=1.0),
        "self_attn.v_proj.weight": _normal(generator, kv_heads * head_dim, hidden, std=1.0),
        "self_attn.o_proj.weight": _normal(generator, hidden, heads * head_dim, std=0.2),
        "post_attention_layernorm.weight": 0.5 + torch.rand(hidden, generator=generator),
        "mlp.gate_proj.weight": _normal(generator, width, hidden, std=1.0),
        "mlp.up_proj.weight": _normal(generator, width, hidden, std=1.0),
        "mlp.down_proj.weight": _normal(generator, hidden, width, std=0.2),
    }
    tensors = {"fc.weight": fc + _normal(generator, hidden, 2 * hidden, std=0.1)}
    tensors |= {f"layers.0.{name}": value for name, value in layer.items()}
    if bias:
        tensors["fc.bias"] = _normal(generator, hidden, std=0.1)
    if own_embeddings:  # the target's, as EAGLE's checkpoints copy it, here perturbed to tell them apart
        rows = target.get_input_embeddings().weight.detach().float()
        tensors["embed_tokens.weight"] = rows + _normal(generator, vocab, hidden, std=0.05)
    return {name: value.float().contiguous() for name, value in tensors.items()}


def eagle1_config(target, **changes) -> dict:
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": target.config.hidden_size,
        "intermediate_size": 2 * target.config.hidden_size,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_hidden_layers": 1,
        "rms_norm_eps": 1e-5,
        "rope_theta": 5000.0,  # the head's own, not the target's (10000)
        "max_position_embeddings": 512,
        "vocab_size": target.config.vocab_size,
        "hidden_act": "silu",
        "bias": True,
    }
    return config | changes


def write_eagle1(folder: Path, target, tensors, weights="bin", **changes) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    if weights == "bin":
        torch.save(tensors, folder / "pytorch_model.bin")
    else:
        save_file(tensors, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(eagle1_config(target, **changes)))
    return folder


def eagle1_layer(w, embeddings, features):
    """EAGLE-1's layer on T positions attending causally: fc over [embedding; feature], the Llama
    decoder layer without its input norm, no final norm (cnets1.py)."""
    tokens = features.shape[0]
    x = torch.cat([embeddings, features], dim=-1) @ w["fc.weight"].T + w.get("fc.bias", 0.0)
    head_dim = w["layers.0.self_attn.o_proj.weight"].shape[1] // 4
    q, k, v = (x @ w[f"layers.0.self_attn.{p}_proj.weight"].T for p in "qkv")
    q, k, v = (t.view(tokens, -1, head_dim) for t in (q, k, v))
    positions = torch.arange(tokens)
    q, k = (rotate(t.transpose(0, 1), positions) for t in (q, k))
    k, v = k.repeat_interleave(2, dim=0), v.transpose(0, 1).repeat_interleave(2, dim=0)
    scores = q @ k.transpose(1, 2) / head_dim**0.5
    scores = scores.masked_fill(~torch.ones(tokens, tokens, dtype=torch.bool).tril(), float("-inf"))
    attended = (scores.softmax(-1) @ v).transpose(0, 1).reshape(tokens, -1)
    hidden = x + attended @ w["layers.0.self_attn.o_proj.weight"].T
    normed = rms(hidden, w["layers.0.post_attention_layernorm.weight"])
    gate, up = (normed @ w[f"layers.0.mlp.{p}_proj.weight"].T for p in ("gate", "up"))
    return hidden + (torch.nn.functional.silu(gate) * up) @ w["layers.0.mlp.down_proj.weight"].T


def eagle1_reference(w, weights, sequence, path) -> torch.Tensor:
    """The target's LM head on the head's output after ``sequence`` and the tree ``path``, from scratch:
    at committed positions the target's final (normed) state paired with the next token, along the path
    the layer's own output of the parent."""
    w = {k: v.double() for k, v in w.items()}
    with torch.no_grad():
        features = weights(sequence[None], output_hidden_states=True).hidden_states[-1][0]
        table = w.get("embed_tokens.weight", weights.get_input_embeddings().weight)
        inputs, feats, out = list(sequence[1:]), list(features[:-1]), None
        for token in [None, *path]:
            if token is not None:
                inputs.append(token)
                feats.append(out[-1])
            out = eagle1_layer(w, table[torch.stack(inputs)], torch.stack(feats))
        return out[-1] @ weights.get_output_embeddings().weight.T


def load(source: str, target: HFModel, **options):
    request = sources.ModelRequest("head", source, options=tuple({"of": "target", **options}.items()))
    return sources.load(request, {"target": target}.__getitem__)


EAGLE1_CASES = {
    "pytorch_model.bin, own embedding, fc bias, tree": ("bin", True, True, (3, 2, 2, 6)),
    "model.safetensors, the target's embedding, no bias, chain": ("safetensors", False, False, (4, 1, 1, 4)),
}


@pytest.mark.parametrize("case", list(EAGLE1_CASES))
def test_an_eagle1_head_drafts_what_its_definition_computes_and_stays_lossless(case, tmp_path):
    weights_file, own, bias, (depth, branch, frontier, nodes) = EAGLE1_CASES[case]
    weights = counter_target(VOCAB, layers=2)
    ar = autoregressive.generate(HFModel(weights, "t"), PROMPT, max_new_tokens=16)
    assert ar.tokens[:4] == [int(successor(VOCAB, steps)[PROMPT[-1]]) for steps in (1, 2, 3, 4)]
    tensors = eagle1_tensors(weights, own_embeddings=own, bias=bias)
    folder = write_eagle1(tmp_path / "head", weights, tensors, weights_file, bias=not bias)  # the file wins
    target = HFModel(weights, "target")
    drafter = load(f"eagle1:{folder}", target)
    assert drafter.target_layers == ("last",) and drafter.checkpoint["fc_bias"] is bias
    assert drafter.checkpoint["layout"] == "eagle1" and drafter.checkpoint["own_embeddings"] is own
    recording = Recording(drafter)
    out = tree_speculative.generate(
        target, recording, PROMPT, depth=depth, branch=branch, frontier=frontier, nodes=nodes,
        max_new_tokens=16,
    )  # fmt: skip
    assert out.tokens == ar.tokens
    assert sum(accepted for _, accepted in out.steps) >= 8, out.steps  # it drafts right, mostly
    assert len(recording.calls) > 5
    for tokens, path, logits in recording.calls:
        want = eagle1_reference(tensors, weights, torch.cat([PROMPT, tokens]), path)
        torch.testing.assert_close(logits, want, rtol=1e-8, atol=1e-8)


# -- Medusa --------------------------------------------------------------------------------------------


def medusa_tensors(target, heads=3, layers=1, seed=0, prefix="") -> dict:
    """Medusa heads under the layout's names: head k's LM head scores the token k + 2 places on from
    the state's token (plus noise), its residual blocks are near the identity; a head's n blocks are
    one module repeated, so their saved copies are equal."""
    generator = torch.Generator().manual_seed(seed)
    hidden, vocab = target.config.hidden_size, target.config.vocab_size
    rows = target.get_input_embeddings().weight.detach()
    tensors = {}
    for k in range(heads):
        weight, bias = _normal(generator, hidden, hidden, std=0.3), _normal(generator, hidden, std=0.3)
        for layer in range(layers):
            tensors[f"{prefix}{k}.{layer}.linear.weight"] = weight.clone()
            tensors[f"{prefix}{k}.{layer}.linear.bias"] = bias.clone()
        lm = scorer(rows, k + 2).float() + _normal(generator, vocab, hidden, std=0.3)
        tensors[f"{prefix}{k}.{layers}.weight"] = lm
    return {name: value.float().contiguous() for name, value in tensors.items()}


def write_medusa(folder: Path, tensors, heads=3, layers=1, weights="safetensors", **changes) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    if weights == "safetensors":
        save_file(tensors, str(folder / "medusa_lm_head.safetensors"))
    else:
        torch.save(tensors, folder / "medusa_lm_head.pt")
    config = {
        "medusa_num_heads": heads,
        "medusa_num_layers": layers,
        "base_model_name_or_path": "target",
        "transformers_version": "4.41.0",
    } | changes
    (folder / "config.json").write_text(json.dumps({k: v for k, v in config.items() if v is not None}))
    return folder


def medusa_reference(w, feature, heads, layers) -> torch.Tensor:
    """[K, V]: head k's own LM head on its n residual blocks (x + SiLU(W x + b)) of the feature."""
    w = {k.removeprefix("medusa_head."): v.double() for k, v in w.items()}
    out = []
    for k in range(heads):
        x = feature
        for layer in range(layers):
            x = x + torch.nn.functional.silu(
                x @ w[f"{k}.{layer}.linear.weight"].T + w[f"{k}.{layer}.linear.bias"]
            )
        out.append(x @ w[f"{k}.{layers}.weight"].T)
    return torch.stack(out)


class RecordingHeads:
    """The heads, with the features they were given and the logits they returned."""

    def __init__(self, heads):
        self.inner, self.calls = heads, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def logits(self, feature):
        logits = self.inner.logits(feature)
        self.calls.append((feature.clone(), logits))
        return logits


MEDUSA_CASES = {
    "safetensors, one block": ("safetensors", 1, ""),
    "medusa_lm_head.pt saved from the whole model, two shared blocks": ("pt", 2, "medusa_head."),
}


@pytest.mark.parametrize("case", list(MEDUSA_CASES))
def test_medusa_heads_draft_what_their_definition_computes_and_stay_lossless(case, tmp_path):
    weights_file, layers, prefix = MEDUSA_CASES[case]
    weights = counter_target(VOCAB, layers=2)
    ar = autoregressive.generate(HFModel(weights, "t"), PROMPT, max_new_tokens=16)
    tensors = medusa_tensors(weights, layers=layers, prefix=prefix)
    folder = write_medusa(tmp_path / "heads", tensors, layers=layers, weights=weights_file)
    target = HFModel(weights, "target")
    drafter = load(f"medusa-heads:{folder}", target)
    assert len(drafter.heads.blocks) == 3 and drafter.checkpoint["layers_per_head"] == layers
    assert drafter.num_parameters == sum(t.numel() for t in tensors.values())
    recording = RecordingHeads(drafter)
    out = tree_speculative.generate(
        target, MedusaTreeDrafter(recording), PROMPT, depth=3, branch=2, frontier=2, nodes=8,
        max_new_tokens=16,
    )  # fmt: skip
    assert out.tokens == ar.tokens
    assert sum(accepted for _, accepted in out.steps) >= 8, out.steps
    with torch.no_grad():  # the target's final state after its final norm, at each committed position
        states = weights(torch.cat([PROMPT, torch.tensor(ar.tokens)])[None], output_hidden_states=True)
    finals = states.hidden_states[-1][0]
    assert len(recording.calls) > 3
    for feature, logits in recording.calls:
        assert any(torch.allclose(feature, row, rtol=1e-9, atol=1e-9) for row in finals)
        torch.testing.assert_close(
            logits, medusa_reference(tensors, feature, 3, layers), rtol=1e-8, atol=1e-8
        )


# -- a recipe, and bad heads ---------------------------------------------------------------------------


def test_a_recipe_runs_published_eagle1_and_medusa_heads_lossless_records_and_prices_them(tmp_path):
    target = tiny_target()
    eagle = write_eagle1(tmp_path / "eagle1", target.model, eagle1_tensors(target.model, seed=2))
    medusa_weights = medusa_tensors(target.model, seed=3)
    medusa = write_medusa(tmp_path / "medusa", medusa_weights)
    data = tiny_recipes.recipe(
        "published-heads",
        {
            "target": tiny_recipes.tiny(vocab_size=300, layers=8),
            "eagle1": {"source": f"eagle1:{eagle}", "options": {"of": "target"}},
            "heads": {"source": f"medusa-heads:{medusa}", "options": {"of": "target"}},
        },
        [
            tiny_recipes.ar(),
            {"name": "e", "method": "eagle", "target": "target", "drafter": "eagle1", "params": {"depth": 3}},
            {"name": "m", "method": "medusa", "target": "target", "drafter": "heads", "params": {"depth": 3}},
        ],
        max_new_tokens=10,
    )
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(data))
    result = CliRunner().invoke(app, ["run", str(path), "--output-dir", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (tmp_path / "out" / "examples.jsonl").read_text().splitlines()]
    drafted = [row for row in rows if row["method"] != "autoregressive"]
    assert {row["method"] for row in drafted} == {"eagle", "medusa"}
    assert all(row["divergence_class"] == "identical" for row in drafted)
    recorded = json.loads((tmp_path / "out" / "environment.json").read_text())["models"]
    assert recorded["eagle1"]["checkpoint"]["layout"] == "eagle1"
    assert recorded["heads"]["checkpoint"]["layout"] == "medusa"
    assert recorded["heads"]["checkpoint"]["verifier"] == "target"
    assert all(len(recorded[m]["checkpoint"]["digest"]) == 16 for m in ("eagle1", "heads"))
    planned = CliRunner().invoke(app, ["plan", str(path), "--format", "json"])
    assert planned.exit_code == 0, planned.output
    models = {m["name"]: m for m in json.loads(planned.output)["models"]}
    assert models["heads"]["params"] == sum(t.numel() for t in medusa_weights.values())
    assert models["eagle1"]["shares"] == "target" and models["eagle1"]["params"] > 0


def _config(folder: Path, **changes):
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps({k: v for k, v in config.items() if v is not None}))


def _bin(folder: Path, **changes):
    tensors = torch.load(folder / "pytorch_model.bin", weights_only=True)
    tensors.update(changes)
    torch.save({k: v for k, v in tensors.items() if v is not None}, folder / "pytorch_model.bin")


def _medusa(folder: Path, **changes):
    tensors = load_file(str(folder / "medusa_lm_head.safetensors"))
    tensors.update(changes)
    save_file({k: v for k, v in tensors.items() if v is not None}, str(folder / "medusa_lm_head.safetensors"))


def _shard(folder: Path):
    (folder / "pytorch_model.bin").rename(folder / "pytorch_model-00001-of-00001.bin")
    (folder / "pytorch_model.bin.index.json").write_text(json.dumps({"weight_map": {}}))


# name -> (kind, how the written head is spoiled, what the one line says)
BAD = {
    "another hidden size": (
        "eagle1",
        lambda f: _config(f, hidden_size=48),
        r"hidden_size 48; expected target's, 32",
    ),
    "another vocabulary": (
        "eagle1",
        lambda f: _config(f, vocab_size=60),
        r"vocab_size 60; expected target's, 64",
    ),
    "an EAGLE-3 head": ("eagle1", lambda f: _config(f, draft_vocab_size=10), r"is an EAGLE-3 head.*eagle3:"),
    "two layers": ("eagle1", lambda f: _config(f, num_hidden_layers=2), r"num_hidden_layers 2: multi-layer"),
    "qkv_bias": ("eagle1", lambda f: _config(f, qkv_bias=True), r"qkv_bias: true .* not implemented"),
    "another layer family": ("eagle1", lambda f: _config(f, model_type="qwen2"), r"model_type 'qwen2'"),
    "fc width": (
        "eagle1",
        lambda f: _bin(f, **{"fc.weight": torch.zeros(32, 96)}),
        r"fc\.weight is \[32, 96\]; expected \[32, 64\]",
    ),
    "an input norm": (
        "eagle1",
        lambda f: _bin(f, **{"layers.0.input_layernorm.weight": torch.ones(32)}),
        r"holds layers\.0\.input_layernorm\.weight",
    ),
    "sharded": ("eagle1", _shard, r"pytorch_model\.bin\.index\.json shards the head's weights"),
    "not Medusa heads": ("medusa", lambda f: _config(f, medusa_num_heads=None), r"has no medusa_num_heads"),
    "heads for another vocabulary": (
        "medusa",
        lambda f: _medusa(f, **{"0.1.weight": torch.zeros(60, 32)}),
        r"score 60 tokens from states 32 wide; expected target's 64 tokens and hidden size 32",
    ),
    "a head missing": ("medusa", lambda f: _config(f, medusa_num_heads=4), r"has no 3\.0\.linear\.weight"),
    "more blocks than saved": (
        "medusa",
        lambda f: _config(f, medusa_num_layers=2),
        r"has no 0\.1\.linear\.weight",
    ),
    "no weights": (
        "medusa",
        lambda f: (f / "medusa_lm_head.safetensors").unlink(),
        r"holds no medusa_lm_head\.safetensors or medusa_lm_head\.pt",
    ),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_published_head_is_one_line_naming_the_field_and_what_was_expected(case, tmp_path):
    kind, spoil, message = BAD[case]
    weights = counter_target(VOCAB, layers=2)
    if kind == "eagle1":
        folder = write_eagle1(tmp_path / "head", weights, eagle1_tensors(weights))
        source = f"eagle1:{folder}"
    else:
        folder = write_medusa(tmp_path / "head", medusa_tensors(weights))
        source = f"medusa-heads:{folder}"
    spoil(folder)
    with pytest.raises(SpecbenchError, match=message) as raised:
        load(source, HFModel(weights, "target"))
    assert str(raised.value).startswith("models.head.") and "\n" not in str(raised.value)


@pytest.mark.parametrize("prefix", ["eagle1:", "medusa-heads:"])
def test_a_hub_head_offline_fails_fast_with_one_line(prefix, tmp_path, monkeypatch):
    from specbench.models import cache

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(cache, "hub_reachable", lambda: False)
    with pytest.raises(
        SpecbenchError, match=r"models\.head\.source: hub repository 'org/head' is not"
    ) as raised:
        load(f"{prefix}org/head", HFModel(counter_target(VOCAB, layers=2), "target"))
    assert "\n" not in str(raised.value) and "hf download org/head" in str(raised.value)
