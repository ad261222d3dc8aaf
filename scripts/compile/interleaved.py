"""One-token passes of SmolLM2-135M-Instruct bfloat16 under several compile configurations, timed in
one process, interleaved pass by pass, so that the machine's drift hits every configuration alike.

    SPECBENCH_COMPILE_CACHE=DIR python -m scripts.compile.interleaved NAME=OPTIONS_JSON ...

Each configuration gets its own model object over the same weights (its own static cache); its
inductor options are merged into the engine's CPU options. Prints each one's compile seconds and
cache outcome, then the median one-token pass of each over 60 rounds and its ratio to the first.
"""

import json
import sys
import time

import torch

from specbench import sources
from specbench.models import compiled
from specbench.models.machine import this_machine


def main() -> None:
    configurations = [argument.split("=", 1) for argument in sys.argv[1:]]
    request = sources.ModelRequest("target", "smollm2-135m-instruct", "bfloat16", "cpu", options=())
    weights = sources.load(request)
    print(this_machine().describe())
    engine_options = dict(compiled.CPU_OPTIONS)
    models = []
    for name, options in configurations:
        compiled.CPU_OPTIONS = {**engine_options, **json.loads(options)}
        model = compiled.CompiledHFModel(weights.model, name, weights.tokenizer)
        seconds = model.prepare(200, (4,))
        print(
            json.dumps(
                {
                    "name": name,
                    "options": compiled.CPU_OPTIONS,
                    "compile_s": round(seconds, 1),
                    "cache": dict(model.compile_cache),
                }
            ),
            flush=True,
        )
        models.append(model)
    ids = torch.arange(10, 90)
    for model in models:
        model.start(ids[:20])
        model.score(ids[20:21], 0)
    times = {model.name: [] for model in models}
    for end in range(21, 81):
        for model in models:
            begin = time.perf_counter()
            model.score(ids[20 : end + 1], 0)
            times[model.name].append(time.perf_counter() - begin)
    first = sorted(times[models[0].name])[30]
    for name, seconds in times.items():
        median = sorted(seconds)[30]
        ratio = median / first
        print(f"{name}: one-token pass {1000 * median:.2f} ms (median of 60), {ratio:.3f}x {models[0].name}")


if __name__ == "__main__":
    main()
