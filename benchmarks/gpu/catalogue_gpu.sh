#!/usr/bin/env bash
# The ground-truth catalogue's device call (issue 8 section 1): build the extensions, record every
# catalogue run in one launch of one process per GPU (python -m profiler.workflows.catalogue), and bring the
# run directories back as one tarball with the log. Everything it writes lands under $OUT.
#   run (device tool, 2 GPUs):  EP_COMMIT=<commit> bash benchmarks/gpu/catalogue_gpu.sh
#   ONLY=balanced,timeout ...   records a subset (the scenario keys of profiler/workflows/catalogue.py)
#   bash benchmarks/gpu/catalogue_gpu.sh --only late-entry-ab,late-entry-aa,upstream-gemm   (the same, as a flag)
#   bash benchmarks/gpu/catalogue_gpu.sh --late-entry      issue 24's scenarios: late-entry-ab, late-entry-aa,
#                                                          upstream-gemm (catalogue_plan.LATE_ENTRY)
set -uo pipefail
while [ $# -gt 0 ]; do
  case "$1" in
    --only) ONLY="$2"; shift 2 ;;
    --only=*) ONLY="${1#--only=}"; shift ;;
    --late-entry) ONLY=$(PYTHONPATH=. python -c "from profiler.workflows.catalogue_plan import LATE_ENTRY; print(','.join(LATE_ENTRY))") \
                    && [ -n "$ONLY" ] || { echo "catalogue_gpu.sh: cannot read LATE_ENTRY" >&2; exit 2; }; shift ;;
    *) echo "catalogue_gpu.sh: unknown argument $1 (--only KEYS | --late-entry)" >&2; exit 2 ;;
  esac
done
source benchmarks/gpu/env.sh   # the checkout on PYTHONPATH, NVLink multicast off
export TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=${MAX_JOBS:-16}
# builds under the repo's git-ignored build/: a later device call on the same (warm) machine reuses
# them (the catalogue's builds serve `epscope ab`'s side for this tree and `epscope tune`)
export EPSCOPE_BUILD_DIR=${EPSCOPE_BUILD_DIR:-$PWD/build/epscope}
OUT=${OUT:-/tmp/catalogue_out}
mkdir -p "$OUT"
CATALOGUE_TIMEOUT=${CATALOGUE_TIMEOUT:-420}
only=(); [ -n "${ONLY:-}" ] && only=(--only "$ONLY")

# the device copy has no .git: the commit comes in by env so every manifest names it
if [ -n "${EP_COMMIT:-}" ]; then export EPSCOPE_GIT_COMMIT="$EP_COMMIT" EPSCOPE_GIT_BRANCH="${EP_BRANCH:-main}"; fi
{ nvidia-smi --query-gpu=name,driver_version --format=csv; echo "commit ${EP_COMMIT:-unknown}"; date -u; } | tee "$OUT/gpu.txt"

t0=$(date +%s)
# three independent JIT builds in parallel (each has its own cache directory)
python -c "import ep_core._ext as X; X.load(False)" > "$OUT/build_noprof.log" 2>&1 &
python -c "import ep_core._ext as X; X.load(True)" > "$OUT/build_prof.log" 2>&1 &
python -c "from profiler.record.build import load_record_extension as L; L(profile=False)" > "$OUT/build_record.log" 2>&1 &
wait
echo "build: $(( $(date +%s) - t0 )) s"

t1=$(date +%s)
timeout "$CATALOGUE_TIMEOUT" python -m profiler.workflows.catalogue --out "$OUT/catalogue" "${only[@]}" 2>&1 | tee "$OUT/catalogue.log"
rc=${PIPESTATUS[0]}
echo "catalogue: exit $rc, $(( $(date +%s) - t1 )) s" | tee -a "$OUT/catalogue.log"
if [ -d "$OUT/catalogue" ]; then
  du -sk "$OUT"/catalogue/* | tee -a "$OUT/catalogue.log"
  tar czf "$OUT/catalogue.tar.gz" -C "$OUT" catalogue && rm -rf "$OUT/catalogue"
fi
# build logs come back only when a build failed
if grep -qiE "error|Traceback" "$OUT"/build_*.log; then cat "$OUT"/build_*.log | gzip > "$OUT/build_logs.gz"; fi
rm -f "$OUT"/build_*.log
echo "total: $(( $(date +%s) - t0 )) s"
exit "$rc"
