"""The plan and expect blocks of the low-latency A/B story recordings (benchmarks/gpu/ll_stories.py),
on the CPU: one story per knob, sides that differ in that knob only, interleaved replicates, and
expect blocks that profiler.expect accepts and that name the knob, kernel and direction."""
from __future__ import annotations

import pytest

from benchmarks.gpu import ll_stories as S
from ep_core.low_latency import LowLatencyConfig
from profiler.expect import Cause, Effect, Expect


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
