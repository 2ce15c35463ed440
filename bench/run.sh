#!/usr/bin/env bash
# Builds the release binaries and runs the end-to-end benchmarks (bench/e2e.py) and, with
# --micro, the criterion micro-benchmarks. Arguments after the options go to e2e.py.
set -euo pipefail
cd "$(dirname "$0")/.."
micro=0
if [[ "${1:-}" == "--micro" ]]; then micro=1; shift; fi
cargo build --release -p sluice -p sluice-loadgen
python3 bench/e2e.py "$@"
if [[ $micro == 1 ]]; then
  cargo bench -p sluice-inputs -p sluice-expr -p sluice-processors -p sluice-segment -p sluice-queue -p sluice-registry -- --warm-up-time 1 --measurement-time 3
fi
