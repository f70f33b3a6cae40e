#!/usr/bin/env bash
# Issue 12's device call: `epscope ab` A/A (this tree against itself) and A/B (this tree against
# the tree of a commit that changes one kernel knob), then `epscope tune` of the 2-GPU normal shape.
# Everything lands under $OUT: logs, comparison records and run directories (one tarball), the
# tuned table. The sides of `epscope ab` build their own extensions in their own caches.
#   CPU side, before:  python -m profiler ab --export <knob-commit> .ab/knob   (the device has no .git)
#   run (device tool, 2 GPUs):  EP_COMMIT=<commit> bash benchmarks/gpu/ab_tune_gpu.sh
#   STEPS="aa ab tune" (default all), KNOB_TREE=.ab/knob, AB_ARGS / TUNE_ARGS add flags
set -uo pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=${MAX_JOBS:-16}
# builds under the repo's git-ignored build/: a later device call on the same (warm) machine reuses
# them (the catalogue's builds serve `epscope ab`'s side for this tree and `epscope tune`)
export EPSCOPE_BUILD_DIR=${EPSCOPE_BUILD_DIR:-$PWD/build/epscope}
OUT=${OUT:-/tmp/ab_tune_out}
mkdir -p "$OUT/ab"
STEPS=${STEPS:-"aa ab tune"}
KNOB_TREE=${KNOB_TREE:-.ab/knob}
AB_ARGS=${AB_ARGS:-"--num-sms 24 --rounds 6 --profile-rounds -1 --iters 20 --warmup 5 --build-root build/ab"}
TUNE_ARGS=${TUNE_ARGS:-"--sms 24,32,48,64 --chunks default --copy-paths direct,tma:2,tma:3 --rounds 3 --recheck-rounds 4 --top 2"}
if [ -n "${EP_COMMIT:-}" ]; then export EPSCOPE_GIT_COMMIT="$EP_COMMIT" EPSCOPE_GIT_BRANCH="${EP_BRANCH:-main}"; fi
{ nvidia-smi --query-gpu=name,driver_version --format=csv; echo "commit ${EP_COMMIT:-unknown}"; date -u; } | tee "$OUT/gpu.txt"
t0=$(date +%s)
rc=0
for step in $STEPS; do
  t1=$(date +%s)
  case "$step" in
    aa) timeout 500 python -m profiler ab . . $AB_ARGS --out "$OUT/ab/aa" 2>&1 | tee "$OUT/ab-aa.log"; r=${PIPESTATUS[0]} ;;
    ab) if [ -d "$KNOB_TREE/ep_core" ]; then
          timeout 500 python -m profiler ab . "$KNOB_TREE" $AB_ARGS --out "$OUT/ab/knob" 2>&1 | tee "$OUT/ab-knob.log"
          r=${PIPESTATUS[0]}
        else echo "ab: no tree at $KNOB_TREE (export it on the CPU side first)" | tee "$OUT/ab-knob.log"; r=2; fi ;;
    tune) timeout 500 python -m profiler tune $TUNE_ARGS --table "$OUT/tuned.json" 2>&1 | tee "$OUT/tune.log"
          r=${PIPESTATUS[0]} ;;
    *) echo "unknown step $step"; r=2 ;;
  esac
  echo "$step: exit $r, $(( $(date +%s) - t1 )) s"
  [ "$r" = 0 ] || rc=$r
done
if [ -d "$OUT/ab" ]; then
  tar czf "$OUT/ab.tar.gz" -C "$OUT" ab && rm -rf "$OUT/ab"
fi
echo "total: $(( $(date +%s) - t0 )) s"
exit "$rc"
