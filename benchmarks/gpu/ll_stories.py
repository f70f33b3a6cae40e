"""Seed 002's five techniques as A/B recordings of ep_core's low-latency kernels (issue 10).

    PYTHONPATH=. python benchmarks/gpu/ll_stories.py --out traces        # 2 GPUs, ~1.5 min
    python benchmarks/gpu/ll_stories.py --plan                           # the plan, no GPU
    ... --out traces --record-only   then   ... --out traces --checks-only (no GPU)

For each knob of LowLatencyConfig, side A runs it at its old behaviour and side B at the new one
(every other knob new), REPLICATES runs per side, recorded interleaved (A0 B0 of every story, then
A1 B1, ...), all in ONE launch of one process per GPU. A run is a profiler.record Session of
PROFILED decode steps (dispatch + combine, FP8, hidden 7168, top-8 of 256) after WARMUP unprofiled
ones. Each run's manifest gets an `expect` block (profiler.groundtruth.expect) with what was planted: the
single-run cause of its side and, for the pair, outcome knob_change naming the kernel, phase and
direction B should move in. After recording, rank 0 checks each planted cause in its own
recordings with profiler.analysis (idle blocks, useless arrivals, host time on the critical path,
the op latency B / A) and writes the checks into the expect block's `extra`; a planted cause that
did not show fails its check and the command exits 1, so a story whose truth did not happen is
never bundled silently.

Upstream GPU work (issue 24, `ll-upstream-gemm`): not an A/B of a knob but one run of decode
steps (the new config) in which each rank's compute stream runs a BF16 GEMM of a different size
before every dispatch (UPSTREAM): the rank with the larger one enters the op late while its host
has long called it. Its expect block names the late entry (rank_imbalance on that rank, side
'gpu') when the measured wait of the other rank is material (profiler.workflows.catalogue_expect's
late-entry measurements, the catalogue's bands), and its checks fail the command when the GEMMs
(CUDA events, kept beside the runs in UPSTREAM_FACTS for --checks-only) or the late entry did not
happen.

Routing: each token picks top_k / 2 experts on each of the 2 ranks (uniformly within the rank):
every token reaches both ranks, so no warp of the new behaviour is idle because its token had no
expert on a rank (a coincidence of uniform routing, ~0.4 % of tokens, that would show as a few
idle warps and blur the stories). Geometry: LowLatencyConfig's default, 64 blocks x 16 warps.
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from profiler.analysis.compare import HOST_CALL  # noqa: E402
from profiler.groundtruth.expect import Cause, ComparisonExpect, Direction, Effect, Expect  # noqa: E402

HIDDEN, TOPK, EXPERTS, RANKS = 7168, 8, 256, 2
# 8 profiled steps a run (the first run at 418ddf3 had 3, of which the first two were skewed by
# the host: the compare's interval spanned -41..+12 us on a 28 us kernel); about 0.1 MB of trace
# per step and run, so 30 runs stay near 25 MB
REPLICATES, WARMUP, PROFILED = 3, 3, 8
CAPACITY = 256          # records per warp: a warp records a few per task, at most ~20 here
# Kernel stories: every step is [pre sleep] all_reduce [lead sleep] dispatch combine on the GPU.
# The pre sleep keeps the GPU busy while both hosts enqueue the all_reduce and the lead, so the
# two GPUs leave the all_reduce together and start dispatch together (at 418ddf3, without it, the
# rank whose host returned last from all_reduce started its lead up to 50 us late and the other
# rank's dispatch waited for it); the lead covers the host's profiled enqueue of both calls
# (about 150 us at 418ddf3).
PRE_US, LEAD_US = 200, 400
# The host story's step is a decode step and nothing else: attention, dispatch, the experts'
# GEMMs, combine, no rendezvous. The GPU stand-ins last longer than the cached calls' host time
# (about 36 + 26 us profiled at 418ddf3) and shorter than the per-call ones' (about 150 + 100 us):
# B's GPU never waits for its host, A's waits before each call.
ATTN_US, GEMM_US = 80, 80
SM_CLOCK_GHZ = 1.98     # measured-facts.md: torch.cuda._sleep counts SM cycles


@dataclass(frozen=True)
class Story:
    key: str                    # group name and run-name stem
    knob: str                   # LowLatencyConfig field
    tokens: int                 # tokens per rank (= num_max_dispatch_tokens_per_rank)
    cause_a: Cause              # what the single-run pages should name on side A (old) ...
    cause_b: Cause              # ... and on side B (new)
    kernel: str | None          # what B moves, against A
    phase: str | None
    direction: Direction
    host_bound: bool = False    # steps with GPU work between the calls and no lead: the host paces
    why: str = ""

    def side(self, side: str) -> dict:
        return {"cause": (self.cause_a if side == "A" else self.cause_b).value}


STORIES = (
    Story("ll-split", "split", 64, Cause.STARVED_WARPS, Cause.NONE, "ll_dispatch", "send_token", Direction.FASTER,
          why="per block: 64 tokens on 64 blocks, one warp per block copies a whole 14 KB row, 15 of 16 warps idle; "
              "flat: (token, 512-column slice) tasks on every warp"),
    Story("ll-barrier", "barrier", 64, Cause.USELESS_ARRIVALS, Cause.NONE, "ll_dispatch", None, Direction.FASTER,
          why="all: the 128 warps without a send task arrive at send_done and every warp waits for the grid; "
              "working: only warps with work arrive, and leave"),
    # Seed 002's floor does not pay here, and the story records that: its old split cut 6144
    # columns into 40-element (24-byte) slices, below a warp's 512-byte access, with a wait on a
    # remote flag per slice. Ours never cuts below one 128-column group (256 B of BF16), a warp
    # waits each flag once (in its own buffer), and the split never makes more tasks than warps,
    # so the finest split only shortens each warp's work: at 418ddf3, 4 tokens, dispatch 18.2 us
    # without the floor and 21.0 us with it (the clean step of 3 runs a side).
    Story("ll-slice-floor", "min_slice_groups", 4, Cause.STARVED_WARPS, Cause.STARVED_WARPS, "ll_dispatch", None,
          Direction.SLOWER,
          why="4 tokens: no floor cuts each token into 56 single-group slices (224 send tasks of 256 B on 224 "
              "warps), the floor into 14 (56 tasks of 1 KB, 2 passes each); with warps to spare the finer split "
              "finishes sooner. Most warps idle either way"),
    Story("ll-loads", "loads", 128, Cause.NONE, Cause.NONE, "ll_combine", "partial", Direction.FASTER,
          why="in order: each expert row of a partial sum loaded right before its use (about 4 dependent "
              "loads per slice); first: all rows in flight together"),
    # compared on the host calls (the compare page's 'host call' row of ll_dispatch): what the knob
    # moves; the kernels' own time moves only through the peer waiting for a late rank
    Story("ll-host", "host", 128, Cause.HOST_BOUND, Cause.NONE, "ll_dispatch", HOST_CALL, Direction.FASTER,
          host_bound=True,
          why="per call: layout, output tensors, views, plans and hook rebuilt on every call; cached: reused. "
              f"Decode steps: {ATTN_US} us of attention, dispatch, {GEMM_US} us of expert GEMMs, combine, no "
              "rendezvous: the cached host keeps ahead of its GPU, the per-call one does not. The kernel "
              "time moves too: a late host starts its rank's kernels late and the peer's kernels wait for them "
              "(wait_data); the host share of the critical path shows the cause"),
)


@dataclass(frozen=True)
class Upstream:
    """A single-run story: decode steps (dispatch, GEMM_US of expert work, combine) in which rank r
    runs an N x N BF16 GEMM on its compute stream before every dispatch, (r, N) in `gemm`."""

    key: str
    tokens: int
    gemm: tuple[tuple[int, int], ...]
    why: str = ""

    @property
    def name(self) -> str:
        return self.key

    @property
    def late_rank(self) -> int:
        return max(self.gemm, key=lambda x: x[1])[0]

    def n(self, rank: int) -> int:
        return dict(self.gemm).get(rank, 0)


# 4096^2 BF16: ~0.2 ms on H200 (2 x 4096^3 FLOP at ~700 TFLOP/s), ~8x a decode step's dispatch +
# combine (~28 us each, the ll-* stories at 418ddf3); 1024^2 ~5 us. Material by a wide margin.
UPSTREAM = (
    Upstream("ll-upstream-gemm", 128, ((0, 4096), (1, 1024)),
             why="decode steps, a BF16 GEMM before every dispatch on each rank's compute stream, 4096x4096 on rank "
                 "0 and 1024x1024 on rank 1: rank 0 enters the op late on the GPU side (its host called it long "
                 "before)"),
)
UPSTREAM_FACTS = "ll_upstream_facts.json"   # the GEMMs' CUDA-event µs per run and rank, for --checks-only


def plan_upstream(only: tuple[str, ...] | None = None) -> list[Upstream]:
    return [u for u in UPSTREAM if only is None or u.key in only]


def upstream_expect(u: Upstream, launches, gemm_us: dict[int, list[float]], planted_by: str) -> tuple[Expect, list]:
    """The expect block of an upstream-GEMM run and its checks (dicts, as check_run's), from the
    recording's launches and the GEMMs' measured µs per rank."""
    import statistics

    from profiler.workflows import catalogue_expect as X

    late = u.late_rank
    med = {r: statistics.median(v) for r, v in gemm_us.items() if v}
    others = [v for r, v in med.items() if r != late]
    extra_us = round(med[late] - max(others), 1) if late in med and others else None
    checks = [{"what": f"rank {late}'s GEMM minus the others' (us, medians, CUDA events)",
               "ok": extra_us is not None and extra_us > 0, "value": extra_us}]
    lags = X.entry_lags_us(launches, late)
    at = lags[lags["kernel"] == "ll_dispatch"]["lag_us"].round(1).tolist() if len(lags) else []
    want = X.MIN_DELAY_SHARE * (extra_us or 0.0)
    checks.append({"what": f"rank {late}'s GPU entry lag at ll_dispatch (us, every step >= {want:g})",
                   "ok": bool(at) and extra_us is not None and min(at) >= want, "value": at})
    # GPU side: the late rank's host had called dispatch before the other rank's GPU entered it
    la = launches[launches["kernel"].astype(str) == "ll_dispatch"]
    host = la[la["rank"] == late].set_index("iteration")["host_begin_ns"]
    entry = la[la["rank"] != late].groupby("iteration")["gpu_begin_ns"].min()
    early = [bool(host[i] < entry[i]) for i in host.index if i in entry.index and host[i] >= 0]
    checks.append({"what": f"rank {late}'s host called ll_dispatch before the other rank's GPU entered it "
                           "(steps)", "ok": bool(early) and all(early), "value": f"{sum(early)}/{len(early)}"})
    shares = X.late_entry_shares(launches, late)
    cause, side = X.late_entry_truth("gpu", shares)
    checks.append({"what": "the late entry is material (cause, side from the median measured share)",
                   "ok": (cause, side) == (Cause.RANK_IMBALANCE, "gpu"), "value": [cause.value, side]})
    extra = {"checks": checks, "upstream_gemm_us": {str(r): v for r, v in sorted(med.items())},
             "gpu_entry_lag_us": at, "late_entry_share": shares, "tokens": u.tokens}
    exp = Expect(cause=Cause.RANK_IMBALANCE, rank=late, late_entry="gpu",
                 effect=Effect("upstream_gemm_extra_us", extra_us or 0.0, "us"), planted_by=planted_by,
                 note=u.why, extra=extra)
    return exp, checks


@dataclass(frozen=True)
class PlannedRun:
    story: Story
    side: str
    replicate: int

    @property
    def name(self) -> str:
        return f"{self.story.key}-{self.side.lower()}{self.replicate}"

    def config_dict(self) -> dict:
        from ep_core.low_latency import LowLatencyConfig

        cfg = LowLatencyConfig()
        if self.side == "A":
            cfg = cfg.with_old(self.story.knob)
        return cfg.to_dict()

    def knob_value(self):
        return self.config_dict()[self.story.knob]


def plan(only: tuple[str, ...] | None = None, replicates: int = REPLICATES) -> list[PlannedRun]:
    stories = [s for s in STORIES if only is None or s.key in only]
    return [PlannedRun(s, side, r) for r in range(replicates) for s in stories for side in ("A", "B")]


def expect_for(run: PlannedRun, effect: Effect | None, extra: dict, planted_by: str) -> Expect:
    s = run.story
    cause = s.cause_a if run.side == "A" else s.cause_b
    cmp_ = ComparisonExpect(group=s.key, side=run.side, replicate=run.replicate, outcome=Cause.KNOB_CHANGE,
                            knob=s.knob, value=run.knob_value(), kernel=s.kernel, phase=s.phase,
                            direction=s.direction)
    kernel = s.kernel if cause is not Cause.NONE else None
    phase = "send_done" if cause is Cause.USELESS_ARRIVALS else None
    if cause is Cause.USELESS_ARRIVALS:
        kernel = "ll_dispatch"
    return Expect(cause=cause, kernel=kernel if cause is not Cause.HOST_BOUND else None, phase=phase,
                  effect=effect, comparison=cmp_, planted_by=planted_by, note=s.why, extra=extra)


# ---- recording (GPU) ------------------------------------------------------------------------------
def balanced_routing(T: int, seed: int, dev):
    """Each token: TOPK / RANKS distinct experts on each rank, uniform within the rank."""
    import torch

    g = torch.Generator().manual_seed(seed)
    per = EXPERTS // RANKS
    parts = [torch.argsort(torch.rand((T, per), generator=g), dim=1)[:, : TOPK // RANKS] + r * per
             for r in range(RANKS)]
    idx = torch.cat(parts, dim=1).to(torch.int64)
    w = torch.rand((T, TOPK), generator=g) + 0.1
    return idx.to(dev), (w / w.sum(1, keepdim=True)).to(dev)


def _record_rank(ctx, opts) -> list[dict]:
    import torch
    import torch.distributed as dist

    import ep_core
    from ep_core import _ext
    from ep_core import low_latency as ll
    from ep_core import low_latency_reference as ref
    from profiler.record.session import Session

    rank = ctx.rank
    runs = plan(opts.only, opts.replicates)
    tokens = {r.story.tokens for r in runs} | {u.tokens for u in plan_upstream(opts.only)}
    t_max = max(tokens)
    buffer = ep_core.Buffer(ctx.group, num_rdma_bytes=ep_core.Buffer.get_low_latency_rdma_size_hint(
        t_max, HIDDEN, RANKS, EXPERTS), low_latency_mode=True)
    _ext.load(profile=True)
    inputs = {}
    for T in sorted(tokens):
        g = torch.Generator().manual_seed(T * 1000 + rank)
        x = torch.randn((T, HIDDEN), generator=g).to(torch.bfloat16).to(ctx.device)
        idx, w = balanced_routing(T, T * 1000 + rank, ctx.device)
        # combine's input: the received rows themselves, as BF16 (what the experts read)
        recv, _, _, _, _ = buffer.low_latency_dispatch(x, idx, T, EXPERTS)
        y = ref.dequantize(recv[0].reshape(-1, HIDDEN), recv[1].reshape(-1, HIDDEN // 128)).view(
            recv[0].shape).contiguous()
        inputs[T] = (x, idx, w, y)
    torch.cuda.synchronize()
    go = torch.zeros(1, device=ctx.device)
    cycles = {k: int(us * SM_CLOCK_GHZ * 1e3) for k, us in
              (("pre", PRE_US), ("lead", LEAD_US), ("attn", ATTN_US), ("gemm", GEMM_US))}

    def make_step(s: Story, cfg):
        x, idx, w, y = inputs[s.tokens]

        def step():
            if s.host_bound:  # a decode step: nothing but the op's own work and its neighbours'
                torch.cuda._sleep(cycles["attn"])
                h = buffer.low_latency_dispatch(x, idx, s.tokens, EXPERTS, config=cfg)[2]
                torch.cuda._sleep(cycles["gemm"])
                buffer.low_latency_combine(y, idx, w, h, config=cfg)
                return
            torch.cuda._sleep(cycles["pre"])       # both hosts enqueue the rendezvous and the lead meanwhile
            dist.all_reduce(go, group=ctx.group)  # the GPUs leave it together ...
            torch.cuda._sleep(cycles["lead"])      # ... and start dispatch together, enqueued during the lead
            h = buffer.low_latency_dispatch(x, idx, s.tokens, EXPERTS, config=cfg)[2]
            buffer.low_latency_combine(y, idx, w, h, config=cfg)
        return step

    upstream = plan_upstream(opts.only)
    if upstream:
        from profiler.workflows.catalogue_record import Matmul

        for u in upstream:   # cuBLAS's first call of each size, before any profiled step
            if u.n(rank):
                for _ in range(2):
                    Matmul(u.n(rank), ctx.device)()

    def upstream_step(u: Upstream, cfg, gemm):
        x, idx, w, y = inputs[u.tokens]

        def step():   # a decode step with unequal work before the op (no rendezvous: hosts run free)
            if gemm is not None:
                gemm()
            h = buffer.low_latency_dispatch(x, idx, u.tokens, EXPERTS, config=cfg)[2]
            torch.cuda._sleep(cycles["gemm"])
            buffer.low_latency_combine(y, idx, w, h, config=cfg)
        return step

    if runs:
        _warm_profile_memory(ctx, buffer, runs, make_step, opts.out)
    facts = []
    for run in runs:
        s = run.story
        cfg = ll.LowLatencyConfig(**run.config_dict())
        step = make_step(s, cfg)
        for _ in range(WARMUP):
            step()
        torch.cuda.synchronize()
        dist.barrier(group=ctx.group)
        session = Session(opts.out, name=run.name, description=f"{s.key} side {run.side} ({s.knob}="
                          f"{run.knob_value()}), {s.tokens} tokens/rank, replicate {run.replicate}",
                          rank=rank, world_size=RANKS, group=ctx.group, capacity=CAPACITY, overwrite=True,
                          workload={"kind": "ep-low-latency", "story": s.key, "side": run.side,
                                    "replicate": run.replicate, "tokens": s.tokens, "hidden": HIDDEN,
                                    "topk": TOPK, "experts": EXPERTS, "routing": "balanced-per-rank",
                                    "host_bound_steps": s.host_bound},
                          config={"low_latency": cfg.to_dict()})
        with session:
            with buffer.profile(session):
                for it in range(PROFILED):
                    buffer.profile_iteration = it
                    step()
        torch.cuda.synchronize()
        facts.append({"run": run.name, "path": str(session.path) if session.path else None})
        if rank == 0:
            print(f"[ll_stories {time.strftime('%H:%M:%S')}] recorded {run.name}", flush=True)
    for u in upstream:
        from profiler.workflows.catalogue_record import Matmul

        cfg = ll.LowLatencyConfig()
        gemm = Matmul(u.n(rank), ctx.device) if u.n(rank) else None
        step = upstream_step(u, cfg, gemm)
        for _ in range(WARMUP):
            step()
        torch.cuda.synchronize()
        dist.barrier(group=ctx.group)
        if gemm is not None:
            gemm.events.clear()   # the profiled steps' GEMMs only
        session = Session(opts.out, name=u.name, description=f"{u.key}: {u.why}", rank=rank, world_size=RANKS,
                          group=ctx.group, capacity=CAPACITY, overwrite=True,
                          workload={"kind": "ep-low-latency", "story": u.key, "tokens": u.tokens, "hidden": HIDDEN,
                                    "topk": TOPK, "experts": EXPERTS, "routing": "balanced-per-rank",
                                    "upstream_gemm": {str(r): n for r, n in u.gemm}},
                          config={"low_latency": cfg.to_dict()})
        with session:
            with buffer.profile(session):
                for it in range(PROFILED):
                    buffer.profile_iteration = it
                    step()
        torch.cuda.synchronize()
        facts.append({"run": u.name, "rank": rank, "path": str(session.path) if session.path else None,
                      "upstream_gemm_us": gemm.times_us() if gemm is not None else []})
        if rank == 0:
            print(f"[ll_stories {time.strftime('%H:%M:%S')}] recorded {u.name}", flush=True)
    buffer._ll.synchronize()
    return facts


def _warm_profile_memory(ctx, buffer, runs: list[PlannedRun], make_step, out: str) -> None:
    """One throwaway profiled step of every story shape before the recordings. A session's first
    profiled call of a kernel makes its profile slab; in a fresh process that allocates device and
    pinned host memory, which waits for the GPU (at 418ddf3 every run's step 0 had its kernels start
    only when the host was done: up to 340 us skewed). Afterwards torch's caching allocators hold
    the blocks and a run's slabs are asynchronous from step 0 on."""
    import shutil
    import tempfile

    import torch
    import torch.distributed as dist

    from ep_core import low_latency as ll
    from profiler.record.session import Session

    tmp = tempfile.mkdtemp(prefix="ll-warm-", dir=out)
    seen = {}
    for r in runs:
        seen.setdefault((r.story.key, r.side), r)
    session = Session(tmp, name="warm", description="throwaway: warms the profile memory", rank=ctx.rank,
                      world_size=RANKS, group=ctx.group, capacity=CAPACITY, workload={"kind": "ep-low-latency"},
                      config={})
    with session:
        with buffer.profile(session):
            for i, r in enumerate(seen.values()):
                buffer.profile_iteration = i
                make_step(r.story, ll.LowLatencyConfig(**r.config_dict()))()
    torch.cuda.synchronize()
    dist.barrier(group=ctx.group)
    shutil.rmtree(tmp, ignore_errors=True)


# ---- checks and expect blocks (rank 0, after the recording) ----------------------------------------
def _op_latency_us(launches, kernel: str | None):
    """Per iteration: the slowest rank's GPU time of `kernel`, or (None: the host story) the step's
    period, the time between the ends of consecutive steps' last kernels on the slower rank (a
    decode step's cost when the host may run ahead: the span from a host call to its GPU end would
    grow with how far ahead it runs)."""
    la = launches
    if kernel is not None:
        k = la[la["kernel"].astype(str) == kernel]
        k = k.assign(us=(k["gpu_end_ns"] - k["gpu_begin_ns"]) / 1e3)
        return k.groupby("iteration")["us"].max()
    end = la.groupby(["rank", "iteration"])["gpu_end_ns"].max().unstack("rank").sort_index()
    return (end.diff().max(axis=1) / 1e3).dropna()


def check_run(run: PlannedRun, loaded) -> list[dict]:
    """Whether the planted single-run cause shows in the recording (profiler.analysis)."""
    from profiler import analysis

    ev, reg = loaded.events, loaded.manifest.get("registry")
    cause = run.story.cause_a if run.side == "A" else run.story.cause_b
    checks = []
    # the launch table: warps that recorded nothing (the idle ones of a starved split) count too
    idle = analysis.idle_warps(ev, registry=reg, launches=loaded.launches)
    ll_idle = idle.per_warp[idle.per_warp["kernel"].astype(str).str.startswith("ll_")]
    n_idle = int((~ll_idle["did_work"].astype(bool)).sum())
    bar = analysis.barrier_contention(ev, registry=reg)
    useless = int(bar.summary["useless_arrivals"].sum()) if len(bar.summary) else 0
    if cause is Cause.STARVED_WARPS:
        checks.append({"what": "idle warps in the ll_ kernels", "ok": n_idle > 0, "value": n_idle})
    if cause is Cause.USELESS_ARRIVALS:
        checks.append({"what": "useless barrier arrivals", "ok": useless > 0, "value": useless})
    if cause is Cause.NONE:
        checks.append({"what": "no idle warp in the ll_ kernels", "ok": n_idle == 0, "value": n_idle})
        # the barriers page's own rule (a material share of arrivals, held a material time) decides;
        # the raw count is the value (one finished duty warp per occurrence is not a story)
        v = bar.verdict
        checks.append({"what": "no useless-arrival alarm on the barriers page (value: useless arrivals)",
                       "ok": not (v.alarm and v.cause is Cause.USELESS_ARRIVALS), "value": useless})
    if run.story.host_bound:
        cp = analysis.critical_path(ev, registry=reg, launches=loaded.launches)
        share = float(cp.path_ns.loc[cp.path_ns["kind"] == "host", "share"].sum() / max(cp.path_ns["iteration"].nunique(), 1))
        v = cp.verdict
        host_alarm = bool(v.alarm and v.cause is Cause.HOST_BOUND)
        if cause is Cause.HOST_BOUND:
            checks.append({"what": "host-bound on the critical path (value: host share of the path)",
                           "ok": host_alarm, "value": round(share, 3)})
        else:  # the cached side: its GPUs must not be found waiting for their hosts
            checks.append({"what": "no host-bound alarm on the critical path (value: host share of the path)",
                           "ok": not host_alarm, "value": round(share, 3)})
    return checks


def finalize(runs: list[PlannedRun], out: Path, planted_by: str, only: tuple[str, ...] | None = None) -> int:
    import statistics

    from profiler.store.runstore import load_run, update_manifest

    loaded = {r.name: load_run(out / r.name) for r in runs}
    bad = 0
    for key in dict.fromkeys(r.story.key for r in runs):
        members = [r for r in runs if r.story.key == key]
        s = members[0].story
        metric = None if s.host_bound else s.kernel  # the host story: the decode step's period
        lat = {side: [v for r in members if r.side == side for v in _op_latency_us(loaded[r.name].launches, metric)]
               for side in ("A", "B")}
        med = {side: statistics.median(v) for side, v in lat.items()}
        change = med["B"] / med["A"] - 1.0
        sign = -1 if s.direction is Direction.FASTER else 1
        moved = {"what": f"{metric or 'step period'} B / A - 1 (medians over runs x iterations)",
                 "ok": sign * change > 0, "value": round(change, 4)}
        for r in members:
            checks = check_run(r, loaded[r.name]) + [moved]
            extra = {"checks": checks, "median_us": {k: round(v, 2) for k, v in med.items()},
                     "config": r.config_dict(), "tokens": s.tokens}
            exp = expect_for(r, Effect("op_latency_change", round(change, 4), "fraction"), extra, planted_by)
            update_manifest(out / r.name, {"expect": exp.to_json()})
            for c in checks:
                flag = "ok  " if c["ok"] else "FAIL"
                bad += 0 if c["ok"] else 1
                print(f"{flag} {r.name:<22} {c['what']}: {c['value']}")
        print(f"     {key}: {s.knob} A {med['A']:.2f} us -> B {med['B']:.2f} us ({change * 100:+.1f} %)")
    return bad + finalize_upstream(plan_upstream(only), out, planted_by)


def save_upstream_facts(per_rank: list[list[dict]], out: Path) -> None:
    """The GEMMs' µs of every upstream run, per rank (UPSTREAM_FACTS beside the runs)."""
    import json

    facts = {}
    for rank_facts in per_rank or []:
        for f in rank_facts:
            if "upstream_gemm_us" in f:
                facts.setdefault(f["run"], {})[str(f["rank"])] = f["upstream_gemm_us"]
    if facts:
        (out / UPSTREAM_FACTS).write_text(json.dumps(facts, indent=1) + "\n")


def finalize_upstream(ups: list[Upstream], out: Path, planted_by: str) -> int:
    import json

    from profiler.store.runstore import load_run, update_manifest

    if not ups:
        return 0
    path = out / UPSTREAM_FACTS
    facts = json.loads(path.read_text()) if path.is_file() else {}
    bad = 0
    for u in ups:
        if not (out / u.name).is_dir():   # a directory recorded before issue 24 (or with --only other stories)
            print(f"skip {u.name}: not recorded under {out}")
            continue
        gemm = {int(r): v for r, v in facts.get(u.name, {}).items()}
        exp, checks = upstream_expect(u, load_run(out / u.name).launches, gemm, planted_by)
        update_manifest(out / u.name, {"expect": exp.to_json()})
        for c in checks:
            bad += 0 if c["ok"] else 1
            print(f"{'ok  ' if c['ok'] else 'FAIL'} {u.name:<22} {c['what']}: {c['value']}")
    return bad


PLANTED_BY = "ll_stories.planted_by"  # the recording command, for --checks-only


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="traces", help="directory that receives the run directories")
    ap.add_argument("--only", type=lambda v: tuple(v.split(",")), default=None, help="story keys, comma-separated")
    ap.add_argument("--replicates", type=int, default=REPLICATES)
    ap.add_argument("--plan", action="store_true", help="print the plan and exit (no GPU)")
    ap.add_argument("--record-only", action="store_true",
                    help="record and stop (the checks and expect blocks take a minute of CPU: --checks-only later)")
    ap.add_argument("--checks-only", action="store_true",
                    help="no GPU: check the recorded runs under --out and write their expect blocks")
    ap.add_argument("--timeout", type=float, default=600.0)
    argv = sys.argv[1:] if argv is None else argv
    a = ap.parse_args(argv)
    runs = plan(a.only, a.replicates)
    if a.plan:
        for r in runs:
            print(f"{r.name:<24} {r.story.knob}={r.knob_value()!r:<12} {r.story.tokens:>4} tokens  "
                  f"expect {(r.story.cause_a if r.side == 'A' else r.story.cause_b).value}")
        for u in plan_upstream(a.only):
            print(f"{u.name:<24} upstream GEMM {dict(u.gemm)} {u.tokens:>4} tokens  expect rank_imbalance "
                  f"(rank {u.late_rank}, late entry gpu)")
        return 0
    out = Path(a.out)
    if a.checks_only:
        saved = out / PLANTED_BY
        planted_by = saved.read_text().strip() if saved.is_file() else "python benchmarks/gpu/ll_stories.py"
    else:
        from ep_core.launch import run_ranks

        out.mkdir(parents=True, exist_ok=True)
        a.out = str(out)
        planted_by = "python benchmarks/gpu/ll_stories.py " + " ".join(argv)
        (out / PLANTED_BY).write_text(planted_by + "\n")
        t0 = time.time()
        save_upstream_facts(run_ranks(_record_rank, RANKS, a, timeout_s=a.timeout), out)
        print(f"recorded {len(runs)} runs in {time.time() - t0:.0f} s", flush=True)
        if a.record_only:
            return 0
    bad = finalize(runs, out, planted_by, a.only)
    print(f"{bad} failed checks" if bad else "every planted cause showed", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
