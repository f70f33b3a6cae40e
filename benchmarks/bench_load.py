"""Opening a run as a user meets it: `load_run(RUN).events` as the first call of a fresh process
(what `epscope report` and the viewer's first visit pay), for 1 M and 10 M events; and the
`kind` column built through its codes against the old way through strings.

    python3 benchmarks/bench_load.py [--sizes 1e6 10e6] [--repeats 5] [--out benchmarks/results/...]

Target (issue 14): load_run of 10 M events <= 1 s cold. Each measurement runs in its own
process (imports not counted, reported apart); the run's files are in the OS page cache, as
they are right after a recording or on a second look at a run.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.machine import commit as machine_commit, cpu_name  # noqa: E402

CHILD = """
import json, sys, time
t0 = time.perf_counter()
from profiler.store.runstore import load_run
t1, c1 = time.perf_counter(), time.process_time()
run = load_run(sys.argv[1])
t2 = time.perf_counter()
ev = run.events
t3, c3 = time.perf_counter(), time.process_time()
print(json.dumps({"import_s": t1 - t0, "open_s": t2 - t1, "events_s": t3 - t2, "load_s": t3 - t1,
                  "cpu_s": c3 - c1, "rows": len(ev)}))
"""


def make_run(n: int, where: Path) -> Path:
    from benchmarks.bench_profiler import synth_events
    from profiler.store.runstore import write_run
    ev, la = synth_events(n)
    return write_run(where / f"run-{n}", ev, la, {"name": f"bench-load {n}"}, perfetto=False)


def cold_load(run: Path, repeats: int) -> dict:
    out = []
    for _ in range(repeats):
        p = subprocess.run([sys.executable, "-c", CHILD, str(run)], capture_output=True, text=True, cwd=ROOT,
                           env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
        if p.returncode:
            raise RuntimeError(p.stderr)
        out.append(json.loads(p.stdout))
    return {k: statistics.median(o[k] for o in out) for k in out[0]} | {"all_load_s": [o["load_s"] for o in out]}


def kind_column(n: int, repeats: int) -> dict:
    """The kind column of n stored rows (a categorical in stored order) to the schema's."""
    import numpy as np
    import pandas as pd

    from profiler.store.schema import EVENT_KINDS, kind_column as by_codes
    rng = np.random.default_rng(0)
    stored = pd.Series(pd.Categorical.from_codes(rng.integers(0, 5, n).astype(np.int8),
                                                 ["arrive", "depart", "host", "instant", "span"]))

    def by_strings(s):   # what coerce_events did before (commit 7f835a5)
        return pd.Categorical(s.astype(str), categories=EVENT_KINDS)

    times = {}
    for name, f in (("strings", by_strings), ("codes", by_codes)):
        ts = []
        for _ in range(repeats):
            t = time.perf_counter()
            got = f(stored)
            ts.append(time.perf_counter() - t)
        times[name] = statistics.median(ts)
        times[name + "_result"] = got
    assert (np.asarray(times.pop("strings_result")) == np.asarray(times.pop("codes_result"))).all()
    return times


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", nargs="+", type=float, default=[1e6, 10e6])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    load0 = os.getloadavg()[0]
    lines = ["# load_run, cold (first call in a fresh process)", "",
             f"{cpu_name()} ({os.cpu_count()} cores), {dt.date.today()}, commit {machine_commit(('profiler',))}, "
             f"medians of {a.repeats} processes; files in the page cache; imports not counted (shown apart).",
             "LOADAVG", "",
             "| events | load_run + .events (wall) | of which .events | CPU time (all threads) | import profiler.store.runstore | target |",
             "| ---: | ---: | ---: | ---: | ---: | --- |"]
    with tempfile.TemporaryDirectory(prefix="epscope-bench-load-") as tmp:
        for n in map(int, a.sizes):
            run = make_run(n, Path(tmp))
            r = cold_load(run, a.repeats)
            assert r["rows"] == n or r["rows"] >= n * 0.99, r
            target = "≤ 1 s" if n >= 10_000_000 else ""
            lines.append(f"| {r['rows']:,} | {r['load_s']:.3f} s | {r['events_s']:.3f} s | {r['cpu_s']:.3f} s | "
                         f"{r['import_s']:.3f} s | {target} |")
            print(lines[-1], "all:", [round(x, 3) for x in r["all_load_s"]], flush=True)
    k = kind_column(10_000_000, a.repeats)
    lines += ["", "`kind` column of 10 M stored rows to the schema's categories (issue 14: 2.16 s → ~17 ms):", "",
              f"- through strings (before): {k['strings'] * 1e3:.0f} ms",
              f"- remapping the codes (now, `schema.kind_column`): {k['codes'] * 1e3:.1f} ms (identical column)"]
    lines[lines.index("LOADAVG")] = (f"Load average (1 min) {load0:.1f} at the start, {os.getloadavg()[0]:.1f} at "
                                      "the end: other processes on the machine slow every figure here.")
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        a.out.write_text(text)


if __name__ == "__main__":
    main()
