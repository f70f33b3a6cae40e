#!/usr/bin/env bash
# Issue 33: where combine's recording cost goes on one rank. Builds both ep_core variants, then
#  1. CUPTI kernel durations per mode (benchmarks/gpu/ep_cost_ncu.py --phase cupti): is the cost
#     inside combine_kernel, or in the barrier kernel and the gaps around it?
#  2. Nsight Compute on few launches per mode (--clock-control none: the device notes say to leave
#     the clocks alone), exported as raw and per-SASS-line source CSVs, summarised by
#     benchmarks/gpu/ncu_summary.py (the metrics that differ most from the compiled-out build).
# Usage (repo root, on the GPU machine): OUT=/tmp/out bash benchmarks/gpu/ep_ncu_gpu.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source benchmarks/gpu/env.sh   # the checkout on PYTHONPATH, NVLink multicast off
export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}" MAX_JOBS="${MAX_JOBS:-16}"
export EPSCOPE_BUILD_DIR=${EPSCOPE_BUILD_DIR:-$PWD/build/epscope}
OUT="${OUT:-/tmp/epscope-ep-ncu-out}"
SMS="${NCU_SMS:-24 64}"
mkdir -p "$OUT"
{
  echo "commit ${EP_COMMIT:-unknown}  date $(date -u +%FT%TZ)"
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
  ncu --version | tail -n 1
  python3 -c "import ep_core._ext as X; X.load(False)" > "$OUT/build_ep.log" 2>&1 &
  python3 -c "import ep_core._ext as X; X.load(True)" > "$OUT/build_ep_prof.log" 2>&1 &
  wait
  timeout 200 python3 benchmarks/gpu/ep_cost_ncu.py --phase cupti --out "$OUT" --sms $SMS
  echo "cupti exit $?"
  timeout 300 ncu --clock-control none --target-processes all -k "regex:dispatch_kernel|combine_kernel" \
    --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
    --section InstructionStats --section SchedulerStats --section MemoryWorkloadAnalysis \
    --section ComputeWorkloadAnalysis --section SourceCounters \
    --export "$OUT/ep" -f python3 benchmarks/gpu/ep_cost_ncu.py --phase ncu --out "$OUT" --sms $SMS > "$OUT/ncu_profile.log" 2>&1
  echo "ncu exit $?"
  tail -n 5 "$OUT/ncu_profile.log"
  ncu -i "$OUT/ep.ncu-rep" --page raw --csv > "$OUT/ncu_raw.csv" 2> "$OUT/ncu_raw.err"
  echo "raw export exit $? ($(wc -c < "$OUT/ncu_raw.csv") bytes)"
  ncu -i "$OUT/ep.ncu-rep" --page details --csv > "$OUT/ncu_details.csv" 2> "$OUT/ncu_details.err"
  echo "details export exit $?"
  ncu -i "$OUT/ep.ncu-rep" --page source --csv --print-source sass > "$OUT/ncu_source.csv" 2> "$OUT/ncu_source.err"
  echo "source export exit $? ($(wc -c < "$OUT/ncu_source.csv") bytes)"
  python3 benchmarks/gpu/ncu_summary.py "$OUT/ncu_raw.csv" "$OUT/ncu_launches.json" > "$OUT/ncu_summary.txt"
  echo "summary exit $?"
  head -c 12000 "$OUT/ncu_summary.txt"
} 2>&1 | tee "$OUT/ep_ncu.log"
