#!/usr/bin/env bash
# The recorder's one GPU-machine job: build both variants of the recorder's and ep_core's
# extensions once (in parallel), run the one-GPU tests (the recorder's and the EP tests that
# record), record the self-test traces, measure the recorder (benchmarks/gpu/recorder_bench.py),
# the EP kernels' recording cost on one rank (benchmarks/gpu/recorder_ep_cost.py) and
# `epscope calibrate`, prove "off means off" from the SASS. Everything lands under $OUT:
#   logs.txt                      every step's output
#   gpu_tests_recorder.log        pytest tests/gpu/test_recorder_gpu.py
#   gpu_tests_ep.log              the other one-GPU tests (tests/gpu -m "gpu and not multigpu")
#   traces.tar.gz                 traces/<run>/ directories (unpack into the repo's traces/)
#   raw.tar.gz                    the raw buffers of those runs (*.rawbuf, for re-decoding on CPU)
#   recorder-<gpu>-<date>.md/json the measurements (copy into benchmarks/results/)
#   recorder-ep-1rank.json        the EP kernels' recording cost, one rank
#   calibration.json              `epscope calibrate` of this GPU (10 ms SM-clock kernel, record designs)
#   calibrate.txt                 its printed summary
#   sm-anchors.npy                its raw SM anchor samples (int64[SMs, 101, 4])
# Usage (repo root): OUT=/tmp/out EP_COMMIT=<commit> bash benchmarks/gpu/recorder_gpu.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source benchmarks/gpu/env.sh   # the checkout on PYTHONPATH, NVLink multicast off
export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}" MAX_JOBS="${MAX_JOBS:-16}"
export EPSCOPE_BUILD_DIR=${EPSCOPE_BUILD_DIR:-$PWD/build/epscope}
OUT="${OUT:-/tmp/epscope-recorder-out}"
mkdir -p "$OUT/traces" "$OUT/raw"
LOG="$OUT/logs.txt"
step() { echo; echo "=== $* ($(date -u +%H:%M:%S))"; }
{
  step "machine (tree of commit ${EP_COMMIT:-unknown})"
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count())'

  step "build both variants of the recorder's extension; ep_core's in the background"
  for p in True False; do
    python3 -c "import ep_core._ext as X; print(X.load($p).__name__)" > "$OUT/build_ep_$p.log" 2>&1 &
  done
  rec=()
  for p in True False; do
    python3 -c "from profiler.record.build import load_record_extension as l; m = l(profile=$p); print(m.__name__, 'profile', m.profile_enabled())" &
    rec+=($!)
  done
  wait "${rec[@]}"

  # most wanted first: a call cut short by the device-time limit still returns what ran
  step "benchmark"
  python3 benchmarks/gpu/recorder_bench.py --out "$OUT"

  step "GPU tests: the recorder"
  timeout 120 python3 -m pytest -q -rs tests/gpu/test_recorder_gpu.py -p no:cacheprovider 2>&1 | tee "$OUT/gpu_tests_recorder.log" | tail -15

  step "calibrate"
  python3 -m profiler.record.calibrate --out "$OUT/calibration.json" --samples "$OUT/sm-anchors.npy" | tee "$OUT/calibrate.txt"

  step "ep_core builds"
  wait
  tail -n 3 "$OUT"/build_ep_*.log

  step "EP kernels, one rank: recording cost"
  timeout 240 python3 benchmarks/gpu/recorder_ep_cost.py --out "$OUT"

  step "GPU tests: the rest of one GPU's (the EP tests that record)"
  timeout 240 python3 -m pytest -q -rs tests/gpu -m "gpu and not multigpu" --deselect tests/gpu/test_recorder_gpu.py -p no:cacheprovider 2>&1 | tee "$OUT/gpu_tests_ep.log" | tail -15

  step "self-test traces"
  python3 -m profiler.record.selftest --out "$OUT/traces" --raw-dir "$OUT/raw" --which all

  step "summary"
  python3 - "$OUT" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
res = json.loads(next(p for p in out.glob("recorder-*.json") if p.name != "recorder-ep-1rank.json").read_text())
for r in res["record_cost"]:
    print(f"record_cost {r['grid']}x{r['warps']}: cycles/record", r["cycles_per_record"])
for r in res["record_parts"]:
    print(f"designs {r['grid']}x{r['warps']}:", r["cycles_per_record"])
for k, o in res["overhead"].items():
    print(f"{k}: on {o['on_vs_compiled_out_pct']:+.2f}% runtime off {o['runtime_off_vs_compiled_out_pct']:+.2f}% "
          f"off (launch path) {o['off_launch_path_vs_compiled_out_pct']:+.2f}% noise {o['noise_compiled_out_halves_pct']:.2f}%")
print("static", res.get("static_record_cost"))
PY
} 2>&1 | tee "$LOG"
tar czf "$OUT/traces.tar.gz" -C "$OUT" traces && rm -rf "$OUT/traces"
tar czf "$OUT/raw.tar.gz" -C "$OUT" raw && rm -rf "$OUT/raw"
ls -la "$OUT"
