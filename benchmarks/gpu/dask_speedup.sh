#!/bin/bash
# Issue 31: `epscope analyze --workers N` against one process on a machine with free cores (the lent
# GPU host's 16 CPU cores; this CPU VM has 2 shared ones). No GPU is used. From the repository root:
#   bash benchmarks/gpu/dask_speedup.sh [ITERATIONS=16] [WORKERS="2 4 8"]
# The host has numba but no dask: the wheels it lacks (dask, distributed, partd, locket, tornado,
# tblib, zict, importlib_metadata, lazy_importer, msgspec, ijson; 3.5 MB, checked on the host)
# travel in .whl/dev and are installed into a folder on PYTHONPATH. A synthetic slow_rank run of 8 ranks x ITERATIONS iterations x 2.5 M events (one
# 2.5 M-event chunk an iteration) is written to local disk, the compiled loops built once, then
# bench_entry_points.py times a fresh single-process analyze and a fresh --workers N analyze for
# each N (the stored files compared byte for byte). Logs and the table go to $OUT.
set -euo pipefail
source benchmarks/gpu/env.sh
ITERS=${1:-16}; WORKERS=${2:-"2 4 8"}
OUT=${OUT:-/tmp/dask_out}; mkdir -p "$OUT"
DEPS=/tmp/epscope-deps; mkdir -p $DEPS
pip install -q --no-index --no-deps --target $DEPS .whl/dev/*.whl 2>&1 | tail -3
export PYTHONPATH=.:$DEPS
python -c "import dask, distributed, msgspec, ijson; print('dask', dask.__version__)"
python -c "import numba" 2>/dev/null && echo "numba present" || echo "no numba: numpy fallbacks"
echo "cores $(nproc); $(grep -m1 'model name' /proc/cpuinfo); python $(python -V 2>&1)" | tee "$OUT/machine.txt"
RUN=/tmp/dask_run
t0=$(date +%s)
python -c "
from pathlib import Path
from profiler.groundtruth.synthetic import make_long_run
make_long_run(Path('$RUN'), ranks=8, per_iteration=2_500_000, iterations=$ITERS)"
echo "run written in $(( $(date +%s) - t0 )) s: $(du -sh $RUN | cut -f1)" | tee -a "$OUT/machine.txt"
# the compiled loops' one-time build (AOT, else numba's cache) on a small run, outside the timings
python -c "
from pathlib import Path
from profiler.groundtruth.synthetic import make_long_run
make_long_run(Path('/tmp/dask_warm'), ranks=8, per_iteration=100_000, iterations=2)"
python -m profiler analyze /tmp/dask_warm > "$OUT/warm.log" 2>&1
for W in $WORKERS; do
  python benchmarks/bench_entry_points.py $RUN --workers $W 2>&1 | tee "$OUT/workers-$W.md"
done
