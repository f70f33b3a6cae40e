"""The PyTorch profiler joined to a real recording (issue 30): a 1-rank ep_core op recorded with
Session(torch_profiler=True) stores its Kineto trace in the run, every profiled launch is joined
to its CUPTI kernel, the alignment is not refused and its width is small, and a BF16 GEMM on the
op's stream before dispatch is what the blame names before notify. Skips without a CUDA GPU."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu


def _record(ctx, out: str) -> str:
    import torch

    import ep_core
    from ep_core import _ext
    from ep_core.config import Problem, op_configs
    from profiler.record.session import Session
    from profiler.workflows.workload import RankOp, make_rank_inputs

    p = Problem(512, 1024, 4, 8, 1, "bf16")
    buffer = ep_core.Buffer(ctx.group, num_nvl_bytes=ep_core.Buffer.get_buffer_size_hint(p.tokens, p.hidden, 1, p.topk))
    op = RankOp(buffer, p, make_rank_inputs(p, "uniform", 0, seed=1, device=ctx.device), *op_configs(1, 24, None))
    op.iteration(None)
    _ext.load(profile=True)
    # 8192^3 BF16: ~1.4 ms, past the host's own gap between layout and dispatch with the profiler on
    # (~0.2-0.5 ms; a 4096^3 GEMM, 0.17 ms, ended before the host launched notify on an H100)
    a = torch.randn(8192, 8192, device=ctx.device, dtype=torch.bfloat16)
    torch.matmul(a, a)                      # cuBLAS's first call (tens of ms) outside the recording
    w = Session(out, name="warm-up", rank=0, world_size=1, group=ctx.group, analyze=False, description="warm-up")
    with w, buffer.profile(w):              # the Buffer learns its profile geometries
        op.combine(op.dispatch(op.layout(True), True), True)
        torch.cuda.synchronize()
    s = Session(out, name="torch-gpu-test", rank=0, world_size=1, group=ctx.group, torch_profiler=True,
                description="tests/gpu/test_torch_profiler_gpu.py", analyze=False)
    made = []
    with s, buffer.profile(s, calls=6):     # every pool slab made here, none inside a call
        made.append(len(s._slabs))
        for it in range(2):
            buffer.profile_iteration = it
            lay = op.layout(True)
            torch.matmul(a, a)
            op.combine(op.dispatch(lay, True), True)
        torch.cuda.synchronize()
        made.append(len(s._slabs))
    assert made[0] > 0 and made[0] == made[1], made
    return str(s.path)


def test_recorded_trace_is_stored_joined_aligned_and_blamed(tmp_path):
    from ep_core.launch import run_ranks
    from profiler.store.runstore import load_run
    from profiler.torchtrace.report import run_blame
    from profiler.torchtrace.store import verify

    path = run_ranks(_record, 1, str(tmp_path), timeout_s=600)[0]
    run = load_run(path)
    field = run.manifest["torch_profiler"]
    assert verify(path) == []
    al = field["alignment"][0]
    assert "error" not in al, al
    assert al["launches"] == len(run.launches) and al["unmatched"] == 0
    assert 0 < al["width_ns"] < 20_000, al
    merged, bl = run_blame(run)
    c = bl.clauses[(bl.clauses["scope"] == "lead_in") & (bl.clauses["kernel"] == "notify")]
    assert len(c) == 2 and (c["cause"] == "gpu").all() and (c["name"] == "aten::mm").all(), c.to_dict("records")
