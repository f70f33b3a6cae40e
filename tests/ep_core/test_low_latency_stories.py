"""The plan and expect blocks of the low-latency A/B story recordings (benchmarks/gpu/ll_stories.py),
on the CPU: one story per knob, sides that differ in that knob only, interleaved replicates, and
expect blocks that profiler.groundtruth.expect accepts and that name the knob, kernel and direction."""
from __future__ import annotations

import pytest

from benchmarks.gpu import ll_stories as S
from ep_core.low_latency import LowLatencyConfig
from profiler.groundtruth.expect import Cause, Effect, Expect


def test_one_story_per_knob():
    assert sorted(s.knob for s in S.STORIES) == sorted(LowLatencyConfig.KNOBS)
    assert len({s.key for s in S.STORIES}) == len(S.STORIES)


def test_sides_differ_in_their_knob_only_and_runs_are_interleaved():
    runs = S.plan()
    assert len(runs) == len(S.STORIES) * 2 * S.REPLICATES
    assert len({r.name for r in runs}) == len(runs)
    new = LowLatencyConfig().to_dict()
    for r in runs:
        cfg = r.config_dict()
        diff = {k for k in cfg if cfg[k] != new[k]}
        assert diff == ({r.story.knob} if r.side == "A" else set()), r.name
        assert r.knob_value() == (LowLatencyConfig.OLD[r.story.knob] if r.side == "A" else new[r.story.knob])
    # A0 B0 of every story, then A1 B1, ...: replicates never run back to back on one side
    reps = [r.replicate for r in runs]
    assert reps == sorted(reps)
    for i in range(0, len(runs), 2):
        assert (runs[i].side, runs[i + 1].side) == ("A", "B") and runs[i].story is runs[i + 1].story
    assert [r.name for r in S.plan(only=("ll-host",), replicates=1)] == ["ll-host-a0", "ll-host-b0"]


@pytest.mark.parametrize("story", S.STORIES, ids=lambda s: s.key)
def test_expect_blocks_round_trip_and_name_the_knob(story):
    for side in ("A", "B"):
        run = S.PlannedRun(story, side, 1)
        exp = S.expect_for(run, Effect("op_latency_change", -0.1, "fraction"), {"checks": []}, "test")
        back = Expect.from_json(exp.to_json())
        assert back == exp
        c = back.comparison
        assert (c.group, c.side, c.replicate, c.outcome, c.knob) == (story.key, side, 1, Cause.KNOB_CHANGE,
                                                                       story.knob)
        assert c.value == run.knob_value() and c.direction is story.direction
        assert back.cause is (story.cause_a if side == "A" else story.cause_b)
    # the old side of every story but the load order plants a cause the single-run pages can name
    assert story.cause_a is not Cause.NONE or story.knob == "loads"


def test_plan_command_needs_no_gpu(capsys):
    assert S.main(["--plan", "--replicates", "1"]) == 0
    out = capsys.readouterr().out
    assert "ll-split-a0" in out and "split='per_block'" in out and "expect starved_warps" in out


def test_host_story_measures_the_step_period_not_the_span_from_a_host_that_runs_ahead():
    import pandas as pd

    # two ranks, 4 steps whose last kernels end every 200 us (rank 1 every 210 us); the host calls
    # run further ahead each step, which must not move the measure
    rows = []
    for r, period in ((0, 200_000), (1, 210_000)):
        for it in range(4):
            end = 1_000_000 + it * period
            rows.append(dict(rank=r, iteration=it, kernel="ll_combine", gpu_begin_ns=end - 20_000, gpu_end_ns=end,
                             host_begin_ns=100_000 + it * 50_000))
    got = S._op_latency_us(pd.DataFrame(rows), None)
    assert got.tolist() == [210.0, 210.0, 210.0]
    k = S._op_latency_us(pd.DataFrame(rows), "ll_combine")
    assert k.tolist() == [20.0] * 4


# -- issue 24: upstream GPU work in decode steps ----------------------------------------------------
def _decode_launches(late_us=0.0, host_late=False, steps=4, late_rank=0):
    """Two ranks' decode steps (ll_dispatch 30 us, 20 us of GPU work, ll_combine 30 us, 100 us a
    step). `late_rank`'s dispatch starts late_us late: queued behind its GEMM (its host called
    5 us into the step), or with host_late its host called late."""
    import pandas as pd

    rows, launch = [], {0: 0, 1: 0}
    for it in range(steps):
        t = 1_000_000 + it * 300_000
        for r in (0, 1):
            lag = int(late_us * 1e3) if r == late_rank else 0
            host = t + 5_000 + (lag if host_late else 0)
            d0 = t + 10_000 + lag
            c0 = d0 + 50_000
            for k, b, e in (("ll_dispatch", d0, d0 + 30_000), ("ll_combine", c0, c0 + 30_000)):
                rows.append(dict(rank=r, launch=launch[r], kernel=k, iteration=it, host_begin_ns=host,
                                 host_end_ns=host + 3_000, gpu_begin_ns=b, gpu_end_ns=e, regions=1, dropped=0))
                launch[r] += 1
    return pd.DataFrame(rows)


def test_upstream_gemm_story_plan_names_the_larger_gemm_as_late(capsys):
    u = S.plan_upstream()[0]
    assert (u.name, u.late_rank, u.n(0), u.n(1), u.n(3)) == ("ll-upstream-gemm", 0, 4096, 1024, 0)
    assert S.plan_upstream(("ll-host",)) == [] and S.plan(("ll-upstream-gemm",)) == []
    assert S.main(["--plan", "--only", "ll-upstream-gemm"]) == 0
    out = capsys.readouterr().out
    assert "ll-upstream-gemm" in out and "late entry gpu" in out and "ll-split" not in out


def test_upstream_gemm_expect_is_a_material_gpu_side_late_entry():
    u = S.UPSTREAM[0]
    gemm = {0: [201.0, 199.0, 200.0], 1: [5.0, 5.2, 4.8]}
    exp, checks = S.upstream_expect(u, _decode_launches(late_us=195.0), gemm, "cmd")
    assert [c["what"] for c in checks if not c["ok"]] == []
    assert (exp.cause, exp.rank, exp.late_entry) == (Cause.RANK_IMBALANCE, 0, "gpu")
    assert (exp.effect.metric, exp.effect.value) == ("upstream_gemm_extra_us", 195.0)
    assert Expect.from_json(exp.to_json()) == exp
    # the same lateness from the host is not upstream GPU work
    _, checks = S.upstream_expect(u, _decode_launches(late_us=195.0, host_late=True), gemm, "cmd")
    assert [c["what"] for c in checks if not c["ok"]] == [
        "rank 0's host called ll_dispatch before the other rank's GPU entered it (steps)"]
    # GEMMs measured, no late entry recorded: not ground truth
    _, checks = S.upstream_expect(u, _decode_launches(), gemm, "cmd")
    failed = [c["what"] for c in checks if not c["ok"]]
    assert failed[0].startswith("rank 0's GPU entry lag at ll_dispatch") and \
        failed[-1] == "the late entry is material (cause, side from the median measured share)"


def test_upstream_facts_round_trip_for_checks_only(tmp_path):
    per_rank = [[{"run": "ll-split-a0", "path": None}, {"run": "ll-upstream-gemm", "rank": 0, "upstream_gemm_us": [200.0]}],
                [{"run": "ll-upstream-gemm", "rank": 1, "upstream_gemm_us": [5.0]}]]
    S.save_upstream_facts(per_rank, tmp_path)
    import json
    assert json.loads((tmp_path / S.UPSTREAM_FACTS).read_text()) == {"ll-upstream-gemm": {"0": [200.0], "1": [5.0]}}
