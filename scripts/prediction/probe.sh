#!/usr/bin/env bash
# The cost profiles of results/prediction/LABEL/, probed on this machine one after another (nothing
# else running). Usage: bash scripts/prediction/probe.sh LABEL
set -euo pipefail
label=${1:?name the machine, e.g. amd-epyc-family26-avx512-bf16}
out=results/prediction/$label
specbench probe recipes/demo.yaml --out "$out/profile_bfloat16_eager.json" --roofline
specbench probe recipes/prediction/demo_float32.yaml --out "$out/profile_float32_eager.json"
# a compiled pass reads its whole static cache: contexts like the demo's, whose requests stay under 256
specbench probe recipes/prediction/demo_compiled.yaml --out "$out/profile_bfloat16_compiled.json" \
  --sizes 1,2,3,4,5,32,64,128 --contexts 32,128,224
# after `make drafts`: SmolLM2 and its distilled drafters in float32, as recipes/drafters/smollm2_offline_repeats.yaml runs them
specbench probe recipes/drafters/smollm2_offline_repeats.yaml --out "$out/profile_float32_drafters.json" \
  --sizes 1,2,3,4,5,8,16,64,128,256 --contexts 32,256
