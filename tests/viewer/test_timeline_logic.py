"""viewer.pages.timeline.logic on hand-made tables: exact binning, rows, aggregate vs detail."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings, strategies as st

from profiler.registry.registry import Registry
from viewer.pages.timeline import logic as L
from tests.analysis.tables import barrier, host, instant, span, table


def brute_busy(begin, end, key, n_keys, t0, t1, bins):
    w = (t1 - t0) / bins
    out = np.zeros((n_keys, bins))
    for b, e, k in zip(begin, end, key):
        for j in range(bins):
            lo, hi = t0 + j * w, t0 + (j + 1) * w
            out[k, j] += max(0.0, min(e, hi) - max(b, lo)) / w
    return out


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1000), st.integers(0, 400), st.integers(0, 2)), min_size=0, max_size=30),
       st.integers(1, 17), st.integers(0, 300), st.integers(1, 900))
def test_binned_busy_matches_brute_force(spans, bins, t0, width):
    begin = np.array([s[0] for s in spans], dtype=np.int64)
    end = begin + np.array([s[1] for s in spans], dtype=np.int64)
    key = np.array([s[2] for s in spans], dtype=np.int64)
    got = L.binned_busy(begin, end, key, 3, float(t0), float(t0 + width), bins)
    want = brute_busy(begin, end, key, 3, float(t0), float(t0 + width), bins)
    np.testing.assert_allclose(got, want, atol=1e-9)


def _events():
    rows = [
        span(0, 0, 0, "send_chunk", 0, 100), span(0, 0, 0, "wait_space", 10, 40),
        span(0, 0, 1, "copy_out", 50, 150), span(0, 1, 0, "send_chunk", 0, 200),
        span(1, 0, 0, "copy_out", 100, 300), span(1, 3, 2, "copy_out", 0, 10),
        instant(0, 0, 0, "publish_tail", 100, 1),
        host(0, "enqueue", 0, 20),
        *barrier(0, 0, 0, "grid", 150, 210), *barrier(0, 1, 0, "grid", 200, 210),
    ]
    return table(rows)


# the nesting comes from the run's registry, read through profiler.registry.registry
MANIFEST = {"registry": {"tl": Registry.from_dict({
    "family": "tl", "version": 1, "roles": [],
    "phases": [{"name": "send_chunk", "id": 1}, {"name": "wait_space", "id": 2, "parent": "send_chunk", "wait": True},
               {"name": "copy_out", "id": 3}, {"name": "publish_tail", "id": 4, "kind": "instant"}],
    "barriers": [{"name": "grid", "id": 1}]}).to_json()}}


def test_a_registry_that_does_not_validate_gives_no_nesting_but_a_timeline():
    ix = L.build_index(_events(), {"registry": {"ep": {"phases": [{"name": "wait_space", "parent": "send_chunk"}]}}})
    assert (ix.parent == -1).all() and ix.n_spans == 7


def test_unfinished_spans_are_marked_drawn_and_announced():
    ev = _events()
    ev.loc[(ev["phase"] == "copy_out") & (ev["rank"] == 1) & (ev["block"] == 0), "open"] = True
    ix = L.build_index(ev, MANIFEST)
    assert int(ix.s_open.sum()) == 1 and L.unfinished_note(ix).startswith("timeout: 1 unfinished span(s) on rank(s) 1")
    v = L.compute_view(ix, "warp", ranks=[1], blocks=(0, 0), t0=90, t1=310)
    assert v.mode == "detail" and v.spans["unfinished"].tolist() == [True]
    bars = [t for t in L.figure(v, ix)["data"] if t["type"] == "bar"]
    assert [t["name"] for t in bars] == ["copy_out (unfinished)"] and "pattern" in bars[0]["marker"]
    assert "1 unfinished" in L.describe(v)
    assert L.unfinished_note(L.build_index(_events(), MANIFEST)) == ""


def test_index_lanes_and_phases():
    ix = L.build_index(_events(), MANIFEST)
    lanes = set(zip(ix.lane_rank.tolist(), ix.lane_block.tolist(), ix.lane_warp.tolist()))
    assert lanes == {(0, -1, -1), (0, 0, 0), (0, 0, 1), (0, 1, 0), (1, 0, 0), (1, 3, 2)}
    assert set(ix.phases) == {"send_chunk", "wait_space", "copy_out", "host enqueue"}
    ws = ix.phases.index("wait_space")
    assert ix.parent[ws] == ix.phases.index("send_chunk") and ix.depth[ws] == 1
    assert np.all(np.diff(ix.s_begin) >= 0)
    assert ix.n_spans == 7 and ix.t_min == 0 and ix.t_max == 300
    assert sorted(ix.p_label) == ["arrive grid", "depart grid", "publish_tail"]


def test_rows_per_level_and_filters():
    ix = L.build_index(_events(), MANIFEST)
    assert L.make_rows(ix, "rank").labels == ["rank 0", "rank 0 host", "rank 1"]
    assert L.make_rows(ix, "block").labels == ["r0 host", "r0 b0", "r0 b1", "r1 b0", "r1 b3"]
    assert L.make_rows(ix, "warp", ranks=[0], blocks=(0, 0)).labels == ["r0 host", "r0 b0 w0", "r0 b0 w1"]
    merged = L.make_rows(ix, "block", max_rows=2)
    assert merged.merged and len(merged.labels) <= 4
    # merging never mixes ranks
    for lab in merged.labels:
        assert lab.startswith(("r0", "r1"))
    with pytest.raises(ValueError):
        L.make_rows(ix, "sm")


def test_aggregate_view_exclusive_time_and_occupancy():
    ix = L.build_index(_events(), MANIFEST)
    v = L.compute_view(ix, "warp", ranks=[0], blocks=(0, 0), t0=0, t1=100, bins=10, detail_limit=0)
    assert v.mode == "aggregate"
    row = v.rows.labels.index("r0 b0 w0")
    ws, sc = ix.phases.index("wait_space"), ix.phases.index("send_chunk")
    # 10..40 is wait_space nested in send_chunk: the child wins those bins, the parent the rest
    assert list(v.dominant[row]) == [sc, ws, ws, ws, sc, sc, sc, sc, sc, sc]
    assert np.allclose(v.occupancy[row], 1.0)
    w1 = v.rows.labels.index("r0 b0 w1")
    assert list(v.dominant[w1][:5]) == [-1] * 5 and np.allclose(v.occupancy[w1][5:], 1.0)


def test_detail_view_when_few_spans():
    ix = L.build_index(_events(), MANIFEST)
    v = L.compute_view(ix, "warp", ranks=[0], blocks=(0, 1), t0=90, t1=160)
    assert v.mode == "detail"
    assert set(v.spans["phase"]) == {"send_chunk", "copy_out"}
    assert set(v.points["label"]) == {"publish_tail", "arrive grid"}
    fig = L.figure(v, ix)
    assert {t["type"] for t in fig["data"]} == {"bar", "scatter"}
    assert fig["layout"]["xaxis"]["range"] == [0.09, 0.16]


def test_base_grid_agrees_with_exact():
    rng = np.random.default_rng(1)
    rows = []
    for r in range(2):
        for b in range(6):
            for w in range(3):
                t = 0
                for _ in range(40):
                    d = int(rng.integers(5, 60))
                    rows.append(span(r, b, w, ["send_chunk", "copy_out"][int(rng.integers(2))], t, t + d))
                    t += d + int(rng.integers(0, 20))
    ix = L.add_base(L.build_index(table(rows), {}))
    for level in ("rank", "block"):
        rows_ = L.make_rows(ix, level)
        lo, hi = ix.t_min, ix.t_max
        exact = L.compute_view(ix, level, t0=lo, t1=hi, bins=16, detail_limit=0, rows=rows_)
        # force the precomputed path with a detail limit the window exceeds by far
        busy = L._from_base(ix, level, rows_, float(lo), float(hi), 16)
        assert busy is not None
        ex = L.exclusive(busy, ix.parent).sum(axis=1) / rows_.lanes_per_row[:, None]
        np.testing.assert_allclose(ex, exact.occupancy, atol=0.02)


def test_critical_overlay_maps_segments_to_rows():
    ix = L.build_index(_events(), MANIFEST)
    rows = L.make_rows(ix, "rank")
    seg = pd.DataFrame({"rank": [0, 1], "block": [0, 0], "warp": [0, 0], "phase": ["send_chunk", "copy_out"],
                        "begin_ns": [0, 100], "end_ns": [100, 300], "duration_ns": [100, 200]})
    tr = L.critical_overlay(seg, rows, ix, 0, 300)
    ys = [y for y in tr["y"] if y is not None]
    assert ys == [rows.labels.index("rank 0")] * 2 + [rows.labels.index("rank 1")] * 2
    assert L.critical_overlay(seg, rows, ix, 400, 500) is None


def test_parse_relayout():
    assert L.parse_relayout(None) is None
    assert L.parse_relayout({"yaxis.range[0]": 1}) is None
    assert L.parse_relayout({"autosize": True}) is None          # a resize keeps the window
    assert L.parse_relayout({"xaxis.autorange": True}) == (None, None)
    assert L.parse_relayout({"xaxis.range[0]": 2.0, "xaxis.range[1]": 1.0}) == (1000.0, 2000.0)
    assert L.parse_relayout({"xaxis.range": [0.5, 1.5]}) == (500.0, 1500.0)


def test_lane_lookup_falls_back_to_block_then_rank():
    ix = L.build_index(_events(), MANIFEST)
    lane = L._lane_of(ix, np.array([0, 0, 0, 1, 5]), np.array([0, 1, -1, 3, 0]), np.array([1, -1, -1, 7, 0]))
    got = [(int(ix.lane_rank[i]), int(ix.lane_block[i]), int(ix.lane_warp[i])) if i >= 0 else None for i in lane]
    assert got == [(0, 0, 1), (0, 1, 0), (0, -1, -1), (1, 3, 2), None]


def test_default_window_is_the_extent_of_the_events():
    ix = L.build_index(table([span(0, 0, 0, "copy_out", 5_000, 6_000), span(1, 0, 0, "copy_out", 5_500, 7_000)]), {})
    assert (ix.t_min, ix.t_max) == (5_000, 7_000)
    v = L.compute_view(ix, "rank")
    assert (v.t0, v.t1) == (5_000, 7_000)


def test_drill_down_rank_to_blocks_to_warps():
    ix = L.build_index(_events(), MANIFEST)
    rows = L.make_rows(ix, "rank")
    assert L.drill_down(ix, "rank", None, (0, 7), rows.labels.index("rank 1")) == ("block", [1], (0, 7))
    assert L.drill_down(ix, "rank", None, (0, 7), rows.labels.index("rank 0 host")) is None
    brows = L.make_rows(ix, "block", [0])
    assert L.drill_down(ix, "block", [0], (0, 7), brows.labels.index("r0 b1")) == ("warp", [0], (1, 1))
    assert L.drill_down(ix, "warp", [0], (0, 0), 1) is None
    assert L.drill_down(ix, "rank", None, (0, 7), 99) is None


def test_critical_overlay_merges_many_segments_per_row_and_pixel():
    """Over L.PATH_SEGMENTS segments, the path is drawn as runs of time bins per row: as many
    pieces as runs, each naming how many segments it holds (the browser's cost is per piece)."""
    ix = L.build_index(_events(), MANIFEST)
    rows = L.make_rows(ix, "rank")
    n = 40
    # rank 0 in [0, 400) as 20 touching segments, then rank 1 in [600, 1000) as 20
    begin = np.r_[np.arange(20) * 20, 600 + np.arange(20) * 20]
    seg = pd.DataFrame({"rank": [0] * 20 + [1] * 20, "block": 0, "warp": 0, "phase": "send_chunk",
                        "begin_ns": begin, "end_ns": begin + 20, "duration_ns": 20})
    exact = L.critical_overlay(seg, rows, ix, 0, 1000, limit=n)
    assert sum(y is not None for y in exact["y"]) == 2 * n            # one piece a segment
    merged = L.critical_overlay(seg, rows, ix, 0, 1000, limit=n - 1, bins=100)
    ys = [y for y in merged["y"] if y is not None]
    assert ys == [rows.labels.index("rank 0")] * 2 + [rows.labels.index("rank 1")] * 2
    xs = [x for x in merged["x"] if x is not None]
    assert xs == pytest.approx([0.0, 0.4, 0.6, 1.0])                # µs: the runs' bins (10 ns each)
    assert "20 segments" in merged["text"][0] and "longest r0 b0 w0 send_chunk" in merged["text"][0]


def test_aggregate_figure_draws_no_trace_per_phase_and_the_page_names_the_colours():
    """The heatmap's colours are named by an HTML legend (phase_legend), not by a dummy scatter
    trace a phase: each trace made every full redraw of a zoom longer (issue 20)."""
    ix = L.build_index(_events(), MANIFEST)
    view = L.compute_view(ix, "rank", detail_limit=0)
    assert view.mode == "aggregate"
    fig = L.figure(view, ix)
    assert [t["type"] for t in fig["data"]] == ["heatmap"]
    assert [n for n, _ in L.phase_legend(ix)] == ix.phases
    assert all(c.startswith("#") or c.startswith("rgb") for _, c in L.phase_legend(ix))
