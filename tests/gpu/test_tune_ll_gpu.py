"""The low-latency side of the ab/tune worker (profiler/workflows/ab_worker.py LowLatencySide) on 2 GPUs,
driven by profiler.workflows.rounds as `epscope tune --ll` drives it: the bit-for-bit check of two grids
against the defaults, and timing rounds of each."""
from pathlib import Path

import pytest

from profiler.workflows import rounds, tune_ll
from profiler.workflows.ab_worker import LL_METRICS
from ep_core.low_latency import LowLatencyConfig

pytestmark = [pytest.mark.gpu, pytest.mark.multigpu]
ROOT = Path(__file__).resolve().parents[2]


def test_low_latency_rounds_on_two_gpus(tmp_path):
    shape = tune_ll.LLShape(2, 7168, 8, 256, "fp8", 0)
    inputs = tune_ll.write_inputs(tmp_path / "inputs", shape, 64)
    ref = LowLatencyConfig().to_dict()
    others = {"b32-w8": LowLatencyConfig(num_blocks=32, warps_per_block=8).to_dict(),
              "slice-8": LowLatencyConfig(min_slice_groups=8).to_dict()}
    with rounds.WorkerSet("tune-ll", ROOT, 2, inputs, tmp_path / "logs", env={"EPSCOPE_TUNED_TABLE": "off"},
                          profile=False) as ws:
        assert all(r["gpu"] for r in ws.start(timeout_s=900))
        for T in (16, 64):
            reps = ws.request({"cmd": "ll_check", "tokens": T, "reference": ref, "configs": others}, timeout_s=120)
            assert [r["differ"] for r in reps] == [{}, {}]
        for i, cfg in enumerate([ref, *others.values()]):
            s = rounds.slowest_rank(ws.request({"cmd": "ll_round", "round": i, "warmup": 2, "iters": 6, "tokens": 64,
                                                "configs": {"ll_dispatch": cfg, "ll_combine": cfg}}, timeout_s=120),
                                    LL_METRICS)
            assert all(len(s[m]) == 6 for m in LL_METRICS), s
            for it in range(6):
                assert 0 < s["ll_dispatch"][it] < 5000 and 0 < s["ll_combine"][it] < 5000
                # the pair spans both calls on one stream (slowest rank per metric: a little slack)
                assert s["ll_op"][it] >= 0.99 * max(s["ll_dispatch"][it], s["ll_combine"][it])
