"""Published EAGLE-3 heads (specbench.drafters.head_layouts, specbench.drafters.eagle3): checkpoints the
test writes in the EAGLE and the speculators layouts load as ``eagle3:<dir>``, draft exactly what a
forward written here from the layouts' definition computes, run lossless in the chain and tree loops,
export to either layout and load back unchanged, and every bad head is one line before any row."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import tiny_recipes
import torch
import yaml
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from specbench import sources
from specbench.cli import app
from specbench.decoding import autoregressive, tree_speculative
from specbench.errors import SpecbenchError
from specbench.models import cache
from specbench.models.hf import HFModel

pytestmark = pytest.mark.usefixtures("one_thread")

LAYERS = 8  # EAGLE's default aux layers, the inputs of layers 2, L // 2 and L - 3, are 2, 4 and 5
VOCAB = 64
PROMPT = torch.tensor([3, 4, 5, 2, 9, 1])


def target_weights(tiny_model, vocab: int = VOCAB):
    return tiny_model("tiny-llama", 3, vocab_size=vocab, init_std=0.3, layers=LAYERS)


# -- a head written from the layouts' definition ------------------------------------------------------


def head_tensors(target, draft_ids, *, model_type="llama", hidden=None, own_embeddings=False, seed=0) -> dict:
    """Random weights of an EAGLE-3 head under the EAGLE layout's names (float32, as heads ship)."""
    generator = torch.Generator().manual_seed(seed)
    config = target.config
    target_hidden, vocab = config.hidden_size, config.vocab_size
    hidden = hidden or target_hidden
    heads, kv_heads, head_dim, width = 4, 2, hidden // 4, 2 * hidden

    def normal(*shape, std=0.3):
        return std * torch.randn(*shape, generator=generator) / shape[-1] ** 0.5 * 4

    def gain(n):
        return 0.5 + torch.rand(n, generator=generator)

    ids = torch.tensor(sorted(draft_ids))
    tensors = {
        "fc.weight": normal(hidden, 3 * target_hidden),
        "midlayer.input_layernorm.weight": gain(hidden),
        "midlayer.hidden_norm.weight": gain(hidden),
        "midlayer.self_attn.q_proj.weight": normal(heads * head_dim, 2 * hidden),
        "midlayer.self_attn.k_proj.weight": normal(kv_heads * head_dim, 2 * hidden),
        "midlayer.self_attn.v_proj.weight": normal(kv_heads * head_dim, 2 * hidden),
        "midlayer.self_attn.o_proj.weight": normal(hidden, heads * head_dim),
        "midlayer.post_attention_layernorm.weight": gain(hidden),
        "midlayer.mlp.gate_proj.weight": normal(width, hidden),
        "midlayer.mlp.up_proj.weight": normal(width, hidden),
        "midlayer.mlp.down_proj.weight": normal(hidden, width),
        "norm.weight": gain(hidden),
        "lm_head.weight": normal(len(ids), hidden),
        "d2t": ids - torch.arange(len(ids)),
        "t2d": torch.zeros(vocab, dtype=torch.bool).index_fill_(0, ids, True),
    }
    if model_type == "qwen3":
        tensors["midlayer.self_attn.q_norm.weight"] = gain(head_dim)
        tensors["midlayer.self_attn.k_norm.weight"] = gain(head_dim)
    if own_embeddings:
        tensors["embed_tokens.weight"] = normal(vocab, hidden, std=0.25)
    return tensors


def layer_config(target, tensors, model_type="llama") -> dict:
    hidden = tensors["norm.weight"].shape[0]
    return {
        "model_type": model_type,
        "hidden_size": hidden,
        "intermediate_size": 2 * hidden,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": hidden // 4,
        "num_hidden_layers": 1,
        "rms_norm_eps": 1e-5,
        "rope_theta": 5000.0,  # the head's own, not the target's (10000)
        "max_position_embeddings": 512,
        "vocab_size": target.config.vocab_size,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
    }


def write_head(
    folder: Path, layout: str, target, tensors, model_type="llama", weights="safetensors", **fields
):
    """``tensors`` as a published head in ``layout`` (``fields``: the config's head fields)."""
    layer = layer_config(target, tensors, model_type)
    head = {"draft_vocab_size": tensors["lm_head.weight"].shape[0], **fields}
    if layout == "speculators":
        tensors = {k.replace("midlayer.", "layers.0."): v for k, v in tensors.items()}
        config = {
            "architectures": ["Eagle3Speculator"],
            "speculators_model_type": "eagle3",
            "speculators_config": {
                "algorithm": "eagle3",
                "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
                "default_proposal_method": "greedy",
                "verifier": {"name_or_path": "tiny-llama", "architectures": ["LlamaForCausalLM"]},
            },
            "transformer_layer_config": layer,
            "target_hidden_size": target.config.hidden_size,
            "norm_before_residual": False,
            **head,
        }
    else:
        config = {**layer, "architectures": ["LlamaForCausalLMEagle3"], **head}
    folder.mkdir(parents=True, exist_ok=True)
    if weights == "safetensors":
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"))
    else:
        torch.save(tensors, folder / "pytorch_model.bin")
    (folder / "config.json").write_text(json.dumps(config))
    return folder


# -- the reference forward, from the layouts' definition (plain torch) --------------------------------


def rms(x, weight, eps=1e-5):
    """RMSNorm as the reference code computes it: the statistics in float32."""
    x32 = x.float()
    return weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def rotate(x, positions, theta=5000.0):
    """Rotary embedding (rotate-half), its angles in float32 as the reference computes them."""
    dim = x.shape[-1]
    inverse = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
    angles = positions.float()[:, None] * inverse[None]
    angles = torch.cat([angles, angles], dim=-1)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    half = dim // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


def reference_layer(w, embeddings, features, qk_norm=False, norm_before_residual=False):
    """(draft-vocabulary logits, pre-norm outputs) of T positions attending causally (positions 0..T-1)."""
    tokens = features.shape[0]
    normed = rms(features, w["midlayer.hidden_norm.weight"])
    residual = normed if norm_before_residual else features
    joint = torch.cat([rms(embeddings, w["midlayer.input_layernorm.weight"]), normed], dim=-1)
    head_dim = w["midlayer.self_attn.o_proj.weight"].shape[1] // 4
    q, k, v = (joint @ w[f"midlayer.self_attn.{p}_proj.weight"].T for p in "qkv")
    q, k, v = (t.view(tokens, -1, head_dim) for t in (q, k, v))
    if qk_norm:  # Qwen3's layers normalise each head's queries and keys
        q, k = rms(q, w["midlayer.self_attn.q_norm.weight"]), rms(k, w["midlayer.self_attn.k_norm.weight"])
    positions = torch.arange(tokens)
    q, k = (rotate(t.transpose(0, 1), positions) for t in (q, k))
    k, v = k.repeat_interleave(2, dim=0), v.transpose(0, 1).repeat_interleave(2, dim=0)
    scores = q @ k.transpose(1, 2) / head_dim**0.5
    scores = scores.masked_fill(~torch.ones(tokens, tokens, dtype=torch.bool).tril(), float("-inf"))
    attended = (scores.softmax(-1) @ v).transpose(0, 1).reshape(tokens, -1)
    hidden = residual + attended @ w["midlayer.self_attn.o_proj.weight"].T
    normed = rms(hidden, w["midlayer.post_attention_layernorm.weight"])
    gate, up = (normed @ w[f"midlayer.mlp.{p}_proj.weight"].T for p in ("gate", "up"))
    out = hidden + (torch.nn.functional.silu(gate) * up) @ w["midlayer.mlp.down_proj.weight"].T
    return rms(out, w["norm.weight"]) @ w["lm_head.weight"].T, out


def reference_logits(w, weights, aux, sequence, path, **layer) -> torch.Tensor:
    """The head's draft-vocabulary logits after the committed ``sequence`` and then the tree ``path``,
    from scratch: at committed positions fc over the target's aux states (layer inputs, in layer
    order) paired with the next token; along the path, the layer's own pre-norm output of its parent."""
    w = {k: v.double() if v.is_floating_point() else v for k, v in w.items()}
    with torch.no_grad():
        states = weights(sequence[None], output_hidden_states=True).hidden_states
        features = torch.cat([states[i][0] for i in sorted(aux)], dim=-1) @ w["fc.weight"].T
        table = w.get("embed_tokens.weight", weights.get_input_embeddings().weight)
        inputs, feats = list(sequence[1:]), list(features[:-1])
        logits = out = None
        for token in [None, *path]:
            if token is not None:
                inputs.append(token)
                feats.append(out[-1])
            logits, out = reference_layer(w, table[torch.stack(inputs)], torch.stack(feats), **layer)
        return logits[-1]


class Recording:
    """The drafter, with what each root and level call returned."""

    def __init__(self, drafter):
        self.inner, self.calls = drafter, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def root(self, tokens, last, accepted):
        logits = self.inner.root(tokens, last, accepted)
        if logits is not None:
            self.calls.append((tokens.clone(), [], logits[0]))
        return logits

    def level(self, tokens, level, tree, expand):
        logits = self.inner.level(tokens, level, tree, expand)
        for row, node in enumerate(expand):
            self.calls.append((tokens.clone(), [tree.tokens[i] for i in tree.path(node)], logits[row]))
        return logits


def load_head(folder: Path, target: HFModel, **options):
    request = sources.ModelRequest(
        "head", f"eagle3:{folder}", options=tuple({"of": "target", **options}.items())
    )
    return sources.load(request, {"target": target}.__getitem__)


# layout, weights file, layer family, (fields), own embeddings and width, tree shape
CASES = {
    "eagle, default layers, chain": ("eagle", "safetensors", "llama", {}, None, (4, 1, 1, 4)),
    "eagle, pytorch_model.bin, tree": ("eagle", "bin", "llama", {}, None, (3, 2, 2, 6)),
    "speculators, own layers, normed residual": (
        "speculators",
        "safetensors",
        "llama",
        {"eagle_aux_hidden_state_layer_ids": [6, 1, 3], "norm_before_residual": True},
        None,
        (3, 3, 2, 8),
    ),
    "speculators, qwen3 layer": ("speculators", "safetensors", "qwen3", {}, None, (3, 2, 2, 6)),
    "speculators, narrower head, own embedding": (
        "speculators",
        "safetensors",
        "llama",
        {"target_hidden_size": 32},
        16,
        (4, 1, 1, 4),
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_layout_drafts_what_its_definition_computes_and_stays_lossless(case, tiny_model, tmp_path):
    layout, weights_file, model_type, fields, narrow, shape = CASES[case]
    weights = target_weights(tiny_model)
    ar = autoregressive.generate(HFModel(weights, "t"), PROMPT, max_new_tokens=24)
    # a draft vocabulary of what the target says, and seed 6: a random head that agrees with it
    # somewhere in every case (no vacuous pass)
    draft_ids = sorted(set(ar.tokens))
    tensors = head_tensors(
        weights, draft_ids, model_type=model_type, hidden=narrow, own_embeddings=bool(narrow), seed=6
    )
    folder = write_head(tmp_path / "head", layout, weights, tensors, model_type, weights_file, **fields)
    target = HFModel(weights, "target")
    drafter = load_head(folder, target)
    aux = sorted(fields.get("eagle_aux_hidden_state_layer_ids", (2, LAYERS // 2, LAYERS - 3)))
    assert drafter.target_layers == tuple(aux)
    assert drafter.vocabulary.tolist() == draft_ids and drafter.vocab_size == VOCAB
    recording = Recording(drafter)
    depth, branch, frontier, nodes = shape
    out = tree_speculative.generate(
        target,
        recording,
        PROMPT,
        depth=depth,
        branch=branch,
        frontier=frontier,
        nodes=nodes,
        max_new_tokens=24,
    )
    assert out.tokens == ar.tokens
    assert any(accepted > 0 for _, accepted in out.steps), out.steps  # it drafted, and was right at times
    layer = {
        "qk_norm": model_type == "qwen3",
        "norm_before_residual": fields.get("norm_before_residual", False),
    }
    assert len(recording.calls) > 10
    for tokens, path, logits in recording.calls:
        want = reference_logits(tensors, weights, aux, torch.cat([PROMPT, tokens]), path, **layer)
        torch.testing.assert_close(logits, want, rtol=1e-8, atol=1e-8)


def test_the_step_graphs_fixed_shapes_draft_the_same_lossless_output(tiny_model, tmp_path):
    """``step_graph``: a greedy tree's levels at fixed shapes over the static cache (a GPU's CUDA graph,
    uncaptured on a CPU) with the head's own LM head and d2t: the host loop's tokens and steps."""
    weights = target_weights(tiny_model)
    ar = autoregressive.generate(HFModel(weights, "t"), PROMPT, max_new_tokens=24)
    tensors = head_tensors(weights, sorted(set(ar.tokens) | {5, 9}), seed=1)
    folder = write_head(tmp_path / "head", "eagle", weights, tensors)
    runs = []
    for options in ({}, {"step_graph": True}):
        target = HFModel(weights, "target")
        drafter = load_head(folder, target, **options)
        assert drafter.step_graph == bool(options)
        runs.append(
            tree_speculative.generate(
                target, drafter, PROMPT, depth=4, branch=3, frontier=2, nodes=10, max_new_tokens=24
            )
        )
    host, graphed = runs
    assert graphed.tokens == host.tokens == ar.tokens and graphed.steps == host.steps


def export(source: Path, layout: str, out: Path):
    result = CliRunner().invoke(app, ["export", str(source), "--format", layout, "-o", str(out)])
    assert result.exit_code == 0, result.output
    return out


@pytest.mark.parametrize("layout", ["eagle", "speculators"])
def test_load_export_load_gives_the_same_head(layout, tiny_model, tmp_path):
    weights = target_weights(tiny_model)
    model_type = "qwen3" if layout == "eagle" else "llama"  # either family in either layout
    tensors = head_tensors(weights, range(0, VOCAB, 3), model_type=model_type)
    fields = {"eagle_aux_hidden_state_layer_ids": [1, 3, 6], "norm_before_residual": True}
    source = write_head(tmp_path / "source", layout, weights, tensors, model_type, **fields)
    target = HFModel(weights, "target")
    original = load_head(source, target)
    for to in ("speculators", "eagle"):
        out = export(source, to, tmp_path / to)
        config = json.loads((out / "config.json").read_text())
        names = set(load_file(str(out / "model.safetensors")))
        if to == "speculators":  # what vLLM reads from the config alone
            assert config["speculators_model_type"] == "eagle3" and config["norm_before_residual"] is True
            assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 3
            assert config["eagle_aux_hidden_state_layer_ids"] == [1, 3, 6]
            assert "layers.0.self_attn.q_proj.weight" in names and not any("midlayer" in n for n in names)
        else:
            assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["draft_vocab_size"] == 22
            assert "midlayer.hidden_norm.weight" in names and not any(n.startswith("layers.") for n in names)
        again = load_head(out, target)
        assert again.target_layers == original.target_layers == (1, 3, 6)
        mine, theirs = original.head.state_dict(), again.head.state_dict()
        assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)
        steps = []
        for drafter in (original, again):
            out_gen = tree_speculative.generate(
                HFModel(weights, "target"),
                Recording(drafter),
                PROMPT,
                depth=3,
                branch=2,
                frontier=2,
                nodes=6,
                max_new_tokens=12,
            )
            steps.append(out_gen.steps)
        assert steps[0] == steps[1]
        features = torch.randn(1, 5, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
        args = (
            features,
            features,
            torch.arange(5)[None],
            torch.ones(5, 5, dtype=torch.bool).tril()[None, None],
        )
        with torch.no_grad():
            assert torch.equal(
                original.head.subset(original.head(*args)), again.head.subset(again.head(*args))
            )


def tiny_target(vocab_size: int = 300) -> HFModel:
    options = (("layers", LAYERS), ("vocab_size", vocab_size))
    return sources.load(sources.ModelRequest("target", "tiny-llama", "float64", "cpu", options=options))


def recipe(head: str) -> dict:
    return tiny_recipes.recipe(
        "published-head",
        {
            "target": tiny_recipes.tiny(vocab_size=300, layers=LAYERS),
            "head": {"source": f"eagle3:{head}", "options": {"of": "target"}},
        },
        [
            tiny_recipes.ar(),
            {"name": "e", "method": "eagle", "target": "target", "drafter": "head", "params": {"depth": 3}},
        ],
        max_new_tokens=10,
    )


def run(tmp_path: Path, data: dict, command: str = "run", out: str = "out"):
    path = tmp_path / f"{out}.yaml"
    path.write_text(yaml.safe_dump(data))
    args = [command, str(path)] + (
        ["--output-dir", str(tmp_path / out)] if command == "run" else ["--format", "json"]
    )
    return CliRunner().invoke(app, args)


def test_a_recipe_runs_a_published_head_lossless_records_it_and_prices_it(tmp_path):
    target = tiny_target()
    tensors = head_tensors(target.model, range(0, 300, 5), seed=2)
    folder = write_head(tmp_path / "head", "speculators", target.model, tensors, norm_before_residual=False)
    result = run(tmp_path, recipe(str(folder)))
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (tmp_path / "out" / "examples.jsonl").read_text().splitlines()]
    eagle_rows = [row for row in rows if row["method"] == "eagle"]
    assert eagle_rows and all(row["divergence_class"] == "identical" for row in eagle_rows)
    recorded = json.loads((tmp_path / "out" / "environment.json").read_text())["models"]["head"]
    checkpoint = recorded["checkpoint"]  # what was read, for telling runs of two heads apart
    assert checkpoint["layout"] == "speculators" and checkpoint["aux_layer_ids"] == [2, 4, 5]
    assert len(checkpoint["digest"]) == 16 and recorded["dtype"] == "torch.float64"
    planned = run(tmp_path, recipe(str(folder)), "plan")
    assert planned.exit_code == 0, planned.output
    head = next(m for m in json.loads(planned.output)["models"] if m["name"] == "head")
    own = sum(t.numel() for k, t in tensors.items() if k not in ("d2t", "t2d"))
    assert head["params"] == own and head["shares"] == "target"
    # a head reading layer 9 of the 8-layer target: the run stops before its first row, in one line
    _config(folder, eagle_aux_hidden_state_layer_ids=[2, 4, 9])
    result = run(tmp_path, recipe(str(folder)), out="bad")
    line = result.output.strip()
    assert result.exit_code == 2 and "\n" not in line and "bad.yaml: models.head.options.of: " in line, line
    assert "aux layers [2, 4, 9]; expected distinct ids from 0 to 7" in line
    rows = tmp_path / "bad" / "examples.jsonl"
    assert not rows.exists() or not rows.read_text()


def _config(folder: Path, **changes):
    config = json.loads((folder / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    (folder / "config.json").write_text(json.dumps(config))


def _tensors(folder: Path, **changes):
    tensors = load_file(str(folder / "model.safetensors"))
    for key, value in changes.items():
        if value is None:
            tensors.pop(key)
        else:
            tensors[key] = value
    save_file(tensors, str(folder / "model.safetensors"))


def _shard(folder: Path):
    (folder / "model.safetensors").rename(folder / "model-00001-of-00001.safetensors")
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {}}))


# name -> (layout, how the written head is spoiled, what the one line says)
BAD = {
    "hidden size": (
        "eagle",
        lambda f: _config(f, hidden_size=24),
        r"target_hidden_size 24; expected target's hidden size 32",
    ),
    "fc width": (
        "eagle",
        lambda f: _tensors(f, **{"fc.weight": torch.zeros(32, 64)}),
        r"fc\.weight is \[32, 64\]; expected \[32, 96\] \(3 aux layers x hidden size 32\)",
    ),
    "t2d length": (
        "eagle",
        lambda f: _tensors(f, t2d=torch.ones(VOCAB + 4, dtype=torch.bool)),
        rf"t2d has {VOCAB + 4} entries; expected target's vocabulary, {VOCAB}",
    ),
    "d2t length": (
        "speculators",
        lambda f: _tensors(f, d2t=torch.zeros(23, dtype=torch.long)),
        r"d2t has shape \[23\]; expected \[22\] \(draft_vocab_size\)",
    ),
    "missing d2t": (
        "eagle",
        lambda f: _tensors(f, d2t=None),
        r"has no d2t; expected d2t \[22\] \(draft_vocab_size\)",
    ),
    "aux ids out of range": (
        "speculators",
        lambda f: _config(f, eagle_aux_hidden_state_layer_ids=[2, 4, 8]),
        r"aux layers \[2, 4, 8\]; expected distinct ids from 0 to 7",
    ),
    "unknown speculators_model_type": (
        "speculators",
        lambda f: _config(f, speculators_model_type="mtp"),
        r"speculators_model_type 'mtp' is not read; expected 'eagle3'",
    ),
    "sharded": ("eagle", _shard, r"model\.safetensors\.index\.json shards the head's weights"),
    "norm_before_fc": (
        "speculators",
        lambda f: _config(f, norm_before_fc=True),
        r"norm_before_fc: true is an EAGLE-3 variant",
    ),
    "fc_norm": ("speculators", lambda f: _config(f, fc_norm=True), r"fc_norm: true is an EAGLE-3 variant"),
    "norm_output": (
        "speculators",
        lambda f: _config(f, norm_output=True),
        r"norm_output: true is an EAGLE-3 variant",
    ),
    "multi-layer": (
        "eagle",
        lambda f: _config(f, num_hidden_layers=2),
        r"num_hidden_layers 2: multi-layer drafts",
    ),
    "a second layer's tensors": (
        "speculators",
        lambda f: _tensors(f, **{"layers.1.mlp.up_proj.weight": torch.zeros(2)}),
        r"layers\.1\.mlp\.up_proj\.weight \(a multi-layer draft, not implemented\)",
    ),
    "no norm_before_residual": (
        "speculators",
        lambda f: _config(f, norm_before_residual=None),
        r"leaves norm_before_residual out \(speculators then reads false, vLLM true\)",
    ),
    "another layer family": (
        "eagle",
        lambda f: _config(f, model_type="mistral"),
        r"decoder layer is model_type 'mistral'",
    ),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_head_is_one_line_naming_the_field_and_what_was_expected(case, tiny_model, tmp_path):
    layout, spoil, message = BAD[case]
    weights = target_weights(tiny_model)
    folder = write_head(tmp_path / "head", layout, weights, head_tensors(weights, range(0, VOCAB, 3)))
    spoil(folder)
    with pytest.raises(SpecbenchError, match=message) as raised:
        load_head(folder, HFModel(weights, "target"))
    assert str(raised.value).startswith("models.head.") and "\n" not in str(raised.value)


def test_a_hub_head_offline_fails_fast_with_one_line(tmp_path, monkeypatch, tiny_model):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(cache, "hub_reachable", lambda: False)
    started = time.time()
    with pytest.raises(
        SpecbenchError, match=r"models\.head\.source: hub repository 'org/eagle3-head' is not"
    ) as raised:
        load_head("org/eagle3-head", HFModel(target_weights(tiny_model), "target"))
    assert time.time() - started < 10 and "\n" not in str(raised.value) and "hf download" in str(raised.value)


def test_export_refuses_what_it_cannot_write_in_one_line(tiny_model, tmp_path):
    weights = target_weights(tiny_model)
    own = tmp_path / "own"
    own.mkdir()
    (own / "eagle.json").write_text("{}")  # specbench's own EAGLE head: EAGLE-1's layer, no published layout
    source = write_head(tmp_path / "head", "eagle", weights, head_tensors(weights, range(10)))
    cases = {
        "specbench's own EAGLE head": (own, "eagle", tmp_path / "a"),
        "no layout 'onnx'": (source, "onnx", tmp_path / "b"),
        "already holds a head": (source, "eagle", source),
    }
    for expected, (head, layout, out) in cases.items():
        result = CliRunner().invoke(app, ["export", str(head), "--format", layout, "-o", str(out)])
        assert result.exit_code == 2 and expected in result.output and "\n" not in result.output.strip()
