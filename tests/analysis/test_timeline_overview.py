"""profiler/analysis/timeline_overview.py: the timeline's overview of a run computed chunk by chunk
equals the one of the whole table; each tile is the exact binned busy time of its iteration's
spans; the stored form reads back equal and refuses parts that do not fit together; the chunked
analyses carry the overview of their closed tables."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from profiler.analysis import chunked, unfinished
from profiler.analysis import timeline_overview as TO
from profiler.store.runstore import load_run
from profiler.groundtruth.synthetic import make_events

TRACES = Path(__file__).resolve().parents[2] / "traces"


def assert_overviews_equal(a: TO.Overview, b: TO.Overview) -> None:
    assert (a.t_min, a.t_max, a.phases) == (b.t_min, b.t_max, b.phases)
    for name in ("lanes", "groups", "extents", "tiles"):
        pd.testing.assert_frame_equal(getattr(a, name).reset_index(drop=True), getattr(b, name).reset_index(drop=True),
                                      obj=name, check_dtype=False)
    assert len(a.fine) == len(b.fine) and len(a.coarse) == len(b.coarse)
    for x, y in zip(a.fine + a.coarse, b.fine + b.coarse):
        assert x.shape == y.shape
        np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-6)


@pytest.fixture(scope="module")
def multi():
    """A synthetic run of 4 iterations, unfinished waits closed (as the analyses see it)."""
    ev, la, _ = make_events(ranks=4, events=60_000, iterations=4, scenario="slow_rank")
    return unfinished.close(ev, la)


def test_chunks_of_iterations_give_the_whole_tables_overview(multi):
    its = multi["iteration"].to_numpy()
    b = TO.Builder()
    for grp in ([0], [1, 2], [3]):
        b.add(multi.iloc[np.flatnonzero(np.isin(its, grp))])
    assert_overviews_equal(b.finish(), TO.overview(multi))


def _reference_tile(ev: pd.DataFrame, ov: TO.Overview, i: int) -> np.ndarray:
    """Busy per (rank, block) group and phase of iteration ov.tiles[i], from the rows directly."""
    t = ov.tiles.iloc[i]
    e = ev[ev["iteration"] == t["iteration"]]
    host = (e["kind"] == "host").to_numpy()
    span = (e["kind"] == "span").to_numpy() | host
    name = np.where(host, "host " + e["phase"].astype(str).to_numpy(), e["phase"].astype(str).to_numpy())
    block = np.where(host, -1, e["block"].to_numpy(np.int64))
    g = ov.groups
    gi = {(int(r), int(bl)): k for k, (r, bl) in enumerate(zip(g["rank"], g["block"]))}
    pi = {p: k for k, p in enumerate(ov.phases)}
    n_ph = len(ov.phases)
    keys = [gi[(int(r), int(bl))] * n_ph + pi[n] for r, bl, n in zip(e["rank"].to_numpy()[span], block[span], name[span])]
    hi = max(int(t["end_ns"]), int(t["begin_ns"]) + 1)
    return TO.binned_busy(e["begin_ns"].to_numpy()[span], e["end_ns"].to_numpy()[span], np.asarray(keys, np.int64),
                          len(g) * n_ph, float(t["begin_ns"]), float(hi), int(t["bins"])).reshape(len(g), n_ph, -1)


def test_each_tile_is_its_iterations_exact_busy_time(multi):
    ov = TO.overview(multi)
    assert list(ov.tiles["iteration"]) == [0, 1, 2, 3]
    rg = ov.rank_groups
    for i in range(len(ov.tiles)):
        want = _reference_tile(multi, ov, i)
        nb, nc = int(ov.tiles["bins"].iloc[i]), int(ov.tiles["coarse_bins"].iloc[i])
        assert nc == min(nb, TO.tile_bins(int(ov.extents["events"][ov.extents["iteration"] == i].mean())))
        np.testing.assert_allclose(ov.coarse[i], want.reshape(len(ov.groups), len(ov.phases), nc, nb // nc).mean(axis=3),
                                   rtol=1e-5, atol=1e-4)
        for k, (r, h) in enumerate(zip(rg["rank"], rg["host"])):
            m = (ov.groups["rank"].to_numpy() == r) & ((ov.groups["block"].to_numpy() < 0) == h)
            np.testing.assert_allclose(ov.fine[i][k], want[m].sum(axis=0), rtol=1e-5, atol=1e-4)


def test_extents_and_lanes_are_the_tables(multi):
    ov = TO.overview(multi)
    g = multi.groupby(["iteration", "rank"], observed=True)
    assert ov.extents["events"].tolist() == g.size().tolist()
    assert ov.extents["begin_ns"].tolist() == g["begin_ns"].min().tolist()
    assert (ov.t_min, ov.t_max) == (int(multi["begin_ns"].min()), int(multi[["begin_ns", "end_ns"]].max().max()))
    assert int(ov.extents["open"].sum()) == int((multi["open"] & (multi["kind"] == "span")).sum())
    host = (multi["kind"] == "host").to_numpy()
    lanes = pd.DataFrame({"rank": multi["rank"].to_numpy(np.int64),
                          "block": np.where(host, -1, multi["block"].to_numpy(np.int64)),
                          "warp": np.where(host, -1, multi["warp"].to_numpy(np.int64))}).drop_duplicates()
    pd.testing.assert_frame_equal(ov.lanes[["rank", "block", "warp"]],
                                  lanes.sort_values(["rank", "block", "warp"]).reset_index(drop=True), check_dtype=False)


def test_the_stored_form_reads_back_equal_and_refuses_what_does_not_fit(multi):
    ov = TO.overview(multi)
    meta, tables = TO.to_stored(ov)
    assert_overviews_equal(TO.from_stored(meta, tables), ov)
    short = dict(tables, fine=tables["fine"].iloc[:-1])
    with pytest.raises(ValueError, match="fine grid size"):
        TO.from_stored(meta, short)
    with pytest.raises(ValueError, match="meta"):
        TO.from_stored(dict(meta, extra=1), tables)
    with pytest.raises(ValueError, match="tables"):
        TO.from_stored(meta, {k: v for k, v in tables.items() if k != "tiles"})


def test_tile_bins_follow_the_iterations_events():
    assert TO.tile_bins(10) == TO.MIN_BINS
    assert TO.tile_bins(1_000_000) == 512          # 100 M events in 100 iterations
    assert TO.tile_bins(10 ** 9) == TO.MAX_BINS
    assert all(TO.tile_bins(n) & (TO.tile_bins(n) - 1) == 0 for n in (1, 5_000, 300_000, 2_500_000))   # powers of 2


def test_the_chunked_analyses_carry_the_overview_of_their_closed_tables():
    run = load_run(TRACES / "ll-split-a2")        # 8 iterations
    res = chunked.analyze(run.events, registry=run.manifest.get("registry"), launches=run.launches, max_events=5_000)
    assert res.chunks > 1
    assert_overviews_equal(res.timeline, TO.overview(unfinished.close(run.events, run.launches)))


def test_rows_sorted_by_iteration_or_not_give_the_same_overview_bit_for_bit(multi):
    """A chunk's tiles come from slices of its rows in iteration order (no sort when sorted):
    a stable sort keeps each iteration's rows in table order, so the sums are the same floats."""
    assert not bool(np.all(np.diff(multi["iteration"].to_numpy()) >= 0))      # the sorting path
    a = TO.overview(multi)
    b = TO.overview(multi.iloc[np.argsort(multi["iteration"].to_numpy(), kind="stable")])   # the slicing path
    assert_overviews_equal(a, b)
    for x, y in zip(a.fine + a.coarse, b.fine + b.coarse):
        assert x.tobytes() == y.tobytes()


def _binned_busy_selecting(begin, end, key, n_keys, t0, t1, bins):
    """binned_busy written by selecting each sum's spans (its first form): the reference."""
    width = (t1 - t0) / bins
    fb, fe = (np.clip(begin, t0, t1) - t0) / width, (np.clip(end, t0, t1) - t0) / width
    ok = fe > fb
    fb, fe, key = fb[ok], fe[ok], key[ok].astype(np.int64)
    ib = np.minimum(np.floor(fb).astype(np.int64), bins - 1)
    ie = np.minimum(np.floor(fe).astype(np.int64), bins - 1)
    size, base, one = n_keys * (bins + 1), key * (bins + 1), ib == ie
    flat = np.zeros(size, dtype=np.float64)
    flat += np.bincount(base[one] + ib[one], weights=fe[one] - fb[one], minlength=size)
    m = ~one
    flat += np.bincount(base[m] + ib[m], weights=(ib[m] + 1) - fb[m], minlength=size)
    flat += np.bincount(base[m] + ie[m], weights=fe[m] - ie[m], minlength=size)
    full = m & (ie - ib > 1)
    diff = np.bincount(base[full] + ib[full] + 1, minlength=size).astype(np.float64)
    diff -= np.bincount(base[full] + ie[full], minlength=size)
    flat += np.cumsum(diff.reshape(n_keys, bins + 1), axis=1).reshape(-1)
    return flat.reshape(n_keys, bins + 1)[:, :bins]


def test_binned_busy_sums_the_same_floats_as_selecting_the_spans():
    """Zero weights in place of selected rows leave every sum the same float (x + 0.0 == x): the
    stored overviews stay byte-identical. Windows clip spans; some end before they begin."""
    rng = np.random.default_rng(7)
    for case in range(200):
        n, bins, nk = int(rng.integers(0, 2000)), int(rng.integers(1, 70)), int(rng.integers(1, 6))
        b = rng.integers(-50, 1000, n)
        e = b + rng.integers(-20, 400, n)
        key = rng.integers(0, nk, n).astype((np.int64, np.int32, np.int16)[case % 3])
        t0 = float(rng.integers(-100, 500))
        t1 = t0 + float(rng.integers(1, 900)) + (0.5 if case % 5 == 0 else 0.0)
        got = TO.binned_busy(b, e, key, nk, t0, t1, bins)
        assert got.tobytes() == _binned_busy_selecting(b, e, key, nk, t0, t1, bins).tobytes(), case


@pytest.mark.parametrize("top", [50, 10 ** 12])     # a bincount over the range; np.unique past it
def test_dense_codes_are_np_unique(top):
    code = np.random.default_rng(3).integers(0, top, 5_000)
    u, inv = np.unique(code, return_inverse=True)
    got_u, got_inv = TO._dense(code)
    assert np.array_equal(got_u, u) and np.array_equal(got_inv, inv.reshape(-1))
