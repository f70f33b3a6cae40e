"""viewer/pages/timeline/logic.py drawn from a stored overview (issue 20: the timeline computed from
what is on screen): the overview's index has the full index's lanes, phases, time range and notes;
a window read from its (rank, iteration) row groups draws what the whole table draws; the tiles,
at their own resolution, are the exact busy time; a window too big to read at the warp level is
drawn per block and says so. Then viewer/analyses.py: a big run with stored results draws its
timeline without reading its event table, and reads only the row groups of a narrow window."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from profiler.analysis import stored, unfinished
from profiler.analysis import timeline_overview as TO
from profiler.store.runstore import load_run, write_run
from profiler.groundtruth.synthetic import make_iterations
from viewer import analyses
from viewer.catalog import Catalog
from viewer.pages.timeline import logic as L

TRACES = Path(__file__).resolve().parents[2] / "traces"
BUNDLED = ("ep-timeout", "ll-split-a2", "ep-balanced")


def _closed(name_or_events):
    if isinstance(name_or_events, str):
        run = load_run(TRACES / name_or_events)
        return unfinished.close(run.events, run.launches), run.manifest
    return name_or_events


def _iterations():
    """4 iterations of 4 ranks, 1 ms apart (synthetic.make_iterations: how the 100 M-event run is made)."""
    parts = list(make_iterations(ranks=4, per_iteration=15_000, iterations=4))
    ev = pd.concat([p[0] for p in parts])
    return ev.reset_index(drop=True), pd.concat([p[1] for p in parts], ignore_index=True), parts[-1][2]


@pytest.fixture(scope="module")
def multi():
    ev, la, man = _iterations()
    return unfinished.close(ev, la), man


def _pair(events, manifest):
    """(the full index without its precomputed grid: exact views, the overview's index, read)."""
    full = L.build_index(events, manifest)
    oix = L.index_from_overview(TO.overview(events), manifest)
    its = events["iteration"].to_numpy()
    rks = events["rank"].to_numpy()
    reads = []

    def read(iterations, ranks, t0, t1):
        reads.append((list(map(int, iterations)), list(map(int, ranks))))
        m = np.isin(its, iterations) & np.isin(rks, ranks)
        m &= (events["end_ns"].to_numpy() >= t0) & (events["begin_ns"].to_numpy() <= t1)
        return L.conform(L.build_index(events[m], manifest), oix)
    return full, oix, read, reads


def assert_views_equal(a: L.View, b: L.View) -> None:
    assert (a.mode, a.level, a.t0, a.t1, a.rows.labels, a.n_visible) == (b.mode, b.level, b.t0, b.t1, b.rows.labels,
                                                                         b.n_visible)
    if a.mode == "aggregate":
        np.testing.assert_array_equal(a.dominant, b.dominant)
        np.testing.assert_allclose(a.occupancy, b.occupancy, atol=1e-9)
    else:
        pd.testing.assert_frame_equal(a.spans.reset_index(drop=True), b.spans.reset_index(drop=True), check_dtype=False)
        pd.testing.assert_frame_equal(a.points.reset_index(drop=True), b.points.reset_index(drop=True),
                                      check_dtype=False)


@pytest.mark.parametrize("case", BUNDLED + ("multi",))
def test_the_overviews_index_is_the_full_indexs_frame(case, multi):
    ev, man = multi if case == "multi" else _closed(case)
    full, oix, _, _ = _pair(ev, man)
    assert (oix.t_min, oix.t_max, oix.phases, oix.ranks) == (full.t_min, full.t_max, full.phases, full.ranks)
    for f in ("parent", "depth", "lane_rank", "lane_block", "lane_warp", "lane_host"):
        np.testing.assert_array_equal(getattr(oix, f), getattr(full, f), err_msg=f)
    assert oix.lane_role == full.lane_role
    assert L.unfinished_note(oix) == L.unfinished_note(full)
    for level in L.LEVELS:
        rows = L.make_rows(full, level, None, (0, 1))
        for r in range(len(rows.labels)):
            assert L.drill_down(oix, level, None, (0, 1), r) == L.drill_down(full, level, None, (0, 1), r)


def _windows(ix):
    lo, hi = ix.t_min, ix.t_max
    w = hi - lo
    return [(None, None), (lo + 0.3 * w, lo + 0.34 * w), (lo + 0.5 * w, lo + 0.5 * w + 2_000),
            (lo + 0.1 * w, lo + 0.9 * w)]


@pytest.mark.parametrize("case", BUNDLED + ("multi",))
def test_a_window_read_from_its_row_groups_draws_what_the_whole_table_draws(case, multi):
    ev, man = multi if case == "multi" else _closed(case)
    full, oix, read, reads = _pair(ev, man)
    ranks = sorted(set(full.ranks))
    for level, rk in (("rank", None), ("block", [ranks[-1]]), ("warp", [ranks[0]])):
        for t0, t1 in _windows(full):
            # window_events above the run: every window is read (tiles never sharp enough: bins=10**6)
            got = L.compute_view(oix, level, rk, (0, 1), t0, t1, bins=L.BINS, read=read, window_events=10 ** 9)
            want = L.compute_view(full, level, rk, (0, 1), t0, t1)
            if got.approx:        # the tiles were sharp enough: drawn from them (checked below)
                continue
            assert_views_equal(got, want)
    assert reads, "no window was read"
    # a read asks only for the window's iterations and the rows' ranks
    its_all = sorted(set(map(int, ev["iteration"])))
    assert any(len(i) < len(its_all) for i, _ in reads) or len(its_all) == 1


def test_a_narrow_window_reads_only_its_iterations_and_ranks(multi):
    ev, man = multi
    full, oix, read, reads = _pair(ev, man)
    ext = oix.overview.extents
    e = ext[(ext["iteration"] == 2) & (ext["rank"] == 1)].iloc[0]
    mid = (int(e["begin_ns"]) + int(e["end_ns"])) / 2
    got = L.compute_view(oix, "block", [1], None, mid, mid + 3_000, read=read)
    assert reads == [([2], [1])]
    assert_views_equal(got, L.compute_view(full, "block", [1], None, mid, mid + 3_000))


def test_the_tiles_at_their_own_resolution_are_the_exact_busy_time(multi):
    ev, man = multi
    full, oix, _, _ = _pair(ev, man)
    ov = oix.overview
    t = ov.tiles.iloc[1]
    t0, t1, nb = float(t["begin_ns"]), float(t["end_ns"]), int(t["bins"])
    for level, (tile_level, bins) in {"rank": ("rank", nb), "block": ("block", int(t["coarse_bins"]))}.items():
        rows = L.make_rows(full, level)
        got, worst = L._from_tiles(oix, tile_level, rows, t0, t1, bins)
        assert worst == pytest.approx(1.0)
        # the exact busy time of the window's spans (neighbouring iterations are 1 ms away: none overlap it)
        sel = L.window(full, t0, t1)
        row = rows.lane_to_row[full.s_lane[sel]]
        n_ph = len(full.phases)
        want = L.binned_busy(full.s_begin[sel], full.s_end[sel], row * n_ph + full.s_phase[sel], len(rows.labels) * n_ph,
                             t0, t1, bins).reshape(len(rows.labels), n_ph, bins)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)
        view = L.compute_view(oix, level, None, None, t0, t1, bins=bins, read=None)
        assert view.approx and view.mode == "aggregate"
        np.testing.assert_array_equal(view.occupancy > 0, L.compute_view(full, level, None, None, t0, t1,
                                                                         bins=bins).occupancy > 0)


def test_warps_of_a_window_too_big_to_read_are_drawn_per_block_and_said(multi):
    ev, man = multi
    _, oix, read, reads = _pair(ev, man)
    v = L.compute_view(oix, "warp", [0], (0, 1), read=read, window_events=10)
    assert not reads and v.level == "block" and v.approx and "overview" in L.describe(v)
    assert all(lbl.startswith("r0 ") for lbl in v.rows.labels) and len(v.rows.labels) <= 3   # blocks 0, 1, host
    fig = L.figure(v, oix)
    assert fig["data"][0]["type"] == "heatmap"


# -- viewer/analyses.py ------------------------------------------------------------------------
@pytest.fixture
def big_root(tmp_path, monkeypatch):
    """A multi-iteration synthetic run with stored results, taken as big (FULL_INDEX_EVENTS 0)."""
    ev, la, man = _iterations()
    write_run(tmp_path / "root" / "multi", ev, la, man, perfetto=False)
    stored.store_run(tmp_path / "root" / "multi")
    monkeypatch.setattr(L, "FULL_INDEX_EVENTS", 0)
    return tmp_path / "root"


def test_a_big_run_with_stored_results_draws_its_timeline_without_reading_its_events(big_root):
    cat = Catalog([big_root])
    run = cat.load("multi")
    ix = analyses.timeline_index(run)
    assert ix.overview is not None
    whole = analyses.timeline_view(run, "rank", None, (0, 1), None, None)
    assert whole.approx and not run.events_read and not run.has("event_reader")
    # a narrow window reads its row groups only, and draws what the full index draws
    ext = ix.overview.extents
    e = ext[(ext["iteration"] == 3) & (ext["rank"] == 2)].iloc[0]
    t0 = (int(e["begin_ns"]) + int(e["end_ns"])) / 2
    got = analyses.timeline_view(run, "block", [2], (0, 1), t0, t0 + 5_000)
    assert not run.events_read and run.has(("timeline_events", (3,), (2,)))
    full = L.build_index(analyses.events(run), run.manifest)
    assert_views_equal(got, L.compute_view(full, "block", [2], (0, 1), t0, t0 + 5_000))


def test_warming_a_big_run_with_stored_results_asks_for_its_timeline_index(big_root):
    cat = Catalog([big_root])
    run = cat.load("multi")
    analyses.stored_results(run)
    analyses.warm(cat, "multi")
    assert cat.jobs.wait([("multi", "timeline_index")], 60)
    assert run.has("timeline_index") and not run.events_read


def test_a_run_with_stored_results_of_an_older_format_draws_from_its_events(big_root, monkeypatch):
    monkeypatch.setattr(stored, "FORMAT_VERSION", stored.FORMAT_VERSION + 1)     # what is stored is now old
    run = Catalog([big_root]).load("multi")
    assert analyses.stored_results(run) is None
    ix = analyses.timeline_index(run)
    assert ix.overview is None and ix.n_spans > 0 and run.events_read
