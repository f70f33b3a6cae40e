"""profiler.workflows.workload: every rank's inputs from a seed, and the traffic they make, checked
against the reference dispatch (ep_core.reference)."""
import torch

from ep_core import reference as ref
from ep_core.config import Problem
from profiler.workflows.workload import make_all_inputs, routing_matrix, traffic


def test_workload_inputs_are_deterministic_and_rank_seeded():
    p = Problem(16, 256, 4, 8, 2)
    a = make_all_inputs(p, "uniform")
    b = make_all_inputs(p, "uniform")
    assert torch.equal(a[1].x, b[1].x) and torch.equal(a[1].topk_idx, b[1].topk_idx)
    assert not torch.equal(a[0].x, a[1].x)
    c = make_all_inputs(p, "uniform", x_kind="rank")
    assert (c[1].x == 1).all() and c[1].x_for("fp8")[0].dtype == torch.float8_e4m3fn


def test_traffic_counts_own_rows_in_logical_only():
    p = Problem(64, 256, 4, 8, 2)
    ins = make_all_inputs(p, "uniform")
    counts = routing_matrix([i.topk_idx for i in ins], p.experts)
    d = ref.dispatch([i.x for i in ins], topk_idx=[i.topk_idx for i in ins],
                     topk_weights=[i.topk_weights for i in ins], num_experts=p.experts)
    for r in range(2):
        tr = traffic(p, counts, r)
        assert tr.rows == d[r].recv_x.size(0)
        assert tr.logical_bytes == d[r].recv_x.numel() * 2
        assert tr.remote_rows == int((d[r].handle.recv_src_rank != r).sum())
        assert tr.nvlink_bytes == tr.remote_rows * 256 * 2
