"""Issue 32's damage classes, the long run: everything around a run's data files, each case through
every reader (load_run + events, report, export, check deep, `epscope analyze`'s store_run; the
viewer's catalog, Runs page and stored-results readers where the class concerns them), counting per
class the cases, the readers' verdicts, the silent ones (a reader accepted or served what the damage
made wrong) and the tracebacks (an untyped error, or a reader that did not return within 60 s).
Classes and cases: tests/profiler/damage.py (CLASSES, run_class); the CI sample:
tests/test_corruption.py.

    nice python3 benchmarks/damage_classes.py [--cases 100] [--seed 32] [--workers 2] \
        --out benchmarks/results/damage-classes-cpu-DATE-COMMIT.md

"special files" enumerates every file a run holds (8) times every kind (6): 48 cases, --cases does
not apply; every other class generates --cases cases from the seed.
"""
from __future__ import annotations

import argparse
import datetime as dt
import multiprocessing as mp
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.machine import commit, cpu_name  # noqa: E402


def run_one(args):
    name, n, seed = args
    from tests.profiler.damage import run_class
    with tempfile.TemporaryDirectory(prefix="damage-classes-") as d:
        t0 = time.perf_counter()
        r = run_class(name, n, seed, Path(d))
        return r, time.perf_counter() - t0


def main() -> None:
    from tests.profiler.damage import CLASSES
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=100)
    ap.add_argument("--seed", type=int, default=32)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--classes", nargs="*", default=list(CLASSES))
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    load0, t0 = os.getloadavg(), time.time()
    with mp.get_context("spawn").Pool(a.workers) as pool:
        results = pool.map(run_one, [(c, a.cases, a.seed) for c in a.classes], chunksize=1)
    lines = [f"# Damage around a run's data files: issue 32's classes ({dt.date.today().isoformat()})", "",
             f"commit {commit(('profiler', 'viewer', 'tests', 'benchmarks'))}; {cpu_name()}, {os.cpu_count()} cores, "
             f"Python {platform.python_version()}; {a.workers} workers under nice; load average {load0[0]:.2f} at start; "
             f"{time.time() - t0:.0f} s; seed {a.seed}", "",
             f"`nice python3 benchmarks/damage_classes.py --cases {a.cases} --seed {a.seed} --workers {a.workers} --out ...`",
             "", "Each case on a fresh copy of a sealed synthetic run (2 ranks, 800 events) with its analyses stored. "
             "Silent: a reader accepted or served what the damage made wrong (a run read, a stored result shown, "
             "`epscope check` not reporting it, a race's stored results not those of the data the run holds). "
             "Tracebacks: an untyped error, or readers not returning within 60 s (a hang).", "",
             "| class | cases | verdicts (readers' outcomes joined, counted) | silent | tracebacks | s |",
             "|---|---:|---|---:|---:|---:|"]
    silent = tracebacks = 0
    details = []
    for r, took in results:
        v = ", ".join(f"{k} {n}" for k, n in sorted(r.verdicts.items(), key=lambda kv: -kv[1]))
        lines.append(f"| {r.name} | {r.cases} | {v} | {len(r.silent)} | {len(r.tracebacks)} | {took:.0f} |")
        silent += len(r.silent)
        tracebacks += len(r.tracebacks)
        details += [f"- silent: {r.name}: {x}" for x in r.silent[:20]] + [f"- traceback: {r.name}: {x}" for x in r.tracebacks[:20]]
    total = sum(r.cases for r, _ in results)
    lines += ["", f"**{total:,} cases, {silent} silent, {tracebacks} tracebacks.**"]
    if details:
        lines += ["", *details]
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        a.out.write_text(text)
    sys.exit(1 if silent or tracebacks else 0)


if __name__ == "__main__":
    main()
