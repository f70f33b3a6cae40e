"""Profiler core CPU benchmarks: decode rate (records/s, one core) and Perfetto export rate
(slices/s) with peak RSS at two sizes, to show the export streams with flat memory.

    OMP_NUM_THREADS=1 python3 benchmarks/bench_profiler.py [--records 30e6] [--out benchmarks/results/...]

Targets (issue 2): decode >= 20 M records/s on one core; export >= 500 k slices/s, peak RSS flat
between 1 M and 10 M slices. Each export size runs in its own subprocess so its peak RSS is its own.
"""
from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
    os.environ[_v] = "1"  # one core: the target is per core

import argparse
import datetime as dt
import json
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from profiler.decode import LaunchInfo, decode_buffer, decode_launches  # noqa: E402
from profiler.generated import layout as L  # noqa: E402
from profiler.registry import load_all  # noqa: E402

# selftest-like warp program: iteration{ work{} tick } repeated; 5 records per pass
_PATTERN_KIND = np.array([L.KIND_BEGIN, L.KIND_BEGIN, L.KIND_END, L.KIND_INSTANT, L.KIND_END], np.uint8)
_PATTERN_ID = np.array([1, 2, 2, 4, 1], np.uint16)


def synth_buffer(reg, rng, blocks: int, warps: int, capacity: int, t0: int) -> bytes:
    """A full buffer (every region at capacity) built with the generated dtypes, vectorised."""
    nreg = blocks * warps
    rdt = np.dtype([("h", L.REGIONHEADER_DTYPE), ("r", L.RECORD_DTYPE, (capacity,))])
    regions = np.zeros(nreg, rdt)
    reps = -(-capacity // len(_PATTERN_KIND))
    kinds = np.tile(_PATTERN_KIND, reps)[:capacity]
    ids = np.tile(_PATTERN_ID, reps)[:capacity]
    steps = rng.integers(0, 8, size=(nreg, capacity), dtype=np.int64) * 32  # 32 ns globaltimer steps
    t = t0 + rng.integers(0, 5000, size=(nreg, 1)) + np.cumsum(steps, axis=1)
    r = regions["r"]
    r["t"], r["kind"], r["id"] = t.astype(np.uint64), kinds, ids
    r["payload"] = rng.integers(0, 8, size=(nreg, capacity))
    h = regions["h"]
    h["attempted"], h["state"] = capacity, L.REGION_STATE_FINISHED
    h["sm"] = np.arange(nreg) // warps % 132
    h["block"], h["warp"] = np.arange(nreg) // warps, np.arange(nreg) % warps
    h["gt_start"], h["gt_end"] = t[:, 0], t[:, -1]
    hdr = np.zeros(1, L.BUFFERHEADER_DTYPE)
    hdr["magic"], hdr["version"], hdr["registry_hash"] = L.MAGIC, L.VERSION, reg.hash
    hdr["num_regions"], hdr["region_capacity"], hdr["warps_per_block"] = nreg, capacity, warps
    return hdr.tobytes() + regions.tobytes()


def bench_decode(n_records: float, repeats: int = 3) -> dict:
    reg = load_all()["selftest"]
    rng = np.random.default_rng(1)
    blocks, warps, capacity = 132, 16, 2000   # 132 SMs x 16 warps (H200), 2000 records a warp
    per = blocks * warps * capacity
    launches = max(1, int(round(n_records / per)))
    bufs = [synth_buffer(reg, rng, blocks, warps, capacity, 1_700_000_000_000_000_000 + i * 10**7) for i in range(launches)]
    items = [(b, LaunchInfo(0, i, "selftest.bench", i, "selftest")) for i, b in enumerate(bufs)]
    decode_buffer(bufs[0][: 64 + 64 + 16 * capacity], LaunchInfo(0, 0, "w", 0, "selftest"), reg) if False else None
    best = 1e9
    for _ in range(repeats):
        t = time.perf_counter()
        d = decode_launches(items, {"selftest": reg})
        best = min(best, time.perf_counter() - t)
    total = per * launches
    return {"launches": launches, "regions_per_launch": blocks * warps, "capacity": capacity, "records": total,
            "events": len(d.events), "seconds": best, "records_per_s": total / best,
            "buffer_MB": sum(len(b) for b in bufs) / 1e6}


def synth_events(n_slices: int, seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """n_slices nested spans on 132 blocks x 16 warps of 2 ranks (record order per warp)."""
    from profiler.schema import EVENT_KINDS
    rng = np.random.default_rng(seed)
    ranks, blocks, warps = 2, 132, 16
    tracks = ranks * blocks * warps
    per = -(-n_slices // tracks)
    k = per * tracks
    tr = np.repeat(np.arange(tracks), per)
    idx = np.tile(np.arange(per), tracks)
    begin = idx * 200 + rng.integers(0, 5, k) * 32
    dur = rng.integers(1, 5, k) * 32
    phase_names = ["send_chunk", "wait_space", "wait_data", "copy_out", "reduce"]
    ev = pd.DataFrame({
        "rank": (tr // (blocks * warps)).astype(np.int16), "launch": np.zeros(k, np.int32),
        "kernel": pd.Categorical.from_codes(np.zeros(k, np.int8), ["dispatch"]),
        "iteration": np.zeros(k, np.int32), "sm": (tr // warps % blocks).astype(np.int16),
        "block": (tr // warps % blocks).astype(np.int32), "warp": (tr % warps).astype(np.int16),
        "role": pd.Categorical.from_codes(np.where(tr % warps < 8, 0, 1).astype(np.int8), ["sender", "receiver"]),
        "kind": pd.Categorical.from_codes(np.zeros(k, np.int8), list(EVENT_KINDS)),
        "phase": pd.Categorical.from_codes(rng.integers(0, 5, k).astype(np.int8), phase_names),
        "begin_ns": begin.astype(np.int64), "end_ns": (begin + dur).astype(np.int64),
        "payload": rng.integers(0, 8, k).astype(np.int64), "open": np.zeros(k, bool),
    })
    launches = pd.DataFrame({"rank": [0, 1], "launch": [0, 0], "kernel": ["dispatch"] * 2, "iteration": [0, 0],
                             "host_begin_ns": [-1, -1], "host_end_ns": [-1, -1], "gpu_begin_ns": [0, 0],
                             "gpu_end_ns": [int(begin.max() + 200)] * 2, "regions": [blocks * warps] * 2,
                             "dropped": [0, 0]})
    return ev, launches


def _export_child(n_slices: int, workdir: str) -> None:
    """Runs in a subprocess: write the run (not timed), then time the export; print JSON."""
    from profiler.perfetto_export import export_perfetto
    from profiler.runstore import write_run
    run = Path(workdir) / f"run{n_slices}"
    ev, la = synth_events(n_slices)
    write_run(run, ev, la, {"name": f"bench {n_slices}"}, perfetto=False)
    del ev
    import gc
    gc.collect()
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t = time.perf_counter()
    out = export_perfetto(run)
    sec = time.perf_counter() - t
    rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"slices": n_slices, "seconds": sec, "slices_per_s": n_slices / sec,
                      "trace_MB": out.stat().st_size / 1e6, "bytes_per_slice": out.stat().st_size / n_slices,
                      "peak_rss_MB_before_export": rss_before / 1024, "peak_rss_MB_after_export": rss_after / 1024}))


def bench_export(sizes) -> list[dict]:
    res = []
    with tempfile.TemporaryDirectory() as d:
        for n in sizes:
            p = subprocess.run([sys.executable, __file__, "--export-child", str(n), d], capture_output=True, text=True)
            if p.returncode:
                raise RuntimeError(p.stderr)
            res.append(json.loads(p.stdout.strip().splitlines()[-1]))
    return res


def _cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=float, default=30e6)
    ap.add_argument("--export-sizes", default="1000000,10000000")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--export-child", nargs=2, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.export_child:
        _export_child(int(a.export_child[0]), a.export_child[1])
        return
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    dec = bench_decode(a.records)
    print(f"decode: {dec['records']/1e6:.1f} M records in {dec['seconds']:.2f} s = {dec['records_per_s']/1e6:.1f} M records/s")
    exp = bench_export([int(s) for s in a.export_sizes.split(",")])
    for e in exp:
        print(f"export: {e['slices']/1e6:.0f} M slices in {e['seconds']:.2f} s = {e['slices_per_s']/1e3:.0f} k slices/s, "
              f"peak RSS {e['peak_rss_MB_before_export']:.0f} -> {e['peak_rss_MB_after_export']:.0f} MB")
    if a.out:
        now = dt.datetime.now(dt.timezone.utc)
        lines = [f"# Profiler core CPU benchmark ({now:%Y-%m-%d})", "",
                 f"- CPU: {_cpu_name()} ({os.cpu_count()} cores; one thread used: OMP/BLAS/numexpr threads = 1)",
                 f"- commit: {commit}, date: {now:%Y-%m-%d %H:%M} UTC, Python {platform.python_version()}, "
                 f"numpy {np.__version__}, pandas {pd.__version__}",
                 f"- command: `python3 benchmarks/bench_profiler.py --records {a.records:.0f} --export-sizes {a.export_sizes}`", "",
                 "## Decode (target >= 20 M records/s on one core)", "",
                 f"{dec['launches']} launches x {dec['regions_per_launch']} regions (132 blocks x 16 warps) x "
                 f"{dec['capacity']} records = {dec['records']/1e6:.1f} M records ({dec['buffer_MB']:.0f} MB of buffers) "
                 f"-> {dec['events']/1e6:.1f} M events in {dec['seconds']:.2f} s (best of 3): "
                 f"**{dec['records_per_s']/1e6:.1f} M records/s**", "",
                 "## Perfetto export (target >= 500 k slices/s, flat memory)", "",
                 "| slices | seconds | slices/s | trace MB | bytes/slice | peak RSS before export (MB) | peak RSS after export (MB) |",
                 "| --- | --- | --- | --- | --- | --- | --- |"]
        for e in exp:
            lines.append(f"| {e['slices']:,} | {e['seconds']:.2f} | {e['slices_per_s']/1e3:.0f} k | {e['trace_MB']:.0f} | "
                         f"{e['bytes_per_slice']:.1f} | {e['peak_rss_MB_before_export']:.0f} | {e['peak_rss_MB_after_export']:.0f} |")
        lines += ["", "Peak RSS 'before export' includes writing the synthetic run in the same process (the events "
                  "table in RAM); the export itself streams parquet batches of "
                  "profiler.perfetto_export.BATCH_ROWS rows, so its own peak does not grow with the slice count "
                  "when the 'after' column stays at the 'before' level.", ""]
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text("\n".join(lines))
        print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
