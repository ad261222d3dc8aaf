"""The compiled engine: the same :class:`~specbench.models.hf.HFModel` interface over a static KV
cache and ``torch.compile`` d forward passes of a few fixed shapes.

* **Static cache, rollback by pointer.** transformers' ``StaticCache`` preallocates each layer's keys
  and values for ``capacity`` positions and writes a pass's new entries at its position pointer (a
  0-d tensor per layer, ``cumulative_length``); its ``crop`` only moves that pointer back. Entries
  past the pointer stay in memory but are never attended to: the causal mask is built from the
  positions of the tokens fed, so a stale entry lies "in the future" of every query until a later pass
  overwrites it. Rolling back costs no copy, which is the gpt-fast pattern the library already
  implements — so we use it rather than a cache of our own (measured in ``results/bench/``).
* **Fixed shapes.** A pass that feeds ``m`` tokens runs the graph of the smallest *bucket*
  ``b >= m`` (1, and k + 1 for each draft length of the cell): the ``b - m`` padding tokens are
  written past the real ones and then cropped off, like any stale entry, and their logits dropped.
  Passes longer than the largest bucket (the prompt's prefill) run eagerly on the same cache.
* **Compilation outside the clock.** :meth:`CompiledHFModel.prepare` compiles every bucket before a
  cell's first timed example, and the time it took is ``compile_seconds``. A pass that meets a shape
  not compiled yet (a longer prompt that outgrows the cache) compiles it on the spot and adds the time
  to ``compile_seconds`` too; the runner then measures that example again (measure.py).

On CPU each pass is compiled ahead of time as one full graph and kept on disk
(:mod:`specbench.models.graph_store`), so a second process loads its graphs in seconds instead of
compiling them again; a pass that cannot be stored is compiled by ``torch.compile`` as before. On CUDA
the passes use ``mode="reduce-overhead"`` (CUDA graphs). The measurements behind these choices are in
docs/engines.md.
"""

from __future__ import annotations

import os
import time
from collections import Counter

import torch
from transformers import StaticCache

from specbench.models import cache
from specbench.models.base import Layer, Pass, pick_hidden
from specbench.models.graph_store import GraphStore
from specbench.models.hf import HFModel, input_device
from specbench.models.tree import TokenTree, move_path_entries, tree_attention, tree_positions

ENGINES = ("eager", "compiled")

# inductor on CPU: whole graphs with the C++ wrapper (which calls the kernels without Python), weights
# as inputs so that the graphs can be stored. Frozen weights (constants, prepacked by oneDNN, with
# autotuned C++ GEMM templates) cannot be stored, and were slower on a 2-core EPYC with AVX512-BF16,
# SmolLM2-135M bf16 (results/compile/): one-token pass 18.80 ms stored, 20.58 ms frozen and prepacked;
# a second process 2.2 s against 164.3 s. On a Xeon with AMX the templates were worth more (16.1 ms
# against 24.0 without them, earlier configuration); that machine was not available to compare.
CPU_OPTIONS = {"freezing": False, "cpp_wrapper": True}
# ``linear: inductor``: the weights frozen into the graphs, and each linear layer's kernel chosen by timing
# inductor's C++ GEMM template against oneDNN's prepacked matmul. Where the passes are bound by reading
# the weights, the template streams them near the machine's bandwidth: Qwen2.5-Coder-1.5B's bf16 linear
# layers over one row at 31.3 GB/s, against 21.9 with oneDNN, 16.5 with ATen and 34.1 for a plain read, on a
# 2-core EPYC (family 25, AVX512-BF16; results/bench/cpu_linear_bandwidth_*.txt), and that model's AR at
# 0.94x llama.cpp's BF16 time per token (results/engines/qwen_ar_inductor/). Frozen graphs cannot be
# stored: every process compiles them (there 105 s for the one-token pass), outside the clock as always.
FROZEN_OPTIONS = {
    "freezing": True,
    "cpp_wrapper": True,
    "max_autotune": True,
    "max_autotune_gemm_backends": "CPP,ATEN",
}
# quick compilation for tests: the same graphs over the same caches, Python wrapper, no autotuning
QUICK_OPTIONS = {"freezing": False, "max_autotune": False}
CAPACITY_STEP = 256
# inductor's counters of its FX graph cache, and of shapes it autotuned (not found in its cache)
CACHE_COUNTERS = {"fxgraph_cache_hit": "hit", "fxgraph_cache_miss": "miss", "fxgraph_cache_bypass": "bypass"}


def use_compile_cache() -> str:
    """Point inductor's on-disk caches at the specbench cache: compiled C++ kernels, autotuning picks
    and FX graphs (where inductor can cache them), one folder per machine and torch build, since the
    kernels are built for this CPU's instruction sets and thread count. ``SPECBENCH_COMPILE_CACHE``
    names another folder, or ``torch`` keeps torch's own default. Returns the folder."""
    from specbench.models.machine import this_machine

    chosen = os.environ.get("SPECBENCH_COMPILE_CACHE", "")
    if chosen == "torch":
        from torch._inductor.runtime.cache_dir_utils import cache_dir

        return cache_dir()
    folder = chosen or str(cache.cache_dir() / "compile" / f"torch-{torch.__version__}-{this_machine().id}")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = folder  # inductor reads it at every cache access
    return folder


class CompiledHFModel(HFModel):
    """An :class:`HFModel` whose decode and verify passes run compiled graphs over a static cache.

    ``quick=True`` compiles without freezing and autotuning: the same code path and graphs with other
    kernels, in a fraction of the time (the tests use it). ``linear="inductor"`` (CPU) freezes the
    weights into the graphs and autotunes their matmuls (:data:`FROZEN_OPTIONS`); such graphs are not
    stored, so every process compiles them.
    """

    def __init__(self, model, name: str, tokenizer=None, *, quick: bool = False, linear: str = "aten"):
        if linear not in ("aten", "inductor"):
            raise ValueError(
                f"{name}: the compiled engine's linear layers are aten or inductor, not {linear!r}"
            )
        if linear == "inductor" and input_device(model).type != "cpu":  # else recorded over CUDA graphs
            raise ValueError(
                f"{name}: linear inductor freezes the weights into inductor's C++ GEMM templates, which "
                "run on the CPU"
            )
        super().__init__(model, name, tokenizer)
        self.linear, self.linear_probe = linear, {}  # recorded as the eager engine's choice is
        # one graph per (model, bucket, cache size): models of one class share dynamo's limit
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 256)
        torch._dynamo.config.accumulated_recompile_limit = max(
            torch._dynamo.config.accumulated_recompile_limit, 4096
        )
        if self.is_encoder_decoder:
            raise ValueError(f"{name}: the compiled engine serves decoder-only models")
        if self.device.type == "cuda":
            self._step = torch.compile(self.model.forward, mode="reduce-overhead", dynamic=False)
            self._options = {}
        else:
            self._step = torch.compile(self.model.forward, dynamic=False)
            # inductor reads these when it compiles (in _compile); torch.compile's options= drops freezing
            self._options = (
                FROZEN_OPTIONS if linear == "inductor" else QUICK_OPTIONS if quick else CPU_OPTIONS
            )
        self.buckets: tuple[int, ...] = (1,)
        self.tree_buckets: tuple[int, ...] = ()  # tree passes: committed token + nodes, padded up
        self._tree_inputs: dict[tuple, tuple[torch.Tensor, ...]] = {}  # (bucket, capacity) -> buffers
        self.capacity = 0
        self.compile_seconds = 0.0
        self.compile_cache = Counter()  # graphs loaded from the store or inductor's cache ("hit"),
        # compiled ("miss"), or not storable ("bypass"), and shapes autotuned ("autotuned")
        self.compile_cache_dir = use_compile_cache()
        # CPU: passes compiled ahead of time and kept on disk; (kind, bucket, capacity, hidden) -> the
        # stored graph, or None where it could not be stored (self._step compiles it then)
        self._store = (
            None
            if self.device.type == "cuda" or self._options["freezing"]
            else GraphStore(self.model, self._cache_argument, self.compile_cache_dir, self._options)
        )
        self._graphs: dict[tuple, object] = {}
        self._recording: dict | None = None
        self._compiled: set[tuple] = set()  # (bucket, capacity, with hidden states) already compiled
        self._held = 0  # where the cache's pointer stands (kept here so reading it costs no sync)
        self._inputs: dict[int, torch.Tensor] = {}

    # -- set-up -------------------------------------------------------------------------------

    def prepare(self, longest: int, draft_lengths=(), hidden: bool = False, tree_sizes=()) -> float:
        """Size the cache for sequences of up to ``longest`` positions (prompt + generation + k + 1)
        and compile the passes of 1 and k + 1 tokens for each k, and the tree passes of 1 + n tokens
        for each tree of n nodes (``hidden``: the graphs that also return hidden states); returns the
        seconds compiling took."""
        buckets = sorted({1, *(k + 1 for k in draft_lengths if k > 0), *self.buckets})
        self.tree_buckets = tuple(sorted({*(n + 1 for n in tree_sizes if n > 0), *self.tree_buckets}))
        before = self.compile_seconds
        self._reserve(longest, buckets)
        with torch.inference_mode():
            for bucket in self.buckets:
                self._compile(bucket, hidden)
            for bucket in self.tree_buckets:
                self._compile_tree(bucket, hidden)
        return self.compile_seconds - before

    def _reserve(self, longest: int, buckets) -> None:
        self.buckets = tuple(buckets)
        self._inputs = {
            b: self._inputs.get(b, torch.zeros((1, b), dtype=torch.long, device=self.device))
            for b in self.buckets
        }
        needed = -(-(longest + max((*buckets, *self.tree_buckets))) // CAPACITY_STEP) * CAPACITY_STEP
        if needed <= self.capacity:
            return
        self.capacity = needed
        self._cache = self._new_cache(self.capacity)
        self._held = self._cached = 0
        # allocate the cache outside any graph (its pointers move to the device there), asking for
        # hidden states so that transformers installs its output-capturing hooks now (under a lock
        # dynamo cannot trace) rather than inside a graph; then, for torch.compile's graphs, guard the
        # cache's tensors: transformers marks them static but unguarded, and dynamo then reused a graph
        # traced with one cache for another, whose writes went to the first cache's tensors
        self._eager(torch.zeros(1, dtype=torch.long, device=self.device), 1, True)
        self._pointers = [layer.cumulative_length for layer in self._cache.layers]
        self._point(0)
        if self._store is None:  # stored graphs take the cache as inputs, and are called with ours alone
            self._guard_cache()

    def _guard_cache(self) -> None:
        for layer in self._cache.layers:
            for tensor in (layer.keys, layer.values, layer.cumulative_length):
                torch._dynamo.mark_static_address(tensor, guard=True)

    def _leave_store(self) -> list[tuple]:
        """A pass that cannot be compiled whole: compile every pass with ``torch.compile`` from now on.
        Returns the passes loaded so far, which must be compiled again."""
        self._store = None
        self._graphs.clear()
        loaded, self._compiled = [k for k in self._compiled if k[-2] == self.capacity], set()
        self._guard_cache()
        return loaded

    def _new_cache(self, capacity: int) -> StaticCache:
        return StaticCache(config=self.model.config.get_text_config(decoder=True), max_cache_len=capacity)

    def _compile(self, bucket: int, hidden: bool) -> None:
        """Run (and so compile) the graph of ``bucket`` tokens on scratch positions, if not done yet."""
        key = (bucket, self.capacity, hidden)
        if key in self._compiled:
            return
        self._warm(key, lambda: self._run(self._inputs[bucket], bucket, hidden))

    def _warm(self, key: tuple, run) -> None:
        """Load or compile a pass's graph and run it twice on scratch positions (reduce-overhead
        records its CUDA graph on the second call), outside the counters, and add the time to
        ``compile_seconds``."""
        from torch._dynamo.utils import counters

        before = Counter(counters["inductor"])
        started = time.perf_counter()
        stored, again = False, []
        with self.counter.kept(), torch._inductor.config.patch(self._options):
            if self._store is not None:
                self._graphs[key] = None  # run() records its arguments here instead of running
                self._point(0)
                graph, outcome = self._store.graph(key, self._arguments(run))
                self.compile_cache[outcome] += 1
                if graph is None:
                    again = self._leave_store()
                else:
                    self._graphs[key] = graph
                    stored = True
            for _ in range(2):
                self._point(0)
                run()
            self._point(0)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
        self.compile_seconds += time.perf_counter() - started
        done = Counter(counters["inductor"]) - before
        if not stored:  # inductor's own caches decided
            self.compile_cache.update(
                {word: done[name] for name, word in CACHE_COUNTERS.items() if done[name]}
            )
        if done["select_algorithm_autotune"]:
            self.compile_cache["autotuned"] += done["select_algorithm_autotune"]
        self._compiled.add(key)
        self._cached = 0  # the scratch passes overwrote the cache: the next pass recomputes the prefix
        for bucket_key in again:  # compiled anew now, not at their first timed pass
            if bucket_key[0] == "tree":
                self._compile_tree(bucket_key[1], bucket_key[3])
            else:
                self._compile(bucket_key[0], bucket_key[2])

    # -- the LanguageModel interface ------------------------------------------------------------

    @torch.inference_mode()
    def start(self, prompt_ids: torch.Tensor) -> None:
        prompt_ids = prompt_ids.to(self.device)
        if prompt_ids.ndim != 1 or prompt_ids.shape[0] == 0:
            raise ValueError(f"{self.name}: the prompt must be a non-empty 1-D tensor of token ids")
        self._prefix = prompt_ids
        if self.capacity == 0:
            self._reserve(prompt_ids.shape[0] + CAPACITY_STEP, self.buckets)
        self._cached = 0

    @torch.inference_mode()
    def score(self, tokens: torch.Tensor, n_candidates: int, hidden: tuple[Layer, ...] = ()) -> Pass:
        tokens = tokens.to(self.device)
        prefix_len = self._prefix.shape[0]
        total = prefix_len + tokens.shape[0]
        if total + self.buckets[-1] > self.capacity:  # a longer request than prepare() was told of
            self._reserve(total, self.buckets)
        keep = min(self._cached, total - n_candidates - 1)
        new = self._unseen(tokens, keep)
        fed = new.shape[0]
        bucket = next((b for b in self.buckets if b >= fed), None)
        if bucket is not None and (bucket, self.capacity, bool(hidden)) not in self._compiled:
            self._compile(bucket, bool(hidden))  # outside the counter's time; the cache is refilled after
            return self.score(tokens, n_candidates, hidden)
        self._point(keep)
        started = self.counter.begin(self.device)
        rows = slice(fed - n_candidates - 1, fed)
        if bucket is None:
            output = self._eager(new, n_candidates + 1, bool(hidden))
            rows = slice(-(n_candidates + 1), None)
        else:
            padded = self._inputs[bucket]  # past ``fed``: ids of earlier passes, any id will do
            padded[0, :fed] = new
            output = self._run(padded, bucket, bool(hidden))
            self._point(keep + fed)  # the padding's entries become stale
        logits = output.logits[0, rows]
        states = pick_hidden(output.hidden_states, hidden, rows, self.name) if hidden else {}
        if bucket is not None and self.device.type == "cuda":  # a CUDA graph's next replay overwrites
            logits = logits.clone()
            states = {layer: state.clone() for layer, state in states.items()}
        self.counter.end(started, fed, self.device, context=keep)
        self._cached = total
        return Pass(logits, states)

    @torch.inference_mode()
    def score_tree(
        self, tokens: torch.Tensor, tree: TokenTree, hidden: tuple[Layer, ...] = (), fed_hidden: bool = False
    ) -> Pass:
        """:meth:`HFModel.score_tree` on the static cache: the nodes' entries are written after the
        committed positions, and the mask spans the whole cache (what lies past them is masked). A
        pass of up to a tree bucket's tokens runs that bucket's compiled graph, padded with rows that
        attend only to themselves (their entries lie past the pointer afterwards); a longer one (the
        prefill) runs eagerly."""
        tokens, nodes = tokens.to(self.device), tree.tokens.to(self.device)
        total = self._prefix.shape[0] + tokens.shape[0]
        if total + len(tree) + max((*self.buckets, *self.tree_buckets)) > self.capacity:
            self._reserve(total + len(tree), self.buckets)
        keep = min(self._cached, total - 1)
        committed = self._unseen(tokens, keep)
        fed = committed.shape[0] + len(tree)
        bucket = next((b for b in self.tree_buckets if b >= fed), None)
        if bucket is not None and ("tree", bucket, self.capacity, bool(hidden)) not in self._compiled:
            self._compile_tree(bucket, bool(hidden))  # outside the counter's time
            return self.score_tree(tokens, tree, hidden, fed_hidden)
        dtype = self.model.get_input_embeddings().weight.dtype
        size = fed if bucket is None else bucket
        ids, mask, positions = self._tree_buffers(size, dtype) if bucket else self._tree_scratch(size, dtype)
        ids[0, :fed] = torch.cat([committed, nodes])
        mask[..., :fed, : keep + fed] = tree_attention(committed.shape[0], keep, tree, dtype, self.device)
        positions[0, :fed] = tree_positions(total, committed.shape[0], tree, self.device)[0]
        if size > fed:  # padding rows see themselves only
            padding = torch.arange(fed, size, device=self.device)
            mask[0, 0, padding, keep + padding] = 0
        self._point(keep)
        started = self.counter.begin(self.device)
        if bucket:
            output = self._run_tree(ids, mask, positions, bool(hidden))
        else:  # only the rows after the root and the nodes go through the LM head
            output = self._tree_eager(ids, mask, positions, bool(hidden), len(tree) + 1)
        self._point(keep + fed)  # a padded bucket's extra entries become stale
        self.counter.end(started, fed, self.device, context=keep)
        rows = slice(fed - len(tree) - 1, fed)
        logits = output.logits[0, rows] if bucket else output.logits[0]
        fed_rows = slice(0, fed) if fed_hidden else rows
        states = pick_hidden(output.hidden_states, hidden, fed_rows, self.name) if hidden else {}
        if bucket is not None and self.device.type == "cuda":  # a CUDA graph's next replay overwrites
            logits = logits.clone()
            states = {layer: state.clone() for layer, state in states.items()}
        self._cached = total
        self._tree = (total, len(tree))
        return Pass(logits, states)

    def _tree_scratch(self, size: int, dtype) -> tuple[torch.Tensor, ...]:
        """Fresh (ids, mask, positions) for an eager tree pass of ``size`` tokens."""
        ids = torch.zeros((1, size), dtype=torch.long, device=self.device)
        mask = torch.full(
            (1, 1, size, self.capacity), torch.finfo(dtype).min, dtype=dtype, device=self.device
        )
        return ids, mask, torch.zeros((1, size), dtype=torch.long, device=self.device)

    def _tree_buffers(self, bucket: int, dtype) -> tuple[torch.Tensor, ...]:
        """The bucket's input buffers (a compiled graph, a CUDA graph most of all, reads the same
        tensors every call), the mask reset to "sees nothing"."""
        key = (bucket, self.capacity)
        if key not in self._tree_inputs:
            self._tree_inputs[key] = self._tree_scratch(bucket, dtype)
        ids, mask, positions = self._tree_inputs[key]
        mask.fill_(torch.finfo(dtype).min)
        return ids, mask, positions

    def _compile_tree(self, bucket: int, hidden: bool) -> None:
        """Run (and so compile) the tree graph of ``bucket`` tokens on scratch positions."""
        key = ("tree", bucket, self.capacity, hidden)
        if key in self._compiled:
            return
        dtype = self.model.get_input_embeddings().weight.dtype
        ids, mask, positions = self._tree_buffers(bucket, dtype)
        mask[0, 0, :, :bucket] = torch.zeros(bucket, bucket, dtype=dtype).masked_fill(
            ~torch.ones(bucket, bucket, dtype=torch.bool).tril(), torch.finfo(dtype).min
        )
        positions[0] = torch.arange(bucket, device=self.device)
        self._warm(key, lambda: self._run_tree(ids, mask, positions, hidden))

    @torch.inference_mode()
    def keep_path(self, path: list[int]) -> None:
        """Copy the accepted nodes' entries next to the committed ones, in place (the graphs are
        guarded on the cache tensors' addresses), and move the pointer behind them."""
        start, _ = self._tree
        move_path_entries(self._cache.layers, start, path, self.device)
        self._point(start + len(path))
        self._cached = start + len(path)

    # -- passes -------------------------------------------------------------------------------

    def _run(self, ids: torch.Tensor, bucket: int, hidden: bool):
        arguments = {"input_ids": ids, "logits_to_keep": bucket, "output_hidden_states": hidden}
        return self._pass((bucket, self.capacity, hidden), arguments)

    def _run_tree(self, ids, mask, positions, hidden: bool):
        arguments = {
            "input_ids": ids,
            "attention_mask": mask,
            "position_ids": positions,
            "logits_to_keep": ids.shape[1],
            "output_hidden_states": hidden,
        }
        return self._pass(("tree", ids.shape[1], self.capacity, hidden), arguments)

    def _pass(self, key: tuple, arguments: dict):
        """Run the pass ``key`` on the cache: its stored graph, else ``torch.compile``'s."""
        graph = self._graphs.get(key)
        if graph is not None:
            output = graph(cache=self._cache, **arguments)
        elif key in self._graphs and self._recording is not None:  # _arguments() asked: record only
            self._recording.update(cache=self._cache, **arguments)
            return None
        else:
            output = self._step(**arguments, **{self._cache_argument: self._cache}, use_cache=True)
        self._held += arguments["input_ids"].shape[1]
        return output

    def _arguments(self, run) -> dict:
        """The arguments ``run`` calls its pass with, recorded instead of running it."""
        self._recording = {}
        try:
            run()
            return self._recording
        finally:
            self._recording = None

    def _tree_eager(self, ids, mask, positions, hidden: bool, keep_logits: int):
        output = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            **{self._cache_argument: self._cache},
            use_cache=True,
            logits_to_keep=keep_logits,
            output_hidden_states=hidden,
        )
        self._held += ids.shape[1]
        return output

    def _eager(self, new: torch.Tensor, keep_logits: int, hidden: bool):
        output = self.model(
            input_ids=new[None],
            **{self._cache_argument: self._cache},
            use_cache=True,
            logits_to_keep=keep_logits,
            output_hidden_states=hidden,
        )
        self._held += new.shape[0]
        return output

    def _point(self, position: int) -> None:
        """Move the cache's pointer to ``position``: everything from there on is stale."""
        if self._held != position:  # StaticCache.crop, in one call over the layers instead of one each
            torch._foreach_add_(self._pointers, position - self._held)
            self._held = position
