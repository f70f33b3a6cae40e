"""Clocks of a recording session (Session's clock seam): the NTP-style samples against the peers
(`sync_clocks`, through mapped ClockSlots areas: profiler/record/clocks.py), the host/GPU clock
pairs, and at save time the clock model fitted from them (`build_clock_model`, profiler.decode.align).
`SessionClocks` is a part of profiler.record.session.Session.
"""
from __future__ import annotations

import numpy as np

from .. import errors as E
from ..decode.align import ClockModel, ClockSample, fit_host_clock, fit_rank_clock
from ..generated import layout as L
from .pool import SessionError


class SessionClocks:
    """Clock samples and host pairs of a Session (see the module docstring)."""

    def add_clock_samples(self, peer_rank: int, samples, when: str) -> None:
        """NTP samples (t0, t1, t2, t3) against `peer_rank`, taken on rank 0; when: start | end."""
        if when not in ("start", "end"):
            raise SessionError(f"when must be 'start' or 'end', got {when!r}")
        a = np.asarray(samples, dtype=np.int64).reshape(-1, 4)
        self._clock.setdefault(int(peer_rank), {"start": [], "end": []})[when].append(a)

    def add_host_pairs(self, pairs) -> None:
        """(host_before_ns, gpu_globaltimer_ns, host_after_ns) triples of this rank's GPU."""
        self._host_pairs += [tuple(int(x) for x in p) for p in np.asarray(pairs, dtype=np.int64).reshape(-1, 3)]

    def pair_host_clock(self, n: int | None = None) -> None:
        from .clocks import host_gpu_pairs

        self.add_host_pairs(host_gpu_pairs(n or self.n_host_pairs))

    def sync_clocks(self, my_slots: int, peer_slots: dict[int, int] | int, when: str, n: int = 32,
                    timeout_ns: int = 5_000_000_000) -> None:
        """Ping-pong with every rank (rank 0) or with rank 0 (rank k) through mapped ClockSlots
        areas (pointers as integers; peer_slots maps rank -> that rank's area mapped here).
        Every rank must call it, with the same n, in the same order."""
        from .clocks import ping_pong

        base = self._clock_seq
        self._clock_seq += n * self.world_size
        out = ping_pong(self.rank, self.world_size, my_slots, peer_slots, n=n, seq_base=base, timeout_ns=timeout_ns)
        if self.rank == 0:
            for peer, s in out.items():
                self.add_clock_samples(peer, s, when)


def build_clock_model(payloads: list[dict], world_size: int) -> tuple[ClockModel, list[dict]]:
    """Rank clocks from rank 0's ping-pong samples, the host clock from rank 0's pairs (all ranks
    of one host share perf_counter_ns), t0 = the earliest of session start and any GPU start."""
    notes = []
    p0 = next(p for p in payloads if p["rank"] == 0)
    ranks = {0: fit_rank_clock(0, [], [])}
    for r in range(1, world_size):
        d = p0["clock"].get(r, {"start": [], "end": []})
        win = {w: [ClockSample(*map(int, row)) for a in d.get(w, []) for row in a if row[0] >= 0 and row[3] > 0]
               for w in ("start", "end")}
        if not win["start"] and not win["end"]:
            from ..decode.align import RankClock

            ranks[r] = RankClock(r, 0.0, 0.0, float("inf"))
            notes.append(E.ClockFallback(1, f"rank {r}: no clock-sync samples; its globaltimer is taken as "
                                            "rank 0's (uncertainty unknown)").to_json())
        else:
            ranks[r] = fit_rank_clock(r, win["start"], win["end"])
    host = None
    pairs = [p for pl in payloads if pl["rank"] == 0 for p in pl["host_pairs"]]
    if pairs:
        host = fit_host_clock(pairs, rank=0)
    starts = []
    for pl in payloads:
        for info, buf in pl["launches"]:
            g = first_gpu_start(buf)
            if g is not None:
                starts.append(int(ranks[info.rank].to_ref(np.array([g]))[0]))
    if host is not None:
        starts.append(int(host.to_gpu(np.array([p0["start_host_ns"]]))[0]))
    t0 = min(starts) if starts else 0
    return ClockModel(ranks, t0, host), notes


def first_gpu_start(buf) -> int | None:
    """Earliest gt_start of the started regions of a raw buffer (None if none or unreadable)."""
    a = np.asarray(buf).view(np.uint8)
    if a.size < L.BUFFERHEADER_SIZE:
        return None
    h = a[: L.BUFFERHEADER_SIZE].view(L.BUFFERHEADER_DTYPE)[0]
    if int(h["magic"]) != L.MAGIC:
        return None
    n, cap = int(h["num_regions"]), int(h["region_capacity"])
    stride = L.REGIONHEADER_SIZE + cap * (L.RECORD8_SIZE if int(h["version"]) >= 3 else L.RECORD_SIZE)
    if n == 0 or a.size < L.BUFFERHEADER_SIZE + n * stride:
        return None
    regs = a[L.BUFFERHEADER_SIZE: L.BUFFERHEADER_SIZE + n * stride].reshape(n, stride)[:, : L.REGIONHEADER_SIZE]
    rh = np.ascontiguousarray(regs).view(L.REGIONHEADER_DTYPE).reshape(n)
    started = rh["gt_start"][rh["state"] != L.REGION_STATE_UNUSED]
    return int(started.min()) if started.size else None
