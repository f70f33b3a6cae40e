"""Issue 31: the entry points as a user meets them, each in a fresh process (CPU, peak RSS, wall).

    python benchmarks/bench_entry_points.py RUN [--analyze] [--workers N] [--report] [--what-if] [--repeat 2]

--analyze: `epscope analyze RUN` (the analyses, RUN/analysis/ with the what-if inputs and the
report's tables, RUN/analysis-summary.json); --workers N: the same with the chunks on a local Dask
cluster of N worker processes, then the stored files are compared with the single-process ones
(byte for byte) and both are timed; --report: `epscope report RUN` on the analysed run;
--what-if: the viewer's exact what-if on the stored run (a fresh process loads the stored results,
as a cold viewer page does, then `Stored.what_if_summary` re-times every chunk from its stored
input: `viewer/analyses.what_if`'s path), dispatch/send_chunk 30 % faster on rank 3 (the
synthetic straggler), then again (the inputs' hashes remembered, profiler.store.hashcache).

CPU = user + system of the process and the children it waited for (`/usr/bin/time -v`; the Dask
workers are children of this process's cluster); peak RSS = the largest process's (for --workers,
the driver's: each worker's own peak is printed by the child script). Prints one markdown row
per measurement with the machine's load average before it.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

WHAT_IF = r"""
import resource, sys, time
from profiler.analysis import stored
c0, w0 = time.process_time(), time.perf_counter()
s = stored.load(sys.argv[1])
c1, w1 = time.process_time(), time.perf_counter()
for i in range(2):
    a, b = time.process_time(), time.perf_counter()
    out = s.what_if_summary(phase="dispatch/send_chunk", speedup=0.3, rank=3)
    print(f"what-if {i}: {time.process_time() - a:.2f} s CPU, {time.perf_counter() - b:.2f} s wall, "
          f"{len(out)} iterations, median op change {out['op_change_ns'].median():.0f} ns")
print(f"stored results read: {c1 - c0:.2f} s CPU, {w1 - w0:.2f} s wall; peak RSS "
      f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6:.2f} GB")
"""


def _timed(cmd: list[str]) -> dict:
    # the checkout first; a PYTHONPATH the caller set (dependencies installed to a folder) kept after it
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    load = os.getloadavg()[0]
    p = subprocess.run(["/usr/bin/time", "-v", *cmd], capture_output=True, text=True, env=env, cwd=ROOT)
    if p.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{p.stdout}\n{p.stderr}")
    err = p.stderr

    def num(label):
        return float(re.search(rf"{re.escape(label)}: ([0-9.:]+)", err).group(1).split(":")[-1])
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): ([0-9:.]+)", err).group(1).split(":")
    return {"cpu": num("User time (seconds)") + num("System time (seconds)"),
            "rss_gb": num("Maximum resident set size (kbytes)") / 1e6,
            "wall": sum(float(x) * 60 ** i for i, x in enumerate(reversed(wall))), "load": load,
            "out": p.stdout.strip()}


def _stored_digest(run: Path) -> dict[str, str]:
    out = {}
    for p in sorted([run / "analysis-summary.json", *(run / "analysis").rglob("*")]):
        if p.is_file():
            out[str(p.relative_to(run))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def _row(what: str, m: dict) -> str:
    return f"| {what} | {m['cpu']:.1f} | {m['rss_gb']:.2f} | {m['wall']:.1f} | {m['load']:.1f} |"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("run", type=Path)
    ap.add_argument("--analyze", action="store_true")
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--report", action="store_true")
    ap.add_argument("--what-if", action="store_true")
    ap.add_argument("--repeat", type=int, default=1)
    a = ap.parse_args(argv)
    py = sys.executable
    print("| measurement | CPU s | peak RSS GB | wall s | load before |\n| --- | --- | --- | --- | --- |")
    extra = []
    for _ in range(a.repeat):
        if a.analyze or a.workers:
            print(_row("`epscope analyze`", _timed([py, "-m", "profiler", "analyze", str(a.run)])), flush=True)
        if a.workers:
            alone = _stored_digest(a.run)
            m = _timed([py, "-m", "profiler", "analyze", str(a.run), "--workers", str(a.workers)])
            print(_row(f"`epscope analyze --workers {a.workers}`", m), flush=True)
            same = _stored_digest(a.run) == alone
            extra.append(f"--workers {a.workers}: stored files {'identical' if same else 'DIFFERENT'} to the "
                         f"single-process analysis ({len(alone)} files)")
        if a.report:
            m = _timed([py, "-m", "profiler", "report", str(a.run)])
            print(_row("`epscope report` (stored results)", m), flush=True)
        if a.what_if:
            with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
                f.write(WHAT_IF)
            m = _timed([py, f.name, str(a.run)])
            os.unlink(f.name)
            print(_row("exact what-if, fresh process (load stored + 2 what-ifs)", m), flush=True)
            extra.append(m["out"])
    for line in extra:
        print("\n" + line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
