#!/usr/bin/env bash
# Issue 11's device call (tma2): build the extensions, run hook mode's GPU tests, the one-run
# measurement (benchmarks/gpu/tma_bench.py: kernel table + hook-vs-normal table with an 8192^2
# matmul, printed last) and, with STORIES=1, the two A/B story groups of the catalogue
# (python -m ep_core.catalogue --only ab-tma-buffers,ab-hook). Everything lands under $OUT.
#   run (device tool, 2 GPUs):  EP_COMMIT=<commit> bash benchmarks/gpu/tma_gpu.sh
# Steps (1 = run): TESTS, BENCH, STORIES (default 1, 1, 0). Budget: ~2 min build (3 in parallel),
# ~2 min tests, ~3 min bench; stories ~3 min (a second call: the builds under build/ are reused
# while the machine stays warm).
set -uo pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=${MAX_JOBS:-16}
export EPSCOPE_BUILD_DIR=${EPSCOPE_BUILD_DIR:-$PWD/build/epscope}
OUT=${OUT:-/tmp/tma_gpu_out}
mkdir -p "$OUT"
TESTS=${TESTS:-1} BENCH=${BENCH:-1} STORIES=${STORIES:-0}
if [ -n "${EP_COMMIT:-}" ]; then export EPSCOPE_GIT_COMMIT="$EP_COMMIT" EPSCOPE_GIT_BRANCH="${EP_BRANCH:-main}"; fi
{ nvidia-smi --query-gpu=name,driver_version --format=csv; echo "commit ${EP_COMMIT:-unknown (no .git on the device)}"; date -u; } \
  | tee "$OUT/gpu.txt"

t0=$(date +%s)
python -c "import ep_core._ext as X; X.load(False)" > "$OUT/build_noprof.log" 2>&1 &
python -c "import ep_core._ext as X; X.load(True)" > "$OUT/build_prof.log" 2>&1 &
python -c "from profiler.record.build import load_record_extension as L; L(profile=False)" > "$OUT/build_record.log" 2>&1 &
wait
echo "build: $(( $(date +%s) - t0 )) s"; for f in "$OUT"/build_*.log; do tail -n 3 "$f"; done

rc=0
if [ "$TESTS" = 1 ]; then
  timeout 300 python -m pytest -q -x -rA tests/gpu/test_ep_hook.py 2>&1 | tail -40 | tee "$OUT/hook_tests.log"
  [ "${PIPESTATUS[0]}" = 0 ] || rc=1
fi
if [ "$BENCH" = 1 ]; then
  timeout 420 python benchmarks/gpu/tma_bench.py --out "$OUT" 2>&1 | tail -80 | tee "$OUT/tma_bench.log"
  [ "${PIPESTATUS[0]}" = 0 ] || rc=1
fi
if [ "$STORIES" = 1 ]; then
  timeout 420 python -m ep_core.catalogue --out "$OUT/traces" --only ab-tma-buffers,ab-hook 2>&1 \
    | tee "$OUT/stories.log"
  [ "${PIPESTATUS[0]}" = 0 ] || rc=1
  if [ -d "$OUT/traces" ]; then
    du -sk "$OUT"/traces/* | tee -a "$OUT/stories.log"
    tar czf "$OUT/tma_traces.tar.gz" -C "$OUT" traces && rm -rf "$OUT/traces"
  fi
fi
if grep -qiE "error|Traceback" "$OUT"/build_*.log; then cat "$OUT"/build_*.log | gzip > "$OUT/build_logs.gz"; fi
rm -f "$OUT"/build_*.log
echo "total: $(( $(date +%s) - t0 )) s"
exit "$rc"
