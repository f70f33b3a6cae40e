"""How often runs of one config land on opposite sides of a decision (issue 29), measured.

For each scenario of profiler.groundtruth.synthetic that has nothing planted on a rank (host_jitter: every
rank's host held a random delay before each op, the late rank random per op) and for planted ones
(late_host_random, upstream_gpu), at several sizes, many seeds and iteration counts: every page's
verdicts, their decisions (profiler.analysis.decision) and how many seeds each band got per
quantity. A row with both "alarm" and "none" is a config whose runs flip.

    python benchmarks/decision_stability.py --seeds 40 --iterations 2,3,6 -o benchmarks/results/decision-stability-cpu-DATE-COMMIT.md
"""
from __future__ import annotations

import argparse
import datetime as dt
import math
import subprocess
import sys
import warnings
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from profiler.analysis import barrier_contention, critical_path, idle_warps  # noqa: E402
from profiler.groundtruth.synthetic import make_events  # noqa: E402

CASES = [("host_jitter", size, {}) for size in (20_000, 60_000, 120_000, 240_000, 480_000)] + [
    ("late_host_random", 120_000, {"late_rank": 1}), ("late_host_random", 30_000, {"late_rank": 1}),
    ("upstream_gpu", 60_000, {"late_rank": 1})]


def bands(scenario: str, size: int, kw: dict, seed: int, iterations: int) -> tuple[dict, float]:
    """{quantity: band} of one run's decisions (thresholded ones), and the late-entry finding's share."""
    ev, la, man = make_events(ranks=2, events=20_000, scenario=scenario, late_ns=size, seed=seed,
                              iterations=iterations, blocks=2, **kw)
    out, finding = {}, math.nan
    for f in (critical_path, idle_warps, barrier_contention):
        for d in f(ev, registry=man["registry"], launches=la).verdict.decisions:
            if math.isfinite(d.threshold):
                out.setdefault(d.quantity, d.band)
            elif d.quantity == "late-entry wait (all ranks)":
                finding = d.share
    return out, finding


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=40)
    ap.add_argument("--iterations", default="2,3,6")
    ap.add_argument("-o", "--out", type=Path)
    a = ap.parse_args()
    warnings.simplefilter("ignore")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    lines = [f"# Decision stability on synthetic runs (issue 29), {dt.date.today()} at {commit} (+ working tree)", "",
             f"`python benchmarks/decision_stability.py --seeds {a.seeds} --iterations {a.iterations}` on the CPU: "
             "2 ranks, 2 blocks, 20 k events; per quantity, how many seeds got each band (a = alarm, b = "
             "borderline, n = none). FLIP marks a config with both alarm and none. The late-entry finding's share "
             "(every rank's late-entry wait over the iteration) is its mean over seeds.", "",
             "| scenario | size µs | iterations | finding share | quantity | alarm | borderline | none | |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for n in (int(x) for x in a.iterations.split(",")):
        for scenario, size, kw in CASES:
            counts: dict = defaultdict(Counter)
            shares = []
            for seed in range(a.seeds):
                b, share = bands(scenario, size, kw, seed, n)
                shares.append(share)
                for q, band in b.items():
                    counts[q][band] += 1
            mean = sum(x for x in shares if x == x) / max(1, sum(1 for x in shares if x == x))
            for q, c in sorted(counts.items()):
                flip = "FLIP" if c["alarm"] and c["none"] else ""
                lines.append(f"| {scenario} | {size / 1e3:g} | {n} | {100 * mean:.0f}% | {q} | {c['alarm']} | "
                             f"{c['borderline']} | {c['none']} | {flip} |")
            print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    if a.out:
        a.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
