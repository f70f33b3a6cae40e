#!/usr/bin/env bash
# Issue 9's device call ("Cheap enough to leave on"), one run on 2xH200, ~6 min with the JIT builds:
#   1. build ep_core (compiled out + instrumented) and the recorder extension, in parallel;
#   2. GPU tests of the issue: CUDA-graph replays with and without recording, the zero-token
#      FP8 rank (each rank in turn, BF16 and FP8, both scale layouts);
#   3. benchmarks/bench_ep.py: per op and SM count kernel / host / tight-loop / graph-replay time
#      beside DeepEP V1, and the recording-on / compiled-out ratios (BENCH_ARGS=--deepep DIR to
#      measure a built DeepEP in the same processes, baselines.md);
#   4. benchmarks/gpu/recorder_bench.py: cycles per record, workload overhead, SASS proof.
# Everything lands under $OUT (logs, result .md/.json); the short table prints last.
#   run (device tool, repo root): EP_COMMIT=<sha> bash benchmarks/gpu/hostcost_gpu.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH=. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}" MAX_JOBS="${MAX_JOBS:-32}"
OUT="${OUT:-/tmp/hostcost_out}"
mkdir -p "$OUT"
TESTS=${TESTS:-1} BENCH=${BENCH:-1} RECORDER=${RECORDER:-1}
BENCH_ARGS=${BENCH_ARGS:-}
# the device copy has no .git: the commit comes in from the CPU side
if [ -n "${EP_COMMIT:-}" ]; then export EPSCOPE_GIT_COMMIT="$EP_COMMIT" EPSCOPE_GIT_BRANCH="${EP_BRANCH:-main}"; fi
# cuobjdump for the recorder's SASS proof: the CUDA toolkit's, else the one in Triton's wheel
if ! command -v cuobjdump >/dev/null 2>&1; then
  tb=$(python -c "import triton, os; print(os.path.join(os.path.dirname(triton.__file__), 'backends/nvidia/bin'))" 2>/dev/null)
  [ -n "$tb" ] && export PATH="$PATH:$tb"
fi
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; echo "commit ${EP_COMMIT:-unknown}"; date -u; } \
  | tee "$OUT/gpu.txt"

t0=$(date +%s)
python -c "import ep_core._ext as X; X.load(False)" > "$OUT/build_ep_noprof.log" 2>&1 &
python -c "import ep_core._ext as X; X.load(True)" > "$OUT/build_ep_prof.log" 2>&1 &
python -c "from profiler.record.build import load_record_extension as L; L(profile=False)" > "$OUT/build_rec_noprof.log" 2>&1 &
python -c "from profiler.record.build import load_record_extension as L; L(profile=True)" > "$OUT/build_rec_prof.log" 2>&1 &
wait
echo "build: $(( $(date +%s) - t0 )) s"
if grep -qiE "error|Traceback" "$OUT"/build_*.log; then cat "$OUT"/build_*.log | tail -80; fi

if [ "$TESTS" = 1 ]; then
  timeout 240 python -m pytest -q -x -rA tests/gpu/test_ep_graphs.py \
    "tests/gpu/test_ep_acceptance.py::test_zero_token_rank_bf16_and_fp8_both_scale_layouts" 2>&1 \
    | tail -30 | tee "$OUT/gpu_tests.log"
  echo "tests: $(( $(date +%s) - t0 )) s"
fi
if [ "$BENCH" = 1 ]; then
  timeout 300 python benchmarks/bench_ep.py --ranks 2 --out "$OUT" $BENCH_ARGS 2>&1 | tee "$OUT/bench_ep.log" | tail -5
  echo "bench_ep: $(( $(date +%s) - t0 )) s"
fi
if [ "$RECORDER" = 1 ]; then
  timeout 120 python benchmarks/gpu/recorder_bench.py --out "$OUT" --reps 40 > "$OUT/recorder.log" 2>&1
  rc=$?
  echo "recorder: $(( $(date +%s) - t0 )) s (exit $rc)"
  [ "$rc" = 0 ] || tail -20 "$OUT/recorder.log"
fi
rm -f "$OUT"/build_*.log

echo; echo "==================== summary ===================="
[ -f "$OUT/gpu_tests.log" ] && tail -3 "$OUT/gpu_tests.log"
grep -h -A 40 "### Per op" "$OUT"/ep-2x*.md 2>/dev/null | head -60
grep -h -A 8 "## Cost per record" "$OUT"/recorder-*.md 2>/dev/null
echo "total: $(( $(date +%s) - t0 )) s"
