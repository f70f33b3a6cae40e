"""The dependency graph: segment ownership under nesting, cross edges, semantics from the
registry only, re-timing identity."""
import numpy as np
import pytest

from profiler.analysis import graph as G
from profiler.analysis import retime as RT
from profiler.analysis.keys import ranges
from profiler.errors import InvalidRegistry, UndeclaredPhases
from tests.analysis.tables import TEST_REGISTRY, SELFTEST_REGISTRY, barrier, instant, span, table


def _seg(g, t_end):
    """(kind, phase) of the segment ending at time t_end on the first lane that has such a point."""
    p = int(np.flatnonzero(g.pt_t == t_end)[0])
    ph = g.seg_phase[p]
    return G.SEG_KINDS[g.seg_kind[p]], (g.phase_names[ph] if ph >= 0 else "")


def test_nested_child_owns_its_time_and_parent_the_rest():
    # send_chunk [0, 100] contains wait_space [0, 40] (same begin: the longer one is the parent)
    ev = table([span(0, 0, 0, "send_chunk", 0, 100), span(0, 0, 0, "wait_space", 0, 40, 1)])
    g = G.build(ev, TEST_REGISTRY)
    assert _seg(g, 40) == ("wait", "wait_space")
    assert _seg(g, 100) == ("work", "send_chunk")


def test_three_levels_and_gaps():
    ev = table([span(0, 0, 0, "iteration", 0, 100), span(0, 0, 0, "work", 10, 50),
                span(0, 0, 0, "idle", 20, 30), span(0, 0, 0, "iteration", 120, 130)])
    g = G.build(ev, SELFTEST_REGISTRY)
    assert _seg(g, 10) == ("work", "iteration")
    assert _seg(g, 20) == ("work", "work")
    assert _seg(g, 30) == ("idle", "idle")
    assert _seg(g, 50) == ("work", "work")
    assert _seg(g, 100) == ("work", "iteration")
    assert _seg(g, 120) == ("gap", "")


def test_wait_links_to_latest_matching_release_before_its_end():
    ev = table([
        instant(0, 0, 0, "publish_tail", 50, 1),     # signals rank 1: candidate
        instant(0, 0, 0, "publish_tail", 70, 2),     # signals rank 2: wrong target
        instant(0, 0, 0, "publish_tail", 130, 1),    # after the wait ended: not the release
        span(1, 0, 0, "wait_data", 10, 90, 0),
        span(1, 0, 0, "copy_out", 90, 100),
    ])
    g = G.build(ev, TEST_REGISTRY)
    p_end = int(np.flatnonzero((g.pt_t == 90) & (g.lane["rank"].to_numpy()[g.pt_lane] == 1))[0])
    assert g.src[p_end] >= 0 and g.pt_t[g.src[p_end]] == 50
    assert g.binding[p_end]          # released after the wait began
    assert g.lat[p_end] == 40


def test_semantics_come_from_the_registry_only():
    ev = table([instant(0, 0, 0, "publish_head", 50, 1), span(1, 0, 0, "wait_space", 10, 60, 0),
                span(1, 0, 0, "idle_loop", 60, 70)] + barrier(1, 0, 0, "rank_x", 70, 80))
    g = G.build(ev, None)
    # no registry: no name makes a phase a wait, idle, or a barrier cross-rank
    p_end = int(np.flatnonzero(g.pt_t == 60)[0])
    assert g.src[p_end] < 0 and _seg(g, 60) == ("work", "wait_space") and _seg(g, 70) == ("work", "idle_loop")
    assert g.sem.scope("rank_x") == "grid"
    (w,) = g.warnings
    assert isinstance(w, UndeclaredPhases) and w.count == 4
    assert "wait_space" in w.detail and "rank_x" in w.detail
    # the same table with its registry: the wait is released by the peer's publish_head
    g = G.build(ev, TEST_REGISTRY)
    p_end = int(np.flatnonzero(g.pt_t == 60)[0])
    assert g.pt_t[g.src[p_end]] == 50 and _seg(g, 60) == ("wait", "wait_space")
    assert {w.count for w in g.warnings} == {2}         # idle_loop, rank_x: still undeclared


def test_an_unreadable_registry_is_a_typed_warning():
    bad = dict(TEST_REGISTRY, phases=[{"name": "x", "id": 0}])
    g = G.build(table([span(0, 0, 0, "copy_out", 0, 10)]), bad)
    assert any(isinstance(w, InvalidRegistry) for w in g.warnings)


def test_barrier_departure_depends_on_last_arrival_of_the_occurrence():
    rows = (barrier(0, 0, 0, "grid", 10, 60) + barrier(0, 0, 1, "grid", 50, 61)
            + barrier(0, 1, 0, "grid", 20, 62)
            + barrier(0, 1, 1, "grid", 100, 120, occurrence=1))   # another occurrence
    g = G.build(table(rows), TEST_REGISTRY)
    for dep in (60, 61, 62):
        p = int(np.flatnonzero(g.pt_t == dep)[0])
        assert g.pt_t[g.src[p]] == 50
    p = int(np.flatnonzero(g.pt_t == 120)[0])
    assert g.pt_t[g.src[p]] == 100


def test_cross_rank_barrier_occurrence_spans_ranks():
    rows = barrier(0, 0, 0, "rank_start", 10, 80) + barrier(1, 0, 0, "rank_start", 70, 81)
    g = G.build(table(rows), TEST_REGISTRY)
    p = int(np.flatnonzero(g.pt_t == 80)[0])
    assert g.pt_t[g.src[p]] == 70 and g.lane["rank"][g.pt_lane[g.src[p]]] == 1


def test_kernel_start_depends_on_previous_kernel_on_the_rank():
    ev = table([span(0, 0, 0, "notify", 0, 50, kernel="notify", launch=0),
                span(0, 0, 1, "notify", 0, 70, kernel="notify", launch=0),
                span(0, 0, 0, "send_chunk", 90, 120, launch=1)])
    g = G.build(ev, TEST_REGISTRY)
    p = int(np.flatnonzero(g.pt_t == 90)[0])
    assert g.pt_t[g.src[p]] == 70      # the latest warp of the previous launch


def test_retime_with_recorded_durations_reproduces_recorded_times():
    from profiler.groundtruth.synthetic import make_events
    ev, _, man = make_events(ranks=2, blocks=2, chunks=4, iterations=2, seed=3)
    g = G.build(ev, man["registry"])
    T = RT.retime(g, g.d)
    np.testing.assert_array_equal(T, g.pt_t)


@pytest.mark.parametrize("vals,text", [([], ""), ([3], "3"), ([1, 2, 3, 7, 9, 10], "1–3, 7, 9–10"),
                                       ([5, 4, 4], "4–5")])
def test_ranges(vals, text):
    assert ranges(vals) == text


def _reference_retime(g, d):
    """Plain fixed-point iteration of the recurrence, point by point (the oracle for retime)."""
    P = g.n_points
    first = np.zeros(P, bool)
    first[g.lane_first] = True
    occ_of_dep = dict(zip(g.bw_end_pt.tolist(), g.bw_occ.tolist()))
    occ_pts = np.split(g.occ_arr_pt, g.occ_starts[1:]) if len(g.occ_arr_pt) else []
    grp_of = dict(zip(g.prev_first_pt.tolist(), zip(g.prev_grp.tolist(), g.prev_lat.tolist())))
    grp_pts = np.split(g.prev_member_pt, g.prev_starts[1:]) if len(g.prev_member_pt) else []
    T = g.pt_t.astype(np.int64).copy()
    for _ in range(P + 1):
        old = T.copy()
        for p in range(P):
            cands = []
            if not first[p]:
                cands.append(T[p - 1] + d[p])
            if p in occ_of_dep:
                cands.append(max(T[occ_pts[occ_of_dep[p]]]) + g.lat[p])
            elif g.src[p] >= 0:
                cands.append(T[g.src[p]] + g.lat[p])
            if p in grp_of:
                q, lat = grp_of[p]
                cands.append(max(T[grp_pts[q]]) + lat)
            T[p] = max(cands) if cands else g.pt_t[p]
        if np.array_equal(T, old):
            return T
    raise AssertionError("reference did not converge")


@pytest.mark.parametrize("speedup,seed", [(0.3, 0), (0.6, 1), (-0.4, 2)])
def test_retime_matches_the_reference_solution(speedup, seed, monkeypatch):
    from profiler.groundtruth.synthetic import make_events
    monkeypatch.setattr(RT, "RETIME_WINDOW", 7)       # small windows: exercise splitting and joins
    ev, _, man = make_events(ranks=3, blocks=2, chunks=4, iterations=2, scenario="slow_rank", seed=seed)
    g = G.build(ev, man["registry"])
    rng = np.random.default_rng(seed)
    d = g.d.copy()
    pick = rng.random(len(d)) < 0.5
    d[pick] = np.round(d[pick] * (1 - speedup)).astype(np.int64)
    np.testing.assert_array_equal(RT.retime(g, d), _reference_retime(g, d))


@pytest.mark.parametrize("speedup,seed", [(0.3, 0), (0.6, 1), (-0.4, 2)])
def test_retime_input_solves_as_retime_of_the_graph(speedup, seed):
    """RetimeInput (kept without the graph, offsets corrected by the shortening between two
    points) gives retime's times at the points it answers for."""
    from profiler.groundtruth.synthetic import make_events
    ev, _, man = make_events(ranks=3, blocks=2, chunks=4, iterations=2, scenario="slow_rank", seed=seed)
    g = G.build(ev, man["registry"])
    rng = np.random.default_rng(seed)
    out = np.unique(np.r_[g.lane_first, g.lane_last, rng.integers(0, g.n_points, 50)])
    inp = RT.retime_input(g, out)
    np.testing.assert_array_equal(inp.solve(), g.pt_t[out])
    first = g.first_mask()
    pick = np.flatnonzero((rng.random(g.n_points) < 0.5) & ~first)
    d = g.d.copy()
    d[pick] = np.round(d[pick] * (1 - speedup)).astype(np.int64)
    np.testing.assert_array_equal(inp.solve(pick, g.d[pick] - d[pick]), RT.retime(g, d)[out])


def test_graph_cache_follows_the_table_lifetime():
    import gc
    ev = table([span(0, 0, 0, "copy_out", 0, 10)])
    g1 = G.build(ev, TEST_REGISTRY)
    assert G.build(ev, TEST_REGISTRY) is g1
    key = (id(ev), len(ev), id(TEST_REGISTRY), id(None))
    del ev
    gc.collect()
    assert key not in G._CACHE


def _owners_reference(iv_pb, iv_pe, P):
    """points.owners as it was before issue 20 (one pass over every point per nesting level):
    the reference the range painter must equal, overlapping intervals included."""
    owner = np.full(P, -1, dtype=np.int64)
    n_iv = len(iv_pb)
    if n_iv == 0:
        return owner
    pbits = max(P, 1).bit_length()
    order = np.argsort((iv_pb << pbits) | (P - iv_pe), kind="stable")
    pb_s = iv_pb[order]
    grp_first = np.flatnonzero(np.r_[True, pb_s[1:] != pb_s[:-1]])
    start_mark = np.zeros(n_iv, np.int64)
    start_mark[grp_first] = grp_first
    rank_in_grp = np.arange(n_iv) - np.maximum.accumulate(start_mark)
    CB = np.cumsum(np.bincount(iv_pb, minlength=P))
    CE = np.cumsum(np.bincount(iv_pe, minlength=P))
    depth_s = np.maximum(np.where(pb_s > 0, CB[np.maximum(pb_s - 1, 0)], 0) - CE[pb_s] + rank_in_grp, 0)
    kk = np.arange(P)
    for lvl in range(int(depth_s.max()) + 1):
        sel = order[depth_s == lvl]
        if len(sel) == 0:
            continue
        mark = np.full(P, -1, dtype=np.int64)
        mark[iv_pb[sel]] = np.arange(len(sel))
        ff = np.maximum.accumulate(mark)
        cand = sel[np.maximum(ff, 0)]
        cover = (iv_pe[cand] > kk) & (ff >= 0)
        owner[cover] = cand[cover]
    return owner


def test_owners_equal_the_per_level_painter_on_random_intervals():
    from profiler.analysis.points import owners
    rng = np.random.default_rng(20)
    for _ in range(2000):
        P = int(rng.integers(1, 60))
        n = int(rng.integers(0, 25))
        pb = rng.integers(0, P, n).astype(np.int64)
        pe = np.maximum(np.minimum(pb + rng.integers(0, 12, n), P - 1), pb).astype(np.int64)
        np.testing.assert_array_equal(owners(pb, pe, P), _owners_reference(pb, pe, P), err_msg=f"{pb} {pe}")
