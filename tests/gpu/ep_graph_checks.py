"""CUDA-graph checks of ep_core (issue 9), run inside one rank process by tests/gpu/test_ep_graphs.py:
a cached dispatch + combine captured once and replayed on new data gives the reference's result
every replay, eager calls interleaved with replays stay correct (the op's epoch lives on the
device), a capture with recording on writes its profile buffers on every replay, and a profile
block that announces its calls (Buffer.profile(calls=N)) makes no profile buffer inside a call
after each kernel's first."""
from __future__ import annotations

import torch
import torch.distributed as dist

from ep_core import reference as ref
from ep_core.config import Config, Problem
from profiler.workflows.workload import make_all_inputs

SHAPE = dict(tokens=1024, hidden=7168, topk=8, experts=256)


def _new_x(p: Problem, trial: int, device) -> list[torch.Tensor]:
    """Every rank's fresh bf16 input of replay `trial` (the routing, i.e. the handle, stays)."""
    xs = []
    for r in range(p.ranks):
        g = torch.Generator(device=device).manual_seed(10_000 + 100 * trial + r)
        xs.append(torch.randn((p.tokens, p.hidden), generator=g, device=device).to(torch.bfloat16))
    return xs


def _capture(buffer, xs, handle, dconf, cconf, profile=None):
    """Warm up on a side stream (torch's recipe), then capture dispatch + combine of `xs`."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            r = buffer.dispatch(xs, handle=handle, config=dconf, profile=profile)[0]
            buffer.combine(r, handle, config=cconf, profile=profile)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        recv = buffer.dispatch(xs, handle=handle, config=dconf, profile=profile)[0]
        comb = buffer.combine(recv, handle, config=cconf, profile=profile)[0]
    return g, recv, comb


def _check_replays(ctx, p, ins, g, xs, recv, comb, trials, tag, eager=None):
    for trial in range(trials):
        new = _new_x(p, trial, ctx.device)
        xs.copy_(new[ctx.rank])
        dist.barrier(group=ctx.group)
        g.replay()
        torch.cuda.synchronize()
        want = ref.dispatch(new, topk_idx=[i.topk_idx for i in ins], topk_weights=[i.topk_weights for i in ins],
                            num_experts=p.experts)
        assert torch.equal(recv, want[ctx.rank].recv_x), f"[rank {ctx.rank}] {tag} replay {trial}: recv_x"
        wc = ref.combine([w.recv_x for w in want], [w.handle for w in want])[ctx.rank][0]
        diff = ref.calc_diff(comb.float(), wc.float())
        assert diff < 1e-6, f"[rank {ctx.rank}] {tag} replay {trial}: combine diff {diff:.3g}"
        if eager is not None:  # an eager op between replays: the device epoch keeps both in step
            got = eager()
            assert torch.equal(got, want[ctx.rank].recv_x), f"[rank {ctx.rank}] {tag} eager after replay {trial}"


def run_graphs(ctx, out_dir: str) -> dict:
    import ep_core
    from profiler.record.session import Session
    from profiler.store.runstore import load_run

    R, rank = ctx.world_size, ctx.rank
    p = Problem(SHAPE["tokens"], SHAPE["hidden"], SHAPE["topk"], SHAPE["experts"], R)
    Buffer = ep_core.Buffer
    buffer = Buffer(ctx.group, num_nvl_bytes=Buffer.get_buffer_size_hint(p.tokens, p.hidden, R, p.topk))
    dconf, cconf = Config(24, 24, 256), Config(24, 10, 256)
    ins = make_all_inputs(p, "uniform", seed=900, device=ctx.device)
    idx = ins[rank].topk_idx.to(ep_core.topk_idx_t)
    layout = buffer.get_dispatch_layout(idx, p.experts)
    handle = buffer.dispatch(ins[rank].x, num_tokens_per_rank=layout[0], is_token_in_rank=layout[3],
                             num_tokens_per_expert=layout[2], config=dconf)[4]
    xs = ins[rank].x.clone()  # the graph's static input

    g, recv, comb = _capture(buffer, xs, handle, dconf, cconf)
    _check_replays(ctx, p, ins, g, xs, recv, comb, 3, "unprofiled",
                   eager=lambda: buffer.dispatch(xs, handle=handle, config=dconf)[0])
    buffer.synchronize()

    # recording on: the slots taken during the capture are the graph's profile buffers
    name = "graph-profiled"
    session = Session(out_dir, name=name, description="ep_core dispatch+combine replayed from a CUDA graph",
                      rank=rank, world_size=R, group=ctx.group, capacity=256,
                      workload={"kind": "ep", **p.to_dict(), "graph": True})
    eager = 33  # more profiled steps than one default slab (32 launches of a kernel) holds
    with session:
        # calls: the eager steps, the capture's 2 warm-up steps and the captured one (2 calls each)
        with buffer.profile(session, calls=2 * (eager + 3)):
            # the first profiled step makes each kernel's slab (Session.reserve); none after it
            r = buffer.dispatch(xs, handle=handle, config=dconf, profile=True)[0]
            buffer.combine(r, handle, config=cconf, profile=True)
            slabs = len(session._slabs)
            for _ in range(eager - 1):
                r = buffer.dispatch(xs, handle=handle, config=dconf, profile=True)[0]
                buffer.combine(r, handle, config=cconf, profile=True)
            slabs_in_calls = len(session._slabs) - slabs
            n_eager = session.num_launches
            gp, precv, pcomb = _capture(buffer, xs, handle, dconf, cconf, profile=True)
            assert len(session._slabs) == slabs, "the capture's profiled calls took a new slab"
            n_before = session.num_launches
            _check_replays(ctx, p, ins, gp, xs, precv, pcomb, 3, "profiled")
            assert session.num_launches == n_before, "a replay must take no new profile slots"
    buffer.synchronize()
    out = {"rank": rank}
    if rank == 0:
        run = load_run(session.out_dir / name)
        la = run.launches
        graph_launches = la[la["launch"] >= n_before - 4]  # the four captured launches
        spans = run.events[(run.events["kind"] == "span") & run.events["launch"].isin(graph_launches["launch"])]
        out.update(graph_kernels=sorted(graph_launches["kernel"].astype(str).unique().tolist()),
                   graph_spans=int(len(spans)), dropped=int(la["dropped"].sum()))
        # every eager profiled launch of rank 0 (barrier, dispatch, barrier, combine per step) holds
        # device records (the barrier's are arrive / depart, the kernels' spans)
        ev = run.events
        ev = ev[(ev["rank"] == 0) & (ev["launch"] < n_eager) & (ev["kind"].astype(str) != "host")]
        la0 = la[la["rank"] == 0]
        out.update(eager_launches=int((la0["launch"] < n_eager).sum()),
                   eager_launches_recorded=int(ev["launch"].nunique()))
    out["slabs_made_in_calls"] = slabs_in_calls
    return out
