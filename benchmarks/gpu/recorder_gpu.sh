#!/usr/bin/env bash
# The recorder's one GPU-machine job: build both variants once, run the GPU tests, record the
# self-test traces, measure the recorder (benchmarks/gpu/recorder_bench.py), prove "off means off"
# from the SASS. Everything lands under $OUT:
#   logs.txt                      every step's output
#   traces.tar.gz                 traces/<run>/ directories (unpack into the repo's traces/)
#   raw.tar.gz                    the raw buffers of those runs (*.rawbuf, for re-decoding on CPU)
#   recorder-<gpu>-<date>.md/json the measurements (copy into benchmarks/results/)
#   calibration.json              `epscope calibrate` of this GPU (10 ms SM-clock kernel, record designs)
#   calibrate.txt                 its printed summary
#   sm-anchors.npy                its raw SM anchor samples (int64[SMs, 101, 4])
# Usage (repo root): OUT=/tmp/out bash benchmarks/gpu/recorder_gpu.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH=. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}" MAX_JOBS="${MAX_JOBS:-32}"
OUT="${OUT:-/tmp/epscope-recorder-out}"
mkdir -p "$OUT/traces" "$OUT/raw"
LOG="$OUT/logs.txt"
step() { echo; echo "=== $* ($(date -u +%H:%M:%S))"; }
{
  step "machine"
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count())'

  step "build both variants (in parallel)"
  for p in True False; do
    python3 -c "from profiler.record.build import load_record_extension as l; m = l(profile=$p); print(m.__name__, 'profile', m.profile_enabled())" &
  done
  wait

  step "self-test traces"
  python3 -m profiler.record.selftest --out "$OUT/traces" --raw-dir "$OUT/raw" --which all

  step "benchmark"
  python3 benchmarks/gpu/recorder_bench.py --out "$OUT" --traces "$OUT/traces"

  step "calibrate"
  python3 -m profiler.record.calibrate --out "$OUT/calibration.json" --samples "$OUT/sm-anchors.npy" | tee "$OUT/calibrate.txt"

  step "GPU tests"
  timeout 240 python3 -m pytest -q tests/gpu/test_recorder_gpu.py -p no:cacheprovider

  step "summary"
  python3 - "$OUT" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
res = json.loads(next(out.glob("recorder-*.json")).read_text())
for r in res["record_cost"]:
    print(f"record_cost {r['grid']}x{r['warps']}: cycles/record", r["cycles_per_record"])
for r in res["record_parts"]:
    print(f"designs {r['grid']}x{r['warps']}:", r["cycles_per_record"])
for k, o in res["overhead"].items():
    print(f"{k}: on {o['on_vs_compiled_out_pct']:+.2f}% off {o['runtime_off_vs_compiled_out_pct']:+.2f}% "
          f"noise {o['noise_compiled_out_halves_pct']:.2f}%")
print("static", res.get("static_record_cost"))
PY
} 2>&1 | tee "$LOG"
tar czf "$OUT/traces.tar.gz" -C "$OUT" traces && rm -rf "$OUT/traces"
tar czf "$OUT/raw.tar.gz" -C "$OUT" raw && rm -rf "$OUT/raw"
ls -la "$OUT"
