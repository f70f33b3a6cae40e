"""`epscope calibrate`'s two-GPU figures (issue 24): what the link between two GPUs of one host
costs, measured with no kernel of its own (the recorder's clock-sync kernels and torch's copies).

  * flag round trip (µs): the clock sync's NTP ping-pong (profiler/record/clocks.py, one process
    per GPU, ClockSlots areas mapped with CUDA IPC): per sample (t0, t1, t2, t3), rank 0 raises a
    flag in the peer's memory at t0, the peer sees it at t1 and answers at t2, rank 0 sees the
    answer at t3; (t3 - t0) - (t2 - t1) is the two flag crossings without the peer's turnaround,
    each side's %globaltimer read on its own GPU (the offset between the clocks cancels).
  * copy bandwidth (GB/s) per direction, GPU i -> GPU j, `COPY_BYTES` a copy: copy engine =
    torch's contiguous device-to-device copy (cudaMemcpyPeerAsync); SM copy = the same bytes as a
    row-strided view, which torch copies with its elementwise kernel on the source GPU writing
    into peer memory (peer access on): not ep_core's tuned copy loop, a floor for an SM copy.

Pure parts (the round-trip arithmetic, the medians and rates, the skip reason, the record in the
calibration file) are tested on the CPU; the measurement runs on a machine with >= 2 GPUs and
skips with a reason on one.
"""
from __future__ import annotations

import os
import tempfile
import time

import numpy as np

COPY_BYTES = 256 << 20          # 256 MiB: a copy of ~1 ms at NVLink rates, launch cost < 0.1 %
COPY_REPS = 9
ROW_BYTES = 16 << 10            # the SM copy's row: 16 KiB contiguous, rows 64 B apart beyond it
ROUND_TRIPS = 64


def skip_reason(gpus: int, peer_access: bool | None) -> str | None:
    """Why the two-GPU figures cannot be measured here (None: they can)."""
    if gpus < 2:
        return f"needs 2 GPUs of one host, this machine has {gpus}"
    if peer_access is False:
        return "GPU 0 cannot access GPU 1's memory (no peer access): no NVLink / P2P path to measure"
    return None


def round_trips_ns(samples) -> np.ndarray:
    """(t3 - t0) - (t2 - t1) per complete NTP sample (rows with t0 < 0 or t3 == 0 did not finish)."""
    a = np.asarray(samples, dtype=np.int64).reshape(-1, 4)
    a = a[(a[:, 0] >= 0) & (a[:, 3] > 0)]
    return (a[:, 3] - a[:, 0]) - (a[:, 2] - a[:, 1])


def link_figures(samples, copies: dict[str, dict[str, list[float]]], copy_bytes: int = COPY_BYTES) -> dict:
    """The calibration file's `link` record: round trip from the ping-pong samples, and per copy
    kind and direction ("0->1") the median rate over the timed copies (seconds each)."""
    rt = round_trips_ns(samples)
    if rt.size == 0:
        raise ValueError("link figures: no complete ping-pong sample")
    out = {"flag_round_trip_us": round(float(np.median(rt)) / 1e3, 3),
           "flag_round_trip_min_us": round(float(rt.min()) / 1e3, 3), "round_trips": int(rt.size),
           "copy_bytes": int(copy_bytes), "copy_gbps": {}}
    for kind, per_dir in copies.items():
        out["copy_gbps"][kind] = {d: round(copy_bytes / float(np.median(s)) / 1e9, 1) for d, s in per_dir.items() if s}
    return out


def describe_link(link: dict) -> list[str]:
    L = [f"flag round trip over the link {link['flag_round_trip_us']:.2f} µs (median of {link['round_trips']}, "
         f"min {link['flag_round_trip_min_us']:.2f})"]
    for kind, per_dir in link.get("copy_gbps", {}).items():
        L.append(f"{kind}: " + ", ".join(f"{d} {v:.1f} GB/s" for d, v in per_dir.items()))
    return L


# -- on the GPUs -------------------------------------------------------------------------------------
def _ping_worker(rank: int, world: int, init_file: str, out_file: str, n: int) -> None:
    import datetime

    import torch
    import torch.distributed as dist

    from .clocks import IpcSignalAreas, ping_pong

    torch.cuda.set_device(rank)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    areas = IpcSignalAreas(rank, world)
    try:
        dist.barrier()
        out = ping_pong(rank, world, areas.mine, areas.peers, n=n, seq_base=0)
        if rank == 0:
            np.save(out_file, out[1])
    finally:
        torch.cuda.synchronize()
        areas.close()
        dist.destroy_process_group()


def ping_samples(n: int = ROUND_TRIPS) -> np.ndarray:
    """int64[n, 4] NTP samples of GPU 0 against GPU 1 (two processes, spawned)."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="epscope-link-") as tmp:
        out = os.path.join(tmp, "samples.npy")
        mp.start_processes(_ping_worker, args=(2, os.path.join(tmp, "pg"), out, n), nprocs=2,
                           start_method="spawn", join=True)
        return np.load(out)


def _timed(fn, devices, reps: int) -> list[float]:
    import torch

    fn()   # first call: peer access, allocations
    out = []
    for _ in range(reps):
        for d in devices:
            torch.cuda.synchronize(d)
        t0 = time.perf_counter()
        fn()
        for d in devices:
            torch.cuda.synchronize(d)
        out.append(time.perf_counter() - t0)
    return out


def copy_times(copy_bytes: int = COPY_BYTES, reps: int = COPY_REPS) -> dict[str, dict[str, list[float]]]:
    """Seconds per copy of `copy_bytes`, {"copy engine" | "SM copy": {"0->1": [...], "1->0": [...]}}."""
    import torch

    rows = copy_bytes // ROW_BYTES
    pad = 64   # bytes between rows: the view is not contiguous, so torch copies it with a kernel
    out = {"copy engine": {}, "SM copy": {}}
    for i, j in ((0, 1), (1, 0)):
        src = torch.empty(rows, ROW_BYTES + pad, dtype=torch.uint8, device=f"cuda:{i}")
        dst = torch.empty(rows, ROW_BYTES + pad, dtype=torch.uint8, device=f"cuda:{j}")
        flat_src = src.view(-1)[:copy_bytes]
        flat_dst = dst.view(-1)[:copy_bytes]
        out["copy engine"][f"{i}->{j}"] = _timed(lambda: flat_dst.copy_(flat_src, non_blocking=True), (i, j), reps)
        out["SM copy"][f"{i}->{j}"] = _timed(lambda: dst[:, :ROW_BYTES].copy_(src[:, :ROW_BYTES], non_blocking=True),
                                             (i, j), reps)
        del src, dst
    return out


def measure_link() -> tuple[dict | None, str | None]:
    """(the `link` record, None) on a machine with two peer-connected GPUs, else (None, why not)."""
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    why = skip_reason(gpus, torch.cuda.can_device_access_peer(0, 1) if gpus >= 2 else None)
    if why is not None:
        return None, why
    return link_figures(ping_samples(), copy_times()), None
