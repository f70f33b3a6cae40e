"""The graph build's compiled loops (profiler/analysis/graph_fast.py) against its numpy path: equal
arrays (values and dtypes) on random inputs and on every bundled run's graph."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from profiler.analysis import edges, graph as G, graph_fast, keys, points as PT, unfinished
from profiler.analysis.semantics import semantics
from profiler.store.runstore import load_run
from tests.analysis.tables import TEST_REGISTRY, barrier, host, instant, span, table

pytestmark = pytest.mark.skipif(not graph_fast.enabled(), reason="no compiled loops here (numba absent)")
TRACES = Path(__file__).resolve().parents[2] / "traces"


@pytest.fixture
def engine(monkeypatch):
    def set_(name):
        monkeypatch.setattr(graph_fast, "ENGINE", name)
    return set_


def _table(rng, n, lanes, sorted_rows):
    """A random table of spans: lane, begin, end (nested and equal times included)."""
    lane = np.sort(rng.integers(0, lanes, n)) if sorted_rows else rng.integers(0, lanes, n)
    b = rng.integers(0, 40, n)
    e = b + rng.integers(0, 12, n)
    if sorted_rows:
        o = np.lexsort((b, lane))
        lane, b, e = lane[o], b[o], e[o]
    t = SimpleNamespace(n=n, b_rel=b.astype(np.int64), e_rel=e.astype(np.int64), t0=1000,
                        begin=b.astype(np.int64) + 1000, end=e.astype(np.int64) + 1000,
                        tb=max(int(e.max()) if n else 0, 1).bit_length() + 1)
    return t, SimpleNamespace(lane_id=lane.astype(np.int64), n=lanes, by_lane=None)


def _same(a, b, what):
    for f in a.__dataclass_fields__:
        x, y = getattr(a, f), getattr(b, f)
        if x is None and y is None:          # a cache not made yet (Points.is_first)
            continue
        assert x.dtype == y.dtype and np.array_equal(x, y), f"{what}: {f} differs"


@pytest.mark.parametrize("seed", range(40))
def test_points_owners_and_wait_durations_match_numpy_on_random_tables(seed, engine):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 400))
    t, ln = _table(rng, n, int(rng.integers(1, 9)), sorted_rows=seed % 3 != 0)
    engine("numpy")
    want = PT.points(t, ln)
    engine("auto")
    got = PT.points(t, ln)
    _same(want, got, "points")
    if n == 0:
        return
    pb, pe = got.row_pb.copy(), got.row_pe.copy()
    engine("numpy")
    ow_np = PT.owners(pb, pe, got.n)
    engine("auto")
    ow = PT.owners(pb, pe, got.n)
    assert ow.dtype == ow_np.dtype and np.array_equal(ow, ow_np), "owners differ"
    w = rng.choice(n, size=min(n, int(rng.integers(1, 50))), replace=False)
    rel = got.pt_t[pb[w]] + rng.integers(-3, 20, len(w))
    d_np, d = (np.zeros(got.n, np.int64) for _ in range(2))
    engine("numpy")
    edges.wait_durations(d_np, got.pt_t, pb[w], pe[w], rel)
    engine("auto")
    edges.wait_durations(d, got.pt_t, pb[w], pe[w], rel)
    assert np.array_equal(d, d_np), "wait durations differ"


@pytest.mark.parametrize("seed", range(12))
def test_wait_keys_and_release_rows_match_numpy(seed, engine):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 300))
    rank_t, it_t = [(np.int16, np.int32), (np.int64, np.int64), (np.int16, np.int64), (np.int32, np.int32)][seed % 4]
    names = np.array(["a", "b", "c", "d"], dtype=object)
    t = SimpleNamespace(rank=rng.integers(0, 4, n).astype(rank_t), it=rng.integers(3, 6, n).astype(it_t),
                        kernel_c=rng.integers(-1, 3, n).astype(np.int32), payload=rng.integers(-2, 6, n).astype(np.int64),
                        phase_c=rng.integers(-1, 4, n).astype(np.int32), phase_names=names,
                        kind={k: rng.random(n) < 0.2 for k in ("arrive", "depart")})
    ln = SimpleNamespace(is_host_row=rng.random(n) < 0.2)
    rows = rng.choice(n, size=int(rng.integers(0, n)), replace=False)
    g = rng.integers(-1, 3, len(rows))
    radix = (3, 3, 4, 0, 3, 4)
    targets = sorted(rng.choice(names, size=2, replace=False))
    for from_rank in (True, False):
        engine("numpy")
        want = edges.wait_keys(rows, g, t, from_rank, radix)
        engine("auto")
        assert np.array_equal(edges.wait_keys(rows, g, t, from_rank, radix), want), "wait keys differ"
    engine("numpy")
    want = edges.release_rows(t, ln, targets)
    engine("auto")
    got = edges.release_rows(t, ln, targets)
    assert all(x.dtype == y.dtype and np.array_equal(x, y) for x, y in zip(want, got)), "release rows differ"


def test_the_test_fails_when_the_paths_diverge(engine, monkeypatch):
    """A compiled merge that drops the ends' sort must be caught by the comparison above."""
    rng = np.random.default_rng(1)
    t, ln = _table(rng, 300, 3, sorted_rows=True)
    engine("numpy")
    want = PT.points(t, ln)
    engine("auto")
    real = graph_fast.points
    monkeypatch.setattr(graph_fast, "points", lambda lid, b, e, *a: real(lid, b, e[::-1].copy(), *a))
    with pytest.raises(AssertionError):
        _same(want, PT.points(t, ln), "points")


@pytest.mark.parametrize("name", sorted(p.name for p in TRACES.iterdir() if (p / "manifest.json").exists()
                                         and (p / "events.parquet").exists()))
def test_bundled_graphs_match_numpy(name, engine):
    r = load_run(TRACES / name)
    closed = unfinished.close(r.events, r.launches)
    sem = semantics(r.manifest.get("registry"))
    engine("numpy")
    want = G._build(closed, sem)
    engine("auto")
    got = G._build(closed, sem)
    _same_graph(want, got, name)


def _same_graph(want, got, what):
    for f, x in vars(want).items():
        if isinstance(x, np.ndarray):
            y = getattr(got, f)
            assert x.dtype == y.dtype and np.array_equal(x, y), f"{what}: {f} differs"
    pd.testing.assert_frame_equal(want.lane, got.lane)
    assert want.warnings == got.warnings, f"{what}: warnings differ"
    assert want.t0 == got.t0, f"{what}: time origin differs"


def _random_events(rng, order: str) -> pd.DataFrame:
    """A random table of the test registry's phases: per warp lane nested sends with wait spans
    naming a peer rank, release instants, barrier pairs, zero-length spans; host rows per launch.
    order: "decoder" (a launch's host row before its warps', lanes in order), "shuffled" (rows in
    any order: the sorts' fallbacks) or "nested" (one span around many, ending last: the ends'
    insertion sort gives up)."""
    rows, ranks = [], int(rng.integers(1, 4))
    for it in range(int(rng.integers(1, 3))):
        for lch in range(2):
            for r in range(ranks):
                t0 = int(rng.integers(0, 50)) + 1000 * (2 * it + lch)
                rows.append(host(r, "notify", t0, t0 + int(rng.integers(0, 400)), launch=lch, iteration=it))
                for blk in range(int(rng.integers(1, 3))):
                    for w in range(int(rng.integers(1, 3))):
                        rows += _lane_rows(rng, r, blk, w, ranks, t0 + 5, lch, it, order == "nested")
    if order == "shuffled":
        rows = [rows[i] for i in rng.permutation(len(rows))]
    return unfinished.close(table(rows), None)


def _lane_rows(rng, r, blk, w, ranks, t, lch, it, nested):
    kw = dict(launch=lch, iteration=it)
    out, t0 = [], t
    for k in range(int(rng.integers(0, 12))):
        b = t + int(rng.integers(0, 3))
        e = b + int(rng.integers(0, 20))
        peer = int(rng.integers(-1, ranks + 1))          # -1 / ranks: a payload naming no rank
        out.append(span(r, blk, w, "send_chunk", b, e, k, **kw))
        out.append(span(r, blk, w, rng.choice(["wait_space", "wait_data"]), b, b + int(rng.integers(0, 6)), peer, **kw))
        out.append(instant(r, blk, w, rng.choice(["publish_tail", "publish_head"]), e, peer, **kw))
        if rng.random() < 0.2:
            out += barrier(r, blk, w, rng.choice(["rank_start", "grid", "block_sync"]), e, e + int(rng.integers(0, 9)),
                           int(rng.integers(0, 2)), **kw)
        t = e + int(rng.integers(0, 4))
    if nested and out:
        out.insert(0, span(r, blk, w, "reduce", t0, t + 50, 0, **kw))
    return out


@pytest.mark.parametrize("seed", range(24))
def test_random_graphs_match_numpy(seed, engine, monkeypatch):
    """Every compiled loop of the build (table, lanes, intervals, points, owners, segments, wait
    edges, as-of join, binding) against the numpy path on whole random tables: rows in the decoder's
    order, shuffled, with spans ending far out of their begins' order, and with the column widths
    of tables made in memory (int64: the other compiled variants; int32 ranks: none, numpy runs)."""
    rng = np.random.default_rng(seed)
    order = ("decoder", "shuffled", "nested")[seed % 3]
    ev = _random_events(rng, order)
    if order == "nested":                     # any move past the budget: the ends' argsort runs
        monkeypatch.setattr(graph_fast, "END_MOVES", (0, int(rng.integers(0, 3))))
    if seed % 4 == 1:
        ev = ev.astype({c: np.int64 for c in ("rank", "launch", "iteration", "block", "warp")})
    elif seed % 4 == 2:
        ev = ev.astype({"rank": np.int32})
    sem = semantics(TEST_REGISTRY)
    engine("numpy")
    want = G._build(ev, sem)
    engine("auto")
    _same_graph(want, G._build(ev, sem), f"seed {seed}")


@pytest.mark.parametrize("seed", range(16))
def test_asof_join_matches_numpy(seed, engine):
    """keys.asof_latest's compiled probe against searchsorted: ties of key and time (the last
    release wins), queries in ascending runs and out of order, keys with no release."""
    rng = np.random.default_rng(seed)
    nr, nq = int(rng.integers(1, 300)), int(rng.integers(1, 300))
    kr, tr = rng.integers(-2, 6, nr), rng.integers(0, 30, nr)
    kq, tq = rng.integers(-3, 7, nq), rng.integers(-2, 34, nq)
    if seed % 2:
        o = np.lexsort((tq, kq))
        kq, tq = kq[o], tq[o]
    engine("numpy")
    want = keys.asof_latest(kr, tr, kq, tq)
    engine("auto")
    assert np.array_equal(keys.asof_latest(kr, tr, kq, tq), want)
