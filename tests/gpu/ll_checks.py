"""Checks of ep_core's low-latency dispatch/combine inside one rank process (run by
tests/gpu/test_low_latency.py through ep_core.launch.run_ranks), against
ep_core.low_latency_reference on fresh random inputs that every rank rebuilds for every rank.

Dispatch is compared bit for bit (FP8 bytes, scales, counts, src_info, layout_range, the handle);
combine bit for bit too (the kernels round as the reference does), plus DeepEP's own bound on the
difference from the exact weighted sum. Every function raises AssertionError naming the rank and
the variant."""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from ep_core import low_latency as ll
from ep_core import low_latency_reference as ref
from ep_core.reference import calc_diff
from ep_core.routing import make_routing

# DeepEP's tests/test_low_latency.py bound on calc_diff(combined, exact) for BF16 combine
COMBINE_DIFF = 1e-5
# (dtype, round_scale, use_ue8m0) of the dispatch variants
DTYPES = (("fp8", False, False), ("fp8", True, False), ("fp8", True, True), ("bf16", False, False))


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
    return ep_core.Buffer(ctx.group, num_rdma_bytes=size, low_latency_mode=True, **kw)


def _tag(rank, what):
    return f"[rank {rank}, {what}]"


def check_dispatch(rank, recv, count, handle, want: ref.LLRefDispatch, xs, use_fp8, use_ue8m0, tag):
    R = len(xs)
    El = want.recv_count.numel()
    assert torch.equal(count.cpu(), want.recv_count.cpu()), f"{tag} recv_count {count.tolist()} != {want.recv_count.tolist()}"
    q = recv[0] if use_fp8 else recv
    assert q.dtype == (torch.float8_e4m3fn if use_fp8 else torch.bfloat16), tag
    valid = torch.arange(q.size(1), device=q.device).unsqueeze(0) < want.recv_count.to(q.device).unsqueeze(1)
    mine = q.view(torch.uint8)[valid]
    theirs = want.recv_x.view(torch.uint8)[valid]
    assert torch.equal(mine, theirs), f"{tag} recv_x differs in {int((mine != theirs).any(-1).sum())} valid rows"
    if use_fp8:
        sc = recv[1]
        assert sc.dtype == (torch.int32 if use_ue8m0 else torch.float32), tag
        assert sc.stride(1) == 1, f"{tag} scales must be column-major in their last two dimensions"
        assert torch.equal(sc[valid], want.recv_scales[valid]), f"{tag} recv scales"
    assert torch.equal(handle.recv_src_info[valid], want.recv_src_info[valid]), f"{tag} recv_src_info"
    assert torch.equal(handle.recv_layout_range, want.recv_layout_range), f"{tag} recv_layout_range"
    assert torch.equal(handle.recv_tokens, want.recv_tokens), f"{tag} recv_tokens"
    for s in range(R):
        n = xs[s].size(0)
        assert torch.equal(handle.slot[s, :n], want.slot[s, :n]), f"{tag} handle slot of source {s}"
    n = xs[rank].size(0)
    assert torch.equal(handle.sent_mask[:n], want.sent_mask), f"{tag} sent_mask"
    assert handle.num_tokens == n and handle.num_max_dispatch_tokens_per_rank * R == q.size(1), tag
    return int(count.sum())


def check_combine(rank, combined, want, exact, tag):
    assert combined.dtype == torch.bfloat16 and combined.shape == want.shape, f"{tag} combined shape"
    if not torch.equal(combined, want):
        diff = (combined.float() - want.float()).abs()
        raise AssertionError(f"{tag} combine differs from the reference in {int((diff > 0).sum())} elements "
                             f"(max {float(diff.max()):.3g})")
    d = calc_diff(combined.double(), exact)
    assert d < COMBINE_DIFF, f"{tag} calc_diff(combined, exact) = {d:.3g} >= {COMBINE_DIFF}"
    return d


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


def _round_trip(buffer, sc, o: Oracle, rank, dtype, rs, ue, tag, *, hook=False, async_finish=False, zero_copy=False,
                config=None, stats=None):
    kw = dict(use_fp8=dtype == "fp8", round_scale=rs, use_ue8m0=ue, async_finish=async_finish,
              return_recv_hook=hook, config=config)
    if stats is not None:
        kw["cumulative_local_expert_recv_stats"] = stats
    recv, count, handle, event, h = buffer.low_latency_dispatch(o.xs[rank], o.idxs[rank], sc.t_max, sc.experts, **kw)
    if hook:
        assert h is not None, tag
        h()
    if async_finish:
        event.current_stream_wait()
    torch.cuda.synchronize()
    rows = check_dispatch(rank, recv, count, handle, o.disp[rank], o.xs, dtype == "fp8", ue, tag + " dispatch")
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
    d = check_combine(rank, out, o.combined[rank], o.exact[rank], tag + " combine")
    return rows, d


def run_ll_checks(ctx, sc: LLScenario) -> dict:
    """Every dtype variant, plain / hook / async / zero_copy, on fresh inputs; returns counts."""
    rank, R, dev = ctx.rank, ctx.world_size, ctx.device
    buffer = make_buffer(ctx, sc)
    if sc.config:
        buffer._ll.config = ll.LowLatencyConfig(**sc.config)
    checks, rows, diffs = 0, 0, []
    for i, (dtype, rs, ue) in enumerate(sc.dtypes):
        o = Oracle(sc, R, dev, dtype, rs, ue, seed_offset=i)
        for mode in ("plain", "hook", "async", "zero_copy"):
            tag = _tag(rank, f"{dtype} round_scale={rs} ue8m0={ue} {mode}")
            r, d = _round_trip(buffer, sc, o, rank, dtype, rs, ue, tag, hook=mode == "hook",
                               async_finish=mode == "async", zero_copy=mode == "zero_copy")
            rows, checks = rows + r, checks + 1
            diffs.append(d)
    buffer._ll.synchronize()
    return {"rank": rank, "checks": checks, "rows": rows, "max_diff": max(diffs)}


def run_knob_equivalence(ctx, sc: LLScenario) -> dict:
    """Every knob at its old behaviour, one at a time and all together, gives the same bits."""
    rank, R, dev = ctx.rank, ctx.world_size, ctx.device
    buffer = make_buffer(ctx, sc)
    o = Oracle(sc, R, dev, "fp8", False, False)
    new = ll.LowLatencyConfig(**sc.config)
    configs = [("new", new)] + [(f"old {k}", new.with_old(k)) for k in ll.LowLatencyConfig.KNOBS]
    configs.append(("all old", ll.LowLatencyConfig.old(num_blocks=new.num_blocks, warps_per_block=new.warps_per_block)))
    configs.append(("fine split", dataclasses.replace(new, min_slice_groups=1)))
    for name, cfg in configs:
        _round_trip(buffer, sc, o, rank, "fp8", False, False, _tag(rank, f"config {name}"), config=cfg)
    return {"rank": rank, "configs": len(configs)}


def run_in_flight(ctx, sc: LLScenario) -> dict:
    """Two ops in flight with hooks (the two-batch overlap pattern), outputs of both intact."""
    rank, R, dev = ctx.rank, ctx.world_size, ctx.device
    buffer = make_buffer(ctx, sc)
    a = Oracle(sc, R, dev, "fp8", False, False, seed_offset=1)
    b = Oracle(sc, R, dev, "fp8", False, False, seed_offset=2)
    ra = buffer.low_latency_dispatch(a.xs[rank], a.idxs[rank], sc.t_max, sc.experts, return_recv_hook=True)
    rb = buffer.low_latency_dispatch(b.xs[rank], b.idxs[rank], sc.t_max, sc.experts, return_recv_hook=True)
    ra[4]()
    rb[4]()
    torch.cuda.synchronize()
    check_dispatch(rank, ra[0], ra[1], ra[2], a.disp[rank], a.xs, True, False, _tag(rank, "in flight A"))
    check_dispatch(rank, rb[0], rb[1], rb[2], b.disp[rank], b.xs, True, False, _tag(rank, "in flight B"))
    ca = buffer.low_latency_combine(a.ys[rank], a.idxs[rank], a.ws[rank], ra[2], return_recv_hook=True)
    cb = buffer.low_latency_combine(b.ys[rank], b.idxs[rank], b.ws[rank], rb[2], return_recv_hook=True)
    ca[2]()
    cb[2]()
    torch.cuda.synchronize()
    check_combine(rank, ca[0], a.combined[rank], a.exact[rank], _tag(rank, "in flight combine A"))
    check_combine(rank, cb[0], b.combined[rank], b.exact[rank], _tag(rank, "in flight combine B"))
    return {"rank": rank}


def run_graph(ctx, sc: LLScenario, replays: int = 3) -> dict:
    """dispatch + combine captured in one CUDA graph, replayed on new inputs copied into the
    captured tensors: each replay matches the reference (the epochs advance on the device)."""
    rank, R, dev = ctx.rank, ctx.world_size, ctx.device
    buffer = make_buffer(ctx, sc)
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
        check_dispatch(rank, recv, count, handle, o.disp[rank], o.xs, True, False, tag)
        check_combine(rank, out, o.combined[rank], o.exact[rank], tag)
    buffer._ll.synchronize()
    return {"rank": rank, "replays": replays}


def run_stats_and_errors(ctx, sc: LLScenario) -> dict:
    """cumulative_local_expert_recv_stats accumulates; wrong shapes raise ValueError (the
    extension's checks on the cached path), and the buffer stays usable after them."""
    rank, R, dev = ctx.rank, ctx.world_size, ctx.device
    buffer = make_buffer(ctx, sc)
    o = Oracle(sc, R, dev, "fp8", False, False)
    stats = torch.zeros((sc.experts // R,), dtype=torch.int32, device=dev)
    for _ in range(2):
        _round_trip(buffer, sc, o, rank, "fp8", False, False, _tag(rank, "stats"), stats=stats)
    assert torch.equal(stats.cpu(), 2 * o.disp[rank].recv_count.cpu()), _tag(rank, "cumulative stats")
    errors = []
    handle = buffer.low_latency_dispatch(o.xs[rank], o.idxs[rank], sc.t_max, sc.experts)[2]
    for bad in (o.ys[rank][:, :-1], o.ys[rank].float()):
        try:
            buffer.low_latency_combine(bad, o.idxs[rank], o.ws[rank], handle)
        except ValueError as e:
            errors.append(str(e))
    assert len(errors) == 2, _tag(rank, f"bad combine x accepted: {errors}")
    buffer.low_latency_combine(o.ys[rank], o.idxs[rank], o.ws[rank], handle)
    torch.cuda.synchronize()
    buffer._ll.synchronize()
    return {"rank": rank, "errors": errors}


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
    with session:
        with buffer.profile(session):
            for it in range(2):
                buffer.profile_iteration = it
                _round_trip(buffer, sc, o, rank, "fp8", False, False, _tag(rank, f"profiled {it}"), config=cfg)
    return {"rank": rank, "path": str(session.path) if session.path else None}


def run_jobs(ctx, jobs: list) -> list:
    """Several checks in one spawn of the ranks (each spawn costs seconds of process start and NCCL
    init): jobs are (function name, args); each result is ("ok", value) or ("error", message).
    After the first failure the rest are not run ("skipped"): the buffers' state is unknown."""
    import traceback

    out, failed = [], None
    for name, args in jobs:
        if failed is not None:
            out.append(("skipped", f"after {failed} failed"))
            continue
        try:
            out.append(("ok", globals()[name](ctx, *args)))
        except Exception as e:  # noqa: BLE001 (the test names the job and shows the message)
            failed = name
            out.append(("error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
        torch.cuda.synchronize()
        dist.barrier(group=ctx.group)
    return out
