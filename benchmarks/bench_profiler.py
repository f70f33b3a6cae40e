"""Perfetto export CPU benchmark: slices/s on one core and peak RSS, each export in a fresh
process, against a naive streaming builder (perfetto_trace_pb2 packets, written one by one as
the parquet batches stream by) on the same run in the same benchmark.

    OMP_NUM_THREADS=1 python3 benchmarks/bench_profiler.py [--export-sizes 1000000,10000000] [--runs 5] [--out ...]

Targets (issue 14): >= 1.5 M slices/s; peak RSS no larger than the naive streaming builder's.
Decode has its own benchmark: benchmarks/bench_decode.py.
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
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.machine import commit as machine_commit, cpu_name  # noqa: E402

def synth_events(n_slices: int, seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """n_slices nested spans on 132 blocks x 16 warps of 2 ranks (record order per warp)."""
    from profiler.store.schema import EVENT_KINDS
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


def _make_run_child(n_slices: int, run: str) -> None:
    from profiler.store.runstore import write_run
    ev, la = synth_events(n_slices)
    write_run(Path(run), ev, la, {"name": f"bench {n_slices}"}, perfetto=False)


def _hwm_mb() -> float:
    """Peak RSS of this process (VmHWM). ru_maxrss would do, but Linux carries it across exec,
    so a child would report its parent's peak."""
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def naive_export(run, out: Path) -> Path:
    """The naive streaming builder: the same tracks and rows, one perfetto_trace_pb2 TracePacket
    a row written as the parquet batches stream by (no flows: they only add packets)."""
    from profiler.export import perfetto as PE
    P = PE._pb()
    names: dict[str, int] = {}
    with open(out, "wb") as f:
        first = P.TracePacket(trusted_packet_sequence_id=PE.SEQ_ID, first_packet_on_sequence=True,
                              sequence_flags=P.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED)
        first.interned_data.debug_annotation_names.add(iid=1, name="payload")
        f.write(PE._frame(first))
        seen_tracks = set()
        for _, c in PE._batches(run.path, ["rank", "block", "warp", "kind", "phase", "begin_ns", "end_ns", "payload"]):
            codes, cats = c["phase"]
            kinds = PE._kind_codes(c["kind"])
            for r, b, w, k, ph, t0, t1, pl in zip(c["rank"].tolist(), c["block"].tolist(), c["warp"].tolist(), kinds.tolist(),
                                                  codes.tolist(), c["begin_ns"].tolist(), c["end_ns"].tolist(), c["payload"].tolist()):
                u = int(PE.warp_uuid(r, b, w))
                if u not in seen_tracks:
                    seen_tracks.add(u)
                    d = P.TracePacket()
                    d.track_descriptor.uuid, d.track_descriptor.name = u, f"rank {r} block {b} warp {w}"
                    f.write(PE._frame(d))
                name = cats[ph]
                if name not in names:
                    names[name] = len(names) + 1
                    pk = P.TracePacket(trusted_packet_sequence_id=PE.SEQ_ID,
                                       sequence_flags=P.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE)
                    pk.interned_data.event_names.add(iid=names[name], name=name)
                    f.write(PE._frame(pk))
                for ts, typ in ((t0, 1), (t1, 2)) if k == 0 else ((t0, 3),):
                    pk = P.TracePacket(timestamp=ts, trusted_packet_sequence_id=PE.SEQ_ID,
                                       sequence_flags=P.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE)
                    pk.track_event.type, pk.track_event.track_uuid = typ, u
                    if typ != 2:
                        pk.track_event.name_iid = names[name]
                        pk.track_event.debug_annotations.add(name_iid=1, int_value=pl)
                    f.write(PE._frame(pk))
    return out


def _export_child(run: str, how: str) -> None:
    """Runs in its own process, so its peak RSS is the export's own (plus the imports)."""
    from profiler.export.perfetto import export_perfetto
    from profiler.store.runstore import load_run
    r = load_run(run)
    rss0 = _hwm_mb()
    w, c = time.perf_counter(), time.process_time()
    out = export_perfetto(r) if how == "epscope" else naive_export(r, Path(run) / "naive.perfetto-trace")
    wall, cpu = time.perf_counter() - w, time.process_time() - c
    n = r.num_events
    print(json.dumps({"how": how, "slices": n, "wall_s": wall, "cpu_s": cpu, "trace_MB": out.stat().st_size / 1e6,
                      "bytes_per_slice": out.stat().st_size / n, "rss_before_MB": rss0, "peak_rss_MB": _hwm_mb()}))
    out.unlink()


def _child(*args) -> str:
    p = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True)
    if p.returncode:
        raise RuntimeError(p.stderr)
    return p.stdout


def bench_export(sizes, runs: int, naive_max: int) -> list[dict]:
    """Medians of `runs` fresh processes per size (and for the naive builder up to naive_max slices)."""
    res = []
    with tempfile.TemporaryDirectory() as d:
        for n in sizes:
            run = str(Path(d) / f"run{n}")
            _child("--make-run", str(n), run)
            for how in ("epscope", "naive") if n <= naive_max else ("epscope",):
                rs = [json.loads(_child("--export-child", run, how).strip().splitlines()[-1]) for _ in range(runs)]
                med = {k: statistics.median(r[k] for r in rs) for k in ("wall_s", "cpu_s", "peak_rss_MB", "rss_before_MB")}
                res.append({**rs[0], **med, "runs": runs})
            shutil.rmtree(run)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--export-sizes", default="1000000,10000000")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--naive-max", type=int, default=1_000_000, help="largest run the naive builder exports (it is slow)")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--make-run", nargs=2, help=argparse.SUPPRESS)
    ap.add_argument("--export-child", nargs=2, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.make_run:
        return _make_run_child(int(a.make_run[0]), a.make_run[1])
    if a.export_child:
        return _export_child(*a.export_child)
    commit, load0 = machine_commit(("profiler", "benchmarks")), os.getloadavg()
    exp = bench_export([int(x) for x in a.export_sizes.split(",")], a.runs, a.naive_max)
    for e in exp:
        print(f"{e['how']}: {e['slices']/1e6:.1f} M slices: CPU {e['cpu_s']:.2f} s = {e['slices']/e['cpu_s']/1e3:.0f} k/s "
              f"(wall {e['slices']/e['wall_s']/1e3:.0f} k/s), peak RSS {e['peak_rss_MB']:.0f} MB "
              f"(after imports and opening the run: {e['rss_before_MB']:.0f} MB), {e['bytes_per_slice']:.1f} B/slice", flush=True)
    load1 = os.getloadavg()
    if a.out:
        now = dt.datetime.now(dt.timezone.utc)
        lines = [f"# Perfetto export CPU benchmark ({now:%Y-%m-%d})", "",
                 f"- CPU: {cpu_name()} ({os.cpu_count()} cores; one thread used: OMP/BLAS/numexpr threads = 1)",
                 f"- commit: {commit}, date: {now:%Y-%m-%d %H:%M} UTC, Python {platform.python_version()}, "
                 f"numpy {np.__version__}, pandas {pd.__version__}",
                 f"- command: `python3 benchmarks/bench_profiler.py --export-sizes {a.export_sizes} --runs {a.runs} --out ...`",
                 f"- load average at start / end: {load0[0]:.1f} / {load1[0]:.1f} on {os.cpu_count()} cores (shared machine: "
                 "wall time includes waiting for a core; process CPU time is the cost on one core).",
                 "- each row: medians of fresh processes (one export each; the run is written by another process). "
                 "`naive` = a streaming builder writing one perfetto_trace_pb2 packet a row as the batches stream by.", "",
                 "| exporter | slices | CPU s | slices/s (CPU) | slices/s (wall) | trace MB | bytes/slice | RSS before export MB | peak RSS MB |",
                 "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for e in exp:
            lines.append(f"| {e['how']} | {e['slices']:,} | {e['cpu_s']:.2f} | {e['slices'] / e['cpu_s'] / 1e3:.0f} k | "
                         f"{e['slices'] / e['wall_s'] / 1e3:.0f} k | {e['trace_MB']:.0f} | {e['bytes_per_slice']:.1f} | "
                         f"{e['rss_before_MB']:.0f} | {e['peak_rss_MB']:.0f} |")
        ours = {e["slices"]: e for e in exp if e["how"] == "epscope"}
        lines += ["", "## Against the targets", ""]
        for e in exp:
            if e["how"] == "naive":
                o = ours[e["slices"]]
                lines.append(f"- {e['slices']:,} slices: epscope {o['slices'] / o['cpu_s'] / 1e6:.2f} M slices/s CPU = "
                             f"{e['cpu_s'] / o['cpu_s']:.1f}x the naive builder; peak RSS {o['peak_rss_MB']:.0f} MB vs "
                             f"{e['peak_rss_MB']:.0f} MB.")
        big = ours[max(ours)]
        lines.append(f"- largest run: {big['slices'] / big['cpu_s'] / 1e6:.2f} M slices/s CPU (target 1.5 M: "
                     f"{'met' if big['slices'] / big['cpu_s'] >= 1.5e6 else 'NOT met'}).")
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text("\n".join(lines) + "\n")
        print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
