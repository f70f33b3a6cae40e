"""Recorder cost on a real GPU, all numbers from one run (run by benchmarks/gpu/recorder_gpu.sh).

Measures and writes <out>/recorder-<gpu>-<date>.md (+ .json):
  * the %globaltimer step (timer probe kernel: min / mean increment between changes);
  * cycles per record on the recording warp (record_cost kernel: clock64 around n records plus
    one LCG step each; the same loop compiled out is the baseline), in three modes: compiled out
    (EPSCOPE_PROFILE=0), runtime off (null buffer), on (format 3: one clock64 read and one 8-byte store);
  * cycles per record of each record design side by side (record_parts);
  * workload time with recording on vs compiled out, runtime off vs compiled out, and "off" as a
    launch runs it (profiler.record.selftest.build_for: the compiled-out build), with CUDA events
    around single launches, the modes interleaved rep by rep;
  * SASS proof from cuobjdump of both builds' selftest object: %globaltimer reads
    (SR_GLOBALTIMER) and 64-bit record stores (STG.E.64) per kernel.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from profiler.generated import selftest_phases as P  # noqa: E402
from profiler.record import build  # noqa: E402
from profiler.record.calibrate import DESIGNS  # noqa: E402
from profiler.generated import layout as L  # noqa: E402
from profiler.record.selftest import (STARVED, TIMEOUT_CYCLES, barrier_capacity, launch_barrier,  # noqa: E402
                                      launch_starved)
from profiler.record.session import buffer_bytes, git_info, make_header  # noqa: E402


def make_buffer(grid: int, warps: int, capacity: int, hires: bool = False) -> torch.Tensor:
    n = grid * warps
    buf = torch.zeros(buffer_bytes(n, capacity), dtype=torch.uint8, device="cuda")
    hdr = make_header(registry_hash=P.REGISTRY_HASH, num_regions=n, capacity=capacity, rank=0, launch_id=0,
                      warps_per_block=warps, hires=hires)
    buf[: hdr.size].copy_(torch.from_numpy(hdr.copy()))
    return buf


def timer_step(prof) -> dict:
    grid, warps, samples = 132, 4, 512
    buf = make_buffer(grid, warps, samples)
    stats, err = prof.timer_probe(buf, grid, warps, samples, TIMEOUT_CYCLES)
    torch.cuda.synchronize()
    assert int(err.item()) == 0, "timer probe timed out"
    st = stats.cpu().numpy()
    return {"min_step_ns": int(st[:, 0].min()), "max_step_ns": int(st[:, 1].max()),
            "mean_step_ns": float(st[:, 2].sum() / st[:, 3].sum()), "steps": int(st[:, 3].sum()),
            "config": f"{grid} blocks x {warps} warps x {samples} changes"}


def record_cost(prof, noprof, grid: int, warps: int, n: int, launches: int = 7) -> dict:
    """Median over launches of the median over warps of clock64 cycles per loop iteration."""
    modes = {  # formats 2-3: every record is one clock64 read (no globaltimer / hires choice any more)
        "compiled out": (noprof, lambda: None),
        "runtime off": (prof, lambda: None),
        "on": (prof, lambda: make_buffer(grid, warps, n)),
    }
    per_iter = {}
    for name, (ext, mk) in modes.items():
        buf = mk()
        meds = []
        for _ in range(launches):
            cyc = ext.record_cost(buf, grid, warps, n)
            torch.cuda.synchronize()
            meds.append(float(np.median(cyc.cpu().numpy())) / n)
        per_iter[name] = float(np.median(meds))
        if buf is not None:  # the records really landed: every region attempted n
            a = buf.cpu().numpy()
            stride = L.REGIONHEADER_SIZE + n * L.RECORD8_SIZE
            att = np.array([a[64 + r * stride: 64 + r * stride + 4].view(np.uint32)[0] for r in range(grid * warps)])
            assert (att == n).all(), f"{name}: attempted counts {np.unique(att)} != {n}"
    base = per_iter["compiled out"]
    return {"grid": grid, "warps": warps, "records_per_warp": n,
            "cycles_per_iteration": {k: round(v, 2) for k, v in per_iter.items()},
            "cycles_per_record": {k: round(v - base, 2) for k, v in per_iter.items() if k != "compiled out"}}


# record_parts variants (profiler/csrc/selftest.cuh, RecordPart): what each record design costs
PARTS = {0: "loop alone (baseline)", **DESIGNS}


def record_parts(prof, grid: int, warps: int, n: int, launches: int = 7) -> dict:
    """Cycles per record of each record design (median over warps, then over launches), the loop
    alone subtracted; the static stall cycles per record of the same loop beside it."""
    per_iter = {}
    for part in PARTS:
        meds = []
        for _ in range(launches):
            cyc = prof.record_parts(part, grid, warps, n, n, False)
            torch.cuda.synchronize()
            meds.append(float(np.median(cyc.cpu().numpy())) / n)
        per_iter[part] = float(np.median(meds))
    base = per_iter[0]
    return {"grid": grid, "warps": warps, "records_per_warp": n,
            "cycles_per_record": {PARTS[k]: round(v - base, 2) for k, v in per_iter.items() if k},
            "baseline_cycles_per_iteration": round(base, 2)}


def static_record_parts() -> dict:
    """{design: static stall cycles per record} of the record_parts loops (control bits), the
    loop's own instructions included (the baseline loop's figure is given as such)."""
    from benchmarks.sass_static import cuobjdump_path, disassemble, loops

    tool = cuobjdump_path()
    obj = build.build_root() / build.variant_name("epscope_record", True) / "selftest.cuda.o"
    if tool is None or not obj.exists():
        return {"error": "cuobjdump or the instrumented selftest object missing"}
    funcs = disassemble(obj, tool)
    out = {}
    for part, what in PARTS.items():
        name = next((k for k in funcs if f"record_parts_kernelILi{part}E" in k), None)
        if name is None:
            out[what] = None
            continue
        ls = loops(funcs[name])
        inner = [l for l in ls if not any(o is not l and l.start <= o.start and o.end <= l.end for o in ls)]
        main = max(inner, key=lambda l: len(l.body), default=None)
        # iterations per unrolled body: one 128-bit store per iteration (format 2's designs), one timer
        # read (format 3's: a record with its PAYLOAD slot stores twice; ptxas folds the unrolled LCG
        # steps into one multiply), else one 64-bit store (the 8-byte store alone)
        body = main.body if main else ()
        its = (sum("STG.E.128" in i.text for i in body) or sum("SR_GLOBALTIMER" in i.text or "SR_CLOCK" in i.text
                                                              for i in body)
               or sum("STG.E.64" in i.text for i in body))
        out[what] = round(main.stall / its, 2) if its else None
    return out


def workload_overhead(prof, noprof, launch, p: dict, capacity: int, reps: int) -> dict:
    """Kernel time (CUDA events around one launch) per mode, modes interleaved rep by rep."""
    from profiler.record.selftest import _tensors

    tensors = _tensors(p["grid"], p["warps"])
    buf = make_buffer(p["grid"], p["warps"], capacity)
    # "off (launch path)": the build a launch without a buffer runs (build_for: compiled out, issue 33)
    modes = {"compiled out": (noprof, None), "runtime off": (prof, None), "off (launch path)": (None, None),
             "on": (prof, buf)}
    times = {k: [] for k in modes}
    for _ in range(3):  # warm-up
        for ext, b in modes.values():
            launch(ext, b, p, tensors)
    torch.cuda.synchronize()
    for _ in range(reps):
        for name, (ext, b) in modes.items():
            tensors[0].zero_()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            launch(ext, b, p, tensors, zero=False)  # counter zeroed above, outside the timed window
            e.record()
            e.synchronize()
            assert int(tensors[2].item()) == 0, f"{name}: kernel reported a timeout"
            times[name].append(s.elapsed_time(e) * 1e3)
    med = {k: float(np.median(v)) for k, v in times.items()}
    spread = {k: [float(np.percentile(v, 10)), float(np.percentile(v, 90))] for k, v in times.items()}
    # The same version timed twice: the halves of the compiled-out series show the noise floor.
    co = np.array(times["compiled out"])
    halves = abs(float(np.median(co[: reps // 2])) - float(np.median(co[reps // 2:]))) / med["compiled out"] * 100
    return {"median_us": {k: round(v, 2) for k, v in med.items()},
            "p10_p90_us": {k: [round(a, 2), round(b, 2)] for k, (a, b) in spread.items()},
            "on_vs_compiled_out_pct": round((med["on"] / med["compiled out"] - 1) * 100, 3),
            "runtime_off_vs_compiled_out_pct": round((med["runtime off"] / med["compiled out"] - 1) * 100, 3),
            "off_launch_path_vs_compiled_out_pct": round((med["off (launch path)"] / med["compiled out"] - 1) * 100, 3),
            "noise_compiled_out_halves_pct": round(halves, 3), "reps": reps}


def clock_section(root: Path) -> list[dict]:
    """Clock calibration of each run recorded by the same job (manifest['clock'])."""
    rows = []
    for man in sorted(root.glob("*/manifest.json")):
        c = json.loads(man.read_text())["clock"]
        for r in c["ranks"]:
            if r["rank"]:
                rows.append({"run": man.parent.name, "what": f"rank {r['rank']} vs rank 0",
                             "offset_ns": round(r["offset_ns"]), "drift_ppm": round(r["drift_ppm"], 3),
                             "uncertainty_ns": round(r["uncertainty_ns"])})
        if "host" in c:
            rows.append({"run": man.parent.name, "what": f"host vs GPU ({c.get('host_pairs', '?')} pairs)",
                         "offset_ns": None, "drift_ppm": round((c["host"]["slope"] - 1) * 1e6, 3),
                         "uncertainty_ns": round(c["host"]["uncertainty_ns"])})
    return rows


def sass_proof() -> dict:
    cuobjdump = shutil.which("cuobjdump")
    if cuobjdump is None:
        return {"error": "cuobjdump not found"}
    out = {}
    for prof in (False, True):
        obj = build.build_root() / build.variant_name("epscope_record", prof) / "selftest.cuda.o"
        if not obj.exists():
            out[prof] = {"error": f"{obj} missing"}
            continue
        sass = subprocess.run([cuobjdump, "-sass", str(obj)], capture_output=True, text=True).stdout
        kernels, cur = {}, None
        for line in sass.splitlines():
            m = re.search(r"Function : (\S+)", line)
            if m:
                name = re.sub(r".*?(timer_probe|record_cost|imbalance|grid_barrier)_kernel.*", r"\1", m.group(1))
                cur = kernels.setdefault(name, {"SR_GLOBALTIMER": 0, "predicated": 0, "STG.E.64": 0, "CLOCK": 0,
                                                "lines": []})
            elif cur is not None:
                cur["SR_GLOBALTIMER"] += "SR_GLOBALTIMER" in line
                # a record site's read: one of a predicated (clock64, globaltimer) pair executes
                cur["predicated"] += bool(re.search(r"@!?P\d+\s+CS2R\s+\S+\s+SR_GLOBALTIMER", line))
                cur["STG.E.64"] += bool(re.search(r"STG\.E\.64\b", line))   # format 3's record stores
                cur["CLOCK"] += "SR_CLOCK" in line
                if not re.fullmatch(r"\s*/\* 0x[0-9a-f]+ \*/\s*", line):  # encoding-only lines
                    cur["lines"].append(line.strip())
        out["EPSCOPE_PROFILE=1" if prof else "EPSCOPE_PROFILE=0"] = kernels
    return out


def static_record_cost() -> dict:
    """The record_cost loop's stall cycles per record from the control bits of the instrumented
    build (benchmarks/sass_static.py): what ptxas scheduled, to set beside the measured cycles."""
    from benchmarks.sass_static import cuobjdump_path, disassemble, loops

    tool = cuobjdump_path()
    obj = build.build_root() / build.variant_name("epscope_record", True) / "selftest.cuda.o"
    if tool is None or not obj.exists():
        return {"error": "cuobjdump or the instrumented selftest object missing"}
    funcs = disassemble(obj, tool)
    name = next((n for n in funcs if "record_cost_kernel" in n), None)
    ls = loops(funcs[name]) if name else []
    inner = [l for l in ls if not any(o is not l and l.start <= o.start and o.end <= l.end for o in ls)]
    stores = {id(l): sum(bool(re.search(r"STG\.E\.64\b", i.text)) for i in l.body) for l in inner}
    rec = [l for l in inner if stores[id(l)]]
    if not rec:
        return {"error": "no record loop (64-bit record stores) found in record_cost"}
    main = max(rec, key=lambda l: stores[id(l)])  # the unrolled body (the remainder loop holds one record)
    n = stores[id(main)]
    return {"records_per_iteration": n, "stall_cycles": main.stall, "stall_per_record": round(main.stall / n, 2)}


def sass_excerpt(kernels: dict, kernel: str = "record_cost", ctx: int = 3, limit: int = 40) -> list[str]:
    lines = kernels.get(kernel, {}).get("lines", [])
    keep = set()
    for i, l in enumerate(lines):
        if "SR_GLOBALTIMER" in l or "STG.E.64" in l:
            keep.update(range(max(0, i - ctx), min(len(lines), i + ctx + 1)))
    return [lines[i] for i in sorted(keep)][:limit]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=60)
    ap.add_argument("--traces", default=None, help="run directories of the same job: their clock calibration is reported")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    prof = build.load_record_extension(profile=True)
    noprof = build.load_record_extension(profile=False)
    assert prof.profile_enabled() and not noprof.profile_enabled()

    gpu = torch.cuda.get_device_name()
    res = {"gpu": gpu, "git": git_info(), "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
           "torch": torch.__version__, "cuda": torch.version.cuda}
    res["timer"] = timer_step(prof)
    res["record_cost"] = [record_cost(prof, noprof, 1, 1, 4096), record_cost(prof, noprof, 132, 4, 4096)]
    res["record_parts"] = [record_parts(prof, 1, 1, 4096), record_parts(prof, 132, 4, 4096)]
    res["static_record_parts"] = static_record_parts()
    dense = {"grid": 132, "warps": 8, "busy_blocks": 132, "busy_warps": 8, "rounds": 64, "units": 2000}
    res["overhead"] = {
        "starved-warps workload (as traced)": {"config": STARVED, "records_per_warp": 4 * STARVED["rounds"],
                                               **workload_overhead(prof, noprof, launch_starved, STARVED,
                                                                   4 * STARVED["rounds"] + 4, args.reps)},
        "dense: every warp works, 256 records/warp": {"config": dense, "records_per_warp": 4 * dense["rounds"],
                                                      **workload_overhead(prof, noprof, launch_starved, dense,
                                                                          4 * dense["rounds"] + 4, args.reps)},
    }
    from profiler.record.selftest import BARRIER

    res["overhead"]["grid-barrier workload (as traced)"] = {
        "config": BARRIER, "records_per_warp": 4 * BARRIER["rounds"],
        **workload_overhead(prof, noprof, launch_barrier, BARRIER, barrier_capacity(BARRIER), args.reps)}
    res["clocks"] = clock_section(Path(args.traces)) if args.traces else []
    sass = sass_proof()
    res["static_record_cost"] = static_record_cost()
    res["sass"] = {v: {k: {c: n for c, n in d.items() if c != "lines"} for k, d in ks.items()} if isinstance(ks, dict) else ks
                   for v, ks in sass.items()}
    excerpt = {v: sass_excerpt(ks) for v, ks in sass.items() if isinstance(ks, dict) and "error" not in ks}

    date = dt.date.today().isoformat()
    tag = "h200" if "H200" in gpu else re.sub(r"[^a-z0-9]+", "-", gpu.lower()).strip("-")
    (out / f"recorder-{tag}-{date}.json").write_text(json.dumps(res | {"sass_excerpt": excerpt}, indent=1) + "\n")
    md = render_md(res, excerpt)
    (out / f"recorder-{tag}-{date}.md").write_text(md)
    print(md)
    return 0


def render_md(res: dict, excerpt: dict) -> str:
    g = res["git"]
    L = [f"# Recorder on {res['gpu']}: timer step, cost per record, workload overhead, SASS proof", "",
         f"Measured by `benchmarks/gpu/recorder_gpu.sh` (benchmarks/gpu/recorder_bench.py) on {res['gpu']}, "
         f"commit {g['commit'][:12]}{' (dirty)' if g['dirty'] else ''} on {g['branch']}, {res['date']}, "
         f"torch {res['torch']} / CUDA {res['cuda']}. All numbers from this one run.", "",
         "## %globaltimer step", "", f"Timer probe, record-free pass ({res['timer']['config']}): smallest increment "
         f"**{res['timer']['min_step_ns']} ns**, mean {res['timer']['mean_step_ns']:.2f} ns over "
         f"{res['timer']['steps']} changes, largest {res['timer']['max_step_ns']} ns.", "",
         "## Cost per record on the recording warp (clock64 cycles)", "",
         "Loop of n iterations of (record + one LCG step), timed with clock64 on the warp; the compiled-out "
         "build of the same loop is the baseline; median over warps, then over 7 launches.", "",
         "| grid x warps | n | compiled out (cyc/iter) | runtime off (cyc/rec) | on (cyc/rec) |",
         "| --- | --- | --- | --- | --- |"]
    for r in res["record_cost"]:
        c, d = r["cycles_per_iteration"], r["cycles_per_record"]
        L.append(f"| {r['grid']} x {r['warps']} | {r['records_per_warp']} | {c['compiled out']} | {d['runtime off']} | "
                 f"**{d['on']}** |")
    st = res.get("static_record_cost", {})
    static = (f"Static schedule of the instrumented loop (benchmarks/sass_static.py, control bits): "
              f"{st['stall_cycles']} stall cycles for {st['records_per_iteration']} records = "
              f"**{st['stall_per_record']}** per record, loop overhead and LCG included; the runtime-off cost cannot "
              f"be lower (the same instructions issue, the store predicated off)."
              if "error" not in st else f"Static schedule: n/a ({st.get('error')}).")
    L += ["", static, "", "Target: <= 20 cycles per record (issues 2, 9, 22, 33).", ""]
    if res.get("record_parts"):
        st = res.get("static_record_parts", {})
        L += ["## Record designs (record_parts: the same loop, one design per kernel)", "",
              "Cycles per record over the loop alone (LCG + counter), median over warps then launches; the "
              "static column is the loop body's control-bit stall cycles per iteration (loop included) from "
              "the instrumented selftest object. 'Overflow sink' clamps the slot to a per-warp sink slot instead "
              "of predicating the store: a buffer-format change, measured here before it is made.", "",
              "| design | " + " | ".join(f"{r['grid']} x {r['warps']} (cyc/rec)" for r in res["record_parts"])
              + " | static stall/iter |", "| --- |" + " --- |" * (len(res["record_parts"]) + 1)]
        for what in PARTS.values():
            if what == PARTS[0]:
                cells = [f"{r['baseline_cycles_per_iteration']} /iter" for r in res["record_parts"]]
            else:
                cells = [f"**{r['cycles_per_record'][what]}**" for r in res["record_parts"]]
            v = st.get(what) if isinstance(st, dict) else None
            L.append(f"| {what} | " + " | ".join(cells) + f" | {'n/a' if v is None else v} |")
        L += [""]
    L += [
          "## Workload time: recording on / runtime off vs compiled out", "",
          "CUDA events around single launches, the three modes interleaved rep by rep; median (p10-p90) in us. "
          "'noise' = difference of the medians of the two halves of the compiled-out series.", "",
          "| workload | records/warp | compiled out | runtime off | off (launch path) | on | on vs out | runtime off vs out | "
          "off (launch path) vs out | noise |",
          "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, o in res["overhead"].items():
        m, s = o["median_us"], o["p10_p90_us"]
        lp = "off (launch path)"
        L.append(f"| {name} | {o['records_per_warp']} | {m['compiled out']} ({s['compiled out'][0]}-{s['compiled out'][1]}) | "
                 f"{m['runtime off']} ({s['runtime off'][0]}-{s['runtime off'][1]}) | {m[lp]} ({s[lp][0]}-{s[lp][1]}) | "
                 f"{m['on']} ({s['on'][0]}-{s['on'][1]}) | "
                 f"**{o['on_vs_compiled_out_pct']:+.3f}%** | {o['runtime_off_vs_compiled_out_pct']:+.3f}% | "
                 f"**{o['off_launch_path_vs_compiled_out_pct']:+.3f}%** | {o['noise_compiled_out_halves_pct']:.3f}% |")
    L += ["", "Targets (issue 33): recording on <= 1 % of each self-test workload, off <= 0.3 %. Off is what a launch "
          "without a profile buffer runs (profiler.record.selftest.build_for: the compiled-out build); 'runtime off' "
          "(the instrumented build, null buffer) is what it avoids.", ""]
    if res.get("clocks"):
        L += ["## Clock alignment of the runs recorded by the same job", "",
              "From each run's manifest (profiler.decode.align fits; uncertainty = half the best round trip + 2 timer "
              "steps for ranks, worst residual + half-width + 1 step for the host).", "",
              "| run | clock | offset (ns) | drift (ppm) | uncertainty (ns) |", "| --- | --- | --- | --- | --- |"]
        L += [f"| {r['run']} | {r['what']} | {'' if r['offset_ns'] is None else r['offset_ns']} | {r['drift_ppm']} | "
              f"{r['uncertainty_ns']} |" for r in res["clocks"]]
        L += [""]
    L += [
          "## SASS proof (cuobjdump -sass of selftest.cuda.o, both builds)", "",
          "Per kernel: SR_GLOBALTIMER reads (in parentheses those under a predicate; since format 2 a record "
          "reads clock64 only: SR_GLOBALTIMER remain at the warp's init and finish anchors), STG.E.64 record "
          "stores (format 3; the kernels' own outputs are 32-bit stores), SR_CLOCK reads (the record_cost harness and "
          "the spin timeouts use clock64 in both builds).", "",
          "| build | kernel | SR_GLOBALTIMER (predicated) | STG.E.64 | SR_CLOCK |", "| --- | --- | --- | --- | --- |"]
    for v, ks in res["sass"].items():
        if "error" in ks:
            L.append(f"| {v} | {ks['error']} | | | |")
            continue
        for k, d in sorted(ks.items()):
            L.append(f"| {v} | {k} | {d['SR_GLOBALTIMER']} ({d['predicated']}) | {d['STG.E.64']} | {d['CLOCK']} |")
    for v, lines in excerpt.items():
        L += ["", f"record_cost kernel, {v}: lines around SR_GLOBALTIMER / STG.E.64 "
                  f"({'none: the recorder compiled to nothing' if not lines else 'excerpt'})", "", "```"]
        L += lines or ["(no SR_GLOBALTIMER and no STG.E.64 in this kernel)"]
        L += ["```"]
    return "\n".join(L) + "\n"


if __name__ == "__main__":
    sys.exit(main())
