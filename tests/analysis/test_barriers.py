"""Barrier contention: occurrences, useless arrivals, last arriver, cross-rank view, verdict."""
from profiler.analysis import barrier_contention
from profiler.errors import UndeclaredPhases
from profiler.groundtruth.expect import Cause
from profiler.store.schema import empty_events
from profiler.groundtruth.synthetic import make_events
from tests.analysis.tables import TEST_REGISTRY, barrier, span, table


def test_occurrence_statistics_and_last_arriver():
    rows = [span(0, 0, 0, "copy_out", 0, 10), span(0, 0, 1, "copy_out", 0, 50), span(0, 1, 3, "copy_out", 0, 20)]
    rows += barrier(0, 0, 0, "grid", 10, 60) + barrier(0, 0, 1, "grid", 50, 61) + barrier(0, 1, 3, "grid", 20, 62)
    rows += barrier(0, 1, 2, "grid", 5, 63)                      # no work in the launch: useless
    r = barrier_contention(table(rows), registry=TEST_REGISTRY)
    o = r.occurrences.iloc[0]
    assert (o["rank"], o["barrier"], o["scope"], o["occurrence"]) == (0, "grid", "grid", 0)
    assert o["arrivals"] == 4 and o["useless_arrivals"] == 1
    assert (o["first_arrive_ns"], o["last_arrive_ns"], o["spread_ns"]) == (5, 50, 45)
    assert o["total_wait_ns"] == 50 + 11 + 42 + 58
    assert (o["last_rank"], o["last_block"], o["last_warp"]) == (0, 0, 1)
    assert o["lateness_ns"] == 30 and o["unfinished"] == 0        # the last (50) after the one before (20)
    s = r.summary.iloc[0]
    assert s["occurrences"] == 1 and s["last_warp"] == 1 and s["last_share"] == 1.0
    assert r.per_rank.empty


def test_useless_means_no_work_in_the_whole_launch():
    # warp 0 works, then meets warp 1 twice; warp 1 only waits: both its arrivals are useless (3
    # iterations alike: a decision needs more than one)
    rows = []
    for it in range(3):
        t, kw = 100 * it, dict(launch=it, iteration=it)
        rows.append(span(0, 0, 0, "copy_out", t, t + 10, **kw))
        for w in (0, 1):
            rows += (barrier(0, 0, w, "grid", t + 10, t + 20, occurrence=0, **kw)
                     + barrier(0, 0, w, "grid", t + 30, t + 40, occurrence=1, **kw))
        rows += [span(0, 0, 0, "wait_data", t + 20, t + 30, 1, **kw), span(0, 0, 1, "wait_data", t, t + 10, 1, **kw)]
    rep = barrier_contention(table(rows), registry=TEST_REGISTRY)
    occ = rep.occurrences[rep.occurrences["iteration"] == 0].set_index("occurrence")
    assert occ.loc[0, "useless_arrivals"] == 1 and occ.loc[1, "useless_arrivals"] == 1
    v = rep.verdict
    assert (v.alarm, v.cause, v.rank, v.kernel, v.phase) == (True, Cause.USELESS_ARRIVALS, 0, "dispatch", "grid")


def test_scope_comes_from_the_registry():
    rows = barrier(0, 0, 0, "block_sync", 1, 9) + barrier(0, 0, 1, "block_sync", 3, 9) + barrier(0, 1, 0, "block_sync", 7, 9)
    occ = barrier_contention(table(rows), registry=TEST_REGISTRY).occurrences
    assert sorted(occ["block"]) == [0, 1] and sorted(occ["arrivals"]) == [1, 2]
    # without a registry the barrier is per launch (scope grid), and the report says why
    rep = barrier_contention(table(rows))
    assert len(rep.occurrences) == 1 and rep.occurrences.iloc[0]["scope"] == "grid"
    assert any(isinstance(w, UndeclaredPhases) for w in rep.warnings)


def test_cross_rank_barrier_per_rank():
    rows = []
    for it in range(3):
        late = 2 if it < 2 else 0
        for r in range(3):
            t = 100 * it + (50 if r == late else 10 + r)
            rows += barrier(r, 0, 0, "rank_start", t, 100 * it + 60, iteration=it, launch=it)
    rep = barrier_contention(table(rows), registry=TEST_REGISTRY)
    assert (rep.occurrences["rank"] == -1).all() and len(rep.occurrences) == 3
    pr = rep.per_rank.set_index("rank")
    assert pr.loc[2, "times_last"] == 2 and pr.loc[0, "times_last"] == 1
    assert abs(pr.loc[2, "last_share"] - 2 / 3) < 1e-9
    assert pr.loc[2, "mean_lateness_ns"] == (40 + 40 + 1) / 3      # first arrivals: 10, 10, 211
    assert rep.occurrences["lateness_ns"].tolist() == [39, 39, 38]  # the last rank minus the rank before it
    # rank 2 arrives last at the kernel's first barrier because it entered late (its first record is
    # that arrival): the wait is the late entry's, not the barrier's (barriers.held_after_entry)
    assert rep.occurrences["held_ns"].tolist() == [0, 0, 0]
    # it holds the others 40 ns in two iterations of ~50 ns and waits 38 ns for rank 0 in the third:
    # the interval of its mean net late-entry wait (-72% to 127%) straddles the alarm share, so the
    # late entry is borderline, stated with both numbers, and no alarm (decision.decide)
    v = rep.verdict
    assert not v.alarm and v.cause is Cause.NONE
    assert any(n.startswith("borderline late entry: rank 2") for n in v.notes), v.notes


def test_cross_rank_barrier_straggler_every_iteration_is_an_alarm():
    rows = []
    for it in range(3):
        for r in range(3):
            t = 100 * it + (50 if r == 2 else 10 + r)
            rows += barrier(r, 0, 0, "rank_start", t, 100 * it + 60, iteration=it, launch=it)
    v = barrier_contention(table(rows), registry=TEST_REGISTRY).verdict
    assert (v.alarm, v.cause, v.rank, v.kernel, v.phase, v.n) == (True, Cause.BARRIER_STRAGGLER, 2, "dispatch",
                                                                   "rank_start", 3)
    # rank 2's warps arrive as soon as it enters: the others waited for its entry, the late-entry
    # decision's wait (rank 0, first in at 10, waited 40 ns for rank 2 at 50), named here as the rank
    # that arrives last at the cross-rank barrier
    assert v.late_entry is not None and v.magnitude_ns == 40


def test_empty_table():
    rep = barrier_contention(empty_events())
    assert rep.occurrences.empty and rep.summary.empty and rep.per_rank.empty
    assert rep.verdict.cause is Cause.NONE and not rep.verdict.alarm


def test_synthetic_late_arriver_truth():
    ev, _, man = make_events(ranks=4, blocks=6, chunks=3, iterations=2, scenario="late_arriver",
                             late_rank=3, late_block=4, late_warp=6, seed=7)
    rep = barrier_contention(ev, registry=man["registry"])
    s = rep.summary.set_index(["rank", "kernel", "barrier"])
    row = s.loc[(3, "dispatch", "grid")]
    assert (row["last_rank"], row["last_block"], row["last_warp"], row["last_share"]) == (3, 4, 6, 1.0)
    v = rep.verdict
    assert (v.alarm, v.cause, v.rank, v.kernel, v.phase) == (True, Cause.BARRIER_STRAGGLER, 3, "dispatch", "grid")


def _send_done(useless_warps: bool, work_ns: int = 100, after_ns: int = 400, iterations: int = 3):
    """One launch an iteration, every iteration alike: warps 0-1 send (0..work_ns) then meet at grid
    barrier 0; warps 2-3 have no send task and, with useless_warps, arrive at it at once; then every
    warp receives for after_ns."""
    rows = []
    for it in range(iterations):
        t, kw = 100_000 * it, dict(launch=it, iteration=it)
        for w in range(4):
            sends = w < 2
            if sends:
                rows.append(span(0, 0, w, "send_chunk", t, t + work_ns, **kw))
            if sends or useless_warps:
                rows += barrier(0, 0, w, "grid", t + (work_ns if sends else 0), t + work_ns + 10, **kw)
            start = t + (work_ns + 10 if (sends or useless_warps) else 0)
            rows.append(span(0, 0, w, "copy_out", start, start + after_ns, **kw))
    return table(rows)


def test_an_arrival_that_brought_no_work_since_it_last_synchronised_is_useless():
    # warps 2-3 work later in the launch (copy_out), but bring nothing to the barrier: useless; they
    # are held 110 ns of a 510 ns op (22% >= 5%)
    rep = barrier_contention(_send_done(True), registry=TEST_REGISTRY)
    o = rep.occurrences.iloc[0]
    assert o["arrivals"] == 4 and o["useless_arrivals"] == 2
    v = rep.verdict
    assert (v.alarm, v.cause, v.kernel, v.phase, v.rank) == (True, Cause.USELESS_ARRIVALS, "dispatch", "grid", 0)
    assert v.magnitude_ns == 110 and v.reference_ns == 510
    # only the warps with work arrive: nothing useless, no alarm
    rep = barrier_contention(_send_done(False), registry=TEST_REGISTRY)
    assert rep.occurrences.iloc[0]["useless_arrivals"] == 0 and not rep.verdict.alarm


def test_useless_arrivals_held_briefly_are_a_note():
    # held 510 ns of a 20,510 ns op (2.5%): stated, not an alarm
    rep = barrier_contention(_send_done(True, work_ns=500, after_ns=20_000), registry=TEST_REGISTRY)
    assert rep.occurrences.iloc[0]["useless_arrivals"] == 2
    v = rep.verdict
    assert not v.alarm and any("useless arrivals at dispatch/grid" in n and "not material" in n for n in v.notes)


def test_one_stray_useless_arrival_among_many_is_a_note():
    # 40 warps send then meet; one more warp arrives with nothing and is held as long (110 ns of a
    # 510 ns op, 22%): 1 of 41 arrivals (2.4% < 5%) costs the working warps nothing: a note
    rows = []
    for it in range(3):
        t, kw = 100_000 * it, dict(launch=it, iteration=it)
        for w in range(41):
            if w < 40:
                rows.append(span(0, 0, w, "send_chunk", t, t + 100, **kw))
            rows += barrier(0, 0, w, "grid", t + (100 if w < 40 else 0), t + 110, **kw)
            rows.append(span(0, 0, w, "copy_out", t + 110, t + 510, **kw))
    rep = barrier_contention(table(rows), registry=TEST_REGISTRY)
    assert rep.occurrences.iloc[0]["useless_arrivals"] == 1
    v = rep.verdict
    assert not v.alarm and any("useless arrivals at dispatch/grid" in n and "not material" in n for n in v.notes)


def test_work_before_an_earlier_barrier_is_not_brought_to_the_next():
    # both warps work, meet at occurrence 0; then warp 0 works again and warp 1 does not before
    # occurrence 1: warp 1's second arrival is useless, its first is not
    rows = [span(0, 0, 0, "copy_out", 0, 100), span(0, 0, 1, "copy_out", 0, 100)]
    rows += barrier(0, 0, 0, "grid", 100, 110, occurrence=0) + barrier(0, 0, 1, "grid", 100, 110, occurrence=0)
    rows += [span(0, 0, 0, "copy_out", 110, 300)]
    rows += barrier(0, 0, 0, "grid", 300, 310, occurrence=1) + barrier(0, 0, 1, "grid", 110, 310, occurrence=1)
    occ = barrier_contention(table(rows), registry=TEST_REGISTRY).occurrences.set_index("occurrence")
    assert occ.loc[0, "useless_arrivals"] == 0 and occ.loc[1, "useless_arrivals"] == 1


def test_a_barrier_no_arrival_brings_work_to_calls_nothing_useless():
    # every warp meets at the kernel's entry before any work (the barrier orders something the
    # events do not show): no arrival there is useless
    rows = []
    for w in range(3):
        rows += barrier(0, 0, w, "grid", w, 10)
        rows.append(span(0, 0, w, "copy_out", 10, 100))
    rep = barrier_contention(table(rows), registry=TEST_REGISTRY)
    assert rep.occurrences.iloc[0]["useless_arrivals"] == 0 and not rep.verdict.alarm
