"""What issue 32's checks cost a whole read of a run: `load_run(RUN).events` (checksum, schema, and
now the tables checked against each other: every event's launch, no repeated row) as the first call
of a fresh process, this tree against another checkout, alternating, on one run written by the
older checkout's writer (both read it).

    nice python3 benchmarks/bench_integrity_cost.py --before /path/to/old/checkout [--events 2e6]
        [--repeats 5] --out benchmarks/results/integrity-cost-cpu-DATE-COMMIT.md
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
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.machine import commit, cpu_name  # noqa: E402

CHILD = """
import json, sys, time
sys.path.insert(0, sys.argv[1])
from profiler.store.runreader import load_run
t, w = time.process_time(), time.perf_counter()
r = load_run(sys.argv[2]); n = len(r.events)
print(json.dumps({"cpu": time.process_time() - t, "wall": time.perf_counter() - w, "events": n}))
"""


def one(checkout: Path, run: Path) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, str(checkout), str(run)], capture_output=True, text=True,
                         check=True, env=dict(os.environ, PYTHONPATH=str(checkout)))
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=Path, required=True)
    ap.add_argument("--events", type=float, default=2e6)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="integrity-cost-") as d:
        make = (f"import sys; sys.path.insert(0, {str(a.before)!r}); from profiler.groundtruth.synthetic import make_run; "
                f"make_run({d!r} + '/run', ranks=8, events={int(a.events)}, perfetto=False)")
        subprocess.run([sys.executable, "-c", make], check=True, env=dict(os.environ, PYTHONPATH=str(a.before)))
        got = {"before": [], "this tree": []}
        for _ in range(a.repeats):
            got["before"].append(one(a.before, Path(d) / "run"))
            got["this tree"].append(one(ROOT, Path(d) / "run"))
    n = got["this tree"][0]["events"]
    lines = [f"# Cost of issue 32's checks on a whole read ({dt.date.today().isoformat()})", "",
             f"commit {commit(('profiler', 'benchmarks'))}; {cpu_name()}, {os.cpu_count()} cores; load average "
             f"{load0[0]:.2f} at start; `nice python3 benchmarks/bench_integrity_cost.py --before {a.before} "
             f"--events {a.events:g} --repeats {a.repeats}`", "",
             f"`load_run(RUN).events` of a synthetic run of {n:,} events (8 ranks, written by the older checkout, "
             "with checksums) as the first call of a fresh process (imports not counted; the files in the page "
             "cache), the two checkouts alternating.", "",
             "| checkout | CPU s, median (min-max) | wall s, median |", "|---|---|---|"]
    for k, xs in got.items():
        cpu = sorted(x["cpu"] for x in xs)
        lines.append(f"| {k} | {statistics.median(cpu):.3f} ({cpu[0]:.3f}-{cpu[-1]:.3f}) | "
                     f"{statistics.median(x['wall'] for x in xs):.3f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        a.out.write_text(text)


if __name__ == "__main__":
    main()
