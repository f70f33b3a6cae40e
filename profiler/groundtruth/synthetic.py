"""Synthetic EP runs with known truths, for tests, benchmarks and the viewer.

`make_events` simulates ring-buffer EP kernels on R ranks and returns the three parts of a run: the
event table, the launch table and a manifest. The simulated kernels are not ep_core's (those write
rows straight to their final place and have no ring buffer): they are their own kernel family,
declared by `REGISTRY` below and embedded in every manifest, so the analyses read the simulated
phases' semantics (waits, releases, barrier scopes) from it like from any recorded run.
The timing is a causal simulation, so every wait ends after the release it waits for:

  per iteration and rank:  notify (1 warp: `notify`, cross-rank barrier `rank_layout`)
                           dispatch and combine (C blocks = channels, 2R warps per block)
  in dispatch/combine, for every (source s, destination d, channel c):
    sender warp d of block c on rank s, per chunk k:
        send_chunk [ wait_space (ring slot k-depth released by the receiver) , copy ] , publish_tail
    receiver warp R+s of block c on rank d, per chunk k:
        wait_data (until s published chunk k) , copy_out (combine: reduce) , publish_head
  every warp: cross-rank barrier `rank_start` at start, `grid` barrier at the end.
  one host `enqueue` span per launch; a kernel starts after its enqueue and the previous kernel.

Scenarios (the manifest's "synthetic" entry records the truth each one plants):
  balanced      every warp works, no planted effect
  starvation    rank `starved_rank` receives no tokens on blocks >= `active_blocks`: those blocks
                do no work (only barrier events); 2R * active_blocks warps carry all its work
  late_arriver  warp (late_rank, late_block, late_warp) runs `late_ns` longer before the grid
                barrier of every dispatch: it is the last arriver there
  slow_rank     rank `slow_rank` copies `slow_factor` x slower: it paces the rendezvous
  ab            variant 'a' or 'b'; in 'b' the sender's copy in dispatch (send_chunk) is
                `ab_factor` x slower
  late_host     the host of rank `late_rank` enters every iteration `late_ns` after the others:
                they wait for it at notify's cross-rank barrier
  late_host_random  the host of rank `late_rank` is held a random [0, late_ns) before every kernel's
                enqueue (drawn from the run's seed): a late entry per op, host side (issue 24)
  upstream_gpu  the stream of rank `late_rank` runs `late_ns` of unrecorded GPU work before every
                dispatch (an upstream GEMM) while its host enqueues on time: a late entry, GPU side
  host_jitter   before every kernel the hosts meet (as the host sync of an EP op on the peers' counts
                makes them) and each rank's host is then held a random [0, late_ns), drawn per rank
                and kernel: the late rank is random per op, as on real hosts (issue 29). No rank
                is later than another in expectation: nothing is planted on a rank

Size: `events` is a target; the chunk count per (pair, channel) is chosen to reach it (a 10 M
event run of 8 ranks has about 200 chunks per pair and channel over 4 iterations).
"""
from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from ..registry.registry import Registry
from ..store.schema import EVENT_KINDS, LAUNCH_COLUMNS

SCENARIOS = ("balanced", "starvation", "late_arriver", "slow_rank", "ab", "late_host", "late_host_random",
             "upstream_gpu", "host_jitter")
KERNELS = ("notify", "dispatch", "combine")
ROLES = ("notify", "sender", "receiver", "host")
PHASES = ("notify", "send_chunk", "wait_space", "publish_tail", "wait_data", "copy_out",
          "publish_head", "reduce", "rank_start", "rank_layout", "grid", "enqueue")
# Simulated costs (ns). Orders of magnitude of an H200 intranode EP kernel: a 16 KB chunk over
# NVLink takes a couple of microseconds, a flag store becomes visible to a peer in ~1 us, a kernel
# launch after its enqueue ~5 us. They make plausible traces; nothing is measured from them.
COPY_NS = 2000
RECV_COPY_NS = 1500
FLAG_LAT_NS = 800
BARRIER_LAT_NS = 1000
LAUNCH_LAT_NS = 5000
ENQUEUE_NS = 4000
RING_DEPTH = 2

REGISTRY = Registry.from_dict({
    "family": "synthetic_ep", "version": 1,
    "doc": "simulated ring-buffer EP kernels (profiler.groundtruth.synthetic): per-chunk sends into a ring of "
           f"{RING_DEPTH} slots per (source, destination, channel), receives, a grid barrier per launch",
    "roles": ["notify", "sender", "receiver"],
    "phases": [
        {"name": "notify", "id": 1, "role": "notify", "doc": "count exchange"},
        {"name": "send_chunk", "id": 2, "role": "sender", "doc": "wait for a ring slot, copy one chunk; payload = chunk"},
        {"name": "wait_space", "id": 3, "role": "sender", "parent": "send_chunk", "wait": True,
         "waits_for": "publish_head", "doc": "wait until the receiver freed the ring slot; payload = destination rank"},
        {"name": "publish_tail", "id": 4, "role": "sender", "kind": "instant",
         "doc": "the chunk is in the destination's ring; payload = destination rank"},
        {"name": "wait_data", "id": 5, "role": "receiver", "wait": True, "waits_for": "publish_tail",
         "doc": "wait for the source's chunk; payload = source rank"},
        {"name": "copy_out", "id": 6, "role": "receiver", "doc": "dispatch: copy a chunk out; payload = chunk"},
        {"name": "publish_head", "id": 7, "role": "receiver", "kind": "instant",
         "doc": "the ring slot is free again; payload = source rank"},
        {"name": "reduce", "id": 8, "role": "receiver", "doc": "combine: reduce a chunk; payload = chunk"},
    ],
    "barriers": [
        {"name": "rank_start", "id": 1, "scope": "rank", "doc": "every rank started the kernel"},
        {"name": "rank_layout", "id": 2, "scope": "rank", "doc": "every rank's counts are exchanged"},
        {"name": "grid", "id": 3, "scope": "grid", "doc": "every warp of the launch finished"},
    ],
})


def _lognormal(rng, shape, sigma):
    return rng.lognormal(0.0, sigma, size=shape)


class _Rows:
    """Column buffers of the event table being built (numpy chunks, concatenated once)."""

    def __init__(self):
        self.cols = {c: [] for c in ("rank", "launch", "kernel", "iteration", "block", "warp", "role",
                                     "kind", "phase", "begin_ns", "end_ns", "payload")}

    def add(self, mask=None, **kw):
        n = None
        arrs = {}
        for k, v in kw.items():
            a = np.asarray(v)
            arrs[k] = a
        shape = np.broadcast_shapes(*(a.shape for a in arrs.values()))
        if mask is not None:
            shape = np.broadcast_shapes(shape, np.shape(mask))
            m = np.broadcast_to(mask, shape).ravel()
        for k, a in arrs.items():
            flat = np.broadcast_to(a, shape).ravel()
            if mask is not None:
                flat = flat[m]
            self.cols[k].append(flat)
            n = len(flat)
        return n

    def frame(self) -> pd.DataFrame:
        out = {}
        for k, parts in self.cols.items():
            out[k] = np.concatenate(parts) if parts else np.zeros(0, np.int64)
        return out


@dataclass
class _Sim:
    """One simulation's settings, derived sizes, row sink and random stream: what the steps of
    make_events share. The steps draw from `rng` in a fixed order (the bundled synthetic runs are
    this simulation's output for their seeds)."""

    R: int
    C: int
    W: int
    K: int
    scenario: str
    variant: str
    noise: float
    rng: np.random.Generator
    nchunks: np.ndarray                 # chunks per (src, dst, channel)
    planted: dict                       # late_rank, late_block, late_warp, late_ns, slow_rank, slow_factor, ab_factor
    rows: _Rows = field(default_factory=_Rows)
    codes: dict = field(default_factory=lambda: {
        "phase": {p: i for i, p in enumerate(PHASES)}, "kernel": {k: i for i, k in enumerate(KERNELS)},
        "role": {r: i for i, r in enumerate(ROLES)}, "kind": {k: i for i, k in enumerate(EVENT_KINDS)}})

    def code(self, what: str, name: str) -> int:
        return self.codes[what][name]


def make_events(*, ranks: int = 8, events: int = 200_000, scenario: str = "balanced", seed: int = 0,
                variant: str = "a", iterations: int = 4, blocks: int | None = None,
                chunks: int | None = None, starved_rank: int = 1, active_blocks: int = 1,
                late_rank: int = 0, late_block: int = 0, late_warp: int = 0, late_ns: int = 20_000,
                slow_rank: int | None = None, slow_factor: float = 1.6, ab_factor: float = 1.2,
                noise: float = 0.05):
    """Simulate a run; returns (events, launches, manifest). See the module docstring."""
    if scenario not in SCENARIOS:
        raise ValueError(f"scenario must be one of {SCENARIOS}, got {scenario!r}")
    if ranks < 1:
        raise ValueError(f"ranks must be >= 1, got {ranks}")
    if variant not in ("a", "b"):
        raise ValueError(f"variant must be 'a' or 'b', got {variant!r}")
    R = ranks
    if slow_rank is None:
        slow_rank = min(3, R - 1)
    late_rank, starved_rank = min(late_rank, R - 1), min(starved_rank, R - 1)
    C = blocks if blocks is not None else (24 if scenario == "starvation" else max(2, 16 * 8 // (R * 1)) if R < 8 else 16)
    if scenario == "starvation" and not (0 < active_blocks < C):
        raise ValueError(f"starvation needs 0 < active_blocks < blocks, got {active_blocks} of {C}")
    W = 2 * R
    late_block, late_warp = min(late_block, C - 1), min(late_warp, W - 1)
    # events per chunk per (pair, channel) = 6; fixed per warp and launch = 8 (two barriers)
    per_unit = iterations * 2 * R * R * C
    K = chunks if chunks is not None else max(1, int(round((events / per_unit - 8) / 6)))
    nchunks = np.full((R, R, C), K, np.int64)
    if scenario == "starvation":
        nchunks[:, starved_rank, active_blocks:] = 0     # nobody sends to it on those channels
        nchunks[starved_rank, :, active_blocks:] = 0     # and it has nothing to send there
    planted = dict(late_rank=late_rank, late_block=late_block, late_warp=late_warp, late_ns=late_ns,
                   slow_rank=slow_rank, slow_factor=slow_factor, ab_factor=ab_factor)
    sim = _Sim(R, C, W, K, scenario, variant, noise, np.random.default_rng(seed), nchunks, planted)
    launches = _simulate(sim, iterations)
    df = _event_frame(sim.rows.frame())
    lt = pd.DataFrame(launches)
    lt["kernel"] = lt["kernel"].astype("category")
    lt = lt[list(LAUNCH_COLUMNS)].astype(LAUNCH_COLUMNS)
    truth = {"scenario": scenario, "variant": variant, "ranks": R, "blocks": C, "warps_per_block": W, "chunks": K}
    if scenario == "starvation":
        truth.update(starved_rank=starved_rank, idle_blocks=[active_blocks, C - 1],
                     working_warps=active_blocks * W)
    elif scenario == "late_arriver":
        truth.update(late_rank=late_rank, late_block=late_block, late_warp=late_warp, late_ns=late_ns)
    elif scenario in ("late_host", "late_host_random", "upstream_gpu"):
        truth.update(late_rank=late_rank, late_ns=late_ns)
    elif scenario == "host_jitter":
        truth.update(jitter_ns=late_ns)
    elif scenario == "slow_rank":
        truth.update(slow_rank=slow_rank, slow_factor=slow_factor)
    elif scenario == "ab":
        truth.update(ab_phase="dispatch/send_chunk", ab_factor=ab_factor if variant == "b" else 1.0)
    return df, lt, _manifest(sim, seed, iterations, len(df), truth)


def _simulate(sim: _Sim, iterations: int) -> list[dict]:
    """Every launch of every iteration (notify, dispatch, combine), their rows into sim.rows;
    returns the launch table's rows."""
    R, rng = sim.R, sim.rng
    launches = []
    host_t = np.zeros(R, np.int64)          # host clock per rank
    gpu_free = np.zeros(R, np.int64)        # stream of each rank free at
    launch_no = 0
    for it in range(iterations):
        it_factor = _lognormal(rng, (), 0.03)  # iteration-to-iteration drift
        if sim.scenario == "late_host":
            host_t[sim.planted["late_rank"]] += sim.planted["late_ns"]
        for kernel in KERNELS:
            if sim.scenario == "late_host_random":
                host_t[sim.planted["late_rank"]] += int(rng.uniform(0, sim.planted["late_ns"]))
            if sim.scenario == "host_jitter":
                host_t = host_t.max() + rng.uniform(0, sim.planted["late_ns"], R).astype(np.int64)
            if sim.scenario == "upstream_gpu" and kernel == "dispatch":
                gpu_free[sim.planted["late_rank"]] += sim.planted["late_ns"]   # queued first, not recorded
            # host enqueue, kernel start
            h_b = host_t + rng.integers(500, 1500, R)
            h_e = h_b + (ENQUEUE_NS * _lognormal(rng, R, sim.noise)).astype(np.int64)
            host_t = h_e
            k_start = np.maximum(h_e + LAUNCH_LAT_NS, gpu_free + 1000)
            sim.rows.add(rank=np.arange(R), launch=launch_no, kernel=sim.code("kernel", kernel), iteration=it, block=-1,
                         warp=-1, role=sim.code("role", "host"), kind=sim.code("kind", "host"),
                         phase=sim.code("phase", "enqueue"), begin_ns=h_b, end_ns=h_e, payload=0)
            where = dict(launch=launch_no, kernel=sim.code("kernel", kernel), iteration=it)
            if kernel == "notify":
                k_end, regions = _notify(sim, k_start, where), 1
            else:
                k_end, regions = _ep_kernel(sim, kernel, k_start, it_factor, where), sim.C * sim.W
            for r in range(R):
                launches.append({"rank": r, "launch": launch_no, "kernel": kernel, "iteration": it,
                                 "host_begin_ns": int(h_b[r]), "host_end_ns": int(h_e[r]),
                                 "gpu_begin_ns": int(np.asarray(k_start)[r]), "gpu_end_ns": int(np.asarray(k_end)[r] if np.ndim(k_end) else k_end),
                                 "regions": regions, "dropped": 0})
            gpu_free = np.asarray(k_end, np.int64) if np.ndim(k_end) else np.full(R, k_end, np.int64)
            host_t = np.maximum(host_t, h_e)
            launch_no += 1
        # the host synchronises with its stream at the end of each iteration (as EP benchmarks do)
        host_t = np.maximum(host_t, gpu_free)
    return launches


def _notify(sim: _Sim, k_start, where: dict):
    """The notify kernel: one warp per rank, then the cross-rank rank_layout barrier; returns its end."""
    R, rng, c = sim.R, sim.rng, sim.code
    t0 = k_start + rng.integers(100, 400, R)
    n_end = t0 + (3000 * _lognormal(rng, R, sim.noise)).astype(np.int64)
    dep = n_end.max() + BARRIER_LAT_NS + rng.integers(0, 100, R)
    rk = np.arange(R)
    sim.rows.add(rank=rk, block=0, warp=0, role=c("role", "notify"), kind=c("kind", "span"), phase=c("phase", "notify"),
                 begin_ns=t0, end_ns=n_end, payload=0, **where)
    for kind, t in (("arrive", n_end), ("depart", dep)):
        sim.rows.add(rank=rk, block=0, warp=0, role=c("role", "notify"), kind=c("kind", kind),
                     phase=c("phase", "rank_layout"), begin_ns=t, end_ns=t, payload=0, **where)
    return dep


def _ep_kernel(sim: _Sim, kernel: str, k_start, it_factor, where: dict):
    """dispatch or combine: every warp's start and rank_start barrier, the chunks of every
    (source, destination, channel) pair, the grid barrier; returns each rank's kernel end."""
    R, C, W, rng, c = sim.R, sim.C, sim.W, sim.rng, sim.code
    # every warp of every rank: start, rank_start barrier
    w_start = k_start[:, None, None] + rng.integers(100, 2000, (R, C, W))
    rs_dep = w_start.max() + BARRIER_LAT_NS + rng.integers(0, 200, (R, C, W))
    grid = dict(rank=np.arange(R)[:, None, None], block=np.arange(C)[None, :, None], warp=np.arange(W)[None, None, :])
    grid["role"] = np.where(grid["warp"] < R, c("role", "sender"), c("role", "receiver"))
    for kind, t in (("arrive", w_start), ("depart", rs_dep)):
        sim.rows.add(kind=c("kind", kind), phase=c("phase", "rank_start"), begin_ns=t, end_ns=t, payload=0,
                     **grid, **where)
    buf, s_t, r_t = _chunks(sim, kernel, rs_dep, it_factor)
    _chunk_rows(sim, kernel, buf, where)
    # warp finish times -> grid barrier per rank
    fin = rs_dep.copy()
    fin_s = np.where(sim.nchunks > 0, s_t, 0)   # (s, d, c): sender warp d of block c on rank s
    fin_r = np.where(sim.nchunks > 0, r_t, 0)   # receiver warp R+s of block c on rank d
    fin[:, :, :R] = np.maximum(fin[:, :, :R], fin_s.transpose(0, 2, 1))
    fin[:, :, R:] = np.maximum(fin[:, :, R:], fin_r.transpose(1, 2, 0))
    if sim.scenario == "late_arriver" and kernel == "dispatch":
        _late_warp(sim, kernel, fin, where)
    arrive = fin + rng.integers(10, 100, (R, C, W))
    gdep = arrive.reshape(R, -1).max(axis=1)[:, None, None] + BARRIER_LAT_NS + rng.integers(0, 100, (R, C, W))
    for kind, t in (("arrive", arrive), ("depart", gdep)):
        sim.rows.add(kind=c("kind", kind), phase=c("phase", "grid"), begin_ns=t, end_ns=t, payload=0, **grid, **where)
    return gdep.reshape(R, -1).max(axis=1)


def _chunks(sim: _Sim, kernel: str, rs_dep, it_factor):
    """The chunk pipeline of every (s, d, c) pair: sender = warp d of block c on rank s, receiver
    = warp R+s of block c on rank d, a ring of RING_DEPTH chunks between them. Returns the times of
    each chunk's steps ({name: [K, R, R, C]}) and each sender's and receiver's last time."""
    R, C, K, rng, p = sim.R, sim.C, sim.K, sim.rng, sim.planted
    s_t = rs_dep.transpose(0, 2, 1)[:, :R, :].astype(np.int64).copy()
    r_t = rs_dep[:, :, R:].transpose(2, 0, 1).astype(np.int64).copy()
    copy_f = np.ones((R, R, C))
    recv_f = np.ones((R, R, C))
    if sim.scenario == "slow_rank":
        copy_f[p["slow_rank"]] *= p["slow_factor"]
        recv_f[:, p["slow_rank"]] *= p["slow_factor"]
    if sim.scenario == "ab" and sim.variant == "b" and kernel == "dispatch":
        copy_f = copy_f * p["ab_factor"]
    heads = np.zeros((K, R, R, C), np.int64)
    buf = {n: np.zeros((K, R, R, C), np.int64) for n in ("ws_b", "ws_e", "sc_e", "wd_b", "wd_e", "co_e")}
    for k in range(K):
        ws_b = s_t
        space = heads[k - RING_DEPTH] + FLAG_LAT_NS if k >= RING_DEPTH else s_t
        ws_e = np.maximum(ws_b, space)
        sc_e = ws_e + (COPY_NS * copy_f * it_factor * _lognormal(rng, (R, R, C), sim.noise)).astype(np.int64)
        wd_b = r_t
        wd_e = np.maximum(wd_b, sc_e + FLAG_LAT_NS)
        co_e = wd_e + (RECV_COPY_NS * recv_f * it_factor * _lognormal(rng, (R, R, C), sim.noise)).astype(np.int64)
        heads[k] = co_e
        for n, v in (("ws_b", ws_b), ("ws_e", ws_e), ("sc_e", sc_e), ("wd_b", wd_b), ("wd_e", wd_e), ("co_e", co_e)):
            buf[n][k] = v
        active = k < sim.nchunks
        s_t = np.where(active, sc_e + 50, s_t)
        r_t = np.where(active, co_e + 50, r_t)
    return buf, s_t, r_t


def _chunk_rows(sim: _Sim, kernel: str, buf: dict, where: dict) -> None:
    """The rows of every chunk that was sent: the sender's send / wait_space / publish on rank s,
    the receiver's wait_data / copy-out (or reduce) / publish on rank d."""
    R, C, K, c = sim.R, sim.C, sim.K, sim.code
    recv_phase = "copy_out" if kernel == "dispatch" else "reduce"
    kk = np.arange(K)[:, None, None, None]
    act = kk < sim.nchunks[None]
    src, dst, ch = np.arange(R)[:, None, None], np.arange(R)[None, :, None], np.arange(C)[None, None, :]
    S, D, Cc = (np.broadcast_to(a, (K, R, R, C)) for a in (src[None], dst[None], ch[None]))
    common = dict(block=Cc, **where)
    sender = dict(rank=S, warp=D, role=c("role", "sender"), **common)
    receiver = dict(rank=D, warp=R + S, role=c("role", "receiver"), **common)
    for who, kind, phase, b, e, payload in (
            (sender, "span", "send_chunk", "ws_b", "sc_e", kk), (sender, "span", "wait_space", "ws_b", "ws_e", D),
            (sender, "instant", "publish_tail", "sc_e", "sc_e", D), (receiver, "span", "wait_data", "wd_b", "wd_e", S),
            (receiver, "span", recv_phase, "wd_e", "co_e", kk), (receiver, "instant", "publish_head", "co_e", "co_e", S)):
        sim.rows.add(act, kind=c("kind", kind), phase=c("phase", phase), begin_ns=buf[b], end_ns=buf[e],
                     payload=payload, **who)


def _late_warp(sim: _Sim, kernel: str, fin, where: dict) -> None:
    """late_arriver: the planted warp finishes late_ns later, spending it in a recorded span (a slow
    last copy)."""
    p, c = sim.planted, sim.code
    r, b, w, late = p["late_rank"], p["late_block"], p["late_warp"], p["late_ns"]
    recv_phase = "copy_out" if kernel == "dispatch" else "reduce"
    fin[r, b, w] += late
    sim.rows.add(rank=r, block=b, warp=w, role=c("role", "sender") if w < sim.R else c("role", "receiver"),
                 kind=c("kind", "span"), phase=c("phase", "send_chunk") if w < sim.R else c("phase", recv_phase),
                 begin_ns=fin[r, b, w] - late, end_ns=fin[r, b, w], payload=sim.K, **where)


def _event_frame(cols: dict) -> pd.DataFrame:
    """The simulated rows as the event table (profiler.store.schema's dtypes), in record order per warp."""
    order = np.lexsort((-cols["end_ns"], cols["begin_ns"], cols["warp"], cols["block"], cols["launch"], cols["rank"]))
    return pd.DataFrame({
        "rank": cols["rank"][order].astype(np.int16),
        "launch": cols["launch"][order].astype(np.int32),
        "kernel": pd.Categorical.from_codes(cols["kernel"][order].astype(np.int8), categories=list(KERNELS)),
        "iteration": cols["iteration"][order].astype(np.int32),
        "sm": np.where(cols["block"][order] < 0, -1, cols["block"][order] % 132).astype(np.int16),
        "block": cols["block"][order].astype(np.int32),
        "warp": cols["warp"][order].astype(np.int16),
        "role": pd.Categorical.from_codes(cols["role"][order].astype(np.int8), categories=list(ROLES)),
        "kind": pd.Categorical.from_codes(cols["kind"][order].astype(np.int8), categories=list(EVENT_KINDS)),
        "phase": pd.Categorical.from_codes(cols["phase"][order].astype(np.int8), categories=list(PHASES)),
        "begin_ns": cols["begin_ns"][order].astype(np.int64),
        "end_ns": cols["end_ns"][order].astype(np.int64),
        "payload": cols["payload"][order].astype(np.int64),
        "open": np.zeros(len(order), bool),
    })


def _manifest(sim: _Sim, seed: int, iterations: int, n: int, truth: dict) -> dict:
    R, C, W, K, scenario, variant = sim.R, sim.C, sim.W, sim.K, sim.scenario, sim.variant
    registry = REGISTRY
    return {
        "format": "epscope-run", "format_version": 1,
        "name": f"synthetic-{scenario}{'-' + variant if scenario == 'ab' else ''}-r{R}-s{seed}",
        "description": f"synthetic {scenario} run: {R} ranks, {C} blocks x {W} warps, {K} chunks per pair, {n} events",
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "git": {"branch": "synthetic", "commit": "", "dirty": False},
        "workload": {"kind": "synthetic", "scenario": scenario, "variant": variant, "seed": seed,
                     "iterations": iterations},
        "config": {"ranks": R, "blocks": C, "warps_per_block": W, "chunks": K, "ring_depth": RING_DEPTH},
        "gpu": {"name": "synthetic", "count": R, "driver": ""},
        "clock": {"source": "synthetic", "step_ns": 1,
                  "ranks": [{"rank": r, "offset_ns": 0, "drift_ppm": 0.0, "uncertainty_ns": 0} for r in range(R)],
                  "host": {"uncertainty_ns": 0}},
        "registry": {registry.family: registry.to_json()},
        "drops": {"total": 0, "per_rank": [0] * R},
        "warnings": [],
        "headline": {"events": n, "iterations": iterations},
        "synthetic": truth,
    }


def make_run(path, *, ranks: int = 8, events: int = 200_000, scenario: str = "balanced",
             perfetto: bool | None = None, **kw) -> Path:
    """Simulate a run (make_events) and write it as a run directory; returns the path."""
    from ..store.runstore import write_run

    ev, launches, manifest = make_events(ranks=ranks, events=events, scenario=scenario, **kw)
    return write_run(Path(path), ev, launches, manifest, perfetto=perfetto)


def make_iterations(*, ranks: int = 8, per_iteration: int = 1_000_000, iterations: int = 100,
                    scenario: str = "slow_rank"):
    """A run too long to simulate whole, one iteration at a time: yields (events, launches,
    manifest) of each iteration, simulated with its own seed (make_events) and moved after the
    previous one (iteration and launch numbers and times shifted on; the events indexed by their
    row numbers in the whole run). Categories are the first iteration's (every iteration records
    the same kernels and phases), so the parts can be written as one file (runstore.write_run_parts)."""
    t_off, row_off, la_off, dtypes = 0, 0, 0, None
    for i in range(iterations):
        ev, la, man = make_events(ranks=ranks, events=per_iteration, iterations=1, scenario=scenario, seed=i)
        if dtypes is None:
            dtypes = {c: ev[c].dtype for c in ev.columns if isinstance(ev[c].dtype, pd.CategoricalDtype)}
        ev = ev.astype(dtypes)
        ev["iteration"] = (ev["iteration"].to_numpy() + i).astype(ev["iteration"].dtype)
        la["iteration"] = (la["iteration"].to_numpy() + i).astype(la["iteration"].dtype)
        ev["launch"] = (ev["launch"].to_numpy() + la_off).astype(ev["launch"].dtype)
        la["launch"] = (la["launch"].to_numpy() + la_off).astype(la["launch"].dtype)
        for c in ("begin_ns", "end_ns"):
            ev[c] = ev[c].to_numpy() + t_off
        for c in ("host_begin_ns", "host_end_ns", "gpu_begin_ns", "gpu_end_ns"):
            v = la[c].to_numpy()
            la[c] = np.where(v >= 0, v + t_off, v)
        ev.index = np.arange(row_off, row_off + len(ev))
        t_off = int(ev["end_ns"].max()) + 1_000_000
        row_off += len(ev)
        la_off = int(la["launch"].max()) + 1
        yield ev, la, man


def make_long_run(path, *, ranks: int = 8, per_iteration: int = 1_000_000, iterations: int = 100,
                  scenario: str = "slow_rank") -> Path:
    """make_iterations written as one run directory without ever holding it whole
    (runstore.write_run_parts); returns the path."""
    from ..store.runstore import write_run_parts

    launches, manifest = [], {}

    def parts():
        for ev, la, man in make_iterations(ranks=ranks, per_iteration=per_iteration, iterations=iterations,
                                           scenario=scenario):
            launches.append(la)
            manifest.update(man)
            yield ev.reset_index(drop=True)
    # launches and manifest are filled as the parts are made: write_run_parts reads them after the parts
    return write_run_parts(Path(path), parts(), lambda: pd.concat(launches, ignore_index=True), manifest)
