"""Checks of ep_core's low-latency dispatch/combine inside one rank process (run by
tests/gpu/test_low_latency.py through ep_core.launch.run_ranks), against
ep_core.low_latency_reference on fresh random inputs that every rank rebuilds for every rank.

Dispatch is compared bit for bit (FP8 bytes, scales, counts, src_info, layout_range, the handle);
combine bit for bit too (the kernels round as the reference does), plus DeepEP's own bound on the
difference from the exact weighted sum.

Diagnostic by design (the GPU is scarce: one run must localise every remaining bug): a check does
not stop at the first difference. ep_core.low_latency_diff names what differs (counts, layout
ranges, which rows of which experts, source ranks and tokens, which 128-column groups, misplaced
or stale rows, scales, slots, combine tokens / groups / ulps); when a dispatch is wrong its
combine still runs, on the reference's handle, so the combine is judged on its own; every round
trip of a job runs and a job raises at its end with all its findings (Findings). Every round trip
brings new inputs (a read of the previous op's data shows), and the ranks keep calling in step
(a difference never skips a call, so the peer never waits for a call that does not come). An
exception (a device timeout, bounded by the buffer's timeout_s) ends the job on that rank; the
peer's next wait then times out too, and run_jobs goes on with the next job."""
from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from ep_core import low_latency as ll
from ep_core import low_latency_reference as ref
from ep_core.low_latency_diff import DispatchResult, Finding, combine_diff, dispatch_diff, format_findings
from ep_core.routing import make_routing

# (dtype, round_scale, use_ue8m0) of the dispatch variants
DTYPES = (("fp8", False, False), ("fp8", True, False), ("fp8", True, True), ("bf16", False, False))
MODES = ("plain", "hook", "async", "zero_copy")
# a device wait gives up after this (a correct op takes microseconds; the ranks may be up to a
# reference build apart, well under a second): a hang costs seconds, not the run
CHECK_TIMEOUT_S = 5.0
# torch.cuda._sleep cycles per millisecond (H200 SM clock about 1.98 GHz, benchmarks/ep_timing.py)
CYCLES_PER_MS = 1_980_000
MAX_LINES = 24  # findings printed per job and rank


@dataclass
class LLScenario:
    tokens: int = 128
    hidden: int = 7168
    topk: int = 8
    experts: int = 256
    max_tokens: int | None = None         # num_max_dispatch_tokens_per_rank (default: tokens)
    drop: float = 0.0                     # probability of a -1 top-k entry
    seed: int = 0
    zero_rank: int | None = None          # that rank brings no tokens
    hot_expert: int | None = None         # every token's first expert
    dtypes: tuple = DTYPES
    config: dict = field(default_factory=dict)  # LowLatencyConfig fields

    @property
    def t_max(self) -> int:
        return self.max_tokens or max(self.tokens, 1)


def make_inputs(sc: LLScenario, R: int, dev, seed_offset: int = 0):
    """Every rank's (x, topk_idx, topk_weights), the same on every process."""
    xs, idxs, ws = [], [], []
    for r in range(R):
        s = sc.seed + seed_offset + 1000 * r
        T = 0 if r == sc.zero_rank else sc.tokens
        idx, w = make_routing("uniform", T, sc.experts, sc.topk, R, s, drop=sc.drop)
        if sc.hot_expert is not None and T:
            e0 = sc.hot_expert
            idx[:, 1:] = torch.where(idx[:, 1:] == e0, (e0 + 1) % sc.experts, idx[:, 1:])
            idx[:, 0] = e0
        g = torch.Generator().manual_seed(s)
        x = torch.randn((T, sc.hidden), generator=g)
        x[:, : min(128, sc.hidden)] *= 50.0  # a wide first group: the scales differ between groups
        xs.append(x.to(torch.bfloat16).to(dev))
        idxs.append(idx.to(dev))
        ws.append(w.to(dev))
    return xs, idxs, ws


def make_buffer(ctx, sc: LLScenario, **kw):
    import ep_core

    size = ep_core.Buffer.get_low_latency_rdma_size_hint(sc.t_max, sc.hidden, ctx.world_size, sc.experts)
    kw.setdefault("timeout_s", CHECK_TIMEOUT_S)
    return ep_core.Buffer(ctx.group, num_rdma_bytes=size, low_latency_mode=True, **kw)


def _tag(rank, what):
    return f"[rank {rank}, {what}]"


class Findings:
    """Everything that differed in one job on one rank: check tags and their findings."""

    def __init__(self, rank: int):
        self.rank = rank
        self.checks = 0
        self.bad: list[str] = []      # tags of the checks that differ
        self.lines: list[str] = []

    def add(self, tag: str, findings: list[Finding]) -> bool:
        self.checks += 1
        if findings:
            self.bad.append(tag)
            self.lines.append(format_findings(tag, findings))
        return not findings

    def raise_if_any(self) -> None:
        if self.bad:
            shown = "\n".join(self.lines[:MAX_LINES])
            more = f"\n... {len(self.lines) - MAX_LINES} more" if len(self.lines) > MAX_LINES else ""
            raise AssertionError(f"{len(self.bad)} of {self.checks} checks differ from the reference on rank "
                                 f"{self.rank}: {', '.join(self.bad[:8])}{' ...' if len(self.bad) > 8 else ''}\n"
                                 f"{shown}{more}")


def _static(recv, count, handle, want: ref.LLRefDispatch, use_fp8, use_ue8m0, n, R) -> list[Finding]:
    """What the outputs are (dtypes, strides, handle fields), beyond their values."""
    out = []
    q = recv[0] if use_fp8 else recv
    if q.dtype != (torch.float8_e4m3fn if use_fp8 else torch.bfloat16):
        out.append(Finding("recv_x", 1, f"dtype {q.dtype}"))
    if use_fp8:
        sc = recv[1]
        if sc.dtype != (torch.int32 if use_ue8m0 else torch.float32) or sc.stride(1) != 1:
            out.append(Finding("recv_scales", 1,
                               f"{sc.dtype} strides {sc.stride()} (want column-major in the last two)"))
    if handle.num_tokens != n or handle.num_max_dispatch_tokens_per_rank * R != q.size(1):
        out.append(Finding("handle", 1, f"num_tokens {handle.num_tokens} (want {n}), T_max "
                                        f"{handle.num_max_dispatch_tokens_per_rank} for {q.size(1)} rows"))
    return out


def check_dispatch(rank, recv, count, handle, want: ref.LLRefDispatch, xs, use_fp8, use_ue8m0) -> list[Finding]:
    """Every difference of this rank's dispatch outputs (empty: identical)."""
    tokens = [x.size(0) for x in xs]
    return (_static(recv, count, handle, want, use_fp8, use_ue8m0, tokens[rank], len(xs))
            + dispatch_diff(DispatchResult.of(recv, count, handle), want, tokens, rank))


def check_combine(combined, want, exact) -> list[Finding]:
    return combine_diff(combined, want, exact)


def use_reference_handle(handle, want: ref.LLRefDispatch, n: int) -> None:
    """Overwrite what combine reads of a (wrong) dispatch handle with the reference's, so the
    combine after it is checked on its own."""
    handle.slot.copy_(want.slot.to(handle.slot.device))
    handle.recv_tokens.copy_(want.recv_tokens.to(handle.recv_tokens.device))
    handle.sent_mask[:n].copy_(want.sent_mask.to(handle.sent_mask.device))


class Oracle:
    """The reference of one scenario and dtype variant, for every rank (built on this rank)."""

    def __init__(self, sc: LLScenario, R: int, dev, dtype, round_scale, use_ue8m0, seed_offset=0):
        self.xs, self.idxs, self.ws = make_inputs(sc, R, dev, seed_offset)
        self.use_fp8 = dtype == "fp8"
        self.disp = ref.dispatch(self.xs, self.idxs, sc.experts, sc.t_max, self.use_fp8, round_scale, use_ue8m0)
        self.ys = [ref.expert_outputs(d, sc.hidden, self.use_fp8, seed=sc.seed + seed_offset, rank=r)
                   for r, d in enumerate(self.disp)]
        self.combined = ref.combine(self.ys, self.disp, self.idxs, self.ws)
        self.exact = ref.combine_exact(self.ys, self.disp, self.idxs, self.ws)


def _round_trip(buffer, sc, o: Oracle, rank, dtype, rs, ue, tag, found: Findings, *, hook=False, async_finish=False,
                zero_copy=False, config=None, stats=None, lag_ms=0.0):
    """One dispatch + combine on this rank, both checked into `found`; returns the rows received.
    lag_ms: hold this rank's stream that long first (the peer's op then runs ahead of this one)."""
    kw = dict(use_fp8=dtype == "fp8", round_scale=rs, use_ue8m0=ue, async_finish=async_finish,
              return_recv_hook=hook, config=config)
    if stats is not None:
        kw["cumulative_local_expert_recv_stats"] = stats
    if lag_ms:
        torch.cuda._sleep(int(lag_ms * CYCLES_PER_MS))
    recv, count, handle, event, h = buffer.low_latency_dispatch(o.xs[rank], o.idxs[rank], sc.t_max, sc.experts, **kw)
    if hook:
        assert h is not None, tag
        h()
    if async_finish:
        event.current_stream_wait()
    torch.cuda.synchronize()
    want = o.disp[rank]
    n = o.xs[rank].size(0)
    ok = found.add(tag + " dispatch", check_dispatch(rank, recv, count, handle, want, o.xs, dtype == "fp8", ue))
    if not ok:
        use_reference_handle(handle, want, n)
    rows = int(count.sum())
    y = o.ys[rank]
    if zero_copy:
        buf = buffer.get_next_low_latency_combine_buffer(handle)
        buf.copy_(y)
        y = torch.empty_like(y)  # zero_copy ignores x's data
    out, event, h = buffer.low_latency_combine(y, o.idxs[rank], o.ws[rank], handle, zero_copy=zero_copy,
                                               async_finish=async_finish, return_recv_hook=hook, config=config)
    if hook:
        h()
    if async_finish:
        event.current_stream_wait()
    torch.cuda.synchronize()
    found.add(tag + (" combine" if ok else " combine (on the reference handle)"),
              check_combine(out, o.combined[rank], o.exact[rank]))
    return rows


def run_ll_checks(ctx, sc: LLScenario) -> dict:
    """Every dtype variant, plain / hook / async / zero_copy, each round trip on new inputs."""
    rank, R, dev = ctx.rank, ctx.world_size, ctx.device
    buffer = make_buffer(ctx, sc)
    if sc.config:
        buffer._ll.config = ll.LowLatencyConfig(**sc.config)
    found, rows = Findings(rank), 0
    for i, (dtype, rs, ue) in enumerate(sc.dtypes):
        for j, mode in enumerate(MODES):
            o = Oracle(sc, R, dev, dtype, rs, ue, seed_offset=10 * i + j)
            tag = _tag(rank, f"{dtype} round_scale={rs} ue8m0={ue} {mode}")
            rows += _round_trip(buffer, sc, o, rank, dtype, rs, ue, tag, found, hook=mode == "hook",
                                async_finish=mode == "async", zero_copy=mode == "zero_copy")
    buffer._ll.synchronize()
    found.raise_if_any()
    return {"rank": rank, "checks": found.checks, "rows": rows}


def run_knob_equivalence(ctx, sc: LLScenario) -> dict:
    """Every knob at its old behaviour, one at a time and all together, gives the reference's
    bits (each config on new inputs; a failing config does not hide the others)."""
    rank, R, dev = ctx.rank, ctx.world_size, ctx.device
    buffer = make_buffer(ctx, sc)
    new = ll.LowLatencyConfig(**sc.config)
    configs = [("new", new)] + [(f"old {k}", new.with_old(k)) for k in ll.LowLatencyConfig.KNOBS]
    configs.append(("all old", ll.LowLatencyConfig.old(num_blocks=new.num_blocks, warps_per_block=new.warps_per_block)))
    configs.append(("fine split", dataclasses.replace(new, min_slice_groups=1)))
    found = Findings(rank)
    for i, (name, cfg) in enumerate(configs):
        o = Oracle(sc, R, dev, "fp8", False, False, seed_offset=i)
        _round_trip(buffer, sc, o, rank, "fp8", False, False, _tag(rank, f"config {name}"), found, config=cfg)
    found.raise_if_any()
    return {"rank": rank, "configs": len(configs)}


def run_skewed(ctx, sc: LLScenario, ops: int = 6, lag_ms: float = 2.0) -> dict:
    """The condition that broke the first GPU run: one rank's op starts after the peer's has
    published its rows and counts (its own routers still writing), on new inputs every op; the
    lagging rank alternates, every knob set of its own."""
    rank, R, dev = ctx.rank, ctx.world_size, ctx.device
    buffer = make_buffer(ctx, sc)
    found = Findings(rank)
    for i in range(ops):
        cfg = ll.LowLatencyConfig() if i % 4 < 2 else ll.LowLatencyConfig.old()
        o = Oracle(sc, R, dev, "fp8", False, False, seed_offset=i)
        torch.cuda.synchronize()
        dist.barrier(group=ctx.group)
        lag = lag_ms if rank == i % R else 0.0
        _round_trip(buffer, sc, o, rank, "fp8", False, False, _tag(rank, f"skewed {i} (rank {i % R} lags)"), found,
                    config=cfg, lag_ms=lag)
    found.raise_if_any()
    return {"rank": rank, "ops": ops}


def run_t_max_changes(ctx, sc: LLScenario, t_maxes=(16, 128, 4, 64, 128, 1)) -> dict:
    """num_max_dispatch_tokens_per_rank changes from one op to the next on one buffer (sized for
    the largest), the ranks skewed: the halves sit at fixed places, so no op writes into the half
    a peer may still read (the latency table changes it between its rows)."""
    rank, R, dev = ctx.rank, ctx.world_size, ctx.device
    buffer = make_buffer(ctx, dataclasses.replace(sc, max_tokens=max(t_maxes)))
    found = Findings(rank)
    for i, t_max in enumerate(t_maxes):
        s = dataclasses.replace(sc, tokens=min(sc.tokens, t_max), max_tokens=t_max)
        o = Oracle(s, R, dev, "fp8", False, False, seed_offset=i)
        lag = 1.0 if rank == i % R else 0.0
        _round_trip(buffer, s, o, rank, "fp8", False, False, _tag(rank, f"T_max {t_max} (op {i})"), found, lag_ms=lag)
    found.raise_if_any()
    return {"rank": rank, "ops": len(t_maxes)}


def run_in_flight(ctx, sc: LLScenario) -> dict:
    """Two ops in flight with hooks (the two-batch overlap pattern), outputs of both intact."""
    rank, R, dev = ctx.rank, ctx.world_size, ctx.device
    buffer = make_buffer(ctx, sc)
    found = Findings(rank)
    a = Oracle(sc, R, dev, "fp8", False, False, seed_offset=1)
    b = Oracle(sc, R, dev, "fp8", False, False, seed_offset=2)
    ra = buffer.low_latency_dispatch(a.xs[rank], a.idxs[rank], sc.t_max, sc.experts, return_recv_hook=True)
    rb = buffer.low_latency_dispatch(b.xs[rank], b.idxs[rank], sc.t_max, sc.experts, return_recv_hook=True)
    ra[4]()
    rb[4]()
    torch.cuda.synchronize()
    for o, r, name in ((a, ra, "A"), (b, rb, "B")):
        if not found.add(_tag(rank, f"in flight {name} dispatch"),
                         check_dispatch(rank, r[0], r[1], r[2], o.disp[rank], o.xs, True, False)):
            use_reference_handle(r[2], o.disp[rank], o.xs[rank].size(0))
    ca = buffer.low_latency_combine(a.ys[rank], a.idxs[rank], a.ws[rank], ra[2], return_recv_hook=True)
    cb = buffer.low_latency_combine(b.ys[rank], b.idxs[rank], b.ws[rank], rb[2], return_recv_hook=True)
    ca[2]()
    cb[2]()
    torch.cuda.synchronize()
    found.add(_tag(rank, "in flight A combine"), check_combine(ca[0], a.combined[rank], a.exact[rank]))
    found.add(_tag(rank, "in flight B combine"), check_combine(cb[0], b.combined[rank], b.exact[rank]))
    found.raise_if_any()
    return {"rank": rank}


def run_graph(ctx, sc: LLScenario, replays: int = 3) -> dict:
    """dispatch + combine captured in one CUDA graph, replayed on new inputs copied into the
    captured tensors: each replay matches the reference (the epochs advance on the device)."""
    rank, R, dev = ctx.rank, ctx.world_size, ctx.device
    buffer = make_buffer(ctx, sc)
    found = Findings(rank)
    o = Oracle(sc, R, dev, "fp8", False, False, seed_offset=10)
    x, idx, w = o.xs[rank].clone(), o.idxs[rank].clone(), o.ws[rank].clone()
    y = o.ys[rank].clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up: the plans and stable outputs exist before capture
        recv, count, handle, _, _ = buffer.low_latency_dispatch(x, idx, sc.t_max, sc.experts)
        out, _, _ = buffer.low_latency_combine(y, idx, w, handle)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    found.add(_tag(rank, "graph warm-up dispatch"), check_dispatch(rank, recv, count, handle, o.disp[rank], o.xs,
                                                                   True, False))
    found.add(_tag(rank, "graph warm-up combine"), check_combine(out, o.combined[rank], o.exact[rank]))
    dist.barrier(group=ctx.group)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        recv, count, handle, _, _ = buffer.low_latency_dispatch(x, idx, sc.t_max, sc.experts)
        out, _, _ = buffer.low_latency_combine(y, idx, w, handle)
    # the capture ran nothing; its outputs are the second set of stable tensors, which every
    # replay rewrites (the warm-up's are the first)
    for k in range(replays):
        o = Oracle(sc, R, dev, "fp8", False, False, seed_offset=11 + k)
        x.copy_(o.xs[rank])
        idx.copy_(o.idxs[rank])
        w.copy_(o.ws[rank])
        y.copy_(o.ys[rank])
        torch.cuda.synchronize()
        dist.barrier(group=ctx.group)
        graph.replay()
        torch.cuda.synchronize()
        tag = _tag(rank, f"graph replay {k}")
        found.add(tag + " dispatch", check_dispatch(rank, recv, count, handle, o.disp[rank], o.xs, True, False))
        found.add(tag + " combine", check_combine(out, o.combined[rank], o.exact[rank]))
    buffer._ll.synchronize()
    found.raise_if_any()
    return {"rank": rank, "replays": replays}


def run_cumulative_stats(ctx, sc: LLScenario) -> dict:
    """cumulative_local_expert_recv_stats accumulates every dispatch's recv_count."""
    rank, R, dev = ctx.rank, ctx.world_size, ctx.device
    buffer = make_buffer(ctx, sc)
    found = Findings(rank)
    stats = torch.zeros((sc.experts // R,), dtype=torch.int32, device=dev)
    want = torch.zeros_like(stats).cpu()
    for i in range(2):
        o = Oracle(sc, R, dev, "fp8", False, False, seed_offset=i)
        _round_trip(buffer, sc, o, rank, "fp8", False, False, _tag(rank, f"stats {i}"), found, stats=stats)
        want += o.disp[rank].recv_count.cpu()
    if not torch.equal(stats.cpu(), want):
        bad = (stats.cpu() != want).nonzero().flatten()[:4].tolist()
        found.add(_tag(rank, "cumulative stats"), [Finding("cumulative_local_expert_recv_stats", len(bad),
                                                           f"experts {bad}: {stats.cpu()[bad].tolist()} "
                                                           f"(want {want[bad].tolist()})")])
    buffer._ll.synchronize()
    found.raise_if_any()
    return {"rank": rank, "ops": 2, "checks": found.checks}


# Wrong calls on the cached host path after good ones of the same shapes (the first GPU run died in
# such a call): each must raise ValueError before anything is launched, on both ranks alike (a
# refused call sends nothing, so the ranks stay in step).
BAD_CALLS = {
    "combine x missing its last row": lambda o, r: ("combine", o.ys[r][:, :-1], o.ws[r]),
    "combine x float32": lambda o, r: ("combine", o.ys[r].float(), o.ws[r]),
    "combine x not contiguous": lambda o, r: ("combine", o.ys[r].transpose(1, 2).contiguous().transpose(1, 2),
                                              o.ws[r]),
    "combine weights float64": lambda o, r: ("combine", o.ys[r], o.ws[r].double()),
    "dispatch x not contiguous": lambda o, r: ("dispatch", torch.cat([o.xs[r], o.xs[r]], 1)[:, : o.xs[r].size(1)],
                                               None),
}


def run_argument_errors(ctx, sc: LLScenario) -> dict:
    """Every BAD_CALLS entry raises ValueError naming the argument; a round trip before and after
    them is checked against the reference (the buffer stays usable and in step)."""
    rank, R, dev = ctx.rank, ctx.world_size, ctx.device
    buffer = make_buffer(ctx, sc)
    found = Findings(rank)
    o = Oracle(sc, R, dev, "fp8", False, False)
    _round_trip(buffer, sc, o, rank, "fp8", False, False, _tag(rank, "before"), found)
    handle = buffer.low_latency_dispatch(o.xs[rank], o.idxs[rank], sc.t_max, sc.experts)[2]
    errors, accepted = [], []
    for what, make in BAD_CALLS.items():
        kind, x, w = make(o, rank)
        try:
            if kind == "combine":
                buffer.low_latency_combine(x, o.idxs[rank], w, handle)
            else:
                buffer.low_latency_dispatch(x, o.idxs[rank], sc.t_max, sc.experts)
            accepted.append(what)
        except ValueError as e:
            errors.append(f"{what}: {str(e).splitlines()[0]}")
    assert not accepted, _tag(rank, f"wrong calls accepted: {accepted}")
    buffer.low_latency_combine(o.ys[rank], o.idxs[rank], o.ws[rank], handle)
    torch.cuda.synchronize()
    o2 = Oracle(sc, R, dev, "fp8", False, False, seed_offset=1)
    _round_trip(buffer, sc, o2, rank, "fp8", False, False, _tag(rank, "after"), found)
    buffer._ll.synchronize()
    found.raise_if_any()
    return {"rank": rank, "errors": errors, "checks": found.checks}


def run_timeout(ctx, sc: LLScenario, timeout_s: float) -> dict:
    """Rank 1 never calls: rank 0's dispatch gives up after timeout_s with an error naming the
    phase and the rank it waited for, instead of hanging."""
    import ep_core

    rank = ctx.rank
    buffer = make_buffer(ctx, sc, timeout_s=timeout_s)
    o = Oracle(sc, ctx.world_size, ctx.device, "bf16", False, False)
    dist.barrier(group=ctx.group)
    if rank != 0:
        time.sleep(timeout_s + 5)
        return {"rank": rank, "error": None, "seconds": 0.0}
    t0 = time.monotonic()
    err = None
    try:
        buffer.low_latency_dispatch(o.xs[0], o.idxs[0], sc.t_max, sc.experts, use_fp8=False)
        buffer._ll.synchronize()
    except ep_core.EPTimeoutError as e:
        err = str(e)
    return {"rank": rank, "error": err, "seconds": time.monotonic() - t0}


def run_profiled(ctx, sc: LLScenario, out_dir: str, barrier: str) -> dict:
    """A recorded dispatch + combine decodes: the registry's phases are there, nothing dropped."""
    from profiler.record.session import Session

    rank, R, dev = ctx.rank, ctx.world_size, ctx.device
    buffer = make_buffer(ctx, sc)
    o = Oracle(sc, R, dev, "fp8", False, False)
    from ep_core import _ext

    _ext.load(profile=True)
    torch.cuda.synchronize()
    dist.barrier(group=ctx.group)
    cfg = dataclasses.replace(ll.LowLatencyConfig(), barrier=barrier)
    session = Session(out_dir, name=f"ll-profiled-{barrier}", description="one profiled low-latency step",
                      rank=rank, world_size=R, group=ctx.group, workload={"kind": "ep-low-latency"}, config={})
    found = Findings(rank)
    with session:
        with buffer.profile(session):
            for it in range(2):
                buffer.profile_iteration = it
                _round_trip(buffer, sc, o, rank, "fp8", False, False, _tag(rank, f"profiled {it}"), found, config=cfg)
    found.raise_if_any()
    return {"rank": rank, "path": str(session.path) if session.path else None}


def run_jobs(ctx, jobs: list) -> list:
    """Several checks in one spawn of the ranks (each spawn costs seconds of process start and NCCL
    init): jobs are (function name, args); each result is ("ok", value) or ("error", message).
    Every job runs, each on its own new Buffer, whatever the ones before it found (a failure of one
    must not hide the others'); the ranks meet after each job. Only a lost CUDA context (a fault,
    not a difference or a timeout) stops the rest: ("skipped", why)."""
    import traceback

    _fault_log(ctx.rank)
    out, lost = [], None
    for name, args in jobs:
        if lost is not None:
            out.append(("skipped", f"the CUDA context was lost in an earlier job: {lost}"))
            continue
        _log_line(ctx.rank, f"job {len(out)} {name}: started")
        t0 = time.monotonic()
        try:
            value = globals()[name](ctx, *args)
            if isinstance(value, dict):
                value["seconds"] = round(time.monotonic() - t0, 1)
            out.append(("ok", value))
        except Exception as e:  # noqa: BLE001 (the test names the job and shows the message)
            out.append(("error", f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=6)}"))
        _log_job(ctx.rank, len(out) - 1, name, out[-1])
        try:
            torch.cuda.synchronize()
            dist.barrier(group=ctx.group)
        except Exception as e:  # noqa: BLE001 (a sticky CUDA error: nothing after it can run)
            lost = f"{type(e).__name__}: {e}"
    return out


def _log_job(rank: int, i: int, name: str, result) -> None:
    """With LL_JOB_LOG=<path>, each rank appends a line per started and per finished job to
    <path>.rank<r>: what is left when a spawn is killed or crashes before it returns its results."""
    status, value = result
    first = str(value).splitlines()[:12] if status != "ok" else [str(value)]
    _log_line(rank, f"job {i} {name}: {status}: " + "\n    ".join(first))


def _log_line(rank: int, line: str) -> None:
    path = os.environ.get("LL_JOB_LOG")
    if path:
        with open(f"{path}.rank{rank}", "a") as f:
            f.write(line + "\n")


_FAULT_FILES: list = []  # kept open for the process's life: faulthandler writes into them on a crash


def _fault_log(rank: int) -> None:
    """A host crash (SIGSEGV, SIGABRT) writes every thread's Python stack to <LL_JOB_LOG>.rank<r>
    (stderr without LL_JOB_LOG): the line of the check that crashed, not only an exit code."""
    import faulthandler

    path = os.environ.get("LL_JOB_LOG")
    if path:
        f = open(f"{path}.rank{rank}", "a")  # noqa: SIM115 (must outlive this call)
        _FAULT_FILES.append(f)
        faulthandler.enable(file=f, all_threads=True)
    else:
        faulthandler.enable(all_threads=True)
