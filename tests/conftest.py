"""Shared test setup: the ``slow`` marker gate and tiny float64 models built in-process."""

from __future__ import annotations

import copy
import functools
import os
from collections import Counter

import pytest
import torch
import torch.utils._python_dispatch

from specbench.models.base import ModelDrafter
from specbench.models.compiled import ENGINES, CompiledHFModel
from specbench.models.hf import HFModel
from specbench.models.tiny import build_tiny

__all__ = ["ENGINES", "TWO_CELL_RECIPE", "engine_model"]

# a tiny float64 target with AR and prompt-lookup SD on three arithmetic questions: a real run in seconds
TWO_CELL_RECIPE = """\
name: two-cells
seed: 0
warmup: 0
generation: {max_new_tokens: 8, temperature: 0.0}
models:
  target: {source: tiny-llama, dtype: float64, options: {seed: 1, init_std: 0.3}}
  lookup: {source: prompt-lookup}
datasets:
  - {task: arithmetic, limit: 3}
methods:
  - {name: ar, method: autoregressive, target: target}
  - {name: sd, method: speculative, target: target, drafter: lookup, params: {k: 2}}
"""


# the draft lengths tests use: a compiled test model compiles a pass of each + 1 tokens
TEST_DRAFT_LENGTHS = (2, 4, 8)  # buckets 1, 3, 5, 9: the others pad


class PooledCompiledModel(CompiledHFModel):
    """A compiled test model whose static cache comes from a pool shared by the test session.

    Dynamo guards each graph on the addresses of the cache it was traced with, and tracing a tiny
    Llama costs ~0.6 s a shape; tests build hundreds of short-lived models. Models of one shape and
    name take turns with one cache, so they share graphs (quick mode: weights are graph inputs, not
    constants). Only the latest model to take a cache may use it."""

    pool: dict = {}

    def _new_cache(self, capacity: int):
        config = self.model.config.get_text_config(decoder=True)
        slot = (config.to_json_string(), str(self.model.dtype), capacity, self.name)
        if slot not in self.pool:
            self.pool[slot] = [super()._new_cache(capacity), None]
        entry = self.pool[slot]
        entry[1] = self
        self._slot = entry
        for layer in entry[0].layers:  # the previous user's pointer
            if layer.is_initialized:
                layer.cumulative_length.zero_()
        return entry[0]

    def score(self, tokens, n_candidates, hidden=()):
        assert self._slot[1] is self, f"{self.name}: another test model took over this model's cache"
        return super().score(tokens, n_candidates, hidden)


def engine_model(
    weights: torch.nn.Module, name: str, engine: str = "eager", draft_lengths=TEST_DRAFT_LENGTHS
):
    """``weights`` behind the interface of ``engine``. Compiled test models compile quickly (inductor
    without weight freezing or autotuning: the same static cache, padded buckets and graphs) and
    share caches by shape and name (:class:`PooledCompiledModel`)."""
    if engine == "eager":
        return HFModel(weights, name)
    model = PooledCompiledModel(weights, name, quick=True)
    model.prepare(64, draft_lengths)
    return model


# Test files that take minutes (the real vLLM engine and server, measured at about 350 s together on a
# 2-core AMD EPYC): pytest-xdist (``--dist loadfile``) otherwise hands out files with the most tests
# first, which left this one to run last on one worker while the other sat idle.
LONGEST_FILES = ("tests/test_vllm_real.py",)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile`` with :data:`LONGEST_FILES` handed out first."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class LongestFirst(LoadFileScheduling):
        def _assign_work_unit(self, node):
            if not getattr(self, "_ordered", False):
                self._ordered = True
                for scope in [s for s in self.workqueue if s in LONGEST_FILES]:
                    self.workqueue.move_to_end(scope, last=False)
            super()._assign_work_unit(node)

    return LongestFirst(config, log)


def pytest_collection_modifyitems(config, items):
    """Tests marked ``slow`` (real checkpoints, minutes on CPU) run only with SPECBENCH_SLOW=1."""
    if os.environ.get("SPECBENCH_SLOW") == "1":
        return
    skip = pytest.mark.skip(reason="slow test: set SPECBENCH_SLOW=1 to run")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def one_thread():
    """Tiny models run ~30x faster on one intra-op thread (no thread sync, no oversubscription)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _tiny_model(kind: str, seed: int, vocab_size: int = 16, **options) -> torch.nn.Module:
    """A random-init float64 tiny model whose next-token distributions are far from uniform.

    tiny-llama: ``init_std`` 0.5 by default. tiny-t5 maps ``init_std`` to T5's initializer factor
    (std / 0.02), so large values saturate it; and its tied, rescaled LM head makes a random T5
    repeat its input token forever. It keeps the default scale and gets a random final-norm gain,
    which breaks that self-similarity and gives varied, peaky outputs.
    """
    if kind == "tiny-llama":
        options.setdefault("init_std", 0.5)
        model, _ = build_tiny(kind, dtype=torch.float64, seed=seed, vocab_size=vocab_size, **options)
    else:
        model, _ = build_tiny(kind, dtype=torch.float64, seed=seed, vocab_size=vocab_size, **options)
        gain = model.decoder.final_layer_norm.weight
        with torch.no_grad():
            gen = torch.Generator().manual_seed(10_000 + seed)
            gain.copy_(3.0 * torch.randn(gain.shape, generator=gen, dtype=gain.dtype))
    return model


@pytest.fixture(scope="session")
def tiny_model():
    """Cached builder ``(kind, seed, vocab_size=16, **options) -> nn.Module``; treat the result as
    read-only (it is shared), ``copy.deepcopy`` it before changing weights."""
    return functools.cache(_tiny_model)


def model_roles(tiny_model, vocab_size: int, noise: float, same: tuple[str, ...] = ("target",)):
    """``get(kind, seed, role)``: the target's own weights for a role in ``same``, an unrelated model for
    "other", and for "noisy" a copy of the target with Gaussian noise of ``noise`` times each weight
    tensor's std (built once: partial agreement with the target)."""
    noisy = {}

    def get(kind: str, seed: int, role: str = "target") -> torch.nn.Module:
        if role in same:
            return tiny_model(kind, seed, vocab_size=vocab_size)
        if role == "other":
            return tiny_model(kind, 100 + seed, vocab_size=vocab_size)
        if (kind, seed) not in noisy:
            model = noisy[kind, seed] = copy.deepcopy(tiny_model(kind, seed, vocab_size=vocab_size))
            gen = torch.Generator().manual_seed(20_000 + seed)
            with torch.no_grad():
                for param in model.parameters():
                    if param.numel() > 1:
                        param.add_(
                            noise * param.std() * torch.randn(param.shape, generator=gen, dtype=param.dtype)
                        )
        return noisy[kind, seed]

    return get


@pytest.fixture
def tiny_pair(tiny_model, one_thread):
    """Factory: (target HFModel, drafter ModelDrafter) of one kind; equal seeds share the weights
    (each wrapper keeps its own KV cache)."""

    def make(
        kind: str = "tiny-llama",
        target_seed: int = 0,
        drafter_seed: int = 1,
        engine: str = "eager",
        draft_lengths=TEST_DRAFT_LENGTHS,
        **options,
    ):
        target = engine_model(tiny_model(kind, target_seed, **options), "target", engine, draft_lengths)
        drafter = engine_model(tiny_model(kind, drafter_seed, **options), "drafter", engine, draft_lengths)
        return target, ModelDrafter(drafter)

    return make


class OpCount(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts the aten operations dispatched inside it: each is at least one kernel launch on a GPU,
    so a loop's count per step is its launch overhead there, whatever the device that counts it."""

    def __init__(self):
        super().__init__()
        self.ops = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        return sum(self.ops.values())
