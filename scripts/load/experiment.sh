#!/usr/bin/env bash
# The load experiment behind results/load/ (README, "What a run survives"): the demo recipe on 3 prompts
# per dataset, with another process spinning on one of the 2 cores (2 threads, then 1), then on the quiet
# machine. Measured on a 2-core AMD EPYC with AVX512-BF16, bfloat16. Run from the repository root:
#   bash scripts/load/experiment.sh
set -euo pipefail
python3 -c "while True: pass" & SPIN=$!
trap 'kill $SPIN 2>/dev/null || true' EXIT
sleep 1
for t in 2 1; do
  rm -rf results/load/spinner_${t}threads
  /usr/bin/time -f "spinner, $t threads: %e s" .venv/bin/specbench run recipes/demo.yaml --limit 3 --threads $t -o results/load/spinner_${t}threads
done
kill $SPIN
rm -rf results/load/quiet_2threads
/usr/bin/time -f "quiet, 2 threads: %e s" .venv/bin/specbench run recipes/demo.yaml --limit 3 -o results/load/quiet_2threads
