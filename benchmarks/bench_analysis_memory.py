"""CPU seconds and peak RSS of a run's analyses, each measurement in a fresh process (issue 20).

    python benchmarks/bench_analysis_memory.py make --events 10000000 --iterations 4 DIR
    python benchmarks/bench_analysis_memory.py measure DIR [--code PATH] [--mode whole|chunked|cli] [--repeat 2]
    python benchmarks/bench_analysis_memory.py big --iterations 100 --per-iteration 1000000
    python benchmarks/bench_analysis_memory.py make-long --iterations 100 --per-iteration 1000000 DIR

`make` writes a synthetic run of 8 ranks (profiler.groundtruth.synthetic, scenario slow_rank) as a run
directory. `measure` starts a fresh Python for each repeat (cold: nothing imported, nothing
cached) that reads the run's events and launch table, then runs the analyses the way the viewer
does (viewer/analyses.py: one dependency graph per run, critical path, idle and barriers each
given the launch table, and the time model every page reads). It reports, from the child's own
resource.getrusage, the CPU seconds (user + system) of the analyses alone (after the read), the
peak RSS of the whole process, and the RSS after the read (the event table itself), and the
verdicts (so two codes are checked to agree). `--code` imports profiler/ from another checkout
(`git worktree add /tmp/base <commit>`), so the code before a change is measured beside it in one
session. `--mode chunked` calls profiler.analysis.chunked.analyze_run (per-iteration chunks).
`--mode cli` runs `python -m profiler analyze DIR` (the `epscope analyze` command: open the run,
analyse it, store RUN/analysis-summary.json) and reports the whole process's CPU (user + system,
imports included) and peak RSS from os.wait4, and the verdicts it stored.
`big` analyses a synthetic run made one iteration at a time and never held whole (chunked.
analyze_chunks), reporting the generator's CPU apart from the analyses'.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = textwrap.dedent("""
    import json, resource, sys, time
    mode, run_dir, budget = sys.argv[1], sys.argv[2], int(sys.argv[3])
    def usage():
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime, r.ru_stime, r.ru_maxrss * 1024, r.ru_minflt
    def rss():
        for line in open("/proc/self/status"):
            if line.startswith("VmRSS"):
                return int(line.split()[1]) * 1024
    from profiler.store.runstore import load_run
    u0, s0, _, f0 = usage()
    out = {}
    if mode == "whole":
        from profiler.analysis import barrier_contention, critical_path, idle_warps
        from profiler.analysis import graph as G
        from profiler.analysis.timemodel import time_model
        run = load_run(run_dir)
        ev, la, reg = run.events, run.launches, run.manifest.get("registry")
        u1, s1, _, f1 = usage()
        out["rss_after_read"] = rss()
        t = time.perf_counter()
        cp = critical_path(ev, registry=reg, launches=la)
        idle = idle_warps(ev, registry=reg, launches=la)
        bar = barrier_contention(ev, registry=reg, launches=la)
        tm = time_model(G.build(ev, reg, la))
        n = len(ev)
    else:
        from profiler.analysis import chunked
        from profiler.store.runstore import load_run
        run = load_run(run_dir)
        u1, s1, _, f1 = usage()
        out["rss_after_read"] = rss()
        t = time.perf_counter()
        res = chunked.analyze_run(run, max_events=budget)
        cp, idle, bar, tm = res.critical, res.idle, res.barriers, res.time_model
        n = run.num_events
    wall = time.perf_counter() - t
    u2, s2, peak, f2 = usage()
    out.update(mode=mode, events=int(n), read_cpu_s=u1 - u0 + s1 - s0, cpu_s=u2 - u1 + s2 - s1,
               user_s=u2 - u1, sys_s=s2 - s1, wall_s=wall, peak_rss=peak, minor_faults=f2 - f1,
               verdicts={k: v.verdict.headline for k, v in (("critical_path", cp), ("idle", idle), ("barriers", bar))},
               pacing_rank=int(cp.pacing_rank), segments=int(len(cp.segments)), ops=int(len(tm.ops)))
    print("RESULT " + json.dumps(out))
""")


BIG = textwrap.dedent("""
    import json, resource, sys, time
    import numpy as np
    from profiler.analysis import chunked
    from profiler.groundtruth.synthetic import make_events, make_iterations
    iterations, per_it, ranks, scenario = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    gen = {"cpu": 0.0, "events": 0}
    reg = {}
    def chunks():
        # one iteration per chunk (profiler.groundtruth.synthetic.make_iterations: each simulated with its own
        # seed and moved after the previous one): a run that never exists whole in memory
        it = make_iterations(ranks=ranks, per_iteration=per_it, iterations=iterations, scenario=scenario)
        while True:
            c = time.process_time()
            try:
                ev, la, man = next(it)
            except StopIteration:
                return
            reg["registry"] = man["registry"]
            gen["cpu"] += time.process_time() - c
            gen["events"] += len(ev)
            yield ev, la
    make_events(ranks=ranks, events=1000, iterations=1)        # imports and first-call costs
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    first = next(iter(chunks()))
    reg_ = reg["registry"]
    gen["cpu"] = 0.0; gen["events"] = 0
    del first
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t = time.perf_counter()
    res = chunked.analyze_chunks(chunks, registry=reg_, launches=None, ranks=ranks)
    wall = time.perf_counter() - t
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime
    print("RESULT " + json.dumps(dict(mode="big", scenario=scenario, iterations=iterations, generated_events_both_passes=gen["events"],
          chunks=res.chunks, largest_chunk=res.largest_chunk, cpu_s=cpu, generate_cpu_s=gen["cpu"],
          analyses_cpu_s=cpu - gen["cpu"], sys_s=r1.ru_stime - r0.ru_stime, wall_s=wall,
          peak_rss=r1.ru_maxrss * 1024, verdicts={k: v.verdict.headline for k, v in
          (("critical_path", res.critical), ("idle", res.idle), ("barriers", res.barriers))},
          pacing_rank=int(res.critical.pacing_rank), ops=int(len(res.time_model.ops)))))
""")


def big(a) -> None:
    r = subprocess.run([sys.executable, "-c", BIG, str(a.iterations), str(a.per_iteration), str(a.ranks),
                        a.scenario],
                       env=dict(os.environ, PYTHONPATH=str(ROOT)), cwd=str(ROOT), capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"child failed:\n{r.stderr[-3000:]}")
    out = json.loads([x for x in r.stdout.splitlines() if x.startswith("RESULT ")][-1][7:])
    out["load1"] = os.getloadavg()[0]
    print(json.dumps(out), flush=True)


def make_long(a) -> None:
    """A long run written one iteration at a time (synthetic.make_long_run): never whole in memory."""
    import resource
    sys.path.insert(0, str(ROOT))
    from profiler.groundtruth.synthetic import make_long_run
    t = time.perf_counter()
    p = make_long_run(Path(a.dir), ranks=a.ranks, per_iteration=a.per_iteration, iterations=a.iterations)
    r = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"run": str(p), "cpu_s": r.ru_utime + r.ru_stime, "peak_rss": r.ru_maxrss * 1024,
                      "wall_s": time.perf_counter() - t}), flush=True)


def make(a) -> None:
    sys.path.insert(0, str(ROOT))
    from profiler.groundtruth.synthetic import make_run
    p = make_run(Path(a.dir), ranks=a.ranks, events=a.events, scenario="slow_rank", seed=0, iterations=a.iterations,
                 perfetto=False)
    print(p)


def measure_cli(run_dir: str, code: str) -> dict:
    """`epscope analyze run_dir` of the checkout `code`, a fresh process: its rusage."""
    env = dict(os.environ, PYTHONPATH=code)
    with tempfile.TemporaryFile() as err:
        t = time.perf_counter()
        # -P: profiler/ comes from PYTHONPATH (`code`), not from the current directory
        pid = os.posix_spawn(sys.executable, [sys.executable, "-P", "-m", "profiler", "analyze", run_dir], env,
                             file_actions=[(os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
                                           (os.POSIX_SPAWN_DUP2, err.fileno(), 2)])
        _, status, ru = os.wait4(pid, 0)   # the child's own rusage (RUSAGE_CHILDREN's peak is a max over all)
        wall = time.perf_counter() - t
        if os.waitstatus_to_exitcode(status) != 0:
            err.seek(0)
            raise SystemExit(f"child failed ({code}, cli):\n{err.read().decode()[-3000:]}")
    summ = json.loads((Path(run_dir) / "analysis-summary.json").read_text())
    return dict(mode="cli", cpu_s=ru.ru_utime + ru.ru_stime, user_s=ru.ru_utime, sys_s=ru.ru_stime,
                peak_rss=ru.ru_maxrss * 1024, wall_s=wall, minor_faults=ru.ru_minflt,
                verdicts={k: v["headline"] for k, v in summ["verdicts"].items()},
                load1=os.getloadavg()[0], code=code)


def measure_once(run_dir: str, code: str, mode: str, budget: int) -> dict:
    if mode == "cli":
        return measure_cli(run_dir, code)
    env = dict(os.environ, PYTHONPATH=code)
    r = subprocess.run([sys.executable, "-c", CHILD, mode, run_dir, str(budget)], env=env, cwd=code,
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"child failed ({code}, {mode}):\n{r.stderr[-3000:]}")
    line = [x for x in r.stdout.splitlines() if x.startswith("RESULT ")][-1]
    out = json.loads(line[7:])
    out["load1"] = os.getloadavg()[0]
    out["code"] = code
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("dir")
    m.add_argument("--events", type=int, default=10_000_000)
    m.add_argument("--ranks", type=int, default=8)
    m.add_argument("--iterations", type=int, default=4)
    s = sub.add_parser("measure")
    s.add_argument("dir")
    s.add_argument("--code", default=str(ROOT))
    s.add_argument("--mode", choices=("whole", "chunked", "cli"), default="whole")
    s.add_argument("--budget", type=int, default=2_000_000, help="chunked: most events per chunk")
    s.add_argument("--repeat", type=int, default=1)
    b = sub.add_parser("big", help="analyse a synthetic run generated chunk by chunk (one iteration each)")
    b.add_argument("--iterations", type=int, default=100)
    b.add_argument("--per-iteration", type=int, default=1_000_000)
    b.add_argument("--ranks", type=int, default=8)
    b.add_argument("--scenario", default="slow_rank")
    m = sub.add_parser("make-long", help="write a synthetic run one iteration at a time (never whole in memory)")
    m.add_argument("dir")
    m.add_argument("--iterations", type=int, default=100)
    m.add_argument("--per-iteration", type=int, default=1_000_000)
    m.add_argument("--ranks", type=int, default=8)
    a = ap.parse_args(argv)
    if a.cmd == "make-long":
        make_long(a)
        return 0
    if a.cmd == "big":
        big(a)
        return 0
    if a.cmd == "make":
        make(a)
        return 0
    for i in range(a.repeat):
        out = measure_once(a.dir, a.code, a.mode, a.budget)
        out["repeat"] = i
        print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
