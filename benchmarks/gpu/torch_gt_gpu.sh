#!/usr/bin/env bash
# Issue 30 on one GPU, one call: build ep_core (both variants), record the ground-truth runs
# (benchmarks/gpu/torch_blame_gt.py), the example (examples/moe_step.py, an upstream GEMM on its
# one rank), the GPU test, and the 1 M-event Kineto read on this host's CPU. Logs and runs under $OUT.
# Usage (repo root, on the GPU machine): OUT=/tmp/out bash benchmarks/gpu/torch_gt_gpu.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source benchmarks/gpu/env.sh   # the checkout on PYTHONPATH, NVLink multicast off
export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}" MAX_JOBS="${MAX_JOBS:-16}" EPSCOPE_NO_ANALYZE=0
export EPSCOPE_BUILD_DIR=${EPSCOPE_BUILD_DIR:-$PWD/build/epscope}
OUT="${OUT:-/tmp/epscope-torch-out}"
mkdir -p "$OUT/runs"
LOG="$OUT/torch_gt.log"
{
  echo "commit ${EPSCOPE_GIT_COMMIT:-unknown}  date $(date -u +%FT%TZ)"
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -m pip install --no-index --no-deps -q .whl/*.whl 2>&1 | tail -1
  python3 -c 'import torch, ijson, msgspec; print("torch", torch.__version__, "cuda", torch.version.cuda, "ijson", ijson.__version__, ijson.backend, "msgspec", msgspec.__version__)'
  t0=$(date +%s)
  python3 -c "import ep_core._ext as X; X.load(False)" > "$OUT/build_ep.log" 2>&1 &
  python3 -c "import ep_core._ext as X; X.load(True)" > "$OUT/build_ep_prof.log" 2>&1 &
  wait
  echo "build: $(( $(date +%s) - t0 )) s"; tail -n 2 "$OUT"/build_*.log
  echo "== ground truth"; timeout 240 python3 benchmarks/gpu/torch_blame_gt.py --out "$OUT/runs" --iters 8; echo "gt exit $?"
  echo "== example"; timeout 200 python3 examples/moe_step.py --ranks 1 --out "$OUT/runs" --upstream-gemm-rank 0; echo "example exit $?"
  echo "== epscope trace --torch-profiler"; timeout 150 python3 -m profiler.workflows.trace --ranks 1 --tokens 512 --hidden 2048 --experts 16 --topk 4 --iters 3 --profile-iters 2 --torch-profiler --out "$OUT/runs" --name trace-torch-1rank; echo "trace exit $?"
  echo "== gpu test"; timeout 200 python3 -m pytest -q -rs tests/gpu/test_torch_profiler_gpu.py -p no:cacheprovider; echo "pytest exit $?"
  echo "== 1M-event read on this host"; timeout 200 python3 benchmarks/bench_kineto.py --events 1000000 --out "$OUT/kineto-read-h200host.md"; echo "bench exit $?"
  du -sh "$OUT"/runs/*
} 2>&1 | tee "$LOG"
# the example's stored trace (with_stack, ~24 MB) stays behind: it is no bundled run, and the device
# tool returns files of 16 MB at most
tar -C "$OUT" -czf "$OUT/runs.tgz" --exclude='moe-step/torch' --exclude='moe-step.rank*.pt.trace.json.gz' runs && rm -rf "$OUT/runs"
