#!/bin/bash
# Issue 31: `epscope analyze` of a 10 M-event run, CPU time of a fresh process, on the lent GPU host's
# CPUs (no GPU used): a second machine beside the shared 2-core dev VM, whose nested virtualisation and
# free page reporting make fresh memory cost system time. From the repository root:
#   bash benchmarks/gpu/analyze_cpu_host.sh BASE_TREE [PAIRS=4]
# BASE_TREE: another checkout's code (carried, e.g. .stage/base) timed alternately with this one.
# The host lacks msgspec and ijson: their wheels travel in .whl/dev and go into a folder on PYTHONPATH.
# The run: make_long_run(ranks=8, per_iteration=2_500_000, iterations=4), as on the VM. Both trees'
# bytecode is compiled and their compiled loops built (a small run analysed) before any timing, as
# after an install. Each timing: a fresh copy of the run without stored results, one process
# `python -m profiler analyze COPY` run in TREE with PYTHONPATH=TREE, user/sys/peak RSS from wait4.
set -euo pipefail
source benchmarks/gpu/env.sh
BASE=$1; PAIRS=${2:-4}
OUT=${OUT:-/tmp/analyze_out}; mkdir -p "$OUT"
DEPS=/tmp/epscope-deps; mkdir -p $DEPS
pip install -q --no-index --no-deps --target $DEPS ${WHEELS:-.whl/dev}/msgspec*.whl ${WHEELS:-.whl/dev}/ijson*.whl 2>&1 | tail -3
export PYTHONPATH=.:$DEPS
{ echo "cores $(nproc); $(grep -m1 'model name' /proc/cpuinfo); python $(python -V 2>&1)"
  echo "thp enabled: $(cat /sys/kernel/mm/transparent_hugepage/enabled); defrag: $(cat /sys/kernel/mm/transparent_hugepage/defrag)"
  echo "load: $(cat /proc/loadavg)"; } | tee "$OUT/machine.txt"
python -c "
from pathlib import Path
from profiler.groundtruth.synthetic import make_long_run
make_long_run(Path('/tmp/a10m'), ranks=8, per_iteration=2_500_000, iterations=4)
make_long_run(Path('/tmp/awarm'), ranks=8, per_iteration=100_000, iterations=2)"
# `python -m` puts the working directory first on sys.path: each tree's process runs in that tree
BASE=$(cd "$BASE" && pwd); THIS=$(pwd)
for T in "$THIS" "$BASE"; do
  python -m compileall -q "$T/profiler" > /dev/null
  rm -rf /tmp/awarm/analysis /tmp/awarm/analysis-summary.json
  (cd "$T" && PYTHONPATH=$T:$DEPS python -m profiler analyze /tmp/awarm) > "$OUT/warm-$(basename $T).log" 2>&1
done
python - "$BASE" "$PAIRS" "$DEPS" "$THIS" <<'PY' 2>&1 | tee "$OUT/analyze-10m.md"
import os, shutil, subprocess, sys, tempfile
base, pairs, deps, this = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]

def once(tree):
    d = tempfile.mkdtemp(dir="/tmp")
    run = os.path.join(d, "run")
    shutil.copytree("/tmp/a10m", run, ignore=shutil.ignore_patterns("analysis", "analysis-summary.json"))
    env = dict(os.environ, PYTHONPATH=f"{tree}:{deps}")
    p = subprocess.Popen([sys.executable, "-m", "profiler", "analyze", run], env=env, cwd=tree,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, ru = os.wait4(p.pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, p.stderr.read().decode()[-2000:]
    shutil.rmtree(d)
    return ru.ru_utime, ru.ru_stime, ru.ru_maxrss

print("| pair (load) | base user / sys / CPU s | this user / sys / CPU s | base peak MB | this peak MB |")
print("| --- | --- | --- | --- | --- |")
for i in range(pairs):
    load = open("/proc/loadavg").read().split()[0]
    b, n = once(base), once(this)
    print(f"| {i + 1} ({load}) | {b[0]:.2f} / {b[1]:.2f} / {b[0] + b[1]:.2f} | {n[0]:.2f} / {n[1]:.2f} / "
          f"{n[0] + n[1]:.2f} | {b[2] / 1024:.0f} | {n[2] / 1024:.0f} |", flush=True)
PY
