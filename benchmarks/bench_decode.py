"""Decode as a user meets it: records/s on one core, cold (the first call in a fresh process, as
`epscope trace`, `report` and the recording session make it) and warm, with page faults and
peak memory, against a structured-view copy of the same bytes.

    python3 benchmarks/bench_decode.py [--sizes 1e6,10e6,50e6] [--runs 5] [--out benchmarks/results/decode-cpu-DATE.md]

Every measurement is a fresh process (`--child`): it builds its buffers, returns freed memory to
the OS (malloc_trim) and resets its peak RSS (/proc/self/clear_refs), then times decode_launches
once (cold) and again (warm). Medians of --runs processes; ratios from the same run. Shapes:
  dense  132 blocks x 16 warps, every region full (nested iteration{work{} tick} spans, the
         selftest registry), capacity sized to the record count;
  sparse the recorded EP runs' shape: 16 records a warp at capacity 128 (the runs in traces/ use 512-4096: their
         buffers would not fit this machine at 10 M records) (flat send_chunk spans
         with a publish_tail instant between), the ep_intranode registry.
Baseline: a numpy structured view of the same buffers and a copy of the four record fields of
the written records (what any numpy decoder reads at least).
Targets (issue 14): >= 50 M records/s cold and warm; peak RSS <= buffers + table + 10 %.
"""
from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
    os.environ[_v] = "1"  # one core: the target is per core

import argparse
import ctypes
import datetime as dt
import json
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.machine import commit as machine_commit, cpu_name  # noqa: E402
from profiler.generated import layout as L  # noqa: E402

BLOCKS, WARPS = 132, 16          # H200 SMs x warps of an EP block
T0 = 1_700_000_000_000_000_000


def _status(key: str) -> float:
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _full_buffer(reg, rng, nreg: int, cap: int, kinds, ids, n: int, t0: int) -> bytes:
    """nreg regions of capacity `cap`, the first n records of each written with the repeating
    pattern (kinds, ids), 0-7 globaltimer steps of 32 ns apart."""
    rdt = np.dtype([("h", L.REGIONHEADER_DTYPE), ("r", L.RECORD_DTYPE, (cap,))])
    regions = np.zeros(nreg, rdt)
    reps = -(-n // len(kinds))
    r = regions["r"][:, :n]
    steps = rng.integers(0, 8, size=(nreg, n), dtype=np.int64) * 32
    t = t0 + rng.integers(0, 5000, size=(nreg, 1)) + np.cumsum(steps, axis=1)
    r["t"], r["kind"], r["id"] = t.astype(np.uint64), np.tile(kinds, reps)[:n], np.tile(ids, reps)[:n]
    r["payload"] = rng.integers(0, 8, size=(nreg, n))
    h = regions["h"]
    h["attempted"], h["state"] = n, L.REGION_STATE_FINISHED
    h["sm"] = np.arange(nreg) // WARPS % BLOCKS
    h["gt_start"], h["gt_end"] = t[:, 0], t[:, -1]
    hdr = np.zeros(1, L.BUFFERHEADER_DTYPE)
    hdr["magic"], hdr["version"], hdr["registry_hash"] = L.MAGIC, L.VERSION, reg.hash
    hdr["num_regions"], hdr["region_capacity"], hdr["warps_per_block"] = nreg, cap, WARPS
    return hdr.tobytes() + regions.tobytes()


def make_items(shape: str, records: int):
    """(items, registries, records) of one benchmark input."""
    from profiler.decode import LaunchInfo
    from profiler.registry import load_all
    rng = np.random.default_rng(1)
    nreg = BLOCKS * WARPS
    if shape == "dense":
        reg = load_all()["selftest"]
        kinds = np.array([L.KIND_BEGIN, L.KIND_BEGIN, L.KIND_END, L.KIND_INSTANT, L.KIND_END], np.uint8)
        ids = np.array([reg.phase(p).id for p in ("iteration", "work", "work", "tick", "iteration")], np.uint16)
        launches = max(1, records // 2_000_000)
        cap = n = max(1, round(records / (launches * nreg)))
    else:
        reg = load_all()["ep_intranode"]
        kinds = np.array([L.KIND_BEGIN, L.KIND_INSTANT, L.KIND_END, L.KIND_BEGIN, L.KIND_END], np.uint8)
        ids = np.array([reg.phase(p).id for p in ("send_chunk", "publish_tail", "send_chunk", "send_chunk", "send_chunk")],
                       np.uint16)
        cap, n = 128, 16
        launches = max(1, round(records / (nreg * n)))
    bufs = [_full_buffer(reg, rng, nreg, cap, kinds, ids, n, T0 + i * 10**7) for i in range(launches)]
    items = [(b, LaunchInfo(0, i, "bench", i, reg.family)) for i, b in enumerate(bufs)]
    return items, {reg.family: reg}, launches * nreg * n


def _structured_copy(items) -> None:
    """The baseline: view each buffer as records and copy the four fields of the written ones."""
    for buf, _ in items:
        h = np.frombuffer(buf, L.BUFFERHEADER_DTYPE, count=1)[0]
        nreg, cap = int(h["num_regions"]), int(h["region_capacity"])
        slots = L.REGIONHEADER_SIZE // L.RECORD_SIZE + cap
        rec = np.frombuffer(buf, L.RECORD_DTYPE, offset=L.BUFFERHEADER_SIZE).reshape(nreg, slots)
        n = int(np.frombuffer(buf, L.REGIONHEADER_DTYPE, count=1, offset=L.BUFFERHEADER_SIZE)["attempted"][0])
        r = rec[:, slots - cap: slots - cap + n]
        for f in ("t", "id", "kind", "payload"):
            np.ascontiguousarray(r[f])


def _timed(fn) -> dict:
    r0, w = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    out = fn()
    wall, r1 = time.perf_counter() - w, resource.getrusage(resource.RUSAGE_SELF)
    return {"wall_s": wall, "user_s": r1.ru_utime - r0.ru_utime, "sys_s": r1.ru_stime - r0.ru_stime,
            "faults": r1.ru_minflt - r0.ru_minflt, "result": out}


def child(shape: str, records: int, what: str, repeats: int) -> dict:
    items, regs, n = make_items(shape, records)
    ctypes.CDLL("libc.so.6").malloc_trim(0)    # give back the builder's temporaries
    rss0 = _status("VmRSS")
    open("/proc/self/clear_refs", "w").write("5")  # peak RSS from here on
    buffers = sum(len(b) for b, _ in items) / 2**20
    runs = []
    if what == "decode":
        from profiler.decode import decode_launches
        for _ in range(repeats):
            r = _timed(lambda: decode_launches(items, regs))
            d = r.pop("result")
            r["events"] = len(d.events)
            r["table_MB"] = sum((d.events[c].cat.codes if d.events[c].dtype == "category" else d.events[c]).to_numpy().nbytes
                                for c in d.events.columns) / 2**20
            r["peak_over_start_MB"] = _status("VmHWM") - rss0
            runs.append(r)
            del d
    else:
        for _ in range(repeats):
            r = _timed(lambda: _structured_copy(items))
            r.pop("result")
            runs.append(r)
    return {"records": n, "buffers_MB": buffers, "rss_start_MB": rss0, "runs": runs,
            "malloc_env": {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")}}


def run_child(shape: str, records: int, what: str, repeats: int, env: dict | None = None) -> dict:
    p = subprocess.run([sys.executable, __file__, "--child", shape, str(records), what, str(repeats)],
                       capture_output=True, text=True, env={**os.environ, **(env or {})})
    if p.returncode:
        raise RuntimeError(p.stderr)
    return json.loads(p.stdout.strip().splitlines()[-1])


def _med(xs):
    return statistics.median(xs)


def measure(shape: str, records: int, runs: int, repeats: int, env: dict | None = None) -> dict:
    dec = [run_child(shape, records, "decode", repeats, env) for _ in range(runs)]
    base = [run_child(shape, records, "baseline", 2) for _ in range(runs)]
    n = dec[0]["records"]
    cold = [d["runs"][0] for d in dec]
    warm = [r for d in dec for r in d["runs"][1:]]
    out = {"shape": shape, "records": n, "events": cold[0]["events"], "buffers_MB": dec[0]["buffers_MB"],
           "table_MB": cold[0]["table_MB"], "runs": runs}
    for name, rs in (("cold", cold), ("warm", warm or cold)):
        out[name] = {k: _med([r[k] for r in rs]) for k in ("wall_s", "user_s", "sys_s", "faults")}
        out[name]["cpu_rate"] = n / _med([r["user_s"] + r["sys_s"] for r in rs])
        out[name]["wall_rate"] = n / out[name]["wall_s"]
    out["peak_over_start_MB"] = _med([max(r["peak_over_start_MB"] for r in d["runs"]) for d in dec])
    out["baseline_cpu_rate"] = n / _med([r["user_s"] + r["sys_s"] for b in base for r in b["runs"][1:]])
    out["baseline_wall_rate"] = n / _med([r["wall_s"] for b in base for r in b["runs"][1:]])
    return out


def report(results: list[dict], malloc: list[dict], a, commit: str, load0, load1) -> str:
    now = dt.datetime.now(dt.timezone.utc)
    lines = [f"# Decode CPU benchmark ({now:%Y-%m-%d})", "",
             f"- CPU: {cpu_name()} ({os.cpu_count()} cores; one thread: OMP/BLAS threads = 1)",
             f"- commit: {commit}, date: {now:%Y-%m-%d %H:%M} UTC, Python {platform.python_version()}, numpy {np.__version__}",
             f"- command: `python3 benchmarks/bench_decode.py --sizes {a.sizes} --runs {a.runs} --out ...`",
             f"- load average at start / end: {load0[0]:.1f} / {load1[0]:.1f} on {os.cpu_count()} cores (shared machine: wall "
             "time includes waiting for a core; CPU time = user + sys is the cost on one core).",
             "- each row: medians of fresh processes; cold = the first decode_launches call of a process, warm = its "
             "repeats; rates are records per second of CPU time (user + sys), wall in brackets.", "",
             "| shape | records | events | cold M rec/s | cold user / sys s | cold faults | warm M rec/s | warm faults | "
             "structured copy M rec/s | decode / copy (cold, warm) | buffers MB | table MB | peak over start MB | "
             "limit (table + 10 % of buffers + table) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in results:
        c, w = r["cold"], r["warm"]
        limit = r["table_MB"] + 0.1 * (r["buffers_MB"] + r["table_MB"])
        lines.append(f"| {r['shape']} | {r['records'] / 1e6:.1f} M | {r['events'] / 1e6:.1f} M | "
                     f"{c['cpu_rate'] / 1e6:.1f} ({c['wall_rate'] / 1e6:.1f}) | {c['user_s']:.3f} / {c['sys_s']:.3f} | "
                     f"{c['faults']:,.0f} | {w['cpu_rate'] / 1e6:.1f} ({w['wall_rate'] / 1e6:.1f}) | {w['faults']:,.0f} | "
                     f"{r['baseline_cpu_rate'] / 1e6:.0f} | {c['cpu_rate'] / r['baseline_cpu_rate']:.2f}, "
                     f"{w['cpu_rate'] / r['baseline_cpu_rate']:.2f} | {r['buffers_MB']:.0f} | {r['table_MB']:.0f} | "
                     f"{r['peak_over_start_MB']:.0f} | {limit:.0f} |")
    if malloc:
        lines += ["", "## glibc malloc thresholds (MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_ raised in the "
                  "environment of the same measurement)", "",
                  "| shape | records | env | cold M rec/s | cold user / sys s | cold faults |", "| --- | --- | --- | --- | --- | --- |"]
        for env, r in malloc:
            c = r["cold"]
            lines.append(f"| {r['shape']} | {r['records'] / 1e6:.1f} M | {env or 'default'} | {c['cpu_rate'] / 1e6:.1f} | "
                         f"{c['user_s']:.3f} / {c['sys_s']:.3f} | {c['faults']:,.0f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1e6,10e6,50e6")
    ap.add_argument("--shapes", default="dense,sparse")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3, help="decodes per process (the first is cold)")
    ap.add_argument("--malloc", action="store_true", help="also measure with raised glibc malloc thresholds")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.child[0], int(a.child[1]), a.child[2], int(a.child[3]))))
        return
    commit, load0 = machine_commit(("profiler", "benchmarks")), os.getloadavg()
    results, malloc = [], []
    for shape in a.shapes.split(","):
        for size in a.sizes.split(","):
            r = measure(shape, int(float(size)), a.runs, a.repeats)
            results.append(r)
            print(f"{shape} {r['records'] / 1e6:.1f} M: cold {r['cold']['cpu_rate'] / 1e6:.1f} M/s CPU "
                  f"({r['cold']['user_s']:.3f} user, {r['cold']['sys_s']:.3f} sys, {r['cold']['faults']:.0f} faults), "
                  f"warm {r['warm']['cpu_rate'] / 1e6:.1f} M/s, copy {r['baseline_cpu_rate'] / 1e6:.0f} M/s, "
                  f"peak +{r['peak_over_start_MB']:.0f} MB (table {r['table_MB']:.0f}, buffers {r['buffers_MB']:.0f})", flush=True)
    if a.malloc:
        env = {"MALLOC_MMAP_THRESHOLD_": str(1 << 30), "MALLOC_TRIM_THRESHOLD_": str(1 << 30)}
        for shape in a.shapes.split(","):
            n = int(float(a.sizes.split(",")[min(1, len(a.sizes.split(",")) - 1)]))
            for e in ({}, env):
                malloc.append((" ".join(f"{k}={v}" for k, v in e.items()), measure(shape, n, a.runs, 2, e)))
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(report(results, malloc, a, commit, load0, os.getloadavg()))
        print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
