"""The real ab/tune worker (profiler/workflows/ab_worker.py) on 2 GPUs, driven by profiler.workflows.rounds as `epscope
ab` drives it: a timing round with the tree's default config, one with explicit configs, and a
profiled round whose run directory opens and is tagged."""
from pathlib import Path

import pytest

from profiler.workflows import rounds
from ep_core.config import Problem, op_configs

pytestmark = [pytest.mark.gpu, pytest.mark.multigpu]
ROOT = Path(__file__).resolve().parents[2]


def test_worker_rounds_on_two_gpus(tmp_path):
    p = Problem(512, 2048, 8, 64, 2)
    inputs = rounds.write_inputs(tmp_path / "inputs", p, "uniform", 0)
    d, c = op_configs(2, 24)
    with rounds.WorkerSet("A", ROOT, 2, inputs, tmp_path / "logs", env={"EPSCOPE_GIT_COMMIT": "feedface"}) as ws:
        ready = ws.start(timeout_s=900)
        assert all(r["gpu"] for r in ready)
        base = {"cmd": "round", "warmup": 2, "iters": 5, "num_sms": None, "profile": None}
        for i, configs in enumerate((None, {"dispatch": d.to_dict(), "combine": c.to_dict()})):
            s = rounds.slowest_rank(ws.request({**base, "round": i, "configs": configs}, timeout_s=300))
            assert all(len(s[m]) == 5 for m in rounds.METRICS), s
            for it in range(5):
                assert 0 < s["dispatch"][it] and 0 < s["combine"][it]
                # the op spans its three calls on one stream: never shorter than their sum, less slack
                assert s["op"][it] >= 0.99 * (s["layout"][it] + s["dispatch"][it] + s["combine"][it]) - 5.0
        prof = {"out": str(tmp_path / "runs"), "name": "ab-A-r2", "description": "gpu test", "capacity": 512,
                "workload": {"kind": "ep", **p.to_dict(), "ab": {"side": "A", "round": 2}}}
        reps = ws.request({**base, "round": 2, "iters": 2, "configs": None, "profile": prof}, timeout_s=300)
    from profiler.store.runstore import load_run

    run = load_run(reps[0]["run_dir"])
    assert run.manifest["status"] == "ok" and run.manifest["git"]["commit"] == "feedface"
    assert run.manifest["workload"]["ab"] == {"side": "A", "round": 2}
    assert {"dispatch", "combine"} <= set(run.launches["kernel"].astype(str))
