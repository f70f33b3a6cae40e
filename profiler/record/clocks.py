"""Clock pairing on the GPU machine: rank<->rank ping-pong and host<->GPU pairs.

Kernels and protocol: profiler/csrc/clock_sync.cuh. The maths that turns the samples into
offsets, drifts and uncertainties is profiler/decode/align.py; this module only takes the samples.

    pairs = host_gpu_pairs(64)                        # [(host_before, gpu_ns, host_after), ...]
    samples = ping_pong(rank, world, my_slots, peer_slots, n=32, seq_base=0)   # rank 0: {k: [n,4]}

`IpcSignalAreas` is the test mode of the 2-rank sync: a ClockSlots area per rank in plain
cudaMalloc memory, mapped on every other rank with CUDA IPC (ep_core passes its own mapped
buffers instead).
"""
from __future__ import annotations

import time

import numpy as np

from .build import load_record_extension

# Spins on the GPU and in Python give up after this long: long enough for two processes to
# reach their launches (start-up skew of a torch.distributed job is well under a second).
DEFAULT_TIMEOUT_NS = 5_000_000_000


class ClockSyncTimeout(TimeoutError):
    """A ping-pong or host pairing did not complete; the message names the side that gave up."""


def _ext():
    # The clock kernels are the same in both variants; the compiled-out one is the default build.
    return load_record_extension(profile=False)


def host_gpu_pairs(n: int = 64, timeout_ns: int = DEFAULT_TIMEOUT_NS, device=None) -> list[tuple[int, int, int]]:
    """n (host_before, gpu_globaltimer, host_after) triples on the current (or given) GPU.

    A one-thread kernel spins on a flag in pinned host memory; Python raises flag i, the kernel
    writes %globaltimer into slot i, Python notes perf_counter_ns before the flag and after it
    sees the stamp. The GPU
    stamp lies inside [host_before, host_after], so half that width bounds each pair's error
    (profiler.decode.align.fit_host_clock). The first pair also spans the kernel's launch and is
    dropped, and so is any pair more than 3x wider than the narrowest (a descheduled host thread).
    """
    import torch

    if n < 2:
        raise ValueError("host_gpu_pairs needs n >= 2 (the first pair is a warm-up)")
    ext = _ext()
    dev = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
    with torch.cuda.device(dev):
        torch.cuda.synchronize()
        area = torch.zeros(2 + n, dtype=torch.int64, pin_memory=True)
        v = area.numpy()
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            err = ext.host_pair_launch(area, n, int(timeout_ns))
        raw = []
        for i in range(n):
            h0 = time.perf_counter_ns()
            v[0] = i + 1
            while v[2 + i] == 0:  # the GPU's stamp is its own acknowledgement
                if time.perf_counter_ns() - h0 > timeout_ns:
                    stream.synchronize()
                    raise ClockSyncTimeout(f"host pairing: the GPU did not acknowledge pair {i} within "
                                           f"{timeout_ns / 1e9:.1f} s (kernel error {int(err.item())})")
            h1 = time.perf_counter_ns()
            raw.append((h0, int(v[2 + i]), h1))
        stream.synchronize()
        if int(err.item()) != 0:
            raise ClockSyncTimeout(f"host pairing kernel reported error {int(err.item())}")
    return filter_pairs(raw[1:])


def filter_pairs(pairs: list[tuple[int, int, int]], factor: float = 3.0) -> list[tuple[int, int, int]]:
    """Keep the pairs at most `factor` times wider than the narrowest (at least one)."""
    if not pairs:
        return []
    w = np.array([p[2] - p[0] for p in pairs], dtype=np.int64)
    keep = w <= max(int(w.min() * factor), int(w.min()) + 1)
    return [p for p, k in zip(pairs, keep) if k]


def ping_pong(rank: int, world_size: int, my_slots: int, peer_slots, *, n: int = 32, seq_base: int = 0,
              timeout_ns: int = DEFAULT_TIMEOUT_NS) -> dict[int, np.ndarray]:
    """One sync window: rank 0 pings ranks 1..W-1 in turn, rank k answers rank 0.

    my_slots: this rank's ClockSlots area (device pointer as int); peer_slots: {rank: pointer of
    that rank's area as mapped here} (rank k needs only rank 0's; an int is taken as rank 0's).
    seq_base must be the same on every rank and grow by at least n * world_size between windows
    over the same areas. Returns on rank 0 {k: int64[n, 4] (t0, t1, t2, t3)}, on rank k
    {0: int64[n, 4] (t0, t1, t2, 0)} (its own view, for checks).
    """
    import torch

    ext = _ext()
    if isinstance(peer_slots, int):
        peer_slots = {0: peer_slots}
    out = {}
    peers = range(1, world_size) if rank == 0 else [0]
    for peer in peers:
        k = peer if rank == 0 else rank
        base = seq_base + (k - 1) * n  # distinct per peer: rank 0's area serves all of them in turn
        if rank == 0:
            samples, err = ext.clock_ping(int(my_slots), int(peer_slots[peer]), n, base, int(timeout_ns))
        else:
            samples, err = ext.clock_pong(int(my_slots), int(peer_slots[0]), n, base, int(timeout_ns))
        torch.cuda.current_stream().synchronize()
        code = int(err.item())
        if code:
            side = "rank 0 got no reply from" if rank == 0 else "no ping reached"
            raise ClockSyncTimeout(f"clock sync: {side} rank {k} within {timeout_ns / 1e9:.1f} s (error {code})")
        out[peer] = samples.cpu().numpy()
    return out


class IpcSignalAreas:
    """Test mode: one ClockSlots area per rank, mapped on all ranks through CUDA IPC.

    Every rank constructs it collectively (torch.distributed all_gather_object of the handles).
    .mine is this rank's area, .peers {rank: area mapped here}. close() unmaps and frees.
    """

    def __init__(self, rank: int, world_size: int, group=None):
        import torch.distributed as dist

        self.ext = _ext()
        self.rank = rank
        self.mine = self.ext.signal_alloc(int(self.ext.CLOCK_SLOTS_BYTES))
        handles = [None] * world_size
        dist.all_gather_object(handles, self.ext.ipc_handle(self.mine), group=group)
        self.peers = {r: self.ext.ipc_open(h) for r, h in enumerate(handles) if r != rank}

    def close(self, group=None) -> None:
        """Collective: unmap the peers' areas, wait until every rank has, then free our own."""
        import torch.distributed as dist

        for p in self.peers.values():
            self.ext.ipc_close(p)
        self.peers = {}
        dist.barrier(group=group)
        if self.mine:
            self.ext.signal_free(self.mine)
            self.mine = 0
