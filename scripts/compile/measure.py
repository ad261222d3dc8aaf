"""Time the compiled engine's compilation and its one-token pass on SmolLM2-135M-Instruct bfloat16.

    python -m scripts.compile.measure '{}'                              # the engine as it is
    python -m scripts.compile.measure '{"freezing": true, "cpp.weight_prepack": false}'   # other options

Compiles (or loads) the passes of 1 and 5 tokens with ``CompiledHFModel.prepare`` (the inductor
options given are merged into the engine's CPU options), prints the seconds it took and what the
cache gave, then the median and minimum of 39 one-token passes. Run it twice with the same
SPECBENCH_COMPILE_CACHE folder: the second process is what "compiled once" is about.
"""

import json
import sys
import time

STARTED = time.perf_counter()  # before torch is imported: start_and_load_s counts the import
import torch  # noqa: E402

from specbench import sources  # noqa: E402
from specbench.models import compiled  # noqa: E402
from specbench.models.machine import this_machine  # noqa: E402


def main() -> None:
    options = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
    compiled.CPU_OPTIONS = {**compiled.CPU_OPTIONS, **options}
    request = sources.ModelRequest("target", "smollm2-135m-instruct", "bfloat16", "cpu", options=())
    target = sources.load(request)
    loaded = time.perf_counter()
    model = compiled.CompiledHFModel(target.model, "target", target.tokenizer)
    seconds = model.prepare(200, (4,))
    print(
        json.dumps(
            {
                "machine": this_machine().describe(),
                "options": compiled.CPU_OPTIONS,
                "start_and_load_s": round(loaded - STARTED, 1),
                "compile_s": round(seconds, 1),
                "cache": dict(model.compile_cache),
            }
        ),
        flush=True,
    )
    ids = torch.arange(10, 60)
    model.start(ids[:20])
    model.score(ids[20:21], 0)
    times = []
    for end in range(21, 60):
        begin = time.perf_counter()
        model.score(ids[20 : end + 1], 0)
        times.append(time.perf_counter() - begin)
    times.sort()
    median, fastest = times[len(times) // 2], times[0]
    print(json.dumps({"one_token_ms_median": round(1000 * median, 2), "min": round(1000 * fastest, 2)}))


if __name__ == "__main__":
    main()
