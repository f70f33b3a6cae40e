#!/usr/bin/env bash
# One device call that runs several one-GPU jobs back to back, each capped, each packed into one
# tarball under $OUT (the device tool returns at most 8 files): the jobs share one build directory,
# so ep_core and the recorder are compiled once per machine, and a later call on the still-warm
# machine reuses them.
#   JOBS="recorder deepep" OUT=... EPSCOPE_DEEPEP_DIR=<DeepEP checkout> bash benchmarks/gpu/onegpu_session.sh
#   JOBS=torch_gt ...                    (issue 30's ground truth)
# Caps (seconds) per job: CAP_recorder, CAP_deepep, CAP_torch_gt, CAP_tests (every one-GPU test), CAP_ep_cost, CAP_ncu
# (issue 33's Nsight Compute run); a job cut by its cap still packs
# what it wrote.
set -uo pipefail
cd "$(dirname "$0")/../.."
export EPSCOPE_BUILD_DIR=${EPSCOPE_BUILD_DIR:-$PWD/build/epscope}
export EP_COMMIT=${EP_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
export EPSCOPE_GIT_COMMIT=$EP_COMMIT
OUT=${OUT:?set OUT}
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir .whl/*.whl 2>&1 | tail -n 2
fi
declare -A SCRIPT=([recorder]=recorder_gpu.sh [deepep]=deepep_gpu.sh [torch_gt]=torch_gt_gpu.sh [tests]=onegpu_tests.sh [ep_cost]=ep_cost_gpu.sh [ncu]=ep_ncu_gpu.sh)
declare -A CAP=([recorder]=${CAP_recorder:-360} [deepep]=${CAP_deepep:-220} [torch_gt]=${CAP_torch_gt:-500} [tests]=${CAP_tests:-300} [ep_cost]=${CAP_ep_cost:-200} [ncu]=${CAP_ncu:-560})
for job in ${JOBS:?set JOBS}; do
  t0=$(date +%s)
  mkdir -p "/tmp/session/$job"
  echo "##### $job (cap ${CAP[$job]} s) $(date -u +%T)"
  OUT="/tmp/session/$job" timeout -k 5 "${CAP[$job]}" bash "benchmarks/gpu/${SCRIPT[$job]}" 2>&1 | tee "/tmp/session/$job/console.txt" | tail -n 60
  echo "##### $job: exit ${PIPESTATUS[0]}, $(( $(date +%s) - t0 )) s"
  tar -czf "$OUT/$job.tgz" -C /tmp/session "$job"
done
ls -la "$OUT"
