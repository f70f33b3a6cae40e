"""Benchmark of the analyses on a synthetic 10-million-event run of 8 ranks (issue 4's number:
critical path + idle warps + barrier contention <= 10 s together on the 2-core dev machine).

    python benchmarks/bench_analysis.py [--events 10000000] [--ranks 8] [--out benchmarks/results/analysis-cpu-DATE.md]

Times each analysis from a cold graph cache, called as the viewer calls them (viewer/analyses.py:
each given the launch table, so they share one dependency graph: the first one pays its build,
the others reuse it; issue 20 found this benchmark calling idle without launches, which the
viewer did not), best of --repeat runs, and prints a table that
is also written, with the CPU name, commit and date, to --out. Beside the wall-clock seconds it
gives the process CPU seconds (user + system): on the shared 2-core dev machine other helpers'
work stretches wall time by up to 3x, while CPU time stays comparable between two commits.
"""
from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from profiler.analysis import barrier_contention, compare, critical_path, idle_warps, what_if  # noqa: E402
from profiler.analysis import graph as G  # noqa: E402
from profiler.groundtruth.synthetic import make_events  # noqa: E402
from benchmarks.machine import cpu_name, commit as _commit  # noqa: E402

ANALYSIS_PATHS = ("profiler/analysis", "profiler/groundtruth/synthetic.py")  # the code this benchmark times

TARGET_S = 10.0   # issue 4: critical path + idle + barrier analyses on 10 M events, 2-core machine




def timed(fn):
    t, c = time.perf_counter(), time.process_time()
    out = fn()
    timed.cpu = time.process_time() - c
    return time.perf_counter() - t, out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=10_000_000)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()

    print(f"generating a synthetic run: {a.ranks} ranks, ~{a.events:,} events ...", flush=True)
    tg, (ev, la, man) = timed(lambda: make_events(ranks=a.ranks, events=a.events, scenario="slow_rank", seed=0))
    reg = man["registry"]
    print(f"  {len(ev):,} events in {tg:.1f} s", flush=True)

    best = None
    for rep in range(a.repeat):
        G._CACHE.clear()
        t_cp, cp = timed(lambda: critical_path(ev, registry=reg, launches=la))
        c_cp = timed.cpu
        t_idle, idle = timed(lambda: idle_warps(ev, registry=reg, launches=la))
        c_idle = timed.cpu
        t_bar, bar = timed(lambda: barrier_contention(ev, registry=reg, launches=la))
        c_bar = timed.cpu
        G._CACHE.clear()
        t_build, _ = timed(lambda: G.build(ev, reg, la))
        row = dict(cp=t_cp, idle=t_idle, bar=t_bar, total=t_cp + t_idle + t_bar, build=t_build,
                   c_cp=c_cp, c_idle=c_idle, c_bar=c_bar, c_total=c_cp + c_idle + c_bar, c_build=timed.cpu)
        print(f"  run {rep}: critical path {t_cp:.2f} s (incl. graph build), idle {t_idle:.2f} s, "
              f"barriers {t_bar:.2f} s, total {row['total']:.2f} s (CPU {row['c_total']:.2f} s); "
              f"graph build alone {t_build:.2f} s", flush=True)
        if best is None or row["total"] < best["total"]:
            best = row
    t_wi, wi = timed(lambda: what_if(ev, phase="send_chunk", speedup=0.2, rank=man["synthetic"]["slow_rank"], registry=reg,
                                     launches=la, graph=cp.graph, new_path=False))
    c_wi = timed.cpu
    half = ev[ev["iteration"] < ev["iteration"].max() // 2 + 1]
    t_cmp, cmpr = timed(lambda: compare(half, ev[ev["iteration"] > ev["iteration"].max() // 2], n_boot=2000))
    c_cmp = timed.cpu

    ok = best["total"] <= TARGET_S
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    lines = [
        f"# Analyses on a synthetic {len(ev) / 1e6:.1f} M-event run of {a.ranks} ranks",
        "",
        f"- CPU: {cpu_name()} ({os.cpu_count()} cores visible), Python {platform.python_version()}",
        f"- commit: {_commit(ANALYSIS_PATHS)}, date: {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC, "
        f"1-min load average at the end: {load:.1f} (other processes share the machine)",
        f"- command: `python benchmarks/bench_analysis.py --events {a.events} --ranks {a.ranks} --repeat {a.repeat}`",
        f"- run: `make_events(scenario='slow_rank')`, {man['config']['blocks']} blocks x {man['config']['warps_per_block']} warps "
        f"per rank, {man['config']['chunks']} chunks per pair and channel, {man['workload']['iterations']} iterations",
        "",
        "| analysis | seconds (best of {}) | CPU seconds |".format(a.repeat),
        "| --- | ---: | ---: |",
        f"| critical_path (cold: builds the shared dependency graph) | {best['cp']:.2f} | {best['c_cp']:.2f} |",
        f"| idle_warps (graph cached) | {best['idle']:.2f} | {best['c_idle']:.2f} |",
        f"| barrier_contention (graph cached) | {best['bar']:.2f} | {best['c_bar']:.2f} |",
        f"| **critical path + idle + barriers** | **{best['total']:.2f}** (target <= {TARGET_S:.0f}: "
        f"{'met' if ok else 'MISSED'}) | **{best['c_total']:.2f}** |",
        f"| graph build alone | {best['build']:.2f} | {best['c_build']:.2f} |",
        f"| what_if(send_chunk 20% faster on the slow rank) on the critical path's graph, summary only (as the viewer asks) | {t_wi:.2f} | {c_wi:.2f} |",
        f"| compare(first half vs second half of the iterations, 2000 bootstrap draws) | {t_cmp:.2f} | {c_cmp:.2f} |",
        "",
        f"Results: pacing rank {cp.pacing_rank} (planted slow rank: {man['synthetic']['slow_rank']}); "
        f"{len(cp.segments):,} path segments; what-if change {wi.summary['change_pct'].mean():+.2f}% "
        f"(absorbed {wi.summary['absorbed_pct'].mean():.0f}% of the local saving); idle verdict: "
        f"{idle.verdict.headline!r}; {len(bar.occurrences):,} barrier occurrences.",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        Path(a.out).write_text(text)
        print(f"written to {a.out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
