"""A small MoE layer under torch.profiler and epscope: router -> ep_core dispatch -> expert MLPs ->
combine, one process per GPU (1..N), then the PyTorch traces merged into the epscope run.

    python examples/moe_step.py --ranks 2 --out runs/                 # record runs/moe-step + one trace per rank
    python examples/moe_step.py --ranks 2 --upstream-gemm-rank 1      # rank 1 runs an extra GEMM before dispatch
    epscope merge runs/moe-step runs/moe-step.rank*.pt.trace.json.gz   # (the script does this itself at the end)
    epscope report runs/moe-step                                      # "rank 1 entered dispatch <t> late: its
                                                                      #  GPU was running aten::mm (<t>), launched
                                                                      #  from moe_step.py:<line>"

What a training script adds to see inside its EP collectives: a `profiler.record.Session` and
`with buffer.profile(session)` around the profiled steps, inside its usual `torch.profiler.profile`
(with_stack=True names the Python line that launched each kernel); ep_core then labels each
profiled launch in the PyTorch trace, and `epscope merge` joins the two traces launch for launch.
`Session(..., torch_profiler=True)` does both in one (no trace files to pass around).

Forward only: ep_core's dispatch and combine are not autograd functions (DeepEP's are not either;
a training step wraps them in its own torch.autograd.Function).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


def ep_core_topk_idx_t():
    import ep_core
    return ep_core.topk_idx_t


def moe_forward(ctx, buffer, router, w1, w2, x, topk: int, profile, upstream=None):
    """One MoE layer: route, dispatch the tokens to their experts' ranks, run the local experts,
    send the results back and sum them per token."""
    import torch

    logits = router(x)
    weights, idx = torch.topk(torch.softmax(logits.float(), dim=-1), topk, dim=-1)
    idx = idx.to(ep_core_topk_idx_t())
    per_rank, _, per_expert, in_rank, _ = buffer.get_dispatch_layout(idx, router.out_features, profile=profile)
    if upstream is not None:
        upstream()                                   # work of this rank's own before the collective
    recv_x, recv_idx, recv_w, _, handle, _ = buffer.dispatch(
        x, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank, num_tokens_per_expert=per_expert,
        topk_idx=idx, topk_weights=weights, profile=profile)
    y = torch.zeros_like(recv_x)
    for e in range(w1.size(0)):                      # the local experts: rows routed to expert e
        rows = (recv_idx == e).any(dim=1)
        if rows.any():
            h = torch.nn.functional.gelu(recv_x[rows] @ w1[e])
            y[rows] += (h @ w2[e]) * recv_w[rows][recv_idx[rows] == e].unsqueeze(1).to(y.dtype)
    out, _, _ = buffer.combine(y, handle, profile=profile)
    return out


def _rank(ctx, opts: dict) -> dict:
    import torch

    import ep_core
    from profiler.record.session import Session

    torch.manual_seed(ctx.rank)
    R, T, H, E, K, F = ctx.world_size, opts["tokens"], opts["hidden"], opts["experts"], opts["topk"], opts["ffn"]
    dev = ctx.device
    buffer = ep_core.Buffer(ctx.group, num_nvl_bytes=ep_core.Buffer.get_buffer_size_hint(T, H, R, K))
    router = torch.nn.Linear(H, E, bias=False, device=dev, dtype=torch.bfloat16)
    w1 = torch.randn(E // R, H, F, device=dev, dtype=torch.bfloat16) / H ** 0.5
    w2 = torch.randn(E // R, F, H, device=dev, dtype=torch.bfloat16) / F ** 0.5
    x = torch.randn(T, H, device=dev, dtype=torch.bfloat16)
    g = torch.randn(opts["gemm"], opts["gemm"], device=dev, dtype=torch.bfloat16)
    upstream = (lambda: torch.matmul(g, g)) if ctx.rank == opts["upstream_gemm_rank"] else None
    for _ in range(2):                               # warm-up: the builds, the caches
        moe_forward(ctx, buffer, router, w1, w2, x, K, None, upstream)
    from ep_core import _ext
    _ext.load(profile=True)
    torch.cuda.synchronize()
    session = Session(opts["out"], name=opts["name"], rank=ctx.rank, world_size=R, group=ctx.group, overwrite=True,
                      description=f"examples/moe_step.py: {R} rank(s), T={T} H={H} E={E} top-{K}",
                      workload={"kind": "ep", "example": "moe_step", "upstream_gemm_rank": opts["upstream_gemm_rank"]})
    trace = Path(opts["out"]) / f"{opts['name']}.rank{ctx.rank}.pt.trace.json.gz"
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts, with_stack=True) as prof:
        with session, buffer.profile(session):
            for step in range(opts["steps"]):
                buffer.profile_iteration = step
                moe_forward(ctx, buffer, router, w1, w2, x, K, True, upstream)
            torch.cuda.synchronize()
    prof.export_chrome_trace(str(trace))
    return {"rank": ctx.rank, "trace": str(trace), "run": str(session.path) if session.path else None}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=1)
    ap.add_argument("--out", default="runs")
    ap.add_argument("--name", default="moe-step")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--topk", type=int, default=4)
    ap.add_argument("--ffn", type=int, default=1024)
    ap.add_argument("--gemm", type=int, default=8192, help="size of the --upstream-gemm-rank's extra BF16 GEMM")
    ap.add_argument("--upstream-gemm-rank", type=int, default=-1, help="rank that runs an extra GEMM before dispatch")
    a = ap.parse_args(argv)
    Path(a.out).mkdir(parents=True, exist_ok=True)
    from ep_core.launch import run_ranks
    from profiler.commands.cli import main as epscope

    res = run_ranks(_rank, a.ranks, vars(a) | {"upstream_gemm_rank": a.upstream_gemm_rank}, timeout_s=900)
    run = next(r["run"] for r in res if r["run"])
    rc = epscope(["merge", run, *[r["trace"] for r in res]])
    return rc or epscope(["report", run])


if __name__ == "__main__":
    sys.exit(main())
