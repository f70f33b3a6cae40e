"""The GPU scripts' Python, run on the CPU before their first GPU run (GPU run 1 of issue 11 died
in tma_bench.py's reference call, before it measured anything): the scenarios and assertions of
tests/gpu/test_ep_tma.py and tests/gpu/test_ep_hook.py on a reference-backed Buffer over gloo
(tests/ep_core/reference_buffer.py; its hook mode poisons the outputs until the hook runs), at a
small shape; and a buffer that loses its hook's results must fail them."""
from __future__ import annotations

import pytest

from ep_core.launch import RankFailed, run_ranks
from tests.gpu import ep_checks
from tests.gpu import test_ep_hook as H
from tests.gpu import test_ep_tma as T

ENV = {"EPSCOPE_TEST_BUFFER": "tests.ep_core.reference_buffer:ReferenceBuffer"}
SMALL = dict(tokens=48, hidden=256, topk=4, experts=16)


def test_tma_gpu_scenarios_pass_on_the_reference():
    scs = [T.acceptance(1, 24, **SMALL), T.zero_rank(**SMALL), T.skewed(**SMALL)]
    jobs = [("run_acceptance", sc) for sc in scs] + [("run_reference_options", T.options(**SMALL))]
    out = run_ranks(ep_checks.run_many, 2, jobs, backend="gloo", timeout_s=300, env=ENV)
    per_job = [list(r) for r in zip(*out)]
    T.check_acceptance(per_job[0], scs[0])
    T.check_zero_rank(per_job[1], scs[1])
    T.check_skewed(per_job[2], scs[2])
    sc = T.one_gpu(**SMALL)
    T.check_one_gpu(run_ranks(ep_checks.run_acceptance, 1, sc, backend="gloo", timeout_s=300, env=ENV), sc)


def test_hook_gpu_scenarios_pass_on_the_reference():
    scs = H.scenarios(**SMALL)
    H.check_2gpu(run_ranks(ep_checks.run_many, 2, H.jobs(scs), backend="gloo", timeout_s=300, env=ENV), scs)
    sc = H.one_gpu(**SMALL)
    T.check_one_gpu(run_ranks(ep_checks.run_acceptance, 1, sc, backend="gloo", timeout_s=300, env=ENV), sc)


def test_hook_checks_catch_a_receive_that_never_ran():
    env = {"EPSCOPE_TEST_BUFFER": "tests.ep_core.reference_buffer:LostHookBuffer"}
    sc = H.scenarios(**SMALL)[0]
    with pytest.raises(RankFailed, match="differs from the reference|check 2|check 3"):
        run_ranks(ep_checks.run_acceptance, 2, sc, backend="gloo", timeout_s=300, env=env)


# -- benchmarks/gpu/tma_bench.py ------------------------------------------------------------------
def _bench_module():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu" / "tma_bench.py"
    import sys

    if "tma_bench" in sys.modules:
        return sys.modules["tma_bench"]
    spec = importlib.util.spec_from_file_location("tma_bench", path)
    m = sys.modules["tma_bench"] = importlib.util.module_from_spec(spec)  # dataclasses look their module up
    spec.loader.exec_module(m)
    return m


def test_tma_bench_runs_end_to_end_on_the_reference(tmp_path):
    """The whole script as the lead runs it, on a reference-backed Buffer over gloo with host
    clocks: validation, every timed configuration, both tables, the result files."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    cmd = [sys.executable, str(repo / "benchmarks/gpu/tma_bench.py"), "--timer", "wall", "--backend", "gloo",
           "--buffer", "tests.ep_core.reference_buffer:ReferenceBuffer", "--shape", "48,256,4,16", "--gemm-n", "32",
           "--iters", "2", "--hook-iters", "2", "--out", str(tmp_path)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=repo,
                         env={**__import__("os").environ, "PYTHONPATH": str(repo)})
    assert res.returncode == 0, res.stderr[-3000:]
    data = json.loads((tmp_path / "tma_bench.json").read_text())
    r0 = data["ranks"][0]
    assert r0["checks"] == [] and data["ranks"][1]["checks"] == []
    m = _bench_module()
    assert len(r0["rows"]) == 2 * len(m.SMS) * len(m.PATHS) * 3
    assert len(r0["hook_rows"]) == len(m.SMS) * 3 * (len(m.NORMAL_MODES) + 1)
    assert 1.4 < r0["ratio"] < 1.6, "the imbalance bisection lands near 1.5x at this shape too"
    md = (tmp_path / "tma_bench.md").read_text()
    assert "### Hook vs normal mode" in md and md in res.stdout


def test_op_metrics_counts_the_blocks_resident_while_copies_fly():
    m = _bench_module()
    E = m.Ev
    gemm = E("nvjet_gemm", 10, 1000)
    hook = [E("ep_core::notify::barrier_kernel<2>", 0, 5), E("ep_core::dispatch::dispatch_tma_kernel<2, 3>", 5, 50),
            E("Memcpy PtoP (Device -> Device)", 50, 150), E("ep_core::hook::signal_kernel<2>", 150, 152),
            E("ep_core::dispatch::dispatch_tma_kernel<2, 3>", 152, 200), gemm]
    got = m.op_metrics(hook, {"nvjet_gemm"}, 24)
    assert got == m.OpMetrics(ep_us=45 + 2 + 48, span_us=200, gemm_us=990, copies_us=100, sms_during_copies=0)
    # a pack still running when the copies start holds its 24 SMs; the signal kernel 1 on its own
    late = [E(h.name, h.start, 60 if i == 1 else h.end) for i, h in enumerate(hook)]
    assert m.op_metrics(late, {"nvjet_gemm"}, 24).sms_during_copies == 24
    normal = [E("ep_core::notify::barrier_kernel<2>", 0, 5), E("ep_core::dispatch::dispatch_kernel<2>", 5, 300), gemm]
    got = m.op_metrics(normal, {"nvjet_gemm"}, 24)
    assert (got.ep_us, got.span_us, got.copies_us, got.sms_during_copies) == (295, 300, 0, -1)
    # the kernel table's split by kind
    calls = [[E("ep_core::combine::combine_tma_kernel<2, 1>", 0, 7), E("x", 0, 100)]] * 3
    assert m.kernel_us(calls, "combine") == 7


def test_tma_summary_prints_the_tables_and_each_runs_idle_verdict(tmp_path, capsys):
    """tma_gpu.sh's last step on what a device call leaves: the 418ddf3 bench results, a pytest
    log, and a recorded run whose idle page alarms (the bundled starved-warps self-test)."""
    import shutil
    from pathlib import Path

    from benchmarks.gpu import tma_summary

    repo = Path(__file__).resolve().parents[2]
    shutil.copy(repo / "benchmarks/results/tma-2xH200-2026-11-30-418ddf3.json", tmp_path / "tma_bench.json")
    (tmp_path / "gpu_tests.log").write_text("....\n=== 14 passed, 1 skipped in 150.2s ===\n")
    (tmp_path / "stories.log").write_text("group ab-hook: op latency median A {} µs\n")
    shutil.copytree(repo / "traces/selftest-starved-warps", tmp_path / "traces/selftest-starved-warps")
    assert tma_summary.main(["--out", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "gpu_tests.log: 14 passed, 1 skipped" in text and "verdicts.log: not run" in text
    row = next(x for x in text.splitlines() if x.startswith("balanced") and "BF16 dispatch" in x and " 64 " in x)
    assert row.split()[4:6] == ["641", "("] and "614 (  190 µs)" in row, row    # direct ... tma N=3
    assert any(x.split()[:3] == ["64", "BF16", "dispatch"] and x.split()[3] == "hook" for x in text.splitlines())
    assert "selftest-starved-warps     idle ALARM starved warps" in text
    assert "group ab-hook" in text
