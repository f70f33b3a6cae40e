"""Decode as a user meets it: records/s on one core, cold (the first call in a fresh process, as
`epscope trace`, `report` and the recording session make it) and warm, with page faults and
peak memory, for each record loop (profiler.decode.decode ENGINES: numpy, numba) side by side, against a
structured-view copy of the same bytes.

    python3 benchmarks/bench_decode.py [--sizes 1e6,30e6] [--engines numpy,numba] [--format 2,3] [--runs 5]
                                       [--clocks none,model] [--idle 12] [--against main=TREE]
                                       [--out benchmarks/results/decode-cpu-DATE.md]

Every measurement is a fresh process (`--child`): it builds its buffers, returns freed memory to
the OS (malloc_trim) and resets its peak RSS (/proc/self/clear_refs), then times decode_launches
once (cold) and again (warm). Cold includes loading the record loop: the numba engine's ahead-of-
time build from its disk cache (built by the parent before any timing; its build time and the
JIT's cold cost are reported apart, see `one_off`); it excludes importing profiler.decode.decode (numpy,
pandas), reported as import s. Medians of --runs processes; engines of one size run alternately,
so their ratio is measured under the same load. Buffers are format --format, a list measured side
by side (3: 8-byte records of clock64 bits 31..0, what the recorder writes since issue 33, half
format 2's bytes; 2: 16-byte records of full clock64 cycles, both converted through each region's
clock pair; 1: globaltimer ns). Shapes:
  dense  132 blocks x 16 warps, every region full (nested iteration{work{} tick} spans, the
         selftest registry), capacity sized to the record count;
  sparse the recorded EP runs' shape: 16 records a warp at capacity 128 (the runs in traces/ use 512-4096: their
         buffers would not fit this machine at 10 M records) (flat send_chunk spans
         with a publish_tail instant between), the ep_intranode registry.
Clocks: `none` decodes as `epscope` tests and this benchmark always did (each rank's own
globaltimer minus the decode's earliest time); `model` with a clock model as a recording session
saves (profiler.record.session_save: times put on the run timeline through a RankClock with a
fractional offset and a drift of a few ppm).
Baseline: a numpy structured view of the same buffers and a copy of the four record fields of
the written records (what any numpy decoder reads at least).
Targets (issue 20): >= 50 M records/s a core cold, at 1 M and at 30 M records (issue 14: cold
and warm; peak RSS <= buffers + table + 10 %).
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
# --against runs this same file on another checkout's code: its children import from that tree
sys.path.insert(0, os.environ.get("EPSCOPE_BENCH_TREE") or str(ROOT))

from benchmarks.machine import commit as machine_commit, cpu_name  # noqa: E402
from profiler.generated import layout as L  # noqa: E402

BLOCKS, WARPS = 132, 16          # H200 SMs x warps of an EP block
T0 = 1_700_000_000_000_000_000


def _status(key: str) -> float:
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


SM_GHZ = 1.98                    # H200 SM clock (profiler.decode.align.NOMINAL_SM_GHZ)


def _full_buffer(reg, rng, nreg: int, cap: int, kinds, ids, n: int, t0: int, version: int) -> bytes:
    """nreg regions of capacity `cap`, the first n records of each written with the repeating
    pattern (kinds, ids), 0-7 globaltimer steps of 32 ns apart: as globaltimer ns (format 1) or
    as clock64 cycles of a 1.98 GHz SM with the warp's start and finish clock pairs (format 2;
    format 3 the same records as 8-byte slots)."""
    if version >= 3:
        return _format3(_full_buffer(reg, rng, nreg, cap, kinds, ids, n, t0, 2), nreg, cap)
    rdt = np.dtype([("h", L.REGIONHEADER_DTYPE), ("r", L.RECORD_DTYPE, (cap,))])
    regions = np.zeros(nreg, rdt)
    reps = -(-n // len(kinds))
    r = regions["r"][:, :n]
    steps = rng.integers(0, 8, size=(nreg, n), dtype=np.int64) * 32
    gt0 = t0 + rng.integers(0, 5000, size=(nreg, 1))
    t = gt0 + np.cumsum(steps, axis=1)
    h = regions["h"]
    if version >= 2:
        clk0 = rng.integers(0, 1 << 40, size=(nreg, 1))
        cyc = clk0 + np.rint((t - gt0) * SM_GHZ).astype(np.int64)
        r["t"] = cyc.astype(np.uint64)
        h["clk_start"], h["clk_end"] = clk0[:, 0], cyc[:, -1] + 1000
        h["gt_start"], h["gt_end"] = gt0[:, 0], gt0[:, 0] + np.rint((cyc[:, -1] + 1000 - clk0[:, 0]) / SM_GHZ).astype(np.int64)
    else:
        r["t"] = t.astype(np.uint64)
        h["gt_start"], h["gt_end"] = t[:, 0], t[:, -1]
    r["kind"], r["id"] = np.tile(kinds, reps)[:n], np.tile(ids, reps)[:n]
    r["payload"] = rng.integers(0, 8, size=(nreg, n))
    h["attempted"], h["state"] = n, L.REGION_STATE_FINISHED
    h["sm"] = np.arange(nreg) // WARPS % BLOCKS
    hdr = np.zeros(1, L.BUFFERHEADER_DTYPE)
    hdr["magic"], hdr["version"], hdr["registry_hash"] = L.MAGIC, version, reg.hash
    hdr["num_regions"], hdr["region_capacity"], hdr["warps_per_block"] = nreg, cap, WARPS
    return hdr.tobytes() + regions.tobytes()


def _format3(v2: bytes, nreg: int, cap: int) -> bytes:
    """A format-2 buffer's records as format 3 writes them (payloads here fit 16 bits)."""
    rdt = np.dtype([("h", L.REGIONHEADER_DTYPE), ("r", L.RECORD_DTYPE, (cap,))])
    src = np.frombuffer(v2, rdt, offset=L.BUFFERHEADER_SIZE)
    out = np.zeros(nreg, [("h", L.REGIONHEADER_DTYPE), ("r", L.RECORD8_DTYPE, (cap,))])
    out["h"] = src["h"]
    r = src["r"]
    out["r"]["t"] = (r["t"] & np.uint64(0xFFFF_FFFF)).astype(np.uint32)
    out["r"]["meta"] = ((r["kind"].astype(np.uint32) << L.META_KIND_SHIFT) | (r["id"].astype(np.uint32) << L.META_ID_SHIFT)
                        | r["payload"].astype(np.uint32))
    hdr = np.frombuffer(v2, L.BUFFERHEADER_DTYPE, count=1).copy()
    hdr["version"] = 3
    return hdr.tobytes() + out.tobytes()


def make_items(shape: str, records: int, version: int = L.VERSION):
    """(items, registries, records) of one benchmark input."""
    from profiler.decode.decode import LaunchInfo
    from profiler.registry.registry import load_all
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
    bufs = [_full_buffer(reg, rng, nreg, cap, kinds, ids, n, T0 + i * 10**7, version) for i in range(launches)]
    items = [(b, LaunchInfo(0, i, "bench", i, reg.family)) for i, b in enumerate(bufs)]
    return items, {reg.family: reg}, launches * nreg * n


def _structured_copy(items) -> None:
    """The baseline: view each buffer as records and copy the four fields of the written ones."""
    for buf, _ in items:
        h = np.frombuffer(buf, L.BUFFERHEADER_DTYPE, count=1)[0]
        nreg, cap = int(h["num_regions"]), int(h["region_capacity"])
        dtype = L.RECORD8_DTYPE if int(h["version"]) >= 3 else L.RECORD_DTYPE
        slots = L.REGIONHEADER_SIZE // dtype.itemsize + cap
        rec = np.frombuffer(buf, dtype, offset=L.BUFFERHEADER_SIZE).reshape(nreg, slots)
        n = int(np.frombuffer(buf, L.REGIONHEADER_DTYPE, count=1, offset=L.BUFFERHEADER_SIZE)["attempted"][0])
        r = rec[:, slots - cap: slots - cap + n]
        for f in dtype.names:
            np.ascontiguousarray(r[f])


def _timed(fn) -> dict:
    r0, w = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    out = fn()
    wall, r1 = time.perf_counter() - w, resource.getrusage(resource.RUSAGE_SELF)
    return {"wall_s": wall, "user_s": r1.ru_utime - r0.ru_utime, "sys_s": r1.ru_stime - r0.ru_stime,
            "faults": r1.ru_minflt - r0.ru_minflt, "result": out}


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def clock_model(kind: str):
    """None, or a one-rank clock model as a recording session builds (offset and drift of a real
    rank pair's size, anchored at the buffers' start)."""
    if kind == "none":
        return None
    from profiler.decode.align import ClockModel, RankClock
    return ClockModel({0: RankClock(0, offset_ns=-1234.25, drift_ppm=3.7, uncertainty_ns=40.0, anchor_ns=T0)},
                      t0_ns=T0 - 10**6)


def child(shape: str, records: int, what: str, repeats: int, version: int) -> dict:
    """One fresh process: `what` is "decode:ENGINE[:CLOCK]" or "baseline"."""
    c0 = _cpu()
    import profiler.decode.decode  # noqa: F401  (numpy, pandas: not part of the decode's time)
    import_s = _cpu() - c0
    items, regs, n = make_items(shape, records, version)
    ctypes.CDLL("libc.so.6").malloc_trim(0)    # give back the builder's temporaries
    rss0 = _status("VmRSS")
    open("/proc/self/clear_refs", "w").write("5")  # peak RSS from here on
    buffers = sum(len(b) for b, _ in items) / 2**20
    runs = []
    if what.startswith("decode:"):
        from profiler.decode.decode import decode_launches
        engine, _, clock = what.split(":", 1)[1].partition(":")
        clocks = clock_model(clock or "none")
        for _ in range(repeats):
            r = _timed(lambda: decode_launches(items, regs, clocks, engine=engine))
            d = r.pop("result")
            r["events"] = len(d.events)
            r["warnings"] = {type(w).__name__: w.count for w in d.warnings}
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
    return {"records": n, "buffers_MB": buffers, "rss_start_MB": rss0, "import_s": import_s, "runs": runs,
            "numba_imported": "numba" in sys.modules,
            "malloc_env": {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")}}


def _child_env(env: dict | None) -> dict:
    """The children's environment: bytecode cached in a directory of its own (PYCACHE) even where
    PYTHONDONTWRITEBYTECODE is set (the dev VM sets it: every child then compiled the lazily
    imported profiler.decode.decode_fast from source, 3-4 ms of a cold 1 M decode that an installed
    package, shipped with its .pyc, never pays), without writing into the checkout."""
    out = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    out["PYTHONPYCACHEPREFIX"] = str(PYCACHE)
    return {**out, **(env or {})}


PYCACHE = Path(os.environ.get("TMPDIR", "/tmp")) / "epscope-bench-pycache"


IDLE_S = 0.0   # --idle: seconds to sleep before each timed process


def run_child(shape: str, records: int, what: str, repeats: int, version: int, env: dict | None = None,
              tree: Path | None = None) -> dict:
    """One fresh process of this file, importing the code of this checkout or of `tree` (--against)."""
    if IDLE_S:
        time.sleep(IDLE_S)
    env = {**(env or {}), **({"EPSCOPE_BENCH_TREE": str(tree)} if tree else {})}
    p = subprocess.run([sys.executable, __file__, "--child", shape, str(records), what, str(repeats),
                        str(version)], capture_output=True, text=True, env=_child_env(env))
    if p.returncode:
        raise RuntimeError(p.stderr)
    return json.loads(p.stdout.strip().splitlines()[-1])


def _med(xs):
    return statistics.median(xs)


def _summary(dec: list[dict]) -> dict:
    n = dec[0]["records"]
    cold = [d["runs"][0] for d in dec]
    warm = [r for d in dec for r in d["runs"][1:]]
    out = {"events": cold[0]["events"], "table_MB": cold[0]["table_MB"], "warnings": cold[0]["warnings"],
           "import_s": _med([d["import_s"] for d in dec]), "numba_imported": any(d["numba_imported"] for d in dec)}
    for name, rs in (("cold", cold), ("warm", warm or cold)):
        out[name] = {k: _med([r[k] for r in rs]) for k in ("wall_s", "user_s", "sys_s", "faults")}
        out[name]["cpu_s"] = _med([r["user_s"] + r["sys_s"] for r in rs])
        out[name]["cpu_rate"] = n / out[name]["cpu_s"]
        out[name]["wall_rate"] = n / out[name]["wall_s"]
    out["peak_over_start_MB"] = _med([max(r["peak_over_start_MB"] for r in d["runs"]) for d in dec])
    return out


def measure(shape: str, records: int, runs: int, repeats: int, engines: list[str], version: int,
            env: dict | None = None, against: tuple[str, Path] | None = None, clock: str = "none") -> dict:
    """Every engine's decode and the baseline, `runs` fresh processes each, interleaved; with
    `against` (label, tree), each engine also as that tree's code runs it ("ENGINE@label")."""
    todo = [(e, e, None) for e in engines]
    if against:
        todo += [(f"{e}@{against[0]}", e, against[1]) for e in engines]
    dec = {name: [] for name, _, _ in todo}
    base = []
    for _ in range(runs):
        for name, e, tree in todo:
            dec[name].append(run_child(shape, records, f"decode:{e}:{clock}", repeats, version, env, tree))
        base.append(run_child(shape, records, "baseline", 2, version))
    first = dec[engines[0]][0]
    n = first["records"]
    out = {"shape": shape, "clock": clock, "records": n, "buffers_MB": first["buffers_MB"], "runs": runs, "format": version,
           "engines": {e: _summary(d) for e, d in dec.items()}}
    out["baseline_cpu_rate"] = n / _med([r["user_s"] + r["sys_s"] for b in base for r in b["runs"][1:]])
    out["baseline_wall_rate"] = n / _med([r["wall_s"] for b in base for r in b["runs"][1:]])
    ev = {e: s["events"] for e, s in out["engines"].items()}
    assert len(set(ev.values())) == 1, f"engines decoded different event counts: {ev}"
    return out


def one_off(version: int, runs: int) -> dict:
    """What the numba engine costs once: its ahead-of-time build (the first decode after installing
    or changing profiler/decode/decode_fast.py), and the cold first call of the JIT fallback with numba's
    disk cache warm (numba import + first-call setup), on a small input, fresh processes."""
    import shutil
    import tempfile
    out = {}
    tmp = Path(tempfile.mkdtemp(prefix="epscope-bench-aot-"))
    try:
        p = _timed_child_build(tmp)
        out["aot_build"] = p
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    run_child("dense", 10_000, "decode:numba-jit", 1, version)  # fills numba's cache
    jit = [run_child("dense", 10_000, "decode:numba-jit", 2, version) for _ in range(runs)]
    aot = [run_child("dense", 10_000, "decode:numba", 2, version) for _ in range(runs)]
    for name, rs in (("jit", jit), ("aot", aot)):
        out[name + "_cold_s"] = _med([d["runs"][0]["user_s"] + d["runs"][0]["sys_s"] for d in rs])
        out[name + "_warm_s"] = _med([d["runs"][1]["user_s"] + d["runs"][1]["sys_s"] for d in rs])
        out[name + "_numba_imported"] = any(d["numba_imported"] for d in rs)
    return out


def _timed_child_build(where: Path) -> dict:
    code = ("import sys, json, resource, time; sys.path.insert(0, %r); from profiler.decode import decode_fast as F; "
            "w = time.perf_counter(); F.build_aot(__import__('pathlib').Path(%r) / 'k'); r = resource.getrusage(resource.RUSAGE_SELF); "
            "c = resource.getrusage(resource.RUSAGE_CHILDREN); "
            "print(json.dumps({'wall_s': time.perf_counter() - w, 'cpu_s': r.ru_utime + r.ru_stime + c.ru_utime + c.ru_stime}))"
            % (str(ROOT), str(where)))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(p.stdout.strip().splitlines()[-1])


def report(results: list[dict], once: dict | None, a, commit: str, load0, load1, started) -> str:
    now = dt.datetime.now(dt.timezone.utc)
    engines = a.engines.split(",")
    lines = [f"# Decode CPU benchmark ({now:%Y-%m-%d})", "",
             f"- CPU: {cpu_name()} ({os.cpu_count()} cores; one thread: OMP/BLAS threads = 1)",
             f"- commit: {commit}, date: {started:%Y-%m-%d %H:%M}-{now:%H:%M} UTC, Python {platform.python_version()}, "
             f"numpy {np.__version__}",
             f"- command: `python3 benchmarks/bench_decode.py --sizes {a.sizes} --shapes {a.shapes} --engines {a.engines} "
             f"--format {a.format} --runs {a.runs} --repeats {a.repeats} --clocks {a.clocks}"
             + (f" --against {a.against.split('=', 1)[0]}=TREE" if a.against else "")
             + (f" --idle {a.idle:g}" if a.idle else "") + " --out ...`",
             "- children: bytecode cached (PYTHONPYCACHEPREFIX, as an installed package has its .pyc); a warm-up child "
             "per engine builds the AOT loop and the .pyc before any timing",
             f"- load average at start / end: {load0[0]:.1f} / {load1[0]:.1f} on {os.cpu_count()} cores (shared machine: wall "
             "time includes waiting for a core; CPU time = user + sys is the cost on one core).",
             "- each row: medians of fresh processes; cold = the first decode_launches call of a process (loading the "
             "record loop included: the numba engine loads its ahead-of-time build from the disk cache), warm = its "
             "repeats; rates are records per second of CPU time (user + sys), wall in brackets; import s = CPU "
             "time to import profiler.decode.decode (numpy, pandas) before the cold call, not in its rate.", "",
             "| shape | format | records | clock | events | engine | cold M rec/s | cold user / sys s | warm M rec/s | cold, warm vs "
             f"{engines[0]} | structured copy M rec/s | buffers MB | table MB | peak over start MB | import s | numba imported |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in results:
        ref = r["engines"][engines[0]]
        for e, s in r["engines"].items():
            c, w = s["cold"], s["warm"]
            lines.append(f"| {r['shape']} | {r['format']} | {r['records'] / 1e6:.1f} M | {r['clock']} | {s['events'] / 1e6:.2f} M | {e} | "
                         f"{c['cpu_rate'] / 1e6:.1f} ({c['wall_rate'] / 1e6:.1f}) | {c['user_s']:.3f} / {c['sys_s']:.3f} | "
                         f"{w['cpu_rate'] / 1e6:.1f} ({w['wall_rate'] / 1e6:.1f}) | "
                         f"{c['cpu_rate'] / ref['cold']['cpu_rate']:.1f}x, {w['cpu_rate'] / ref['warm']['cpu_rate']:.1f}x | "
                         f"{r['baseline_cpu_rate'] / 1e6:.0f} | {r['buffers_MB']:.0f} | {s['table_MB']:.0f} | "
                         f"{s['peak_over_start_MB']:.0f} | {s['import_s']:.2f} | {s['numba_imported']} |")
    if a.against:
        label = a.against.split("=", 1)[0]
        lines += ["", f"This tree against {label} (the same engine, its processes interleaved with this tree's), "
                      "CPU-time rate ratio cold, warm:", ""]
        for r in results:
            for e in engines:
                s, b = r["engines"][e], r["engines"][f"{e}@{label}"]
                lines.append(f"- {r['shape']} {r['records'] / 1e6:.1f} M clock {r['clock']} {e}: "
                             f"{s['cold']['cpu_rate'] / b['cold']['cpu_rate']:.2f}x, "
                             f"{s['warm']['cpu_rate'] / b['warm']['cpu_rate']:.2f}x")
    warn = {f"{r['shape']} format {r['format']} {r['records'] / 1e6:.1f} M {r['clock']}": r["engines"][engines[0]]["warnings"]
            for r in results}
    lines += ["", f"Decoder warnings (every engine the same event count): {warn}"]
    if once:
        b = once["aot_build"]
        lines += ["", "## One-off costs of the numba engine (10 k records, fresh processes, CPU s)", "",
                  f"- ahead-of-time build (numba.pycc, the first decode after installing or changing "
                  f"profiler/decode/decode_fast.py): {b['cpu_s']:.1f} s CPU, {b['wall_s']:.1f} s wall",
                  f"- cold first call with the AOT build on disk: {once['aot_cold_s']:.3f} s (warm {once['aot_warm_s']:.3f} s); "
                  f"numba imported: {once['aot_numba_imported']}",
                  f"- cold first call of the JIT fallback (engine numba-jit, numba's disk cache warm: numba import + "
                  f"first-call setup + cache load): {once['jit_cold_s']:.3f} s (warm {once['jit_warm_s']:.3f} s)"]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1e6,30e6")
    ap.add_argument("--shapes", default="dense,sparse")
    ap.add_argument("--engines", default="numpy,numba", help="profiler.decode.decode ENGINES, the first is the reference of the ratios")
    ap.add_argument("--format", default=str(L.VERSION), help="buffer format versions to build (1, 2, 3), comma-separated")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--clocks", default="none", help="none (raw globaltimer base) and/or model (a clock model, as a "
                                                     "recording session saves), comma-separated")
    ap.add_argument("--repeats", type=int, default=3, help="decodes per process (the first is cold)")
    ap.add_argument("--no-one-off", action="store_true", help="skip the AOT build and JIT cold measurements")
    ap.add_argument("--against", metavar="LABEL=TREE",
                    help="also run every engine from another checkout of the project (e.g. `git archive` of main "
                         "unpacked in TREE), interleaved with this one: ratios to earlier code under the same load")
    ap.add_argument("--idle", type=float, default=0.0,
                    help="seconds to sleep before each timed process: memory another process just freed makes a fresh "
                         "page cheap to fault in on a VM (huge pages 0.1 ms a MB back to back, 2.4-3.1 after 12 s "
                         "idle on the dev VM: benchmarks/NOTES.md); a user's cold start meets the idle case")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.child[0], int(a.child[1]), a.child[2], int(a.child[3]), int(a.child[4]))))
        return
    global IDLE_S
    IDLE_S = a.idle
    started = dt.datetime.now(dt.timezone.utc)
    commit, load0 = machine_commit(("profiler", "benchmarks")), os.getloadavg()
    engines = a.engines.split(",")
    against = None
    if a.against:
        label, tree = a.against.split("=", 1)
        against = (label, Path(tree).resolve())
    if any(e.startswith("numba") for e in engines):
        from profiler.decode import decode_fast
        print(f"numba engine: {decode_fast.kernels().how} (build in {decode_fast.aot_dir()})", flush=True)
    formats = [int(f) for f in a.format.split(",")]
    for e in engines:   # builds what a first decode builds (the AOT loop, the .pyc files) before any timing
        run_child("dense", 10_000, f"decode:{e}", 1, formats[0])
        if against:
            run_child("dense", 10_000, f"decode:{e}", 1, formats[0], tree=against[1])
    results = []
    for shape, size, clock, fmt in ((sh, si, c, f) for sh in a.shapes.split(",") for si in a.sizes.split(",")
                                    for c in a.clocks.split(",") for f in formats):
        r = measure(shape, int(float(size)), a.runs, a.repeats, engines, fmt, against=against, clock=clock)
        results.append(r)
        for e, s in r["engines"].items():
            print(f"{shape} format {fmt} {r['records'] / 1e6:.1f} M clock {clock} {e}: cold {s['cold']['cpu_rate'] / 1e6:.1f} M/s CPU "
                  f"({s['cold']['user_s']:.3f} user, {s['cold']['sys_s']:.3f} sys), warm {s['warm']['cpu_rate'] / 1e6:.1f} M/s, "
                  f"copy {r['baseline_cpu_rate'] / 1e6:.0f} M/s, peak +{s['peak_over_start_MB']:.0f} MB", flush=True)
    once = None if a.no_one_off or "numba" not in engines else one_off(formats[0], a.runs)
    if once:
        print(once, flush=True)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(report(results, once, a, commit, load0, os.getloadavg(), started))
        print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
