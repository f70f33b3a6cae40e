#!/usr/bin/env bash
# Issue 11's device call (tma3): everything in ONE call on 2 GPUs, the compact table printed last.
#   EP_COMMIT=<commit> bash benchmarks/gpu/tma_gpu.sh          (device kind nvidia-h200-x2)
# Steps and expected device time (2xH200, 16+ cores; measured at 418ddf3 where noted):
#   build   3 extensions in parallel                       ~2 min (0 when build/ is already warm)
#   TESTS   tests/gpu/test_ep_tma.py + test_ep_hook.py      ~2.5 min (tma 85 s at 6a0331a, hook ~60 s)
#   BENCH   benchmarks/gpu/tma_bench.py: direct and tma N=1,2,3 at 24/64 SMs, balanced and 1.5x
#           imbalance; hook vs normal with the 8192^2 matmul  ~1 min (21.5 s of timing at 418ddf3)
#   STORIES profiler.workflows.catalogue --only ab-tma-buffers,ab-hook (12 runs) ~1 min (16 s of recording at
#           418ddf3), then the verdict test on them           ~1 min
#   summary benchmarks/gpu/tma_summary.py                   ~20 s
# Total ~6-7 min with the build. Logs and runs: $OUT (tma_logs.tar.gz, tma_traces.tar.gz, tma_bench.*).
# Any step can be skipped: TESTS=0 BENCH=0 STORIES=0 VERDICTS=0 (the verdict test then runs on the CPU
# from tma_traces.tar.gz: EPSCOPE_VERDICT_RUNS=<untarred>/traces pytest tests/analysis/test_verdicts.py).
set -uo pipefail
source benchmarks/gpu/env.sh   # the checkout on PYTHONPATH, NVLink multicast off
export TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=${MAX_JOBS:-16}
export EPSCOPE_BUILD_DIR=${EPSCOPE_BUILD_DIR:-$PWD/build/epscope}
OUT=${OUT:-/tmp/tma_gpu_out}
mkdir -p "$OUT"
TESTS=${TESTS:-1} BENCH=${BENCH:-1} STORIES=${STORIES:-1} VERDICTS=${VERDICTS:-1}
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
step() { echo "[$(date -u +%H:%M:%S)] $1: $(( $(date +%s) - $2 )) s"; }
if [ "$TESTS" = 1 ]; then
  t=$(date +%s)
  timeout 330 python -m pytest -q -rA tests/gpu/test_ep_tma.py tests/gpu/test_ep_hook.py > "$OUT/gpu_tests.log" 2>&1
  [ $? = 0 ] || rc=1
  tail -25 "$OUT/gpu_tests.log"; step tests "$t"
fi
if [ "$BENCH" = 1 ]; then
  t=$(date +%s)
  timeout 240 python benchmarks/gpu/tma_bench.py --out "$OUT" > "$OUT/tma_bench.log" 2>&1
  [ $? = 0 ] || rc=1
  grep -vE "UserWarning|_warn_once" "$OUT/tma_bench.log" | tail -15; step bench "$t"
fi
if [ "$STORIES" = 1 ]; then
  t=$(date +%s)
  timeout 300 python -m profiler.workflows.catalogue --out "$OUT/traces" --only ab-tma-buffers,ab-hook > "$OUT/stories.log" 2>&1
  [ $? = 0 ] || rc=1
  tail -20 "$OUT/stories.log"; step stories "$t"
fi
if [ "$STORIES" = 1 ] && [ "$VERDICTS" = 1 ]; then
  t=$(date +%s)
  # the pages' verdicts on the new runs (no idle alarm expected on ab-tma-buffers after tma3's fix)
  EPSCOPE_VERDICT_RUNS="$OUT/traces" timeout 240 python -m pytest -q -rA tests/analysis/test_verdicts.py \
    -k "ab-tma-buffers or ab-hook" > "$OUT/verdicts.log" 2>&1
  [ $? = 0 ] || rc=1
  step verdicts "$t"
fi
if grep -qiE "error|Traceback" "$OUT"/build_*.log; then cat "$OUT"/build_*.log | gzip > "$OUT/build_logs.gz"; fi
rm -f "$OUT"/build_*.log
timeout 120 python benchmarks/gpu/tma_summary.py --out "$OUT" 2>&1 | tee "$OUT/summary.txt"
if [ -d "$OUT/traces" ]; then
  du -sk "$OUT"/traces/* > "$OUT/traces_sizes.txt"
  tar czf "$OUT/tma_traces.tar.gz" -C "$OUT" traces && rm -rf "$OUT/traces"
fi
(cd "$OUT" && tar czf tma_logs.tar.gz --ignore-failed-read gpu.txt gpu_tests.log tma_bench.log stories.log verdicts.log \
   summary.txt traces_sizes.txt 2>/dev/null)
echo "total: $(( $(date +%s) - t0 )) s, rc=$rc"
exit "$rc"
