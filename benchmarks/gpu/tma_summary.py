"""The compact table tma_gpu.sh prints last: issue 11's one device call at a glance.

Reads what the call left under OUT (nothing is measured here): the GPU tests' pytest summary
lines, tma_bench.json (kernel table and hook table, rank 0's rows: the bench writes the same
slowest-rank medians for every rank), the re-recorded story runs (idle-warps verdict per run,
computed here by profiler.analysis, the page the ab-tma-buffers fix is about), the catalogue's
group lines and the verdict test's summary line.

    PYTHONPATH=. python benchmarks/gpu/tma_summary.py --out $OUT [--runs DIR]
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

SUMMARY_LINE = re.compile(r"\b\d+ (passed|failed|error)")
PATHS = ("direct", "tma N=1", "tma N=2", "tma N=3")


def pytest_line(log: Path) -> str:
    if not log.exists():
        return f"{log.name}: not run"
    lines = [x for x in log.read_text(errors="replace").splitlines() if SUMMARY_LINE.search(x)]
    return f"{log.name}: {lines[-1].strip('= ') if lines else 'no pytest summary line (crashed or timed out)'}"


def kernel_table(bench: dict) -> list[str]:
    rows = bench["ranks"][0]["rows"]
    cell = {(r["routing"], r["op"], r["sms"], r["path"]): r for r in rows}
    keys = sorted({(r["routing"], r["op"], r["sms"]) for r in rows})
    out = [f"{'routing':<15}{'op':<15}{'SMs':>4}  " + "".join(f"{p:>18}" for p in PATHS)]
    for k in keys:
        cells = []
        for p in PATHS:
            r = cell.get((*k, p))
            cells.append(f"{r['logical_GBps']:>7.0f} ({r['kernel_us']:>5.0f} µs)" if r else f"{'-':>18}")
        out.append(f"{k[0]:<15}{k[1]:<15}{k[2]:>4}  " + "".join(f"{c:>18}" for c in cells))
    return out


def hook_table(bench: dict) -> list[str]:
    out = [f"{'SMs':>4} {'op':<14}{'mode':<16}{'kernel µs':>10}{'send->ret GB/s':>16}{'matmul':>9}{'SMs held':>9}"]
    for r in bench["ranks"][0].get("hook_rows", []):
        out.append(f"{r['sms']:>4} {r['op']:<14}{r['mode']:<16}{r['kernel_us']:>10.0f}"
                   f"{r['send_to_return_GBps']:>16.0f}{r['gemm_slowdown_pct']:>+8.1f}%{r['sms_held_during_transfer']:>9}")
    return out


def story_rows(runs: Path) -> list[str]:
    from profiler.analysis import idle_warps
    from profiler.store.runstore import load_run

    out = []
    for d in sorted(p.parent for p in runs.rglob("manifest.json") if (p.parent / "events.parquet").exists()):
        try:
            run = load_run(d)
            v = idle_warps(run.events, registry=run.manifest.get("registry"), launches=run.launches).verdict
            out.append(f"{d.name:<26} idle {'ALARM' if v.alarm else 'ok   '} {v.headline[:110]}")
        except Exception as e:  # noqa: BLE001 (one unreadable run must not hide the others)
            out.append(f"{d.name:<26} unreadable: {type(e).__name__}: {str(e)[:100]}")
    return out or [f"no runs under {runs}"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--runs", default=None, help="the recorded story runs (default OUT/traces)")
    a = ap.parse_args(argv)
    out = Path(a.out)
    print("\n==== issue 11 summary ====")
    for log in ("gpu_tests.log", "verdicts.log"):
        print(pytest_line(out / log))
    bench = out / "tma_bench.json"
    if bench.exists():
        b = json.loads(bench.read_text())
        print(f"\nkernel table, logical GB/s (kernel µs), commit {b['meta'].get('commit', '?')[:12]}:")
        print("\n".join(kernel_table(b)))
        print("\nhook vs normal, 8192^2 matmul on the compute stream:")
        print("\n".join(hook_table(b)))
    else:
        print("\ntma_bench.json: missing (bench not run or crashed; see tma_bench.log)")
    stories = out / "stories.log"
    if stories.exists():
        print("\nstories (idle-warps verdict per re-recorded run; catalogue group lines):")
        print("\n".join(story_rows(Path(a.runs) if a.runs else out / "traces")))
        for line in stories.read_text(errors="replace").splitlines():
            if line.startswith("group ") or "planted cause" in line or "check" in line.lower() and "fail" in line.lower():
                print(line[:220])
    return 0


if __name__ == "__main__":
    sys.exit(main())
