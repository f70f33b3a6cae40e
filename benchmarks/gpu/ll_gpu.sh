#!/usr/bin/env bash
# Issue 10's device call: build both extension variants once, run the low-latency GPU tests,
# the latency table (benchmarks/gpu/ll_bench.py) and, with STORIES=1, the five A/B story
# recordings (benchmarks/gpu/ll_stories.py). Everything it writes lands under $OUT: the full
# logs (ll_tests.log, ll_bench.log), the per-job diagnosis (ll_report.txt: what differs, where),
# the table; it prints a compact summary (the report, the test outcomes, the table).
#   run (device tool, 2 GPUs):  EP_COMMIT=<commit> bash benchmarks/gpu/ll_gpu.sh
# Issue 24 (upstream GPU work in decode steps), only that story:
#   TESTS=0 BENCH=0 STORY_ARGS="--only ll-upstream-gemm" EP_COMMIT=<commit> bash benchmarks/gpu/ll_gpu.sh
#   or: bash benchmarks/gpu/ll_gpu.sh --late-entry   (the same)
# Steps (1 = run): TESTS, BENCH, STORIES. Budget, each step capped: build ~45 s, tests <= 170 s
# (about 100 expected), table <= 75 s (about 40), story recording <= 150 s (about 50): at most
# 7.5 min, about 4 expected. What comes back (at most 8 files): ll_logs.tar.gz (every log and the
# per-job report), the table (ll-*.md, ll-*.json), the story runs in three tarballs
# (ll_traces_{1,2,3}.tar.gz, each well under 16 MiB). The summary is printed last.
set -uo pipefail
source benchmarks/gpu/env.sh   # the checkout on PYTHONPATH, NVLink multicast off
export TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=32
OUT=${OUT:-/tmp/ll_gpu_out}
mkdir -p "$OUT"
TESTS=${TESTS:-1} BENCH=${BENCH:-1} STORIES=${STORIES:-1}
BENCH_ARGS=${BENCH_ARGS:-}
STORY_ARGS=${STORY_ARGS:-}
if [ "${1:-}" = "--late-entry" ]; then TESTS=0 BENCH=0 STORIES=1 STORY_ARGS="--only ll-upstream-gemm"; fi
if [ -n "${EP_COMMIT:-}" ]; then export EPSCOPE_GIT_COMMIT="$EP_COMMIT" EPSCOPE_GIT_BRANCH="${EP_BRANCH:-main}" EPSCOPE_COMMIT="$EP_COMMIT"; fi
{ nvidia-smi --query-gpu=name,driver_version --format=csv; echo "commit ${EP_COMMIT:-unknown (no .git on the device)}"; date -u; } \
  | tee "$OUT/gpu.txt"

t0=$(date +%s)
python -c "import ep_core._ext as X; X.load(False)" > "$OUT/build_noprof.log" 2>&1 &
python -c "import ep_core._ext as X; X.load(True)" > "$OUT/build_prof.log" 2>&1 &
# the recorder's own extension: clock pairing and ping-pong of every profiled session
python -c "from profiler.record.build import load_record_extension as L; L(profile=False)" > "$OUT/build_record.log" 2>&1 &
wait
echo "build: $(( $(date +%s) - t0 )) s"; for f in "$OUT"/build_*.log; do tail -n 3 "$f"; done

if [ "$TESTS" = 1 ]; then
  t1=$(date +%s)
  rm -f "$OUT/ll_report.txt" "$OUT"/ll_jobs.rank*
  LL_REPORT="$OUT/ll_report.txt" LL_JOB_LOG="$OUT/ll_jobs" timeout 170 \
    python -m pytest -q -rA -p no:cacheprovider tests/gpu/test_low_latency.py > "$OUT/ll_tests.log" 2>&1
  echo "tests: exit $? after $(( $(date +%s) - t1 )) s (full log: ll_tests.log)"
  if [ -s "$OUT/ll_report.txt" ]; then
    echo "--- per-job diagnosis (ll_report.txt) ---"; head -c 7000 "$OUT/ll_report.txt"
  else  # the spawn was killed before it returned: what each rank logged per job
    echo "--- no report; per-job logs ---"; for f in "$OUT"/ll_jobs.rank*; do [ -f "$f" ] && head -c 2500 "$f"; done
  fi
  echo "--- test outcomes ---"
  grep -E "^(PASSED|FAILED|ERROR) |[0-9]+ (passed|failed)|Timeout|timed out" "$OUT/ll_tests.log" | cut -c1-220 | tail -32
fi
if [ "$BENCH" = 1 ]; then
  t1=$(date +%s)
  timeout 75 python benchmarks/gpu/ll_bench.py --out "$OUT" --timeout 70 $BENCH_ARGS > "$OUT/ll_bench.log" 2>&1
  echo "--- latency table: exit $? after $(( $(date +%s) - t1 )) s (full log: ll_bench.log) ---"
  grep -v "UserWarning\|_warn_once" "$OUT/ll_bench.log" | tail -34 | cut -c1-400
fi
if [ "$STORIES" = 1 ]; then
  t1=$(date +%s)
  mkdir -p "$OUT/traces"
  # record only: the checks and expect blocks are CPU work (about 1.5 min), run after the call:
  #   python benchmarks/gpu/ll_stories.py --out <the three tarballs unpacked> --checks-only
  timeout 150 python benchmarks/gpu/ll_stories.py --out "$OUT/traces" --timeout 140 --record-only $STORY_ARGS \
    > "$OUT/ll_stories.log" 2>&1
  echo "--- stories: exit $? after $(( $(date +%s) - t1 )) s (full log: ll_stories.log) ---"
  # three tarballs: every run is about 0.8 MB, one tarball must stay under 16 MiB; a tarball holds
  # what was recorded of its stories (STORY_ARGS="--only ..." records a subset)
  pack() { local tgz=$1; shift; local have=(); for g in "$@"; do for f in $g; do [ -e "$f" ] && have+=("$f"); done; done
           [ ${#have[@]} -gt 0 ] && tar czf "$tgz" "${have[@]}"; return 0; }
  ( cd "$OUT/traces" && pack "$OUT/ll_traces_1.tar.gz" 'll-split-*' 'll-barrier-*' &&
    pack "$OUT/ll_traces_2.tar.gz" 'll-slice-floor-*' 'll-loads-*' &&
    pack "$OUT/ll_traces_3.tar.gz" 'll-host-*' 'll-upstream-*' ll_stories.planted_by ll_upstream_facts.json ) \
    && rm -rf "$OUT/traces"
  ls -la "$OUT"/ll_traces_*.tar.gz
fi
# build logs come back only when a build failed
if grep -qiE "error|Traceback" "$OUT"/build_*.log; then cat "$OUT"/build_*.log > "$OUT/build.log"; fi
rm -f "$OUT"/build_*.log
( cd "$OUT" && tar czf ll_logs.tar.gz --ignore-failed-read gpu.txt ll_tests.log ll_report.txt ll_jobs.rank* \
    ll_bench.log ll_stories.log build.log 2>/dev/null; rm -f ll_tests.log ll_jobs.rank* ll_bench.log build.log )
echo
echo "=================== low-latency summary (logs: ll_logs.tar.gz) ==================="
cat "$OUT/gpu.txt" 2>/dev/null | tail -2
[ -f "$OUT/ll_report.txt" ] && grep -E "^(ok|FAIL)" "$OUT/ll_report.txt"
[ "$TESTS" = 1 ] && tar xzf "$OUT/ll_logs.tar.gz" -O ll_tests.log 2>/dev/null | grep -E "[0-9]+ (passed|failed|error)" | tail -1
[ "$BENCH" = 1 ] && tar xzf "$OUT/ll_logs.tar.gz" -O ll_bench.log 2>/dev/null | grep -E "^\| *[0-9]|WRONG|exit" | head -12 | cut -c1-200
[ -f "$OUT/ll_stories.log" ] && grep -E "recorded [0-9]+ runs|Error|Traceback" "$OUT/ll_stories.log" | head -8
rm -f "$OUT/ll_report.txt" "$OUT/ll_stories.log" "$OUT/gpu.txt"
ls "$OUT"
echo "total: $(( $(date +%s) - t0 )) s"
