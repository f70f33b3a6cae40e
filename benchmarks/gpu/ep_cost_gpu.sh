#!/usr/bin/env bash
# The EP kernels' recording cost on one rank alone (benchmarks/gpu/recorder_ep_cost.py: compiled
# out / instrumented with recording off / on, rounds interleaved), with both ep_core builds.
# Usage (repo root, on the GPU machine): OUT=/tmp/out bash benchmarks/gpu/ep_cost_gpu.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source benchmarks/gpu/env.sh   # the checkout on PYTHONPATH, NVLink multicast off
export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}" MAX_JOBS="${MAX_JOBS:-16}"
export EPSCOPE_BUILD_DIR=${EPSCOPE_BUILD_DIR:-$PWD/build/epscope}
OUT="${OUT:-/tmp/epscope-ep-cost-out}"
mkdir -p "$OUT"
{
  echo "commit ${EP_COMMIT:-unknown}  date $(date -u +%FT%TZ)"
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import ep_core._ext as X; X.load(False)" > "$OUT/build_ep.log" 2>&1 &
  python3 -c "import ep_core._ext as X; X.load(True)" > "$OUT/build_ep_prof.log" 2>&1 &
  wait
  timeout 240 python3 benchmarks/gpu/recorder_ep_cost.py --out "$OUT"
  echo "ep cost exit $?"
} 2>&1 | tee "$OUT/ep_cost.log"
