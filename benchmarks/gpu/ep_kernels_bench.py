"""ep_core kernels on the GPU machine: correctness against ep_core.reference first, then speed.

    PYTHONPATH=. python benchmarks/gpu/ep_kernels_bench.py --ranks 2 --out $OUT

Validates before it benchmarks (style rule 11): every scenario compares ep_core's outputs with
the plain-PyTorch reference on the same inputs (exact for dispatch, calc_diff for combine). Then
times, all in one run: BF16 / FP8 dispatch and BF16 combine at 24 and 64 SMs, the NCCL
all_to_all_single baseline, the block-split / chunk sweep, and kernel time with the profiling
build on vs the compiled-out build. Prints a table last and writes results JSON (and, with
--traces, profiled run directories) under --out.

Logical GB/s = bytes of recv_x (all received rows, own included; FP8 counts its scales) / time,
the DeepEP intranode benchmark's convention (../shared/reference/measured-facts.md); NVLink GB/s
counts only the rows that crossed to another GPU.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from ep_core import reference as ref  # noqa: E402
from ep_core.config import Config, Problem  # noqa: E402
from ep_core.launch import run_ranks  # noqa: E402
from profiler.workflows.workload import make_all_inputs  # noqa: E402


def log(ctx, *a):
    if ctx.rank == 0:
        print(*a, flush=True)


def make_buffer(ctx, tokens, hidden, **kw):
    import ep_core

    R = ctx.world_size
    return ep_core.Buffer(ctx.group, num_nvl_bytes=ep_core.Buffer.get_buffer_size_hint(tokens, hidden, R), **kw)


def layout_of(buffer, idx, E):
    n_rank, _, n_exp, in_rank, _ = buffer.get_dispatch_layout(idx, E)
    return n_rank, n_exp, in_rank


# ---------------------------------------------------------------------------------------------
# correctness
# ---------------------------------------------------------------------------------------------
def check_scenario(ctx, name, tokens, hidden, topk, experts, *, routing="uniform", drop=0.0, dtype="bf16",
                   col_major=False, worst=False, align=1, zero_tokens_rank=None, bias=False, mode=(False, False),
                   num_sms=24, buffer=None):
    import ep_core

    R, me, dev = ctx.world_size, ctx.rank, ctx.device
    p = Problem(tokens, hidden, topk, experts, R)
    ins = make_all_inputs(p, routing, seed=0, device=dev, drop=drop)
    if zero_tokens_rank is not None:  # that rank brings no tokens at all
        z = ins[zero_tokens_rank]
        z.x, z.topk_idx, z.topk_weights = z.x[:0], z.topk_idx[:0], z.topk_weights[:0]
        z._fp8 = None
    mine = ins[me]
    buffer = buffer or make_buffer(ctx, tokens, hidden)
    xs = [i.x_for(dtype) for i in ins]
    x = xs[me]
    if dtype == "fp8" and col_major:
        x = (x[0], x[1].T.contiguous().T)
    idx = mine.topk_idx.to(ep_core.topk_idx_t)
    n_rank, n_exp, in_rank = layout_of(buffer, idx, experts)
    r_rank, _, r_exp, r_in = ref.get_dispatch_layout(mine.topk_idx, experts, R)
    assert torch.equal(n_rank, r_rank) and torch.equal(n_exp, r_exp) and torch.equal(in_rank, r_in), "layout"
    worst_n = tokens * R if worst else 0
    async_mode, prev = mode
    kw = dict(num_tokens_per_rank=n_rank, is_token_in_rank=in_rank, num_tokens_per_expert=n_exp,
              topk_idx=idx, topk_weights=mine.topk_weights, expert_alignment=align, num_worst_tokens=worst_n,
              config=Config(num_sms, 6, 256), async_finish=async_mode)
    if prev:
        kw["previous_event"] = buffer.capture()
    recv_x, recv_idx, recv_w, elist, handle, ev = buffer.dispatch(x, **kw)
    if async_mode:
        ev.current_stream_wait()
    want = ref.dispatch(xs, topk_idx=[i.topk_idx for i in ins], topk_weights=[i.topk_weights for i in ins],
                        num_experts=experts, expert_alignment=align, num_worst_tokens=worst_n)[me]
    n = handle.num_recv_tokens if not worst else int(want.handle.num_recv_tokens)
    got_x = recv_x if isinstance(recv_x, tuple) else (recv_x,)
    want_x = want.recv_x if isinstance(want.recv_x, tuple) else (want.recv_x,)
    for g, w in zip(got_x, want_x):
        assert g.shape == w.shape, f"recv_x shape {tuple(g.shape)} vs {tuple(w.shape)}"
        assert torch.equal(g[:n].view(torch.uint8) if g.dtype == torch.float8_e4m3fn else g[:n],
                           w[:n].view(torch.uint8) if w.dtype == torch.float8_e4m3fn else w[:n]), "recv_x rows"
    assert torch.equal(recv_idx, want.recv_topk_idx), "recv_topk_idx"
    assert torch.equal(recv_w, want.recv_topk_weights), "recv_topk_weights"
    assert elist == want.num_recv_tokens_per_expert_list, f"expert list {elist[:8]} vs {want.num_recv_tokens_per_expert_list[:8]}"
    assert torch.equal(handle.rank_prefix_matrix.cpu(), want.handle.rank_prefix_matrix.cpu()), "rank_prefix_matrix"
    # cached dispatch: same rows
    again = buffer.dispatch(x, handle=handle, config=Config(num_sms, 6, 256), num_worst_tokens=worst_n)
    g2 = again[0] if isinstance(again[0], tuple) else (again[0],)
    for a, b in zip(g2, got_x):
        assert torch.equal(a[:n].view(torch.uint8), b[:n].view(torch.uint8)), "cached dispatch differs"
    # combine of bf16 rows (FP8 rows cast back), weights of the received rows, optional bias pair
    y = ref.per_token_cast_back(*recv_x) if isinstance(recv_x, tuple) else recv_x
    T = mine.x.size(0)
    b = None
    if bias:
        g = torch.Generator(device=dev).manual_seed(100 + me)
        b = (torch.randn((T, hidden), generator=g, device=dev).to(torch.bfloat16),
             torch.randn((T, hidden), generator=g, device=dev).to(torch.bfloat16))
    ckw = dict(topk_weights=recv_w, bias=b, config=Config(num_sms, 6, 256), async_finish=async_mode)
    if prev:
        ckw["previous_event"] = buffer.capture()
    out, out_w, cev = buffer.combine(y, handle, **ckw)
    if async_mode:
        cev.current_stream_wait()
    # every rank's y is needed for the reference combine: gather the received rows
    ys = gather_rows(ctx, y[:n].contiguous(), hidden)
    ws = gather_rows(ctx, recv_w[:n].contiguous(), topk)
    hs = []
    all_d = ref.dispatch(xs, topk_idx=[i.topk_idx for i in ins], topk_weights=[i.topk_weights for i in ins],
                         num_experts=experts)
    for j in range(R):
        hs.append(all_d[j].handle)
    bias_all = [None] * R
    if bias:
        bias_all[me] = b
    want_c = ref.combine(ys, hs, topk_weights=ws, bias=bias_all)[me]
    diff = ref.calc_diff(out.float(), want_c[0].float()) if T else 0.0
    assert diff < 5e-6, f"combine calc_diff {diff}"
    maxerr = (out.float() - want_c[0].float()).abs().max().item() if T else 0.0
    if T:
        assert torch.allclose(out_w, want_c[1], atol=1e-6), "combined weights"
    return {"scenario": name, "rank": me, "recv": int(n), "combine_diff": diff, "combine_maxabs": maxerr}


def gather_rows(ctx, t, width):
    """All ranks' [n_r, width] tensors, in rank order (sizes differ per rank)."""
    R = ctx.world_size
    if R == 1:
        return [t]
    n = torch.tensor([t.size(0)], device=t.device)
    ns = [torch.zeros_like(n) for _ in range(R)]
    dist.all_gather(ns, n, group=ctx.group)
    m = int(max(int(v) for v in ns))
    pad = torch.zeros((m, width), dtype=t.dtype, device=t.device)
    pad[: t.size(0)] = t
    outs = [torch.zeros_like(pad) for _ in range(R)]
    dist.all_gather(outs, pad, group=ctx.group)
    return [o[: int(k)] for o, k in zip(outs, ns)]


SCENARIOS = [
    dict(name="bf16 uniform 4096x7168 top8/256", tokens=4096, hidden=7168, topk=8, experts=256),
    dict(name="fp8 col-major scales, async+prev", tokens=4096, hidden=7168, topk=8, experts=256, dtype="fp8",
         col_major=True, mode=(True, True), num_sms=64),
    dict(name="bf16 drop=0.2, align 4, worst tokens", tokens=1000, hidden=256, topk=4, experts=16, drop=0.2,
         align=4, worst=True),
    dict(name="bf16 skewed, bias pair, 64 SMs", tokens=2048, hidden=1024, topk=8, experts=64, routing="skewed",
         bias=True, num_sms=64),
    dict(name="bf16 last rank brings 0 tokens", tokens=512, hidden=512, topk=2, experts=8, zero_tokens_rank=-1),
    dict(name="fp8 top16/512 hidden 8192", tokens=256, hidden=8192, topk=16, experts=512, dtype="fp8"),
    dict(name="bf16 top1 hidden 128 async", tokens=3, hidden=128, topk=1, experts=8, mode=(True, False)),
]


# ---------------------------------------------------------------------------------------------
# timing
# ---------------------------------------------------------------------------------------------
def timed(ctx, fn, iters=20, warmup=3):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    dist.barrier(group=ctx.group) if ctx.world_size > 1 else None
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    t = start.elapsed_time(end) * 1e3 / iters  # µs
    # the slowest rank sets the pace; report it
    tt = torch.tensor([t], device=ctx.device)
    if ctx.world_size > 1:
        dist.all_reduce(tt, op=dist.ReduceOp.MAX, group=ctx.group)
    return float(tt.item())


def bench(ctx, tokens=4096, hidden=7168, topk=8, experts=256, sweep=True, nccl=True, prof=True):
    import ep_core
    import ep_core.buffer as B

    R, me, dev = ctx.world_size, ctx.rank, ctx.device
    p = Problem(tokens, hidden, topk, experts, R)
    ins = make_all_inputs(p, "uniform", seed=0, device=dev)
    mine = ins[me]
    buffer = make_buffer(ctx, tokens, hidden)
    idx = mine.topk_idx.to(ep_core.topk_idx_t)
    n_rank, n_exp, in_rank = layout_of(buffer, idx, experts)
    recv_rows = int(n_rank.clone().cpu()[me]) if R == 1 else None
    tot = n_rank.clone()
    if R > 1:
        dist.all_reduce(tot, group=ctx.group)
    recv_rows = int(tot[me])
    remote_rows = recv_rows - int(in_rank[:, me].sum())  # rows that crossed NVLink into this rank
    rows = {}

    def row(name, us, nbytes, nvl_bytes):
        rows[name] = {"us": us, "logical_GBps": nbytes / us / 1e3, "nvlink_GBps": nvl_bytes / us / 1e3}
        log(ctx, f"  {name:44s} {us:9.1f} us {nbytes / us / 1e3:8.1f} GB/s logical {nvl_bytes / us / 1e3:8.1f} GB/s NVLink")

    bf16_row = hidden * 2
    fp8_row = hidden + hidden // 128 * 4
    for sms in (24, 64):
        cfg = Config(sms, 6, 256)
        kw = dict(num_tokens_per_rank=n_rank, is_token_in_rank=in_rank, num_tokens_per_expert=n_exp, config=cfg)
        us = timed(ctx, lambda: buffer.dispatch(mine.x, **kw))
        row(f"ep_core BF16 dispatch {sms} SMs", us, recv_rows * bf16_row, remote_rows * bf16_row)
        _, _, _, _, handle, _ = buffer.dispatch(mine.x, **kw)
        us = timed(ctx, lambda: buffer.dispatch(mine.x, handle=handle, config=cfg))
        row(f"ep_core BF16 dispatch cached {sms} SMs", us, recv_rows * bf16_row, remote_rows * bf16_row)
        xf = mine.x_fp8
        us = timed(ctx, lambda: buffer.dispatch(xf, **kw))
        row(f"ep_core FP8 dispatch {sms} SMs", us, recv_rows * fp8_row, remote_rows * fp8_row)
        recv_x, _, _, _, handle, _ = buffer.dispatch(mine.x, **kw)
        us = timed(ctx, lambda: buffer.combine(recv_x, handle, config=cfg))
        row(f"ep_core BF16 combine {sms} SMs", us, recv_rows * bf16_row, remote_rows * bf16_row)

    sweep_rows = []
    if sweep and R > 1:
        base = (B.DISPATCH_SENDER_FRACTION, B.COMBINE_SENDER_FRACTION, B.CHUNKS_PER_SENDER_BLOCK)
        for sms in (24, 64):
            cfg = Config(sms, 6, 256)
            kw = dict(num_tokens_per_rank=n_rank, is_token_in_rank=in_rank, num_tokens_per_expert=n_exp, config=cfg)
            for frac in (0.375, 0.5, 0.625, 0.75):
                for cpb in (2, 4, 8, 16):
                    B.DISPATCH_SENDER_FRACTION, B.CHUNKS_PER_SENDER_BLOCK = frac, cpb
                    _, _, _, _, h, _ = buffer.dispatch(mine.x, **kw)
                    us = timed(ctx, lambda: buffer.dispatch(mine.x, handle=h, config=cfg), iters=10)
                    sweep_rows.append({"kind": "dispatch_cached", "sms": sms, "sender_fraction": frac,
                                       "chunks_per_block": cpb, "us": us,
                                       "logical_GBps": recv_rows * bf16_row / us / 1e3})
            B.DISPATCH_SENDER_FRACTION, B.CHUNKS_PER_SENDER_BLOCK = base[0], base[2]
            recv_x, _, _, _, handle, _ = buffer.dispatch(mine.x, **kw)
            for frac in (0.125, 0.25, 0.375, 0.5):
                B.COMBINE_SENDER_FRACTION = frac
                us = timed(ctx, lambda: buffer.combine(recv_x, handle, config=cfg), iters=10)
                sweep_rows.append({"kind": "combine", "sms": sms, "sender_fraction": frac,
                                   "chunks_per_block": base[2], "us": us,
                                   "logical_GBps": recv_rows * bf16_row / us / 1e3})
            B.COMBINE_SENDER_FRACTION = base[1]
            for kind in ("dispatch_cached", "combine"):
                best = min((r for r in sweep_rows if r["kind"] == kind and r["sms"] == sms), key=lambda r: r["us"])
                log(ctx, f"  sweep best {kind} {sms} SMs: {best}")

    if nccl and R > 1:
        us = timed(ctx, lambda: nccl_a2a(ctx, mine.x, in_rank), iters=10)
        row("NCCL all_to_all_single (counts + payload)", us, recv_rows * bf16_row, remote_rows * bf16_row)

    if prof:
        prof_rows = kernel_profile_cost(ctx, buffer, mine.x, n_rank, in_rank, n_exp)
        for k, v in prof_rows.items():
            rows[k] = v
            log(ctx, f"  {k:44s} {v['us']:9.1f} us")
    return {"rows": rows, "sweep": sweep_rows, "recv_rows": recv_rows, "remote_rows": remote_rows}


def nccl_a2a(ctx, x, in_rank):
    """The NCCL baseline of measured-facts.md: pack rows by destination (index_select), exchange
    counts, then the payload with all_to_all_single."""
    R = ctx.world_size
    order = []
    counts = []
    for d in range(R):
        sel = torch.nonzero(in_rank[:, d], as_tuple=False).flatten()
        order.append(sel)
        counts.append(sel.numel())
    send = x.index_select(0, torch.cat(order))
    sc = torch.tensor(counts, device=x.device)
    rc = torch.empty_like(sc)
    dist.all_to_all_single(rc, sc, group=ctx.group)
    rcl = rc.tolist()
    recv = torch.empty((sum(rcl), x.size(1)), dtype=x.dtype, device=x.device)
    dist.all_to_all_single(recv, send, rcl, counts, group=ctx.group)
    return recv


def kernel_profile_cost(ctx, buffer, x, n_rank, in_rank, n_exp):
    """Kernel-only time of [barrier + dispatch] and [barrier + combine] launches, compiled-out
    build vs instrumented build writing a real profile buffer (same arguments, same handle)."""
    from profiler.record.session import buffer_bytes, make_header
    from ep_core.generated import ep_intranode_phases as P
    out = {}
    cfg = Config(64, 6, 256)
    kw = dict(num_tokens_per_rank=n_rank, is_token_in_rank=in_rank, num_tokens_per_expert=n_exp, config=cfg)
    recv_x, _, _, _, handle, _ = buffer.dispatch(x, **kw)
    nb = buffer._dispatch_blocks(cfg)[0]
    cnb = buffer._combine_blocks(cfg)[0]
    warps = buffer.limits["threads"] // 32

    def profbuf(grid):
        cap = 256
        hdr = make_header(registry_hash=P.REGISTRY_HASH, num_regions=grid * warps, capacity=cap, rank=ctx.rank,
                          launch_id=0, warps_per_block=warps, hires=False)
        b = torch.zeros(buffer_bytes(grid * warps, cap), dtype=torch.uint8, device=ctx.device)
        b[: hdr.size].copy_(torch.from_numpy(hdr.copy()))
        return b

    for label, profile in (("compiled out", False), ("instrumented", True)):
        # the Buffer's own launcher and plans of this build: barrier + kernel, ordered on the
        # current stream (fork and join), no outputs kept
        build = buffer._build(profile)
        dplan = buffer._cached_dispatch_plan(build, handle, x, None, cfg, 0)
        cplan = buffer._combine_plan(build, handle, recv_x, None, cfg)
        bufs = (profbuf(nb), profbuf(cnb)) if profile else ()  # kept alive while the kernels write them
        pd, pc = (b.data_ptr() for b in bufs) if profile else (0, 0)

        def mode():
            return build.mode(torch.cuda.current_stream().cuda_stream, True, True, False, False)

        def disp():
            build.launcher.dispatch(dplan.cpp, x, None, None, None, mode(), 0, pd)

        def comb():
            build.launcher.combine(cplan.cpp, recv_x, None, None, None, mode(), 0, pc)

        out[f"kernel BF16 dispatch 64 SMs, {label}"] = {"us": timed(ctx, disp, iters=30)}
        out[f"kernel BF16 combine 64 SMs, {label}"] = {"us": timed(ctx, comb, iters=30)}
    buffer.synchronize()
    return out


# ---------------------------------------------------------------------------------------------
# profiled runs (traces)
# ---------------------------------------------------------------------------------------------
def record_trace(ctx, out_dir, name, description, routing="uniform", tokens=4096, hidden=7168, iters=3,
                 skip_send=None, timeout_s=None):
    import ep_core
    from profiler.record import Session

    R, me, dev = ctx.world_size, ctx.rank, ctx.device
    p = Problem(tokens, hidden, 8, 256, R)
    mine = make_all_inputs(p, routing, seed=0, device=dev)[me]
    buffer = make_buffer(ctx, tokens, hidden, timeout_s=timeout_s, _test_skip_send_rank=skip_send)
    idx = mine.topk_idx.to(ep_core.topk_idx_t)
    workload = {"kind": "ep", "routing": routing, "tokens": tokens, "hidden": hidden, "topk": 8, "experts": 256,
                "ranks": R, "dtype": "bf16", "num_sms": 24, "iterations": iters}
    err = None
    with Session(out_dir, name=name, description=description, rank=me, world_size=R, group=ctx.group,
                 workload=workload, config=Config(24, 6, 256).to_dict(), capacity=512) as s:
        try:
            with buffer.profile(s):
                for it in range(iters):
                    buffer.profile_iteration = it
                    n_rank, _, n_exp, in_rank, _ = buffer.get_dispatch_layout(idx, 256, profile=True)
                    recv_x, _, recv_w, _, handle, _ = buffer.dispatch(
                        mine.x, num_tokens_per_rank=n_rank, is_token_in_rank=in_rank, num_tokens_per_expert=n_exp,
                        topk_idx=idx, topk_weights=mine.topk_weights, config=Config(24, 6, 256), profile=True)
                    buffer.combine(recv_x, handle, topk_weights=recv_w, config=Config(24, 6, 256), profile=True)
        except ep_core.EPTimeoutError as e:  # the forced-timeout run: the buffer saved the partial trace
            err = str(e)
    return {"name": name, "rank": me, "error": err}


# ---------------------------------------------------------------------------------------------
def worker(ctx, opts):
    torch.cuda.set_device(ctx.device)
    res = {"rank": ctx.rank, "world": ctx.world_size, "checks": [], "bench": None, "traces": []}
    log(ctx, f"== {ctx.world_size} rank(s), {torch.cuda.get_device_name()}")
    for sc in SCENARIOS:
        sc = dict(sc)
        name = sc.pop("name")
        if sc.get("zero_tokens_rank") == -1:
            sc["zero_tokens_rank"] = ctx.world_size - 1
        t0 = time.time()
        try:
            r = check_scenario(ctx, name, **sc)
            r["ok"] = True
        except Exception as e:  # keep going: one failing scenario must not hide the others
            r = {"scenario": name, "rank": ctx.rank, "ok": False, "error": f"{type(e).__name__}: {e}",
                 "tb": traceback.format_exc()[-3000:]}
            if "timed out" in str(e) or "unusable" in str(e):
                res["checks"].append(r)
                log(ctx, f"  FAIL {name}: {r['error']}")
                return res  # a broken buffer state would cascade
        r["s"] = round(time.time() - t0, 2)
        res["checks"].append(r)
        log(ctx, f"  {'ok  ' if r['ok'] else 'FAIL'} {name}" + ("" if r["ok"] else f": {r['error']}"))
    if opts.get("bench") and all(c["ok"] for c in res["checks"]):
        res["bench"] = bench(ctx, sweep=opts.get("sweep", True))
    if opts.get("traces"):
        out = opts["traces"]
        res["traces"].append(record_trace(ctx, out, "ep-2rank-balanced-dispatch-combine",
                                          "2xH200, 4096 tok/rank, hidden 7168, top-8 of 256, uniform routing, "
                                          "24 SMs: layout+dispatch+combine, 3 iterations"))
        res["traces"].append(record_trace(ctx, out, "ep-2rank-skewed-routing",
                                          "2xH200, 4096 tok/rank, skewed routing (hot experts on rank 0), 24 SMs",
                                          routing="skewed"))
        res["traces"].append(record_trace(ctx, out, "ep-2rank-forced-timeout",
                                          "2xH200: rank 1 never sends its dispatch rows (test hook), rank 0 times "
                                          "out after 1 s in wait_data; partial trace", iters=1, skip_send=1,
                                          timeout_s=1.0))
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 1])
    ap.add_argument("--out", default="benchmarks/results/gpu-run")
    ap.add_argument("--no-bench", action="store_true")
    ap.add_argument("--no-sweep", action="store_true")
    ap.add_argument("--traces", default=None, help="directory for profiled runs (2 ranks only)")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    allres = {}
    for R in a.ranks:
        opts = {"bench": not a.no_bench, "sweep": not a.no_sweep, "traces": a.traces if R == 2 else None}
        t0 = time.time()
        try:
            allres[R] = run_ranks(worker, R, opts, timeout_s=420)
        except Exception as e:
            print(f"!! {R} ranks failed: {type(e).__name__}: {e}", flush=True)
            allres[R] = {"error": f"{type(e).__name__}: {e}"}
        print(f"   ({R} ranks: {time.time() - t0:.0f} s)", flush=True)
    (out / "ep_kernels_bench.json").write_text(json.dumps(allres, indent=1, default=str))
    # the table, last
    print("\n== ep_core kernels:", torch.cuda.get_device_name() if torch.cuda.is_available() else "?")
    for R, rs in allres.items():
        if isinstance(rs, dict):
            print(f"{R} ranks: ERROR {rs['error']}")
            continue
        ok = sum(c["ok"] for r in rs for c in r["checks"])
        n = sum(len(r["checks"]) for r in rs)
        print(f"{R} ranks: {ok}/{n} rank-checks passed")
        for r in rs:
            for c in r["checks"]:
                if not c["ok"]:
                    print(f"   FAIL rank {c['rank']} {c['scenario']}: {c['error']}")
        b = rs[0].get("bench")
        if b:
            print(f"   recv rows/rank {b['recv_rows']}, of which over NVLink {b['remote_rows']}")
            for k, v in b["rows"].items():
                extra = f" {v['logical_GBps']:7.1f} GB/s logical {v['nvlink_GBps']:7.1f} GB/s NVLink" \
                    if "logical_GBps" in v else ""
                print(f"   {k:46s} {v['us']:8.1f} us{extra}")
        for t in rs[0].get("traces", []):
            print(f"   trace {t}")


if __name__ == "__main__":
    main()
