#!/usr/bin/env bash
# Issue 33: the EP kernels' recording cost (CUPTI kernel durations per mode, ep_cost_ncu.py --phase
# cupti) for several recorder variants in one device call, each from its own source tree and
# build directory, built in parallel, run one after another (each process compares its own
# compiled-out and instrumented builds, so the percentages do not depend on the order).
#   VARIANTS="label=TREE[:NVCC_FLAGS] ..." OUT=... bash benchmarks/gpu/ep_cost_variants.sh
# e.g. VARIANTS="main=.stage/expA new=. new_x=.:-DSOME_MACRO" (.stage/expA: `git archive` of an older
# commit's ep_core, profiler and benchmarks/gpu, carried). Then, where TESTS names a label,
# the one-GPU tests run against that variant's tree and build.
set -uo pipefail
cd "$(dirname "$0")/../.."
REPO=$PWD
source benchmarks/gpu/env.sh
export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}"
OUT="${OUT:?set OUT}"
mkdir -p "$OUT"
declare -A TREE FLAGS
for v in ${VARIANTS:?set VARIANTS}; do
  label=${v%%=*}; rest=${v#*=}
  TREE[$label]=$(cd "${rest%%:*}" && pwd); FLAGS[$label]=$([[ $rest == *:* ]] && echo "${rest#*:}" || true)
done
build() {  # label: both ep_core builds of the variant's tree, in its own build directory
  local l=$1
  (cd "${TREE[$l]}" && PYTHONPATH=. EPSCOPE_BUILD_DIR="$REPO/build/var-$l" NVCC_APPEND_FLAGS="${FLAGS[$l]}" MAX_JOBS=4 \
     python3 -c "import ep_core._ext as X; X.load(False); X.load(True)") > "$OUT/build-$l.log" 2>&1
  echo "build $l exit $?"
}
{
  echo "commit ${EP_COMMIT:-unknown}  date $(date -u +%FT%TZ)"
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  t0=$(date +%s)
  for l in "${!TREE[@]}"; do build "$l" & done
  wait
  echo "builds: $(( $(date +%s) - t0 )) s"
  for round in 1 2; do
    for v in ${VARIANTS}; do
      l=${v%%=*}
      echo "=== $l (round $round; tree ${TREE[$l]}, flags '${FLAGS[$l]}')"
      (cd "${TREE[$l]}" && PYTHONPATH=. EPSCOPE_BUILD_DIR="$REPO/build/var-$l" NVCC_APPEND_FLAGS="${FLAGS[$l]}" \
         timeout 150 python3 benchmarks/gpu/ep_cost_ncu.py --phase cupti --out "$OUT/cupti-$l-r$round" \
         --rounds "${ROUNDS:-8}" 2>&1 | grep -v -i "warn")
    done
  done
  if [ -n "${TESTS:-}" ]; then
    l=$TESTS
    echo "=== one-GPU tests against $l"
    (cd "${TREE[$l]}" && PYTHONPATH=. EPSCOPE_BUILD_DIR="$REPO/build/var-$l" NVCC_APPEND_FLAGS="${FLAGS[$l]}" MAX_JOBS=16 \
       timeout "${TESTS_CAP:-300}" python3 -m pytest -q -rs tests/gpu -m "gpu and not multigpu" -p no:cacheprovider 2>&1 | tail -n 40)
  fi
} 2>&1 | tee "$OUT/variants.log"
