"""benchmarks/bench_ep.py's CPU-checkable parts: the NCCL baseline's packing (run over gloo and
compared with the reference), the table, and the arguments."""
import importlib.util
from pathlib import Path

import pytest
import torch

from ep_core.launch import run_ranks

# benchmarks/ is a folder of scripts, not a package: load the script by path
_spec = importlib.util.spec_from_file_location(
    "bench_ep", Path(__file__).resolve().parents[2] / "benchmarks" / "bench_ep.py")
bench_ep = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_ep)


def _baseline_vs_reference(ctx):
    from ep_core import reference as ref
    from ep_core.config import Problem
    from ep_core.workload import make_all_inputs

    p = Problem(40, 128, 3, 8, ctx.world_size)
    ins = make_all_inputs(p, "skewed", seed=3, drop=0.1)
    mine = ins[ctx.rank]
    in_rank = ref.get_dispatch_layout(mine.topk_idx, p.experts, p.ranks)[3]
    d = {"x": mine.x, "layout": (None, in_rank, None)}
    got = bench_ep._nccl_dispatch(ctx, d, p)
    want = ref.dispatch([i.x for i in ins], topk_idx=[i.topk_idx for i in ins],
                        topk_weights=[i.topk_weights for i in ins], num_experts=p.experts)[ctx.rank]
    return bool(torch.equal(got, want.recv_x)), got.size(0)


def test_nccl_baseline_rows_equal_the_reference():
    out = run_ranks(_baseline_vs_reference, 2, backend="gloo", timeout_s=120)
    assert all(ok for ok, _ in out) and all(n > 0 for _, n in out)


def test_table_ratios():
    rows = [dict(op="BF16 dispatch", sms=64, us=200.0, p10=190, p90=210, logical=600.0, nvlink=300.0, note=""),
            dict(op="NCCL all_to_all_single dispatch", sms="all", us=600.0, p10=590, p90=610, logical=200.0,
                 nvlink=100.0, note="baseline"),
            dict(op="dispatch+combine, profiling compiled out", sms=64, us=500.0, p10=1, p90=2, logical=None,
                 nvlink=None, note="", kernel_us=400.0),
            dict(op="dispatch+combine, recording on", sms=64, us=700.0, p10=1, p90=2, logical=None, nvlink=None,
                 note="", kernel_us=404.0)]
    table = bench_ep.format_table(rows, 2).splitlines()
    assert "1.10× (545)" in table[2] and "3.00×" in table[2]  # vs DeepEP's 545 GB/s, vs NCCL 600/200 µs
    assert "1.010× off" in table[5]
    assert "×" not in bench_ep.format_table(rows, 4).splitlines()[2].split("|")[7]  # DeepEP figures are 2-rank


def test_arguments():
    a = bench_ep.parse_args(["--ranks", "8", "--sms", "24,64,132"])
    assert a.ranks == 8 and a.sms == [24, 64, 132]
    with pytest.raises(SystemExit):
        bench_ep.parse_args(["--ranks", "9"])
