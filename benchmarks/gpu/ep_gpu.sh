#!/usr/bin/env bash
# ep-kernels' device call: build both extension variants once, check ep_core against the
# reference and benchmark it (benchmarks/gpu/ep_kernels_bench.py, table printed last), record
# profiled traces, then run ep-harness's GPU acceptance tests if they exist. Everything it
# writes lands under $OUT (logs, results JSON, traces tarball).
#   run (device tool): bash benchmarks/gpu/ep_gpu.sh
set -uo pipefail
source benchmarks/gpu/env.sh   # the checkout on PYTHONPATH, NVLink multicast off
export TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=32
OUT=${OUT:-/tmp/ep_gpu_out}
mkdir -p "$OUT"
BENCH_TIMEOUT=${BENCH_TIMEOUT:-330}
TESTS_TIMEOUT=${TESTS_TIMEOUT:-150}
BENCH_ARGS=${BENCH_ARGS:-}
# steps (1 = run): own checks+bench, profiled traces, ep-harness's bench_ep.py table, GPU tests
OWN=${OWN:-1} TRACES=${TRACES:-1} HARNESS_BENCH=${HARNESS_BENCH:-1} TESTS=${TESTS:-1} EP_TRACE=${EP_TRACE:-1}
HARNESS_BENCH_ARGS=${HARNESS_BENCH_ARGS:-}

# the device copy has no .git: pass the commit in (EP_COMMIT=$(git rev-parse HEAD) on the CPU
# side) so run manifests and result files name it (profiler.record.session.git_info)
if [ -n "${EP_COMMIT:-}" ]; then export EPSCOPE_GIT_COMMIT="$EP_COMMIT" EPSCOPE_GIT_BRANCH="${EP_BRANCH:-main}"; fi
{ nvidia-smi --query-gpu=name,driver_version --format=csv; echo "commit ${EP_COMMIT:-unknown (no .git on the device)}"; date -u; } \
  | tee "$OUT/gpu.txt"

t0=$(date +%s)
# three independent JIT builds in parallel (each has its own cache directory)
python -c "import ep_core._ext as X; X.load(False)" > "$OUT/build_noprof.log" 2>&1 &
python -c "import ep_core._ext as X; X.load(True)" > "$OUT/build_prof.log" 2>&1 &
python -c "from profiler.record.build import load_record_extension as L; L(profile=False)" > "$OUT/build_record.log" 2>&1 &
wait
echo "build: $(( $(date +%s) - t0 )) s"; for f in "$OUT"/build_*.log; do tail -n 3 "$f"; done

if [ "$OWN" = 1 ]; then
  targs=(); [ "$TRACES" = 1 ] && targs=(--traces "$OUT/traces")
  timeout "$BENCH_TIMEOUT" python benchmarks/gpu/ep_kernels_bench.py --out "$OUT" "${targs[@]}" $BENCH_ARGS \
    2>&1 | tee "$OUT/bench.log"
fi
if [ "$HARNESS_BENCH" = 1 ] && [ -f benchmarks/bench_ep.py ]; then
  timeout 360 python benchmarks/bench_ep.py --ranks 2 --out "$OUT" $HARNESS_BENCH_ARGS 2>&1 | tail -60 | tee "$OUT/bench_ep.log"
fi
if [ "$EP_TRACE" = 1 ] && [ -f profiler/workflows/trace.py ]; then
  # the same three scenarios through ep-harness's `epscope trace`
  mkdir -p "$OUT/traces"
  et="python -m profiler.workflows.trace --ranks 2 --out $OUT/traces --iters 6 --profile-iters 2"
  { timeout 90 $et --routing uniform --name epscope-trace-2rank-balanced
    timeout 90 $et --routing skewed --name epscope-trace-2rank-skewed
    timeout 90 $et --force-timeout-rank 1 --timeout-s 1 --name epscope-trace-2rank-forced-timeout; } 2>&1 \
    | tail -60 | tee "$OUT/epscope_trace.log"
fi
if [ -d "$OUT/traces" ]; then
  [ -f "$OUT/epscope_trace.log" ] && mv "$OUT/epscope_trace.log" "$OUT/traces/"
  tar czf "$OUT/traces.tar.gz" -C "$OUT" traces && rm -rf "$OUT/traces"
fi

shopt -s nullglob
tests=(tests/gpu/test_ep_*.py)
if [ "$TESTS" = 1 ] && [ ${#tests[@]} -gt 0 ]; then
  timeout "$TESTS_TIMEOUT" python -m pytest -q -x -rA "${tests[@]}" 2>&1 | tail -40 | tee "$OUT/gpu_tests.log"
fi
# build logs come back only when a build failed (at most 8 files return from $OUT)
if grep -qiE "error|Traceback" "$OUT"/build_*.log; then cat "$OUT"/build_*.log | gzip > "$OUT/build_logs.gz"; fi
rm -f "$OUT"/build_*.log
echo "total: $(( $(date +%s) - t0 )) s"
