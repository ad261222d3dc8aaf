#!/usr/bin/env bash
# The runs results/prediction/ validates predictions on, measured on this machine one after another
# (nothing else running): demo in bfloat16 eager (dtype auto on a CPU with bfloat16 units), float32
# eager and bfloat16 compiled, and the fuller quickstart. Usage: bash scripts/prediction/measure.sh LABEL
set -euo pipefail
label=${1:?name the machine, e.g. amd-epyc-family26-avx512-bf16}
out=results/prediction/$label
mkdir -p "$out"
specbench run recipes/demo.yaml --output-dir "$out/demo" --resume
specbench run recipes/prediction/demo_float32.yaml --output-dir "$out/demo_float32" --resume
specbench run recipes/prediction/demo_compiled.yaml --output-dir "$out/demo_compiled" --resume
specbench run recipes/quickstart.yaml --output-dir "$out/quickstart" --resume
# after `make drafts`, with SPECBENCH_DATA_DIR at the offline GSM8K and Spec-Bench samples: the distilled drafters' run, committed from the AMX Xeon as results/drafters/smollm2_offline_repeats
specbench run recipes/drafters/smollm2_offline_repeats.yaml --output-dir "$out/drafters_repeats" --resume
