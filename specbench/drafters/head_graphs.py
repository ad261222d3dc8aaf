"""A one-layer draft head's passes at fixed shapes over a static KV cache, replayed as CUDA graphs.

A small head's pass (EAGLE's decoder layer, :mod:`specbench.drafters.eagle`) costs a GPU about 60
kernel launches and almost no arithmetic, and a tree step runs one pass per level: on an H100 the
eager head took 0.93 ms a pass, six a step, beside a 5.9 ms target pass (results/heads/
smollm2_eagle_gpu). Captured once per shape and replayed, a pass is one launch: 0.389 ms against
0.920 eagerly, the rest being its inputs' copies and attention over the whole cache
(results/heads/gpu_head_graphs_nvidia-h100-80gb.txt).

For that every pass must have a fixed shape: its rows are padded to a power of two (the padded rows
write their keys and values to a scratch slot, the cache's last, which no real row attends), the cache
holds ``capacity`` slots (grown in steps of :data:`CAPACITY_STEP`, re-capturing), and the attention
mask spans the whole cache. The caller names the slots its rows occupy and what each row sees, as a
host mask over the slots used so far; the same code runs without capture on the CPU (the tests' way
of checking it) and for passes wider than :data:`MAX_GRAPH_ROWS` (a prompt's prefill).
"""

from __future__ import annotations

import torch
from torch import nn

from specbench.models.tree import additive_mask

# slots the cache grows by: a growth re-captures every graph, so it should happen at the first prompt,
# not in a timed pass later (a masked slot costs one layer's attention almost nothing on a GPU)
CAPACITY_STEP = 1024
MAX_GRAPH_ROWS = 64


class SlotCache:
    """The static keys and values of one layer; ``update`` writes a pass's rows at ``slots`` and
    returns the whole cache (the interface transformers' attention calls)."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, slots: torch.Tensor):
        self.keys, self.values, self.slots = keys, values, slots

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args, **kwargs):
        self.keys.index_copy_(2, self.slots, key)
        self.values.index_copy_(2, self.slots, value)
        return self.keys, self.values


def bucket(rows: int) -> int:
    """The padded row count of a pass of ``rows`` rows: the next power of two."""
    return 1 << (rows - 1).bit_length()


class StaticHeadPasses:
    """``run(tokens, features, positions, seen, first) -> (features out, logits)`` of ``head`` (called
    as ``head(embeddings, features, positions, mask, cache)``) with ``lm_head`` (a
    :class:`~specbench.drafters.draft_vocab.DraftVocabHead`) on its output: the draft vocabulary's
    logits."""

    def __init__(
        self,
        head: nn.Module,
        embeddings: nn.Module,
        lm_head: nn.Module,
        graphs: bool,
        attention: str | None = None,
    ):
        self.head, self.embeddings, self.lm_head = head, embeddings, lm_head
        config = head.layer.self_attn.config
        if attention is not None:  # transformers' attn_implementation of the head's layer
            config._attn_implementation = attention
        self.kv_shape = (
            config.num_key_value_heads,
            getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads,
        )
        parameter = next(head.parameters())
        self.device, self.dtype = parameter.device, parameter.dtype
        self.graphs = graphs and self.device.type == "cuda"
        self.capacity = 0
        self._keys = self._values = None
        self._captured: dict[int, tuple] = {}  # rows -> (graph, inputs, outputs)

    def _grow(self, needed: int) -> None:
        """Room for ``needed`` slots and the scratch slot; a larger cache needs new graphs."""
        if needed < self.capacity:
            return
        capacity = CAPACITY_STEP * (needed // CAPACITY_STEP + 1)
        keys = torch.zeros(
            1, self.kv_shape[0], capacity, self.kv_shape[1], device=self.device, dtype=self.dtype
        )
        values = torch.zeros_like(keys)
        if self._keys is not None:
            keys[:, :, : self.capacity - 1] = self._keys[:, :, :-1]
            values[:, :, : self.capacity - 1] = self._values[:, :, :-1]
        self._keys, self._values, self.capacity = keys, values, capacity
        self._captured.clear()

    def _inputs(self, tokens, features, positions, seen, first: int) -> dict[str, torch.Tensor]:
        """The pass's inputs padded to its bucket, on the head's device (one copy each)."""
        n, padded = tokens.shape[0], bucket(tokens.shape[0])
        scratch = self.capacity - 1
        allowed = torch.zeros(padded, self.capacity, dtype=torch.bool)
        allowed[:n, : seen.shape[1]] = seen
        allowed[n:, scratch] = True  # a padded row sees its own slot: a defined softmax, never read
        mask = additive_mask(allowed, self.dtype)
        slots = torch.full((padded,), scratch, dtype=torch.long)
        slots[:n] = torch.arange(first, first + n)
        pad = padded - n
        return {
            "tokens": torch.nn.functional.pad(tokens, (0, pad)),
            "features": torch.nn.functional.pad(features, (0, 0, 0, pad)),
            "positions": torch.nn.functional.pad(positions, (0, pad)),
            "mask": mask.to(self.device, non_blocking=True)[None, None],
            "slots": slots.to(self.device, non_blocking=True),
        }

    def _forward(self, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        cache = SlotCache(self._keys, self._values, inputs["slots"])
        out = self.head(
            self.embeddings(inputs["tokens"][None]),
            inputs["features"][None],
            inputs["positions"][None],
            inputs["mask"],
            cache,
        )[0]
        return out, self.lm_head.subset(out)

    def run(self, tokens, features, positions, seen: torch.Tensor, first: int):
        """The head over ``tokens`` / ``features`` (rows written at slots ``first``...), each row
        attending to the slots ``seen`` marks (a host bool ``[rows, used slots]``)."""
        n = tokens.shape[0]
        self._grow(first + n)
        inputs = self._inputs(tokens, features, positions, seen, first)
        padded = inputs["tokens"].shape[0]
        if not self.graphs or padded > MAX_GRAPH_ROWS:
            out, logits = self._forward(inputs)
            return out[:n], logits[:n]
        if padded not in self._captured:
            self._captured[padded] = self._capture(inputs)
        graph, static, outputs = self._captured[padded]
        for name, value in inputs.items():
            static[name].copy_(value)
        graph.replay()
        return outputs[0][:n].clone(), outputs[1][:n].clone()

    def _capture(self, inputs: dict[str, torch.Tensor]):
        """Capture the pass of these inputs' shape. The warm-up runs compute this very pass (its
        rows' keys and values written to the same slots), so running it again is harmless."""
        static = {name: value.clone() for name, value in inputs.items()}
        graph, outputs = capture(self._forward, static, self.device)
        return graph, static, outputs


def capture(function, static: dict[str, torch.Tensor], device: torch.device):
    """(graph, outputs): ``function(static)`` captured as a CUDA graph, after two warm-up runs on a side
    stream (which must be harmless to repeat: the same inputs write the same cache entries). Replay
    after copying new values into ``static``; ``outputs`` then hold the results."""
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        for _ in range(2):
            function(static)
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        outputs = function(static)
    return graph, outputs
