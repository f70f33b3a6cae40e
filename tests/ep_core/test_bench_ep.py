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
    from profiler.workflows.workload import make_all_inputs

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


def _r0(**kw):
    rows = [dict(op="BF16 dispatch", sms=64, kernel_us=199.0, host_us=20.0, event_us=205.0, p90_us=209.0, gbps=570.0,
                 tight_us=212.0, graph_us=201.0),
            dict(op="BF16 combine", sms=24, kernel_us=287.0, host_us=None, event_us=290.0, p90_us=300.0, gbps=410.0,
                 tight_us=295.0, graph_us=None)]
    prof = [dict(sms=64, mode="compiled out", median_us=500.0, p90_us=520.0, kernel_us=400.0, host_us=40.0),
            dict(sms=64, mode="recording on", median_us=505.0, p90_us=530.4, kernel_us=404.0, host_us=48.0)]
    other = [dict(op="NCCL all_to_all_single dispatch", sms="all", event_us=600.0, p90_us=650.0, host_us=90.0,
                  gbps=190.0)]
    return dict(rows=rows, profiling=prof, other=other, sweep=[], **kw)


def test_tables_put_deepep_beside_ep_core_and_the_recording_ratios():
    table = bench_ep.format_tables(_r0(deepep_measured=False), 2).splitlines()
    bf16 = next(line for line in table if line.startswith("| BF16 dispatch | 64"))
    # measured-facts' DeepEP side-by-side figures at 64 SMs: kernel 228, host 65, tight loop 296
    assert "| 199.0 | 228.0 | 20.0 | 65.0 |" in bf16 and "| 212.0 | 296.0 | 201.0 |" in bf16
    comb = next(line for line in table if line.startswith("| BF16 combine | 24"))
    assert "| 287.0 | 416.0 | n/a | 60.0 |" in comb and comb.endswith("| n/a |")  # no graph figure
    on = next(line for line in table if "recording on" in line)
    assert "| 1.010× | 1.020× | 1.010× |" in on
    assert "measured-facts.md" in table[0]
    # other rank counts have no DeepEP figures; a run that measured DeepEP shows its own
    four = bench_ep.format_tables(_r0(deepep_measured=False), 4).splitlines()
    assert "| 199.0 | n/a | 20.0 | n/a |" in next(line for line in four if line.startswith("| BF16 dispatch | 64"))
    r0 = _r0(deepep_measured=True)
    r0["rows"][0]["deepep"] = dict(kernel_us=230.5, host_us=61.0, tight_us=290.0)
    mine = bench_ep.format_tables(r0, 2).splitlines()
    assert "| 199.0 | 230.5 | 20.0 | 61.0 |" in next(line for line in mine if line.startswith("| BF16 dispatch | 64"))
    assert "measured in this run" in mine[0]


def test_arguments():
    a = bench_ep.parse_args(["--ranks", "8", "--sms", "24,64,132"])
    assert a.ranks == 8 and a.sms == [24, 64, 132]
    with pytest.raises(SystemExit):
        bench_ep.parse_args(["--ranks", "9"])


def test_host_table_puts_both_libraries_calls_side_by_side():
    r0 = _r0(deepep_measured=True)
    r0["rows"][0].update(host_idle_us=12.5, host_calls={"cudaLaunchKernel": [2.0, 8.0], "aten::empty": [1.0, 3.0],
                                                        "_wall": [1.0, 20.0]})
    r0["rows"][0]["deepep"] = dict(kernel_us=230.5, host_us=61.0, host_idle_us=40.0, tight_us=290.0,
                                   host_calls={"cudaLaunchKernel": [2.0, 6.0], "cudaEventRecord": [2.0, 4.0],
                                               "_wall": [1.0, 30.0]})
    r0["calibration"] = [dict(what="one kernel launch (torch.cuda._sleep(1))", host_us=4.2,
                              host_calls={"cudaLaunchKernel": [1.0, 3.5], "_wall": [1.0, 6.0]})]
    lines = bench_ep.format_tables(r0, 2).splitlines()
    ep = next(line for line in lines if line.startswith("| BF16 dispatch | 64 | ep_core |"))
    # per call: count x µs each; the cuda* total leaves the aten op out (it holds its own cuda calls)
    assert "| 20.0 | 12.5 | cudaLaunchKernel 2 × 4.0 µs, aten::empty 1 × 3.0 µs; cuda* 8.0 of 20.0 µs |" in ep
    deep = next(line for line in lines if line.startswith("| BF16 dispatch | 64 | DeepEP |"))
    assert "| 61.0 | 40.0 | cudaLaunchKernel 2 × 3.0 µs, cudaEventRecord 2 × 2.0 µs; cuda* 10.0 of 30.0 µs |" in deep
    # a row measured without the profiler says so rather than leaving the cell empty
    assert next(line for line in lines if line.startswith("| BF16 combine | 24 | ep_core |")).endswith("| n/a |")
    cal = next(line for line in lines if line.startswith("| one kernel launch"))
    assert cal == "| one kernel launch (torch.cuda._sleep(1)) | 4.2 | cudaLaunchKernel 1 × 3.5 µs; cuda* 3.5 of 6.0 µs |"


def test_recording_rows_of_two_rounds_and_their_pool_each_get_their_own_ratios():
    split = {"dispatch_kernel": 190.0, "combine_kernel": 210.0}
    prof = [dict(sms=64, mode=m, round=rnd, median_us=med, p90_us=med + 5, kernel_us=k, host_us=40.0,
                 kernel_split_us=split if rnd == "both" else None)
            for rnd, m, med, k in ((1, "compiled out", 400.0, 380.0), (1, "recording on", 420.0, 399.0),
                                   (2, "recording on", 410.0, 400.0), (2, "compiled out", 410.0, 400.0),
                                   ("both", "compiled out", 405.0, 400.0), ("both", "recording on", 409.05, 404.0))]
    lines = bench_ep.format_tables(_r0(deepep_measured=False) | {"profiling": prof}, 2).splitlines()
    on = [line for line in lines if "recording on" in line]
    assert "| 64 | 1 | recording on | 420.0 |" in on[0] and "| 1.050× |" in on[0]  # against round 1's base
    assert "| 64 | 2 | recording on | 410.0 |" in on[1] and "| 1.000× |" in on[1]
    both = on[2]
    assert both.startswith("| 64 | both | recording on | 409.1 |") and "| 1.010× | 1.010× | 1.010× |" in both
    assert "| 404.0 (dispatch 190.0 + combine 210.0) |" in both and both.endswith("| (round 2's) |")
