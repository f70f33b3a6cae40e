"""Record the recorder's self-test traces on a real GPU (also `epscope selftest`).

    python -m profiler.record.selftest --out runs/ --which all    (traces/: to re-record the bundled ones)

writes, each a run directory named for what it shows:

* selftest-timer-resolution: warps wait for %globaltimer to change and record a `tick` after
  each change; the ticks follow the timer's 32 ns steps on H200 (formats 2-3 stamp them with
  clock64, so they sit where the warp saw each change, a few steps apart at most).
* selftest-starved-warps: 128 blocks x 4 warps; only warp 0 of blocks 0..15 works, every other
  warp records `idle` while it waits for them (blocks 16..127 and warps 1..3 of blocks 0..15
  are the starved ones the viewer's verdict must name).
* selftest-grid-barrier: 32 blocks x 4 warps meet at a software grid barrier each round; warp 2
  of block 7 does extra work and is the last arriver of every occurrence.
* selftest-two-gpu-clock-sync (2 GPUs): one process per GPU, NTP-style ping-pong at the start
  and the end, the grid-barrier workload on both ranks, decoded onto one timeline.

The layout of each workload is in its manifest's `workload` section, which the tests and the
viewer's checks read instead of repeating these numbers.
"""
from __future__ import annotations

import argparse
import datetime
import functools
import os
import sys
import time
from pathlib import Path

import numpy as np

from .build import load_record_extension
from .session import Session

FAMILY = "selftest"
# Spin bound of the self-test kernels in clock64 cycles: ~1 s at the H200's 1.98 GHz
# (measured-facts.md); longer at lower clocks, which only makes it more lenient.
TIMEOUT_CYCLES = 2_000_000_000

TIMER = {"grid": 4, "warps": 4, "samples": 256, "iterations": 3}
STARVED = {"grid": 128, "warps": 4, "busy_blocks": 16, "busy_warps": 1, "rounds": 8, "units": 20000, "iterations": 3}
BARRIER = {"grid": 32, "warps": 4, "rounds": 8, "units": 2000, "late_block": 7, "late_warp": 2, "late_units": 10000,
           "iterations": 3}

def barrier_capacity(p=BARRIER) -> int:
    """Record slots a grid-barrier warp needs: per round a `work` span (2) and an arrive and a depart,
    each with a PAYLOAD slot where the registry gives the barrier a 32-bit payload (format 3)."""
    from ..generated import selftest_phases as P

    per_barrier_record = 2 if P.WIDE_PAYLOAD_BARRIERS else 1
    return p["rounds"] * (2 + 2 * per_barrier_record) + 4


ERRORS = {1: "an idle warp timed out waiting for the workers", 2: "a warp timed out at the grid barrier",
          3: "%globaltimer did not advance"}


class SelftestError(RuntimeError):
    """A self-test kernel reported a timeout or a wrong result."""


def _check(err, what: str) -> None:
    code = int(err.item())
    if code:
        raise SelftestError(f"{what}: {ERRORS.get(code, f'error {code}')}")


def _tensors(grid: int, warps: int):
    import torch

    return (torch.zeros(1, dtype=torch.int32, device="cuda"),
            torch.empty(grid * warps * 32, dtype=torch.float32, device="cuda"),
            torch.zeros(1, dtype=torch.int32, device="cuda"))


@functools.lru_cache(maxsize=None)
def _build(profile: bool):
    return load_record_extension(profile=profile)


def build_for(buf):
    """The build a launch runs: the instrumented one when it records (a buffer), else the compiled-out
    one. Off is then free: no predicated record issues at all (issue 33; the instrumented build with
    a null buffer, the runtime switch, cost +1.4 % on the dense self-test workload at e800f1e)."""
    return _build(buf is not None)


# -- the workloads (one launch each; `ext` None = the build for `buf`, see build_for; with an
# instrumented `ext`, `buf` None = runtime off) ----------------------------------------------------
def launch_starved(ext, buf, p=STARVED, tensors=None, zero=True):
    ext = build_for(buf) if ext is None else ext
    counter, out, err = tensors or _tensors(p["grid"], p["warps"])
    if zero:
        counter.zero_()
    ext.imbalance(buf, p["grid"], p["warps"], p["rounds"], p["busy_blocks"], p["busy_warps"], p["units"],
                  counter, out, err, TIMEOUT_CYCLES)
    return err


def launch_barrier(ext, buf, p=BARRIER, tensors=None, zero=True):
    ext = build_for(buf) if ext is None else ext
    counter, out, err = tensors or _tensors(p["grid"], p["warps"])
    if zero:
        counter.zero_()
    ext.grid_barrier(buf, p["grid"], p["warps"], p["rounds"], p["units"], p["late_block"], p["late_warp"],
                     p["late_units"], counter, out, err, TIMEOUT_CYCLES)
    return err


# -- the traces -----------------------------------------------------------------------------------
def record_timer_resolution(out_dir, ext, raw_dir=None, overwrite: bool = False) -> tuple[Path, dict]:
    p = TIMER
    wl = {"kind": "selftest", "test": "timer_resolution", **p}
    stats_all = []
    with Session(out_dir, name="selftest-timer-resolution", workload=wl, capacity=p["samples"], raw_dir=raw_dir,
                 overwrite=overwrite,
                 description=f"{p['grid']}x{p['warps']} warps wait for %globaltimer to change and record a tick "
                             "after each change: ticks follow the timer's steps") as s:
        for it in range(p["iterations"]):
            with s.host_span("selftest.timer_probe", it):
                buf = s.buffer("selftest.timer_probe", FAMILY, p["grid"], p["warps"], it)
                stats, err = ext.timer_probe(buf, p["grid"], p["warps"], p["samples"], TIMEOUT_CYCLES)
            _check(err, "timer probe")
            stats_all.append(stats.cpu().numpy())
        st = np.concatenate(stats_all)
        measured = {"globaltimer_min_step_ns": int(st[:, 0].min()), "globaltimer_max_step_ns": int(st[:, 1].max()),
                    "globaltimer_mean_step_ns": round(float(st[:, 2].sum() / max(st[:, 3].sum(), 1)), 2),
                    "timer_steps_observed": int(st[:, 3].sum())}
        s.headline_extra.update(measured)
    return s.path, measured


def record_starved_warps(out_dir, ext, raw_dir=None, overwrite: bool = False) -> Path:
    p = STARVED
    idle = (f"blocks {p['busy_blocks']}-{p['grid'] - 1} (all warps) and warps {p['busy_warps']}-{p['warps'] - 1} of "
            f"blocks 0-{p['busy_blocks'] - 1}")
    wl = {"kind": "selftest", "test": "starved_warps", **p,
          "busy": f"warps 0-{p['busy_warps'] - 1} of blocks 0-{p['busy_blocks'] - 1}", "idle": idle,
          "busy_warp_count": p["busy_blocks"] * p["busy_warps"]}
    with Session(out_dir, name="selftest-starved-warps", workload=wl, capacity=4 * p["rounds"] + 4, raw_dir=raw_dir,
                 overwrite=overwrite,
                 description=f"{p['grid']}x{p['warps']} warps, only {wl['busy']} work; {idle} record idle") as s:
        tensors = _tensors(p["grid"], p["warps"])
        for it in range(p["iterations"]):
            with s.host_span("selftest.imbalance", it):
                buf = s.buffer("selftest.imbalance", FAMILY, p["grid"], p["warps"], it)
                err = launch_starved(ext, buf, p, tensors)
            _check(err, "starved-warps workload")
    return s.path


def record_grid_barrier(out_dir, ext, raw_dir=None, overwrite: bool = False) -> Path:
    p = BARRIER
    wl = {"kind": "selftest", "test": "grid_barrier", **p}
    with Session(out_dir, name="selftest-grid-barrier", workload=wl, capacity=barrier_capacity(p), raw_dir=raw_dir,
                 overwrite=overwrite,
                 description=f"{p['grid']}x{p['warps']} warps meet at a grid barrier {p['rounds']} times; warp "
                             f"{p['late_warp']} of block {p['late_block']} works {p['late_units']} extra FMAs and "
                             "arrives last every time") as s:
        tensors = _tensors(p["grid"], p["warps"])
        for it in range(p["iterations"]):
            with s.host_span("selftest.grid_barrier", it):
                buf = s.buffer("selftest.grid_barrier", FAMILY, p["grid"], p["warps"], it)
                err = launch_barrier(ext, buf, p, tensors)
            _check(err, "grid-barrier workload")
    return s.path


# -- two GPUs: clock sync ----------------------------------------------------------------------
def _two_gpu_worker(rank: int, world: int, init_file: str, out_dir: str, name: str, raw_dir, gap_s: float,
                    overwrite: bool = False):
    import torch
    import torch.distributed as dist

    from .clocks import IpcSignalAreas

    torch.cuda.set_device(rank)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    ext = load_record_extension(profile=True)
    p = BARRIER
    areas = IpcSignalAreas(rank, world)
    try:
        wl = {"kind": "selftest", "test": "two_gpu_clock_sync", "ranks": world, "sync_gap_s": gap_s, **p}
        with Session(out_dir, name=name, rank=rank, world_size=world, workload=wl, capacity=barrier_capacity(p),
                     raw_dir=raw_dir, overwrite=overwrite,
                     description=f"{world} GPUs, one process each: NTP ping-pong at start and end ({gap_s} s "
                                 "apart), the grid-barrier workload on every rank, one aligned timeline") as s:
            dist.barrier()
            s.sync_clocks(areas.mine, areas.peers, when="start")
            tensors = _tensors(p["grid"], p["warps"])
            for it in range(p["iterations"]):
                dist.barrier()  # start the ranks' launches together, so their overlap is visible
                with s.host_span("selftest.grid_barrier", it):
                    buf = s.buffer("selftest.grid_barrier", FAMILY, p["grid"], p["warps"], it)
                    err = launch_barrier(ext, buf, p, tensors)
                _check(err, f"rank {rank} grid-barrier workload")
            time.sleep(gap_s)  # separate the two sync windows so the drift fit has a baseline
            dist.barrier()
            s.sync_clocks(areas.mine, areas.peers, when="end")
    finally:
        torch.cuda.synchronize()
        areas.close()
        dist.destroy_process_group()


def record_two_gpu_clock_sync(out_dir, raw_dir=None, name: str = "selftest-two-gpu-clock-sync",
                              gap_s: float = 0.2, overwrite: bool = False) -> Path:
    import tempfile

    import torch.multiprocessing as mp

    from ..store.runstore import free_path

    if not overwrite:   # rank 0 writes in a child process: pick the free name here, to return it
        name = free_path(Path(out_dir) / name).name
    with tempfile.TemporaryDirectory(prefix="epscope-pg-") as tmp:
        mp.start_processes(_two_gpu_worker, args=(2, os.path.join(tmp, "pg"), str(out_dir), name, raw_dir, gap_s,
                                                  overwrite),
                           nprocs=2, start_method="spawn", join=True)
    return Path(out_dir) / name


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="epscope selftest", description=__doc__.split("\n\n")[0])
    # no default: the checkout's traces/ (the old one) is the bundled runs, which a test run must not
    # change, and a command writes where its user says (issue 34)
    ap.add_argument("--out", required=True, help="directory that receives the run directories (e.g. runs/)")
    ap.add_argument("--which", default="all",
                    choices=["all", "timer-resolution", "starved-warps", "grid-barrier", "two-gpu-clock-sync"])
    ap.add_argument("--raw-dir", default=None, help="also keep the raw buffers here (*.rawbuf, for re-decoding)")
    ap.add_argument("--overwrite", action="store_true",
                    help="replace existing runs of the same names (default: write NAME-2, NAME-3, ...)")
    args = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("epscope selftest: needs a CUDA GPU (none visible)", file=sys.stderr)
        return 2
    out = Path(args.out)
    ext = load_record_extension(profile=True)
    done = []
    if args.which in ("all", "timer-resolution"):
        path, measured = record_timer_resolution(out, ext, args.raw_dir, args.overwrite)
        done.append((path, ", ".join(f"{k}={v}" for k, v in measured.items())))
    if args.which in ("all", "starved-warps"):
        done.append((record_starved_warps(out, ext, args.raw_dir, args.overwrite), ""))
    if args.which in ("all", "grid-barrier"):
        done.append((record_grid_barrier(out, ext, args.raw_dir, args.overwrite), ""))
    if args.which == "two-gpu-clock-sync" or (args.which == "all" and torch.cuda.device_count() >= 2):
        done.append((record_two_gpu_clock_sync(out, args.raw_dir, overwrite=args.overwrite), ""))
    for path, note in done:
        print(f"wrote {path}" + (f"  ({note})" if note else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
