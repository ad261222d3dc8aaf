"""EAGLE heads (Li, Wei, Zhang and Zhang, "EAGLE: Speculative Sampling Requires Rethinking Feature
Uncertainty", ICML 2024; the dynamic tree of "EAGLE-2: Faster Inference of Language Models with
Dynamic Draft Trees", EMNLP 2024).

The head autoregresses on the target's *features*, its final hidden state f_t (after the final norm,
what its LM head reads): at position t it reads ``fc([embedding(x_{t+1}); f_t])`` (the token one step
ahead resolves the feature's uncertainty), runs one decoder layer of the target's own kind (EAGLE-1
drops that layer's input norm) and predicts f̂_{t+1}; the target's LM head, frozen and here restricted
to a draft vocabulary (FR-Spec, :mod:`specbench.drafters.draft_vocab`), turns it into the next token's
distribution. The token embedding is the target's too, so the head's own weights are the ``fc`` and
the layer (about 4M parameters on SmolLM2-135M).

Drafting (:class:`EagleDrafter`): after each verification the head reads the target's features at
every position just committed (one pass, its KV cache extended), then grows the tree a level at a time,
each expanded node fed its parent's predicted feature and its own token, under tree attention. The
head's tree entries are dropped before the next step, which re-reads the accepted positions with the
target's true features. With ``step_graph`` a greedy tree is drafted whole at fixed shapes instead
(:meth:`EagleDrafter.greedy_tree`: the same tree, read once), which a GPU replays as one CUDA graph.

EAGLE-3's multi-layer feature fusion (Li, Wei, Zhang and Zhang, "EAGLE-3: Scaling up Inference
Acceleration of Large Language Models via Training-Time Test", 2025): a head trained with
``--size eagle3`` reads at the committed positions the target's low, middle and high states
(:func:`fusion_layers`: the inputs of decoder layers 2, L/2 and L - 3, vLLM's choice too), concatenated
and projected to one feature by ``fuse`` (3H -> H, no bias), then RMS-normalised (``fusion_norm``,
EAGLE-3's ``hidden_norm``, which there normalises every feature entering the layer; here only the
fused one: the head's own outputs enter unnormed, at the scale it learned); deeper tree levels read
the head's own output, as before, and it is trained on the token loss alone. The rest is this
module's EAGLE-1 layout (the fc over [embedding; feature], the target's decoder layer, the shared LM
head), not EAGLE-3's own layer (which widens attention to 2H inputs and has its own LM head); vLLM
cannot load it. EAGLE-3's own layer, as published heads have it, is :mod:`specbench.drafters.eagle3`.

Saved as ``eagle_head.safetensors`` + ``eagle.json`` (the target's config fields it was built with,
the draft vocabulary, the training record) in ``<cache>/drafters/<target>/eagle``; loaded by the
``eagle:`` source. :func:`save_vllm` writes vLLM's ``eagle`` layout beside it.
"""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path

import torch
from torch import nn

from specbench.drafters.head_graphs import StaticHeadPasses, capture
from specbench.drafters.heads import draft_vocab_head, follow_linear, read_manifest
from specbench.errors import SpecbenchError
from specbench.models.base import LAST, ForwardCounter, Pass
from specbench.models.tree import ROOT, TokenTree, additive_mask

HEAD_FILE = "eagle_head.safetensors"
MANIFEST = "eagle.json"


HEAD_ATTENTION = ("sdpa", "eager")  # the implementations that take the head's tree mask


def head_config(target_model):
    """The target's text config cut to one decoder layer, its attention the portable SDPA kernel."""
    config = copy.deepcopy(target_model.config.get_text_config())
    config.num_hidden_layers = 1
    config._attn_implementation = "sdpa"
    return config


def fusion_layers(num_layers: int) -> tuple[int, ...]:
    """EAGLE-3's low, middle and high states of a target with ``num_layers`` decoder layers: the inputs
    of layers 2, L // 2 and L - 3 (``hidden_states[i]``), fewer where a small target repeats one."""
    return tuple(sorted({min(2, num_layers - 1), num_layers // 2, max(num_layers - 3, 0)}))


class EagleHead(nn.Module):
    """``forward(embeddings, features) -> predicted next features``, one decoder layer of the target's
    class (``layer_type``, ``rotary_type``: the target's decoder layer and rotary embedding classes).
    ``fused_layers``: the target states an EAGLE-3 head fuses into the feature it reads at committed
    positions (none: it reads the final state, as EAGLE-1); ``fusion_norm``: the fused feature is
    RMS-normalised (EAGLE-3's ``hidden_norm``; heads trained before it existed have none)."""

    def __init__(self, config, layer_type, rotary_type, fused_layers: tuple = (), fusion_norm: bool = False):
        super().__init__()
        hidden = config.hidden_size
        self.fc = nn.Linear(2 * hidden, hidden, bias=False)  # vLLM's EAGLE layout has no bias
        self.layer = layer_type(config, layer_idx=0)
        self.layer.input_layernorm = nn.Identity()  # EAGLE-1: the fc output enters the layer unnormed
        self.rotary = rotary_type(config=config)
        self.fused_layers = tuple(fused_layers)
        self.fuse = nn.Linear(len(fused_layers) * hidden, hidden, bias=False) if fused_layers else None
        # the target's residual states before its final norm can be huge (SmolLM2's layers 15 and 27
        # reach 24832, RMS ~70): unnormalised, the fused feature swamps the token embedding in fc
        norm = nn.RMSNorm(hidden, eps=getattr(config, "rms_norm_eps", 1e-6))
        self.fusion_norm = norm if fused_layers and fusion_norm else None

    @classmethod
    def for_target(cls, target_model, fused_layers: tuple = (), fusion_norm: bool = False) -> EagleHead:
        base = target_model.base_model
        layer, rotary = type(base.layers[0]), type(base.rotary_emb)
        return cls(head_config(target_model), layer, rotary, fused_layers, fusion_norm)

    @property
    def reads(self) -> tuple:
        """The target layers whose states the head reads at committed positions."""
        return self.fused_layers or (LAST,)

    def read(self, states: torch.Tensor) -> torch.Tensor:
        """The feature the head reads at committed positions from the target's states of :attr:`reads`
        concatenated ([..., len(reads) * H]): the final state itself, or an EAGLE-3 head's fusion."""
        if self.fuse is None:
            return states
        fused = self.fuse(states)
        return fused if self.fusion_norm is None else self.fusion_norm(fused)

    def forward(self, embeddings, features, positions, mask, cache=None) -> torch.Tensor:
        """``embeddings``, ``features``: [B, T, H]; ``positions``: [B, T]; ``mask``: bool
        [B, 1, T, cached + T] (True: attend)."""
        hidden = self.fc(torch.cat([embeddings, features], dim=-1))
        out = self.layer(
            hidden,
            attention_mask=mask,
            position_ids=positions,
            cache=cache,
            use_cache=cache is not None,
            position_embeddings=self.rotary(hidden, positions),
        )
        return out[0] if isinstance(out, tuple) else out


def causal_mask(cached: int, new: int, device) -> torch.Tensor:
    """[1, 1, new, cached + new]: each new position sees the cache and the new ones up to itself."""
    seen = torch.ones(new, cached + new, dtype=torch.bool, device=device)
    seen[:, cached:] = torch.ones(new, new, dtype=torch.bool, device=device).tril()
    return seen[None, None]


class EagleDrafter:
    """The head on one target, as a tree drafter (:func:`specbench.decoding.tree_speculative.draft_tree`):
    ``root`` reads the target's features at the newly committed positions, ``level`` expands nodes.
    ``lm_head`` scores the head's outputs over its draft vocabulary (``ids``, ``vocab_size``,
    ``subset``): the target's LM head restricted to it, or a published EAGLE-3 head's own
    (:class:`~specbench.drafters.eagle3.Eagle3Head` is both)."""

    fed_hidden = True  # the prefill's features too: the head reads every committed position once

    def __init__(
        self,
        name: str,
        head: EagleHead,
        embeddings: nn.Module,
        lm_head: nn.Module,
        target_name: str,
        static: bool | None = None,
        attention: str = "sdpa",
        step_graph: bool = False,
    ):
        self.name = name
        self.head = head.eval()
        self.target_layers = head.reads  # the target's states it reads (tree_speculative asks for them)
        # transformers' attn_implementation of the head's layer: sdpa (head_config's), or eager (on an
        # H100 a replayed pass took 0.344 ms against 0.426 with SDPA; results/heads/
        # gpu_head_graphs_profile_nvidia-h100-80gb.txt), which adds its mask, so ours is then additive
        self.attention = head.layer.self_attn.config._attn_implementation = attention
        self.embeddings, self.lm_head = embeddings, lm_head
        self.target_name = target_name
        self.counter = ForwardCounter()
        # root and level return logits over these tokens only (the draft vocabulary; FR-Spec)
        self.vocabulary, self.vocab_size = lm_head.ids, lm_head.vocab_size
        self.num_parameters = sum(p.numel() for p in head.parameters())
        self.device = next(head.parameters()).device
        self.dtype = next(head.parameters()).dtype  # the target's: the heads read its features
        # on a GPU the passes run at fixed shapes over a static cache, replayed as CUDA graphs
        # (head_graphs.py); elsewhere over a growing cache (``static=True`` runs the fixed shapes
        # uncaptured, as the tests check them)
        self.static = self.device.type == "cuda" if static is None else static
        self._passes = StaticHeadPasses(head, embeddings, lm_head, graphs=True) if self.static else None
        # a greedy tree's levels at fixed shapes in one go (greedy_tree), replayed as one CUDA graph on
        # a GPU; needs the static passes
        self.step_graph = step_graph and self._passes is not None
        self._levels: dict[tuple, tuple] = {}  # tree shape -> (graph or None, inputs, outputs, capacity)

    def start(self, prompt_ids: torch.Tensor) -> None:
        from transformers import DynamicCache

        self.counter.reset()
        self._prompt = prompt_ids.to(self.device)
        self._cache = DynamicCache()
        self._used = 0  # cache slots written: the committed pairs, then this step's tree entries
        self._pairs = 0  # committed positions t whose (x_{t+1}, f_t) the cache holds
        # the predicted features of the tree's nodes (ROOT's first), one row each, and each node's row
        self._features: torch.Tensor | None = None
        self._feature_row: dict[int, int] = {}
        self._slots: dict[int, int] = {}  # expanded tree node -> its cache entry

    def _pass(
        self, tokens, features, positions, seen: torch.Tensor, scored: slice = slice(None)
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(predicted features, draft-vocabulary logits) of ``tokens`` written at the next slots, each
        row attending to the slots ``seen`` marks (host bool ``[rows, slots used + rows]``); the
        logits of the rows ``scored`` (the static passes score every row)."""
        first = self._used
        started = self.counter.begin(self.device)
        if self._passes is not None:
            out, logits = self._passes.run(tokens, features, positions, seen, first)
        else:
            mask = seen.to(self.device)[None, None]
            if self.attention != "sdpa":
                mask = additive_mask(mask, self.dtype)
            out = self.head(self.embeddings(tokens[None]), features[None], positions[None], mask, self._cache)
            out = out[0]
            logits = self.lm_head.subset(out[scored])  # part of the pass, timed with it
        self.counter.end(started, tokens.shape[0], self.device, context=first)
        self._used = first + tokens.shape[0]
        return out, logits

    @torch.inference_mode()
    def root(self, tokens: torch.Tensor, last: Pass | None, accepted: list[int]) -> torch.Tensor | None:
        """The head's logits (over :attr:`vocabulary`) for the token after the committed ``tokens``;
        ``accepted``: the rows of ``last``'s features at the positions committed since the head's last
        read."""
        if last is None:
            return None
        if self._used > self._pairs:  # the previous step's tree entries
            if self._passes is None:
                self._cache.crop(self._pairs - self._used)
            self._used = self._pairs
        first = self._pairs + 1  # the token paired with the first unread feature
        tokens = tokens.to(self.device)
        prompt = self._prompt.shape[0]
        if first >= prompt:  # only the tail: the prompt is read once, at the prefill
            new_tokens = tokens[first - prompt :]
        else:
            new_tokens = torch.cat([self._prompt[first:], tokens])
        states = torch.cat([last.hidden[layer][accepted] for layer in self.target_layers], dim=-1)
        features = self.head.read(states.to(self.device, self.dtype))
        if new_tokens.shape[0] != features.shape[0]:
            raise RuntimeError(
                f"{self.name}: {features.shape[0]} target features for {new_tokens.shape[0]} new positions"
            )
        n = new_tokens.shape[0]
        positions = torch.arange(self._pairs, self._pairs + n, device=self.device)
        seen = causal_mask(self._pairs, n, "cpu")[0, 0]
        out, logits = self._pass(new_tokens, features, positions, seen, scored=slice(-1, None))
        self._pairs += n
        self._features, self._feature_row = out[-1:], {ROOT: 0}
        self._slots = {}
        return logits[-1:].to(tokens.device)

    @torch.inference_mode()
    def level(self, tokens: torch.Tensor, level: int, tree: TokenTree, expand: list[int]) -> torch.Tensor:
        """Logits after each node of ``expand`` (all at depth ``level``): each reads its parent's
        predicted feature and its own token, seeing the committed positions and its ancestors."""
        cached = self._used
        n = len(expand)
        # built on the host and copied once: one kernel per entry would dominate a GPU step
        seen_rows, seen_slots = [], []
        for row, node in enumerate(expand):
            slots = [self._slots[ancestor] for ancestor in tree.path(node)[:-1]] + [cached + row]
            seen_rows += [row] * len(slots)
            seen_slots += slots
        seen = torch.zeros(n, cached + n, dtype=torch.bool)
        seen[:, : self._pairs] = True
        seen[seen_rows, seen_slots] = True
        features = self._features[[self._feature_row[tree.parents[i]] for i in expand]]
        positions = torch.full((n,), self._pairs + level - 1, dtype=torch.long, device=self.device)
        out, logits = self._pass(tree.tokens[expand].to(self.device), features, positions, seen)
        first = self._features.shape[0]
        self._features = torch.cat([self._features, out])
        for row, node in enumerate(expand):
            self._feature_row[node] = first + row
            self._slots[node] = cached + row
        return logits.to(tokens.device)

    @torch.inference_mode()
    def greedy_tree(
        self,
        tokens,
        last: Pass | None,
        accepted: list[int],
        *,
        depth: int,
        branch: int,
        frontier: int,
        nodes: int,
    ) -> TokenTree | None:
        """EAGLE-2's greedy tree (:func:`~specbench.decoding.tree_speculative.draft_tree`'s, node for
        node) with every level drafted at fixed shapes and nothing read back until the end: the
        expanded nodes, their features, slots and masks stay on the device (a node's mask row is its
        parent's plus its own slot), the reranking's ancestor closure too, and the finished tree is read
        once. On a GPU the levels replay as one CUDA graph per tree shape; no level is skipped (the
        host loop's early stop needs a read), so the head runs ``depth - 1`` level passes a step.
        None: nothing to draft from yet."""
        root = self.root(tokens, last, accepted)
        if root is None:
            return None
        shape = (depth, branch, frontier, nodes)
        widths = _level_widths(depth, min(branch, root.shape[-1]), frontier)
        rows = sum(widths)
        self._passes._grow(self._pairs + rows)
        entry = self._levels.get(shape)
        if entry is None or entry[3] != self._passes.capacity:
            inputs = {
                "root": root.to(self.device).clone(),
                "feature": self._features.clone(),
                "pairs": torch.tensor([self._pairs], device=self.device),
            }
            grow = functools.partial(self._grow_levels, shape=shape)
            if self._passes.graphs:
                graph, outputs = capture(grow, inputs, self.device)
            else:
                graph, outputs = None, None
            entry = self._levels[shape] = (graph, inputs, outputs, self._passes.capacity)
        graph, inputs, outputs, _ = entry
        started = self.counter.begin(self.device)
        inputs["root"].copy_(root)
        inputs["feature"].copy_(self._features)
        inputs["pairs"].fill_(self._pairs)
        if graph is None:
            outputs = self._grow_levels(inputs, shape)
        else:
            graph.replay()
        passes = [(width, self._pairs + sum(widths[:i])) for i, width in enumerate(widths)]
        if passes:
            self.counter.end_all(started, passes, self.device)
        self._used = self._pairs + rows
        kept, node_tokens, parents = outputs.tolist()  # the step's one read
        keep = [i for i, k in enumerate(kept) if k]
        index = {old: new for new, old in enumerate(keep)}
        parents = tuple(ROOT if parents[i] == ROOT else index[parents[i]] for i in keep)
        return TokenTree.from_host([node_tokens[i] for i in keep], parents, tokens.device)

    def _grow_levels(self, inputs: dict[str, torch.Tensor], shape: tuple) -> torch.Tensor:
        """The tree's levels from the root's logits and feature (``inputs``): [3, M] (kept, token,
        parent) of its M drafted nodes in :func:`draft_tree`'s order; fixed shapes, no reads."""
        depth, branch, frontier, nodes = shape
        capacity, device = self._passes.capacity, self.device
        slots = torch.arange(capacity, device=device)
        pairs = inputs["pairs"]
        masks = (slots < pairs)[None]  # [rows, capacity]: the slots each expanded node's subtree sees
        probs, features = torch.softmax(inputs["root"], dim=-1), inputs["feature"]
        path_probability = torch.ones(1, dtype=probs.dtype, device=device)
        expanded = torch.full((1,), ROOT, device=device)  # the expanded nodes' indices
        level_tokens, level_scores, level_parents = [], [], []
        drafted, offset = 0, 0
        for level in range(depth):
            width = min(branch, probs.shape[-1])
            picked = torch.topk(probs, width, dim=-1).indices
            scores = (path_probability[:, None] * probs.gather(-1, picked)).flatten()
            picked = picked.flatten()
            level_tokens.append(self.vocabulary[picked] if self.vocabulary is not None else picked)
            level_scores.append(scores)
            level_parents.append(expanded[:, None].expand(-1, width).flatten())  # no size read
            first, drafted = drafted, drafted + scores.shape[0]
            if level == depth - 1:
                break
            ranked = scores.topk(min(frontier, scores.shape[0])).indices
            rows = ranked.shape[0]
            path_probability, parent_row = scores[ranked], ranked // width
            own = pairs + offset + torch.arange(rows, device=device)
            masks = masks[parent_row] | (slots[None] == own[:, None])
            out, logits = self._passes._forward(
                {
                    "tokens": level_tokens[-1][ranked],
                    "features": features[parent_row],
                    "positions": (pairs + level).expand(rows),
                    "mask": additive_mask(masks, self.dtype)[None, None],
                    "slots": own,
                }
            )
            probs, features = torch.softmax(logits, dim=-1), out
            expanded, offset = first + ranked, offset + rows
        scores, parents = torch.cat(level_scores), torch.cat(level_parents)
        if scores.shape[0] > nodes:  # EAGLE-2's reranking: the best nodes and all their ancestors
            best = scores.topk(nodes).indices
            kept = torch.zeros(scores.shape[0], dtype=torch.bool, device=device).index_fill_(0, best, True)
            kept = with_ancestors(kept, parents, depth)
        else:
            kept = torch.ones(scores.shape[0], dtype=torch.bool, device=device)
        return torch.stack([kept.long(), torch.cat(level_tokens), parents])

    def rollback(self, n_tokens: int) -> None:
        pass  # the next root drops the tree entries; committed positions are re-read from the target


def with_ancestors(kept: torch.Tensor, parents: torch.Tensor, depth: int) -> torch.Tensor:
    """``kept`` (bool [M]) with every ancestor of a kept node (``parents``: [M], ROOT for the root's
    children) in a tree of ``depth`` levels, at fixed shapes: one parent step at a time. A child's path
    probability is at most its parent's, so only ties can keep a node without its parent."""
    for _ in range(depth - 1):
        reached = torch.zeros(kept.shape[0] + 1, dtype=torch.int32, device=kept.device)
        reached.index_add_(0, parents + 1, kept.int())
        kept = kept | (reached[1:] > 0)
    return kept


def _level_widths(depth: int, branch: int, frontier: int) -> list[int]:
    """The rows of each level pass of a greedy tree drafted to its full depth: the nodes expanded."""
    widths, candidates = [], branch
    for _ in range(depth - 1):
        widths.append(min(frontier, candidates))
        candidates = widths[-1] * branch
    return widths


def save(folder: Path, head: EagleHead, manifest: dict) -> None:
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.contiguous() for k, v in head.state_dict().items() if not k.startswith("rotary.")}
    save_file(state, str(folder / HEAD_FILE))
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")


def save_vllm(folder: Path, head: EagleHead, target_model) -> None:
    """The head in vLLM's ``eagle`` layout for Llama targets (``vllm/model_executor/models/
    llama_eagle.py``): ``config.json`` (the target's, one layer, ``EagleLlamaForCausalLM``) and
    ``model.safetensors`` with ``fc.weight`` and ``layers.0.*`` (no input norm; vLLM takes the embedding
    and LM head from the target, and its LM head is the full vocabulary). Pass the folder as vLLM's
    draft ``model`` with ``method: eagle``."""
    from safetensors.torch import save_file

    if head.fuse is not None:
        raise ValueError("an EAGLE-3-fused head has no vLLM eagle layout")
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {"fc.weight": head.fc.weight.detach().float().contiguous()}
    for key, value in head.layer.state_dict().items():
        tensors[f"layers.0.{key}"] = value.detach().float().contiguous()
    save_file(tensors, str(folder / "model.safetensors"))
    config = head_config(target_model).to_dict()
    config.pop("_attn_implementation", None)
    config.update(architectures=["EagleLlamaForCausalLM"], num_hidden_layers=1, torch_dtype="float32")
    (folder / "config.json").write_text(json.dumps(config, indent=1, default=str) + "\n")


class HeadForEngine:
    """An EAGLE head whose target runs on a serving engine: the engine loads it (vLLM's ``eagle``
    layout, written by ``specbench distill --size eagle``), so this process keeps where it is and
    its size (for SWI's cost tables)."""

    def __init__(self, name: str, folder: Path):
        manifest = json.loads((folder / MANIFEST).read_text())
        if manifest.get("fused_layers"):
            raise SpecbenchError(
                f"models.{name}.source",
                f"the head in {folder} fuses the target's layers {manifest['fused_layers']} (EAGLE-3), "
                "which vLLM's eagle layout cannot carry",
                "run it with engine: eager or compiled, or use an EAGLE-1 head (--size eagle)",
            )
        self.name, self.folder = name, folder
        self.num_parameters = manifest["parameters"]
        self.origin = f"EAGLE head {folder}, loaded by the engine"

    def vllm_folder(self) -> Path:
        out = self.folder / "vllm"
        if not (out / "config.json").is_file():
            raise SpecbenchError(
                f"models.{self.name}.source",
                f"no vLLM layout of the EAGLE head in {out}",
                "train it again with `specbench distill --size eagle` (it writes the vLLM layout)",
            )
        return out


def load(
    folder: Path,
    name: str,
    target,
    where: str,
    cuda_graphs: bool = True,
    attn_implementation: str = "sdpa",
    step_graph: bool = False,
) -> EagleDrafter:
    """The head in ``folder`` on ``target`` (an HFModel): refused with one line when it was trained for
    another hidden size, vocabulary, layer count or decoder layer shape. ``cuda_graphs``: on a GPU, its
    passes replayed as CUDA graphs (else eager, as on a CPU); ``attn_implementation``: its layer's
    attention, sdpa or eager (:data:`HEAD_ATTENTION`); ``step_graph``: with ``cuda_graphs`` on a GPU,
    a greedy tree's levels as one graph (:meth:`EagleDrafter.greedy_tree`)."""
    from safetensors.torch import load_file

    manifest = read_manifest(folder, (MANIFEST, HEAD_FILE), "eagle", "EAGLE head", target, where)
    fused = tuple(manifest.get("fused_layers", ()))
    head = EagleHead.for_target(target.model, fused, manifest.get("fusion_norm", False))
    try:
        head.load_state_dict(load_file(str(folder / HEAD_FILE)))
    except RuntimeError as error:  # same widths, another layer shape (heads, MLP width, biases)
        raise SpecbenchError(
            f"{where}.options.of",
            f"the EAGLE head in {folder} does not fit {target.name}'s decoder layer "
            f"({str(error).splitlines()[-1].strip()[:120]})",
            "train a head for this target (specbench distill --target ... --size eagle)",
        ) from None
    weight = target.model.get_output_embeddings().weight.detach()
    head = head.to(device=weight.device, dtype=weight.dtype)
    embeddings = target.model.get_input_embeddings()
    static = True if step_graph else None if cuda_graphs else False
    lm_head = draft_vocab_head(target, manifest)
    drafter = EagleDrafter(
        name, head, embeddings, lm_head, target.name, static, attn_implementation, step_graph
    )
    follow_linear(target, drafter.head, drafter.lm_head)
    return drafter
