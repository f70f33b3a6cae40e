#!/usr/bin/env bash
# The GPU tests one H200 can run (the `gpu and not multigpu` markers), at the checkout's commit:
# build the extensions in parallel once, then run them; the two-GPU tests are collected and skip
# with their reason. Logs: $OUT/onegpu_tests.log (and the build logs), for benchmarks/results/.
# Usage (repo root, on the GPU machine): OUT=/tmp/out bash benchmarks/gpu/onegpu_tests.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source benchmarks/gpu/env.sh   # the checkout on PYTHONPATH, NVLink multicast off
export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}" MAX_JOBS="${MAX_JOBS:-16}"
export EPSCOPE_BUILD_DIR=${EPSCOPE_BUILD_DIR:-$PWD/build/epscope}
OUT="${OUT:-/tmp/epscope-onegpu-out}"
mkdir -p "$OUT"
LOG="$OUT/onegpu_tests.log"
{
  echo "commit $(git rev-parse HEAD 2>/dev/null || echo unknown)  date $(date -u +%FT%TZ)"
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count())'
  t0=$(date +%s)
  python3 -c "import ep_core._ext as X; X.load(False)" > "$OUT/build_ep.log" 2>&1 &
  python3 -c "import ep_core._ext as X; X.load(True)" > "$OUT/build_ep_prof.log" 2>&1 &
  python3 -c "from profiler.record.build import load_record_extension as L; L(profile=True)" > "$OUT/build_rec.log" 2>&1 &
  python3 -c "from profiler.record.build import load_record_extension as L; L(profile=False)" > "$OUT/build_rec_off.log" 2>&1 &
  wait
  echo "build: $(( $(date +%s) - t0 )) s"; for f in "$OUT"/build_*.log; do echo "-- $f"; tail -n 2 "$f"; done
  timeout 420 python3 -m pytest -q -rs tests/gpu -m "gpu and not multigpu" -p no:cacheprovider
  echo "pytest exit $?"
} 2>&1 | tee "$LOG"
