"""Compiled passes kept on disk, so that a second process loads them instead of compiling.

``torch.compile`` caches inductor's kernels and, where it can, its FX graphs; a second process still
traces the model with dynamo and AOTAutograd (25 s for SmolLM2's two passes with frozen weights, and
200 s when oneDNN's prepacked weights made the FX graph uncacheable). Here each pass is compiled ahead
of time as one full graph (dynamo's ``aot_compile``: the graph, its guards and inductor's code), saved
to a file named by what the graph depends on, and loaded by the next process in about a second.

The weights are inputs of the graphs, not constants (no freezing), so one file serves every model of
the same architecture, dtype and pass shape. A pass that cannot be compiled into one graph, or whose
graph cannot be saved, returns None: the caller compiles it the usual way, and it counts as a bypass.
"""

from __future__ import annotations

import hashlib
import json
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import torch
import transformers

from specbench.models.cache import write_atomic

# bump when what a graph file holds, or how a pass is called, changes
FORMAT = 1


class Output(NamedTuple):
    logits: torch.Tensor
    hidden_states: tuple[torch.Tensor, ...]


class Step(torch.nn.Module):
    """One decoder pass as a function of tensors and constants: what the stored graphs are traced from.
    (A module of its own, since transformers' decorated ``forward`` cannot be pickled by name.)"""

    def __init__(self, model: torch.nn.Module, cache_argument: str):
        super().__init__()
        self.model = model
        self.cache_argument = cache_argument

    def forward(
        self,
        input_ids: torch.Tensor,
        cache,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        logits_to_keep: int = 1,
        output_hidden_states: bool = False,
    ):
        output = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=True,
            logits_to_keep=logits_to_keep,
            output_hidden_states=output_hidden_states,
            **{self.cache_argument: cache},
        )
        return output.logits, tuple(output.hidden_states) if output_hidden_states else ()


def _serializable(entries) -> list[bool]:
    """Keep the guards on the inputs' shapes, dtypes and constants; drop those a file cannot hold
    (object identities, globals, and the code objects of transformers' decorators), which the file's
    name stands for instead."""
    from torch._dynamo.guards import CheckFunctionManager

    unsupported = CheckFunctionManager.UNSUPPORTED_SERIALIZATION_GUARD_TYPES
    return [
        not (
            entry.is_global
            or entry.guard_type in unsupported
            or "__code__" in entry.name
            or "__closure__" in entry.name
        )
        for entry in entries
    ]


# graphs this process has loaded or compiled, by file: a model built again (a tune's rounds, a test's
# hundreds of short-lived models) reuses them without reading the file again
_IN_PROCESS: dict[Path, object] = {}


class GraphStore:
    """The stored graphs of one model: :meth:`graph` gives the compiled pass for a key, loaded ("hit")
    or compiled and saved ("miss"), or None where it cannot be stored ("bypass")."""

    def __init__(self, model: torch.nn.Module, cache_argument: str, folder: str | Path, options: dict):
        self.step = Step(model, cache_argument)
        self.options = options
        self.bypassed: dict[tuple, str] = {}  # key -> why its graph was not stored
        self.folder = Path(folder) / "graphs"
        config = {
            k: v
            for k, v in model.config.to_dict().items()
            if k not in ("_name_or_path", "transformers_version")
        }
        dtype = next(model.parameters()).dtype
        self._identity = {
            "format": FORMAT,
            "class": type(model).__qualname__,
            "config": config,
            "dtype": str(dtype),
            "device": next(model.parameters()).device.type,
            "options": options,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
        }

    def path(self, key: tuple) -> Path:
        payload = json.dumps({**self._identity, "pass": key}, sort_keys=True, default=str)
        return self.folder / f"{hashlib.sha256(payload.encode()).hexdigest()[:24]}.graph"

    def graph(self, key: tuple, kwargs: dict) -> tuple[Callable | None, str]:
        """The compiled pass for ``key`` (any hashable description of its shapes) called with
        ``kwargs``, and how it was found: "hit", "miss" or "bypass" (None: compile it otherwise)."""
        path = self.path(key)
        refused = path.with_suffix(".bypass")
        if refused.is_file():  # an earlier process could not store it: do not pay for trying again
            self.bypassed[key] = refused.read_text().strip()
            return None, "bypass"
        if path in _IN_PROCESS:
            return self._bind(_IN_PROCESS[path]), "hit"
        if path.is_file():
            try:
                loaded = self._load(path.read_bytes())
                if loaded.guard_check(self.step, **kwargs):
                    _IN_PROCESS[path] = loaded
                    return self._bind(loaded), "hit"
            except Exception:  # a torn file
                pass
            path.unlink(missing_ok=True)  # torn, or its guards refuse these inputs: compile it again
        try:
            compiled = self._compile(kwargs)
        except Exception as error:  # a graph break, or a model dynamo cannot take whole
            self.bypassed[key] = _reason(error)
            write_atomic(refused, self.bypassed[key] + "\n")
            return None, "bypass"
        try:
            self._save(path, compiled)
        except Exception as error:  # compiled, but not storable: this process still uses it
            self.bypassed[key] = _reason(error)
            write_atomic(refused, self.bypassed[key] + "\n")
            return self._bind(compiled), "bypass"
        _IN_PROCESS[path] = compiled
        return self._bind(compiled), "miss"

    def _compile(self, kwargs: dict):
        from torch._dynamo.aot_compile import ModelInput

        module = torch.compile(
            self.step, fullgraph=True, dynamic=False, options={"guard_filter_fn": _serializable}
        )
        with torch._inductor.config.patch(self.options):
            module._aot_compile([ModelInput((), kwargs, [])])
        (compiled,) = module.forward.compiled_results
        return compiled

    def _save(self, path: Path, compiled) -> None:
        from torch._dynamo.aot_compile import AOTCompiledFunction

        write_atomic(path, AOTCompiledFunction.serialize(compiled).serialized_data)

    def _load(self, data: bytes) -> Callable:
        from torch._dynamo.aot_compile import AOTCompiledModel

        (compiled,) = AOTCompiledModel.deserialize(self.step, pickle.dumps([data])).compiled_results
        return compiled

    def _bind(self, compiled) -> Callable:
        """The graph as a function of the pass's arguments. Its guards were checked against the
        arguments it was found for; they are not checked at every call (1.2 ms of a 22 ms SmolLM2
        pass), since the caller keys each graph by every shape it is called with."""
        compiled.disable_guard_check()
        step = self.step

        def run(**kwargs) -> Output:
            logits, hidden = compiled(step, **kwargs)
            return Output(logits, hidden)

        return run


def _reason(error: Exception) -> str:
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}"
