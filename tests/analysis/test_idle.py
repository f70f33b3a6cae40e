"""Idle warps: busy/idle accounting, imbalance and the named verdict."""
import numpy as np

from profiler.analysis import idle_warps
from profiler.groundtruth.expect import Cause
from profiler.store.schema import empty_events
from profiler.groundtruth.synthetic import make_events
from tests.analysis.tables import TEST_REGISTRY, SELFTEST_REGISTRY, barrier, span, table


def _starved(blocks=8, working_blocks=2, warps=2):
    rows = []
    for b in range(blocks):
        for w in range(warps):
            if b < working_blocks:
                rows.append(span(1, b, w, "wait_data", 0, 20, 0))
                rows.append(span(1, b, w, "copy_out", 20, 100))
                rows += barrier(1, b, w, "grid", 100, 110)
            else:
                rows += barrier(1, b, w, "grid", 5, 110)    # only arrived to be released
    return table(rows)


def test_verdict_names_the_idle_blocks_and_the_working_warps():
    r = idle_warps(_starved(), registry=TEST_REGISTRY)
    v = r.verdict
    assert (v.alarm, v.cause, v.rank, v.kernel, v.n) == (True, Cause.STARVED_WARPS, 1, "dispatch", 12)
    assert v.detail == "rank 1 dispatch: blocks 2–7 did no work; 4 warps carried all work"
    pw = r.per_warp.set_index(["block", "warp"])
    assert pw.loc[(0, 0), "busy_ns"] == 80 and pw.loc[(0, 0), "wait_ns"] == 30
    assert pw.loc[(0, 0), "kernel_ns"] == 110 and pw.loc[(0, 0), "idle_ns"] == 30
    assert np.isclose(pw.loc[(0, 0), "busy_share"], 80 / 110)
    assert not pw.loc[(5, 1), "did_work"] and pw.loc[(5, 1), "busy_ns"] == 0
    pb = r.per_block.set_index("block")
    assert pb.loc[1, "working_warps"] == 2 and not pb.loc[7, "did_work"]
    assert len(r.evidence) == 16 and set(r.evidence["rank"]) == {1}


def test_idle_warps_inside_working_blocks_are_listed():
    rows = []
    for b in range(4):
        for w in range(4):
            if w < 2:
                rows.append(span(0, b, w, "copy_out", 0, 100))
            else:
                rows.append(span(0, b, w, "wait_data", 0, 100, 1))
    r = idle_warps(table(rows), registry=TEST_REGISTRY)
    assert r.verdict.cause is Cause.STARVED_WARPS
    assert r.verdict.detail == "rank 0 dispatch: 8 warps did no work (warps 2–3 of blocks 0–3); 8 warps carried all work"


def test_idle_phase_is_not_work_and_nesting_counts_once():
    rows = [span(0, 0, 0, "iteration", 0, 100), span(0, 0, 0, "work", 0, 90),
            span(0, 0, 1, "iteration", 0, 100), span(0, 0, 1, "idle", 0, 100)]
    r = idle_warps(table(rows), registry=SELFTEST_REGISTRY)
    pw = r.per_warp.set_index("warp")
    assert pw.loc[0, "busy_ns"] == 100           # work 90 + the parent's own 10, not 190
    assert pw.loc[1, "busy_ns"] == 0 and not pw.loc[1, "did_work"]
    assert r.verdict.cause is Cause.STARVED_WARPS and "warp 1 of block 0" in r.verdict.detail


def test_imbalance_ratio_and_balanced_verdict():
    rows = [span(0, 0, w, "copy_out", 0, d, role="receiver") for w, d in enumerate((100, 100, 100, 300))]
    r = idle_warps(table(rows), registry=TEST_REGISTRY)
    im = r.imbalance.iloc[0]
    assert im["max_busy_ns"] == 300 and im["median_busy_ns"] == 100 and np.isclose(im["ratio"], 3.0)
    # one warp busier than its siblings is worth a note, not an alarm: nobody starved
    assert not r.verdict.alarm and any("3.00×" in n for n in r.verdict.notes)
    r = idle_warps(table(rows[:3]), registry=TEST_REGISTRY)
    assert r.verdict.cause is Cause.NONE and r.verdict.detail.startswith("every warp did work")
    assert r.verdict.notes == ()


def test_empty_table():
    r = idle_warps(empty_events())
    assert r.per_warp.empty and r.verdict.detail == "no GPU warps in the run" and not r.verdict.alarm


def test_synthetic_starvation_truth():
    ev, _, man = make_events(ranks=4, blocks=12, chunks=3, iterations=2, scenario="starvation",
                             starved_rank=2, active_blocks=3, seed=4)
    t = man["synthetic"]
    r = idle_warps(ev, registry=man["registry"])
    v = r.verdict
    lo, hi = t["idle_blocks"]
    assert (v.cause, v.rank) == (Cause.STARVED_WARPS, t["starved_rank"])
    assert f"blocks {lo}–{hi} did no work; {t['working_warps']} warps carried all work" in v.detail


def test_kernels_without_work_on_any_rank_are_not_called_starved():
    rows = [span(0, 0, 0, "copy_out", 0, 100), span(0, 0, 1, "copy_out", 0, 100)]
    rows += barrier(0, 0, 0, "rank_start", 200, 210, kernel="barrier", launch=1)
    r = idle_warps(table(rows), registry=TEST_REGISTRY)
    assert not r.verdict.alarm and r.verdict.detail.startswith("every warp of the kernels that record work did work")
    assert not r.per_warp.set_index("kernel").loc["barrier", "did_work"]


def test_warps_that_recorded_nothing_count_when_the_launch_table_says_they_existed():
    import pandas as pd
    # 4 blocks x 2 warps launched; only block 0 recorded anything (the others had no chunk)
    ev = table([span(0, 0, w, "copy_out", 0, 100) for w in (0, 1)])
    launches = pd.DataFrame({"rank": [0], "launch": [0], "kernel": ["dispatch"], "iteration": [0],
                             "host_begin_ns": [-1], "host_end_ns": [-1], "gpu_begin_ns": [0], "gpu_end_ns": [100],
                             "regions": [8], "dropped": [0]})
    r = idle_warps(ev, registry=TEST_REGISTRY, launches=launches)
    assert len(r.per_warp) == 8 and int((~r.per_warp["did_work"]).sum()) == 6
    assert r.verdict.cause is Cause.STARVED_WARPS
    assert r.verdict.detail == "rank 0 dispatch: blocks 1–3 did no work; 2 warps carried all work"
    assert len(idle_warps(ev, registry=TEST_REGISTRY).per_warp) == 2          # without it: what was recorded


def test_the_top_warps_of_every_block_that_recorded_nothing_count_too():
    import pandas as pd
    # 2 blocks x 4 warps launched (8 regions); warps 0-2 of both blocks recorded: the largest warp
    # index + 1 (3) does not divide the regions, the blocks recorded (2) do: 4 warps per block
    ev = table([span(0, b, w, "copy_out", 0, 100) for b in (0, 1) for w in (0, 1, 2)])
    launches = pd.DataFrame({"rank": [0], "launch": [0], "kernel": ["dispatch"], "iteration": [0],
                             "host_begin_ns": [-1], "host_end_ns": [-1], "gpu_begin_ns": [0], "gpu_end_ns": [100],
                             "regions": [8], "dropped": [0]})
    r = idle_warps(ev, registry=TEST_REGISTRY, launches=launches)
    assert len(r.per_warp) == 8
    assert r.verdict.detail == "rank 0 dispatch: 2 warps did no work (warp 3 of blocks 0–1); 6 warps carried all work"


def _two_ranks(extra_ns: int, op_ns: int = 1000, warps: int = 4, iterations: int = 3):
    """Rank 0's receivers copy 1.5x rank 1's over the same spans (4 warps each, one launch an
    iteration, every iteration alike); the kernel lasts op_ns on both ranks; rank 0's busiest
    receiver works extra_ns longer than rank 1's."""
    rows = []
    for it in range(iterations):
        t = 10 * op_ns * it
        for r, d in ((0, 100 + extra_ns), (1, 100)):
            for w in range(warps):
                rows.append(span(r, 0, w, "copy_out", t, t + d, role="receiver", launch=it, iteration=it))
            rows.append(span(r, 1, 0, "notify", t, t + op_ns, role="sender", launch=it, iteration=it))   # its length
    return table(rows)


def test_an_imbalance_that_costs_the_op_little_is_a_note():
    # receivers busy 4 x 200 against 4 x 100: ratio 800 / 400 (the other rank) = 2.0; balanced, each
    # rank's receivers would do 150 ns: balancing saves rank 0's warps 50 ns, of a 1000 ns op (5%:
    # material, every iteration alike: the interval is that point), then of a 2000 ns op (2.5%: a
    # note). Nobody waits on rank 0 (its sender warp, the kernel's busiest, ends with rank 1's).
    v = idle_warps(_two_ranks(100), registry=TEST_REGISTRY).verdict
    assert (v.alarm, v.cause, v.rank, v.ratio) == (True, Cause.RANK_IMBALANCE, 0, 2.0)
    assert v.magnitude_ns == 50 and v.reference_ns == 1000 and v.reference == "the op latency after entry"
    v = idle_warps(_two_ranks(100, op_ns=2000), registry=TEST_REGISTRY).verdict
    assert (v.alarm, v.cause) == (False, Cause.NONE)
    assert any(n.startswith("not material: rank 0 carries 2.00× the other ranks' receiver work") for n in v.notes)
    # one iteration says nothing about the next: never an alarm, borderline at the threshold
    v = idle_warps(_two_ranks(100, iterations=1), registry=TEST_REGISTRY).verdict
    assert not v.alarm and any(n.startswith("borderline: rank 0 carries") for n in v.notes)


def test_op_latency_is_the_slowest_ranks_kernel_time_without_host_gaps():
    from profiler.analysis import graph as G
    from profiler.analysis.imbalance import op_latency
    from tests.analysis.tables import host
    rows = [host(0, "dispatch", 0, 5000), span(0, 0, 0, "copy_out", 5000, 5100),
            span(0, 0, 0, "copy_out", 9000, 9300, kernel="combine", launch=1),
            span(1, 0, 0, "copy_out", 100, 600)]
    op = op_latency(G.build(table(rows), TEST_REGISTRY))
    assert op.to_dict("records") == [{"iteration": 0, "op_ns": 500}]      # rank 0: 100 + 300; rank 1: 500


def test_balancing_projection_with_no_iteration_re_timed_is_nan_without_a_warning(monkeypatch):
    """A what-if that re-timed no iteration (every op change NaN: no op latency to re-time) gives
    no mean change, quietly: the all-NaN nanmean warned in the suite's property test (issue 34)."""
    import types
    import warnings

    import pandas as pd

    from profiler.analysis import idle as I
    busy = pd.DataFrame({"kernel": ["dispatch"] * 2, "phase": ["copy_out"] * 2, "rank": [0, 1],
                         "busy_ns": [300.0, 100.0]})
    monkeypatch.setattr(I.IM, "phase_busy", lambda g: busy)
    summary = pd.DataFrame({"op_change_ns": [float("nan"), float("nan")]})
    monkeypatch.setattr(I, "what_if", lambda *a, **k: types.SimpleNamespace(summary=summary))
    g = types.SimpleNamespace(events=None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        phase, speedup, change = I.balancing_projection(g, {"where": [("dispatch", "copy_out")]}, 0)
        assert (phase, speedup) == ("dispatch/copy_out", round(1 - 200 / 300, 3)) and np.isnan(change)
        summary.loc[0, "op_change_ns"] = -50.0
        assert I.balancing_projection(g, {"where": [("dispatch", "copy_out")]}, 0)[2] == -50.0
