"""Reading a PyTorch profiler (Kineto) trace of N events (default 1 M), streaming
(profiler.torchtrace.kineto.read_kineto): events/s of one core (process CPU time) and the peak
memory of the read, plain JSON and gzipped; the trace is made here with the shape of a real step's
(cpu_op / python_function / cuda_runtime / kernel in the proportions of a with_stack trace, args as
Kineto writes them).

    python benchmarks/bench_kineto.py [--events 1000000] [--out benchmarks/results/kineto-read-cpu-...md]
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BASE = 1_700_000_000_000_000_000


def _event(i: int) -> dict:
    t = 1_000 * i
    kind = i % 10
    if kind < 5:   # a with_stack trace is mostly Python frames
        return {"ph": "X", "cat": "python_function", "name": f"model/layer.py({100 + i % 50}): forward", "pid": 7,
                "tid": 7, "ts": t / 1000, "dur": 3.5, "args": {"Python parent id": i - 1, "Python id": i,
                                                              "Python thread": 0}}
    if kind < 8:
        return {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 7, "tid": 7, "ts": t / 1000, "dur": 12.25,
                "args": {"External id": i, "Record function id": 0, "Ev Idx": i, "Sequence number": i,
                         "Fwd thread id": 0}}
    if kind == 8:
        return {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 7, "tid": 7, "ts": t / 1000,
                "dur": 4.1, "args": {"External id": i, "cbid": 211, "correlation": i}}
    return {"ph": "X", "cat": "kernel", "name": "nvjet_tst_128x256_64x4_2x1_v_bz_coopA_NNT", "pid": 0, "tid": 7,
            "ts": t / 1000, "dur": 80.5, "args": {"External id": i, "queued": 0, "device": 0, "context": 1,
                                                   "stream": 7, "correlation": i - 1, "registers per thread": 168,
                                                   "shared memory": 213504, "blocks per SM": 1.0,
                                                   "warps per SM": 12.0, "grid": [132, 1, 1], "block": [384, 1, 1],
                                                   "est. achieved occupancy %": 19}}


def write_trace(path: Path, n: int, gz: bool) -> int:
    opener = gzip.open if gz else open
    with opener(path, "wt") as f:
        f.write('{"schemaVersion": 1, "deviceProperties": [], "distributedInfo": {"backend": "nccl", "rank": 0, '
                f'"world_size": 1}}, "baseTimeNanoseconds": {BASE}, "traceEvents": [\n')
        for i in range(n):
            f.write(json.dumps(_event(i)) + (",\n" if i + 1 < n else "\n"))
        f.write('], "traceName": "bench"}\n')
    return path.stat().st_size


def measure(path: Path, root: Path | None = None, block: str = "") -> dict:
    """Read in a fresh process: CPU seconds and its peak RSS over the interpreter's baseline."""
    code = ("import resource,time,sys; from profiler.torchtrace.kineto import read_kineto;"
            "b=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss; t=time.process_time(); w=time.perf_counter();"
            f"k=read_kineto({str(path)!r}{block}); c=time.process_time()-t; w=time.perf_counter()-w;"
            "m=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss;"
            "print(k.read, len(k.events), c, w, b, m, k.events.memory_usage(deep=True).sum())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=str(root or Path.cwd()),
                         env=os.environ | {"PYTHONPATH": str(root or Path(__file__).resolve().parents[1])}).stdout.split()
    read, kept, cpu, wall, base_kb, peak_kb, table = (float(x) for x in out)
    return {"read": int(read), "kept": int(kept), "cpu_s": cpu, "wall_s": wall, "events_per_s_cpu": read / cpu,
            "peak_rss_mb": peak_kb / 1024, "baseline_rss_mb": base_kb / 1024, "table_mb": table / 1e6}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--out", default=None, help="write the results as markdown here")
    ap.add_argument("--before", default=None, help="also read each file with the reader of this checkout (before)")
    a = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for gz in (False, True):
            p = Path(d) / ("t.json.gz" if gz else "t.json")
            size = write_trace(p, a.events, gz)
            kind = "gzip" if gz else "json"
            if a.before:
                rows.append((f"{kind}, before ({a.before})", size, measure(p, Path(a.before))))
                rows.append((f"{kind}, ijson only (block=0)", size, measure(p, block=", block=0")))
            rows.append((kind, size, measure(p)))
            p.unlink()
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        commit = ""
    commit = os.environ.get("EPSCOPE_GIT_COMMIT", commit or "unknown")[:7]
    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    lines = [f"# Reading a {a.events:,}-event Kineto trace (issue 30)", "",
             f"CPU: {cpu}; {os.cpu_count()} cores seen, load {os.getloadavg()[0]:.1f}; commit {commit}; "
             f"{time.strftime('%Y-%m-%d')}; `python benchmarks/bench_kineto.py --events {a.events}`; "
             "cold (a fresh process per read), CPU time of the reading process.", "",
             "| file | bytes | events read | kept | CPU s | wall s | events/s (CPU) | peak RSS MB (baseline) | kept table MB |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for kind, size, r in rows:
        lines.append(f"| {kind} | {size / 1e6:.0f} MB | {r['read']:,} | {r['kept']:,} | {r['cpu_s']:.2f} | "
                     f"{r['wall_s']:.2f} | {r['events_per_s_cpu'] / 1e6:.3f} M | {r['peak_rss_mb']:.0f} "
                     f"({r['baseline_rss_mb']:.0f}) | {r['table_mb']:.0f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        Path(a.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
