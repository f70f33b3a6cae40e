#!/usr/bin/env bash
# Issue 35's device call: build ep_core (the compiled-out variant: DeepEP's scripts never profile),
# run DeepEP's test_intranode.py and test_low_latency.py from the checkout in EPSCOPE_DEEPEP_DIR
# with `import deep_ep` resolving to ep_core (benchmarks/gpu/deepep_tests.py) at every rank count
# the GPUs allow (or RANKS=1,2), the GPU tests of tests/gpu/test_deepep_scripts.py that need no
# checkout (DeepEP's default device and dtype, the new methods on real buffers), and the
# default-config measurement (benchmarks/gpu/default_config_bench.py, one rank; BENCH=0 skips it).
#   run (device tool):  EPSCOPE_DEEPEP_DIR=<checkout> EP_COMMIT=<commit> bash benchmarks/gpu/deepep_gpu.sh
#   the two-GPU session: the same with RANKS=1,2 (BENCH=0 if the one-rank figures are already recorded)
# Every step is capped (build 200 s, each script run 150 s, tests 90 s, bench 90 s); what comes
# back: $OUT/deepep_logs.tar.gz (every log), $OUT/deepep_tests.md, $OUT/default_config.json.
set -uo pipefail
cd "$(dirname "$0")/../.."
source benchmarks/gpu/env.sh   # the checkout on PYTHONPATH, NVLink multicast off
export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}" MAX_JOBS="${MAX_JOBS:-16}"
export EPSCOPE_BUILD_DIR=${EPSCOPE_BUILD_DIR:-$PWD/build/epscope}
OUT=${OUT:-/tmp/deepep_gpu_out}
LOGS="$OUT/logs"
mkdir -p "$LOGS"
DEEPEP=${EPSCOPE_DEEPEP_DIR:?set EPSCOPE_DEEPEP_DIR to a DeepEP checkout (its tests/ directory at least)}
RANKS=${RANKS:-} BENCH=${BENCH:-1}
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  echo "epscope commit ${EP_COMMIT:-unknown}  date $(date -u +%FT%TZ)"
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count())'
} 2>&1 | tee "$LOGS/gpu.txt"

t0=$(date +%s)
timeout 200 python3 -c "import ep_core._ext as X; X.load(False)" > "$LOGS/build.log" 2>&1
echo "build: exit $?, $(( $(date +%s) - t0 )) s"; tail -n 3 "$LOGS/build.log"

t0=$(date +%s)
python3 benchmarks/gpu/deepep_tests.py --deepep "$DEEPEP" --out "$LOGS" --timeout 150 ${RANKS:+--ranks "$RANKS"} \
  > "$LOGS/deepep_tests.out" 2>&1
echo "deepep scripts: exit $?, $(( $(date +%s) - t0 )) s"
cp "$LOGS/deepep_tests.md" "$OUT/" 2>/dev/null

t0=$(date +%s)
EPSCOPE_DEEPEP_DIR= timeout 90 python3 -m pytest -q -rs -p no:cacheprovider tests/gpu/test_deepep_scripts.py \
  > "$LOGS/pytest_deepep.log" 2>&1
echo "pytest: exit $?, $(( $(date +%s) - t0 )) s"

if [ "$BENCH" = 1 ]; then
  t0=$(date +%s)
  timeout 90 python3 benchmarks/gpu/default_config_bench.py --out "$LOGS" > "$LOGS/default_config.log" 2>&1
  echo "bench: exit $?, $(( $(date +%s) - t0 )) s"
  cp "$LOGS/default_config.json" "$OUT/" 2>/dev/null
fi

tar -czf "$OUT/deepep_logs.tar.gz" -C "$OUT" logs
echo "=== DeepEP's scripts"; cat "$OUT/deepep_tests.md" 2>/dev/null || tail -n 20 "$LOGS/deepep_tests.out"
for f in "$LOGS"/test_*-n*.log; do
  [ -e "$f" ] || continue
  echo "--- $(basename "$f"): $(grep -c ' passed' "$f") 'passed' lines"
  grep -E "Best|default|Dispatch bandwidth|Dispatch \+ combine|send/recv|Error|error" "$f" | head -n 14
  tail -n 3 "$f"
done
echo "=== pytest"; tail -n 8 "$LOGS/pytest_deepep.log"
[ "$BENCH" = 1 ] && { echo "=== bench"; grep -v "^| replay" "$LOGS/default_config.log" | head -n 80; }
exit 0
