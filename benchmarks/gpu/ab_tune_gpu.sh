#!/usr/bin/env bash
# Issue 12's device call: `epscope ab` A/A (this tree against itself) and A/B (this tree against
# the tree of a commit that changes one kernel knob), then `epscope tune` of the 2-GPU normal shape, then
# `epscope tune --ll` of the low-latency shape (T_max buckets 1..16, 17..64, 65..128, 129..256).
# Everything lands under $OUT: logs, comparison records and run directories (one tarball), the
# tuned table. The sides of `epscope ab` build their own extensions in their own caches.
#   CPU side, before:  python -m profiler ab --export <knob-commit> .ab/knob   (the device has no .git)
#   run (device tool, 2 GPUs):  EP_COMMIT=<commit> bash benchmarks/gpu/ab_tune_gpu.sh
#   STEPS="aa ab tune tunell" (default all), KNOB_TREE=.ab/knob, AB_ARGS / TUNE_ARGS / TUNE_LL_ARGS add flags
# Both tune steps update $OUT/tuned.json, started from the committed ep_core/tuned.json (so its other
# entries stay as they are: commit the result as ep_core/tuned.json).
set -uo pipefail
source benchmarks/gpu/env.sh   # the checkout on PYTHONPATH, NVLink multicast off
export TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=${MAX_JOBS:-16}
# builds under the repo's git-ignored build/: a later device call on the same (warm) machine reuses
# them (the catalogue's builds serve `epscope ab`'s side for this tree and `epscope tune`)
export EPSCOPE_BUILD_DIR=${EPSCOPE_BUILD_DIR:-$PWD/build/epscope}
OUT=${OUT:-/tmp/ab_tune_out}
mkdir -p "$OUT/ab"
STEPS=${STEPS:-"aa ab tune tunell"}
KNOB_TREE=${KNOB_TREE:-.ab/knob}
AB_ARGS=${AB_ARGS:-"--num-sms 24 --rounds 6 --profile-rounds -1 --iters 20 --warmup 5 --build-root build/ab"}
TUNE_ARGS=${TUNE_ARGS:-"--sms 24,32,48,64 --chunks default --copy-paths direct,tma:2,tma:3 --rounds 3 --recheck-rounds 4 --top 2"}
# low latency: 9 candidates + the defaults per bucket (profiler/workflows/tune_ll.py says why these); rounds are
# ~25 ms (40 pairs behind a 300 µs lead each), so more rounds than the normal sweep cost little
TUNE_LL_ARGS=${TUNE_LL_ARGS:-"--rounds 4 --recheck-rounds 6 --top 2 --iters 40 --warmup 5"}
[ -f "$OUT/tuned.json" ] || cp ep_core/tuned.json "$OUT/tuned.json"
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
    tunell) timeout 400 python -m profiler tune --ll $TUNE_LL_ARGS --table "$OUT/tuned.json" 2>&1 | tee "$OUT/tune-ll.log"
          r=${PIPESTATUS[0]} ;;
    *) echo "unknown step $step"; r=2 ;;
  esac
  echo "$step: exit $r, $(( $(date +%s) - t1 )) s"
  [ "$r" = 0 ] || rc=$r
done
if [ -d "$OUT/ab" ] && [ -n "$(ls -A "$OUT/ab")" ]; then
  tar czf "$OUT/ab.tar.gz" -C "$OUT" ab && rm -rf "$OUT/ab"
else
  rmdir "$OUT/ab" 2>/dev/null   # (tune steps only: no empty tarball over an earlier call's)
fi
echo "total: $(( $(date +%s) - t0 )) s"
exit "$rc"
