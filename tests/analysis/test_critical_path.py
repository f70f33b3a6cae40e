"""Critical path: hand-made graphs with a known longest chain, and synthetic runs with a planted pacer."""
import numpy as np

from profiler.analysis import critical_path
from profiler.groundtruth.expect import Cause
from profiler.store.schema import empty_events
from profiler.groundtruth.synthetic import make_events
from tests.analysis.tables import TEST_REGISTRY, barrier, host, instant, span, table


def _path(cp):
    return [tuple(r) for r in cp.segments[["rank", "warp", "phase", "kind", "begin_ns", "end_ns"]].itertuples(index=False)]


def test_wait_released_by_peer_puts_the_sender_on_the_path():
    ev = table([span(0, 0, 0, "send_chunk", 0, 100), instant(0, 0, 0, "publish_tail", 100, 1),
                span(1, 0, 0, "wait_data", 10, 120, 0), span(1, 0, 0, "copy_out", 120, 150)])
    cp = critical_path(ev, registry=TEST_REGISTRY)
    assert _path(cp) == [(0, 0, "send_chunk", "work", 0, 100), (1, 0, "wait_data", "wait", 100, 120),
                         (1, 0, "copy_out", "work", 120, 150)]
    assert cp.total_ns.iloc[0].tolist() == [0, 0, 150, 150]
    assert np.isclose(cp.segments["share"].sum(), 1.0)
    assert cp.pacing_rank == 0


def test_wait_that_began_after_the_release_stays_on_its_own_warp():
    ev = table([span(0, 0, 0, "send_chunk", 0, 10), instant(0, 0, 0, "publish_tail", 10, 1),
                span(1, 0, 0, "copy_out", 0, 100), span(1, 0, 0, "wait_data", 100, 105, 0),
                span(1, 0, 0, "copy_out", 105, 150)])
    cp = critical_path(ev, registry=TEST_REGISTRY)
    assert set(cp.segments["rank"]) == {1}
    assert cp.segments["begin_ns"].iloc[0] == 0
    assert cp.pacing_rank == 1


def test_barrier_last_arriver_paces_and_others_have_slack():
    rows = [span(0, 0, w, "copy_out", 0, e) for w, e in ((0, 30), (1, 80), (2, 50))]
    rows += barrier(0, 0, 0, "grid", 30, 90) + barrier(0, 0, 1, "grid", 80, 90) + barrier(0, 0, 2, "grid", 50, 90)
    rows += [span(0, 0, 0, "copy_out", 90, 100)]
    cp = critical_path(table(rows), registry=TEST_REGISTRY)
    assert _path(cp) == [(0, 1, "copy_out", "work", 0, 80), (0, 0, "grid", "barrier", 80, 90),
                         (0, 0, "copy_out", "work", 90, 100)]
    sl = cp.slack.set_index("warp")
    assert sl.loc[1, "slack_ns"] == 0 and sl.loc[1, "on_path"]
    assert sl.loc[2, "slack_ns"] == 30 and not sl.loc[2, "on_path"]   # arrived 30 ns before the last
    assert sl.loc[0, "busy_ns"] == 40


def test_host_enqueue_precedes_kernel_start():
    ev = table([host(0, "enqueue", 0, 40), span(0, 0, 0, "copy_out", 50, 60)])
    cp = critical_path(ev, registry=TEST_REGISTRY)
    assert _path(cp) == [(0, -1, "enqueue", "host", 0, 40), (0, 0, "", "launch", 40, 50),
                         (0, 0, "copy_out", "work", 50, 60)]


def test_iterations_are_separate_and_selectable():
    ev = table([span(0, 0, 0, "copy_out", 0, 10, iteration=0, launch=0),
                span(0, 0, 0, "copy_out", 20, 50, iteration=1, launch=1)])
    cp = critical_path(ev, registry=TEST_REGISTRY)
    assert cp.total_ns["total_ns"].tolist() == [10, 30]
    assert cp.segments.groupby("iteration")["duration_ns"].sum().tolist() == [10, 30]
    only = critical_path(ev, iteration=1, registry=TEST_REGISTRY)
    assert only.segments["iteration"].unique().tolist() == [1]
    assert only.total_ns["iteration"].tolist() == [1]


def test_empty_table():
    cp = critical_path(empty_events())
    assert cp.segments.empty and cp.slack.empty and cp.total_ns.empty and cp.pacing_rank == -1
    assert list(cp.segments.columns) == ["iteration", "rank", "kernel", "launch", "block", "warp", "role", "phase",
                                         "kind", "begin_ns", "end_ns", "duration_ns", "share", "peer", "unfinished"]


def test_path_is_contiguous_on_a_synthetic_run():
    ev, _, man = make_events(ranks=4, blocks=4, chunks=6, iterations=3, seed=1)
    cp = critical_path(ev, registry=man["registry"])
    for it, seg in cp.segments.groupby("iteration"):
        b, e = seg["begin_ns"].to_numpy(), seg["end_ns"].to_numpy()
        assert np.all(b[1:] == e[:-1])             # each segment starts where the previous ended
        tot = cp.total_ns.set_index("iteration").loc[it]
        assert e[-1] == tot["end_ns"] and b[0] >= tot["begin_ns"]


def test_slow_rank_paces_the_rendezvous():
    ev, _, man = make_events(ranks=4, blocks=4, chunks=8, iterations=2, scenario="slow_rank", slow_rank=2, seed=2)
    assert critical_path(ev, registry=man["registry"]).pacing_rank == 2
    ev, _, man = make_events(ranks=4, blocks=4, chunks=8, iterations=2, scenario="slow_rank", slow_rank=1, seed=2)
    assert critical_path(ev, registry=man["registry"]).pacing_rank == 1


def test_synchronising_host_call_waits_for_its_kernel():
    # one host call launches the kernel at some point after it begins and returns after it ends
    ev = table([host(0, "dispatch", 0, 200), span(0, 0, 0, "copy_out", 50, 150),
                host(0, "combine", 210, 260, kernel="combine", launch=1),
                span(0, 0, 0, "reduce", 270, 300, kernel="combine", launch=1)])
    cp = critical_path(ev, registry=TEST_REGISTRY)
    assert _path(cp) == [(0, 0, "", "launch", 0, 50), (0, 0, "copy_out", "work", 50, 150),
                         (0, -1, "dispatch", "host", 150, 200), (0, -1, "", "host", 200, 210),
                         (0, -1, "combine", "host", 210, 260), (0, 0, "", "launch", 260, 270),
                         (0, 0, "reduce", "work", 270, 300)]
    assert cp.segments["kernel"].tolist()[2:5] == ["dispatch", "dispatch", "combine"]


def _steps(host_ns: int, work_ns: int, ranks: int = 2, iterations: int = 3):
    """Each rank and iteration: a host call of host_ns, then its kernel's work_ns (no peer waits)."""
    rows = []
    for it in range(iterations):
        t0 = it * 10_000
        for r in range(ranks):
            rows.append(host(r, "enqueue", t0, t0 + host_ns, launch=it, iteration=it))
            rows.append(span(r, 0, 0, "copy_out", t0 + host_ns + 10, t0 + host_ns + 10 + work_ns, launch=it,
                             iteration=it))
    return table(rows)


def test_host_calls_that_are_most_of_the_path_on_every_rank_are_host_bound_with_no_rank():
    # 700 ns of host call before 200 ns of kernel on both ranks: host is ~77% of each iteration's path
    v = critical_path(_steps(700, 200), registry=TEST_REGISTRY).verdict
    assert (v.alarm, v.cause, v.rank, v.kernel) == (True, Cause.HOST_BOUND, None, None)
    assert "every rank's host" in v.headline
    # 200 ns of host before 700 ns of kernel: the GPU is the larger part: no alarm
    v = critical_path(_steps(200, 700), registry=TEST_REGISTRY).verdict
    assert not v.alarm and v.cause is Cause.NONE
