"""The what-if's compiled re-timing loop (profiler/analysis/retime_fast.py) against retime._solve's
numpy path: the same new times, and the same number of halved windows, on random inputs (barrier
occurrences, previous-launch groups, fixed points, ties in time, windows that need halving) and on
every bundled run's re-timing input."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from profiler.analysis import graph as G
from profiler.analysis import retime as R
from profiler.analysis import retime_fast, unfinished
from profiler.analysis.semantics import semantics
from profiler.store.runstore import load_run

pytestmark = pytest.mark.skipif(not retime_fast.enabled(), reason="no compiled loop here (numba absent)")
TRACES = Path(__file__).resolve().parents[2] / "traces"


@pytest.fixture
def engine(monkeypatch):
    def set_(name):
        monkeypatch.setattr(retime_fast, "ENGINE", name)
    return set_


def _starts(rng, n_items, n_groups):
    """Group starts over n_items (ascending; equal starts: empty groups, as reduceat reads them)."""
    return np.sort(rng.integers(0, n_items, n_groups)) if n_groups else np.zeros(0, np.int64)


def _random_input(rng, narrow: bool):
    """A RetimeInput of random targets (cycles and all: the loop must agree even where the sweeps
    never settle), times drawn from a few values (ties), offsets small."""
    nt = int(rng.integers(1, 300))
    t = rng.integers(0, max(nt // 4, 2), nt).astype(np.int64) * 10
    first = rng.random(nt) < 0.15
    first[0] = True
    has_src = rng.random(nt) < 0.4
    ks = np.where(has_src, rng.integers(0, nt, nt), -1)
    n_occ = int(rng.integers(0, 6)) if rng.random() < 0.8 else 0
    n_a = int(rng.integers(n_occ, 4 * n_occ + 1)) if n_occ else 0
    occ_of_t = np.full(nt, -1, np.int64)
    if n_occ:
        dep = rng.random(nt) < 0.15
        occ_of_t[dep] = rng.integers(0, n_occ, int(dep.sum()))
        has_src &= ~dep
        ks[dep] = -1
    n_grp = int(rng.integers(0, 4)) if rng.random() < 0.8 else 0
    n_m = int(rng.integers(n_grp, 3 * n_grp + 1)) if n_grp else 0
    grp_of_t = np.full(nt, -1, np.int64)
    if n_grp:
        pfm = first & (rng.random(nt) < 0.6)
        grp_of_t[pfm] = rng.integers(0, n_grp, int(pfm.sum()))
    fixed = first & ~has_src & (grp_of_t < 0) & (occ_of_t < 0)
    order = np.lexsort((np.arange(nt), t))
    if rng.random() < 0.2:   # a subset of the targets (retime's `iterations`)
        order = order[rng.random(nt) < 0.7]
    inp = R.RetimeInput(
        tgt=np.arange(nt), t=t, first=first, fixed=fixed,
        own_off=np.where(first, 0, rng.integers(0, 30, nt)), has_src=has_src, src_pt=np.zeros(nt, np.int64), ks=ks,
        src_off=np.where(has_src, rng.integers(-5, 30, nt), 0), occ_of_t=occ_of_t, lat_bw=rng.integers(0, 20, nt),
        a_pt=np.zeros(n_a, np.int64), ak=rng.integers(0, nt, n_a), aoff=rng.integers(-5, 30, n_a),
        occ_starts=_starts(rng, n_a, n_occ), grp_of_t=grp_of_t, lat_pf=rng.integers(0, 20, nt),
        m_pt=np.zeros(n_m, np.int64), mk=rng.integers(0, nt, n_m), moff=rng.integers(-5, 30, n_m),
        prev_starts=_starts(rng, n_m, n_grp), order=order, out_pt=np.zeros(0, np.int64),
        out_k=np.zeros(0, np.int64), out_off=np.zeros(0, np.int64))
    if narrow:
        for k, v in vars(inp).items():
            if isinstance(v, np.ndarray):
                setattr(inp, k, R._narrow(v.astype(np.int64) if v.dtype.kind == "i" else v))
    return inp


def _both(inp, engine, args=None):
    """(numpy T, compiled T, windows numpy halved, windows compiled halved)."""
    a = args or (inp.own_off.astype(np.int64), inp.ks.astype(np.int64), inp.src_off.astype(np.int64),
                 inp.aoff.astype(np.int64), inp.moff.astype(np.int64))
    engine("numpy")
    want = R._solve(inp, *a)
    h_np = R.numpy_halved
    engine("auto")
    retime_fast.last_halved = -1
    got = R._solve(inp, *a)
    return want, got, h_np, retime_fast.last_halved


def _same(want, got, what):
    assert want.dtype == got.dtype and np.array_equal(want, got), f"{what}: new times differ"


@pytest.mark.parametrize("window,sweeps", [(4096, 12), (16, 3), (5, 2), (1, 1)])
def test_random_inputs_match_numpy(window, sweeps, engine, monkeypatch):
    monkeypatch.setattr(R, "RETIME_WINDOW", window)
    monkeypatch.setattr(R, "WINDOW_SWEEPS", sweeps)
    halved = 0
    for seed in range(150):
        rng = np.random.default_rng(seed)
        inp = _random_input(rng, narrow=seed % 2 == 1)
        want, got, h_np, h_c = _both(inp, engine)
        _same(want, got, f"seed {seed}")
        assert h_np == h_c, f"seed {seed}: numpy halved {h_np} windows, the loop {h_c}"
        halved += h_np
    if 1 < window < 4096:
        assert halved > 0, "no window needed halving: the halving went untested"


def test_the_test_fails_when_the_paths_diverge(engine, monkeypatch):
    """A loop that skips the barrier occurrences' maxima must be caught by the comparison above."""
    monkeypatch.setattr(R, "RETIME_WINDOW", 16)
    monkeypatch.setattr(R, "WINDOW_SWEEPS", 3)
    real = retime_fast.solve

    def broken(inp, *a):
        inp2 = R.RetimeInput(**{**vars(inp), "occ_of_t": np.full(len(inp.occ_of_t), -1, np.int64)})
        return real(inp2, *a)
    monkeypatch.setattr(retime_fast, "solve", broken)
    caught = 0
    for seed in range(40):
        want, got, _, _ = _both(_random_input(np.random.default_rng(seed), narrow=False), engine)
        try:
            _same(want, got, "")
        except AssertionError:
            caught += 1
    assert caught > 0


@pytest.mark.parametrize("name", sorted(p.name for p in TRACES.iterdir() if (p / "manifest.json").exists()
                                         and (p / "events.parquet").exists()))
def test_bundled_runs_retime_inputs_match_numpy(name, engine, monkeypatch):
    """Each bundled run's graph: the recorded durations, a
    random shortening of a third of the segments (RetimeInput.solve, as the what-if calls it, on
    the narrowed input it stores), and the same with small windows that need halving."""
    r = load_run(TRACES / name)
    g = G._build(unfinished.close(r.events, r.launches), semantics(r.manifest.get("registry")))
    if g.n_points == 0:
        return
    inp, _, _ = R._prepare(g, g.d)
    want, got, h_np, h_c = _both(inp, engine)
    _same(want, got, f"{name}, recorded durations")
    assert h_np == h_c
    stored = R.retime_input(g, np.arange(g.n_points))
    rng = np.random.default_rng(0)
    not_first = np.ones(g.n_points, bool)
    not_first[g.lane_first] = False
    pts = np.flatnonzero(not_first & (rng.random(g.n_points) < 0.33))
    shorter = (np.minimum(g.d[pts], rng.integers(0, 2000, len(pts)))).astype(np.int64)
    for window, sweeps in ((R.RETIME_WINDOW, R.WINDOW_SWEEPS), (8, 2)):
        monkeypatch.setattr(R, "RETIME_WINDOW", window)
        monkeypatch.setattr(R, "WINDOW_SWEEPS", sweeps)
        engine("numpy")
        want = stored.solve(pts, shorter)
        h_np = R.numpy_halved
        engine("auto")
        got = stored.solve(pts, shorter)
        _same(want, got, f"{name}, shortened, window {window}")
        assert h_np == retime_fast.last_halved


def _prepared(g, engine, out_pt):
    """retime._prepare's (RetimeInput, kx, S) by numpy, then by the compiled loops."""
    engine("numpy")
    want = R._prepare(g, g.d, out_pt=out_pt)
    engine("auto")
    got = R._prepare(g, g.d, out_pt=out_pt)
    return want, got


def _same_input(want, got, what):
    for k, v in vars(want[0]).items():
        w = getattr(got[0], k)
        assert v.dtype == w.dtype and np.array_equal(v, w), f"{what}: RetimeInput.{k} differs"
    assert np.array_equal(want[1], got[1]) and np.array_equal(want[2], got[2]), f"{what}: kx or S differs"


@pytest.mark.parametrize("name", sorted(p.name for p in TRACES.iterdir() if (p / "manifest.json").exists()
                                         and (p / "events.parquet").exists()))
def test_bundled_runs_prepare_and_segments_match_numpy(name, engine):
    """The compiled retime._prepare (mark, fill, radix time order), narrowing and whatif's segments
    give numpy's arrays, dtypes included (the stored what-if inputs are compared byte for byte)."""
    from profiler.analysis import spill, whatif as W
    r = load_run(TRACES / name)
    g = G._build(unfinished.close(r.events, r.launches), semantics(r.manifest.get("registry")))
    if g.n_points == 0:
        return
    out = np.concatenate([g.lane_first, g.lane_last])
    _same_input(*_prepared(g, engine, out), name)
    arrays = {}
    for eng in ("numpy", "auto"):
        engine(eng)
        arrays[eng] = W.WhatIfInput.from_graph(g, None).to_arrays()
    for k, v in arrays["numpy"].items():
        w = arrays["auto"][k]
        assert type(v) is type(w), f"{name}: to_arrays()[{k!r}] packed differently"
        v, w = spill.expand(v), spill.expand(w)
        assert v.dtype == w.dtype and np.array_equal(v, w), f"{name}: to_arrays()[{k!r}] differs"
    assert b"".join(map(bytes, spill.encode(arrays["numpy"]))) == b"".join(map(bytes, spill.encode(arrays["auto"])))


def _graph_like(rng, P):
    """The fields retime._prepare reads, random: lanes of random lengths, sources anywhere (ties in
    time, times out of order within a lane, repeated departures), every dtype as a graph has it."""
    from types import SimpleNamespace
    cuts = np.unique(np.r_[0, rng.integers(1, P, int(rng.integers(0, max(P // 3, 1))))])
    lane_first = cuts.astype(np.int64)
    src = np.where(rng.random(P) < 0.3, rng.integers(-1, P, P), -1).astype(np.int32)
    bw = rng.integers(0, P, int(rng.integers(0, 6))).astype(np.int32)
    pf = rng.choice(lane_first, int(rng.integers(0, len(lane_first) + 1))).astype(np.int64)
    n_occ = int(rng.integers(0, 4))
    a_pt = rng.integers(0, P, int(rng.integers(0, 8))).astype(np.int32)
    m_pt = rng.integers(0, P, int(rng.integers(0, 8))).astype(np.int64)
    spread = 1 if rng.random() < 0.2 else 2**int(rng.integers(1, 40))
    return SimpleNamespace(
        n_points=P, lane_first=lane_first, src=src, d=rng.integers(0, 50, P).astype(np.int64),
        lat=rng.integers(-5, 50, P).astype(np.int64), pt_t=rng.integers(0, spread, P).astype(np.int64) - spread // 3,
        bw_end_pt=bw, bw_occ=rng.integers(0, max(n_occ, 1), len(bw)).astype(np.int64), occ_arr_pt=a_pt,
        occ_starts=np.sort(rng.integers(0, max(len(a_pt), 1), n_occ)).astype(np.int64), prev_first_pt=pf,
        prev_grp=rng.integers(0, 3, len(pf)).astype(np.int64), prev_lat=rng.integers(0, 9, len(pf)).astype(np.int64),
        prev_member_pt=m_pt, prev_starts=np.sort(rng.integers(0, max(len(m_pt), 1), 2)).astype(np.int64))


def test_random_graphs_prepare_matches_numpy(engine):
    for seed in range(200):
        rng = np.random.default_rng(seed)
        g = _graph_like(rng, int(rng.integers(1, 400)))
        _same_input(*_prepared(g, engine, rng.integers(0, g.n_points, 5)), f"seed {seed}")


def test_random_graphs_retime_input_matches_numpy(engine):
    """retime_input's arrays (the compiled fill writing int32 where all values fit, else the int64
    fill narrowed) equal numpy's _prepare narrowed, dtypes included: offsets and latencies past int32
    in some graphs, so both routes run."""
    ran = {True: 0, False: 0}
    for seed in range(200):
        rng = np.random.default_rng(seed)
        g = _graph_like(rng, int(rng.integers(1, 400)))
        if seed % 3 == 0:
            g.lat = g.lat * 2**int(rng.integers(20, 34))          # some past int32
        if seed % 5 == 0:
            g.d = g.d * 2**int(rng.integers(20, 34))
        out = rng.integers(0, g.n_points, 5)
        engine("numpy")
        want = R.retime_input(g, out)
        engine("auto")
        got = R.retime_input(g, out)
        for k, v in vars(want).items():
            w = getattr(got, k)
            assert v.dtype == w.dtype and np.array_equal(v, w), f"seed {seed}: RetimeInput.{k} differs"
        ran[got.own_off.dtype == np.int32 and got.src_off.dtype == np.int32] += 1
    assert ran[True] and ran[False], ran


def test_radix_time_order_is_lexsort():
    """Ties, one value, negative times and spans of 0 to 2**61 ns, against np.lexsort."""
    c = retime_fast._compiled()
    for seed in range(100):
        rng = np.random.default_rng(seed)
        n = int(rng.integers(0, 5000))
        span = 2**int(rng.integers(0, 62))
        t = (rng.integers(0, span, n) if span > 1 else np.zeros(n, np.int64)) - span // 2
        order = np.empty(n, np.int64)
        assert retime_fast._radix_order(c, t.astype(np.int64), order)
        assert np.array_equal(order, np.lexsort((np.arange(n), t))), f"seed {seed}"
    assert not retime_fast._radix_order(c, np.array([-2**62, 2**62], np.int64), np.empty(2, np.int64))


def test_narrowing_matches_numpy(engine):
    """retime._narrow: int32 exactly where every value fits, by either path."""
    for a in (np.arange(-5000, 5000, dtype=np.int64), np.r_[np.zeros(5000, np.int64), 2**31],
              np.r_[np.zeros(5000, np.int64), -2**31], np.r_[np.zeros(5000, np.int64), -2**31 - 1]):
        engine("numpy")
        want = R._narrow(a)
        engine("auto")
        got = R._narrow(a)
        assert want.dtype == got.dtype and np.array_equal(want, got)


def test_kept_scratch_gives_the_same_times(engine):
    """Solves inside retime_fast.kept_scratch (one scratch reused, grown, sliced to each input) give the
    times of solves that allocate their own, for inputs of several sizes in a row (a larger then a
    smaller one reads only its own part of the kept arrays)."""
    engine("auto")
    inputs = [_random_input(np.random.default_rng(seed), narrow=seed % 2 == 1) for seed in (3, 11, 4, 29)]
    args = [(inp.own_off.astype(np.int64), inp.ks.astype(np.int64), inp.src_off.astype(np.int64),
             inp.aoff.astype(np.int64), inp.moff.astype(np.int64)) for inp in inputs]
    want = [R._solve(inp, *a) for inp, a in zip(inputs, args)]
    with retime_fast.kept_scratch():
        got = [R._solve(inp, *a) for inp, a in zip(inputs, args)]
        assert retime_fast._held.scratch, "nothing kept inside kept_scratch"
    assert retime_fast._held.scratch is None
    for i, (w, g) in enumerate(zip(want, got)):
        _same(w, g, f"input {i}")


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_select_is_numpys_selection(dtype):
    """retime_fast.select against np.flatnonzero(phase_ok[seg_phase] & lane_ok[seg_lane]) on random
    segments, and None (numpy's code then runs) where a phase or a lane lies outside its look-up."""
    for seed in range(30):
        rng = np.random.default_rng(seed)
        n, nph, nl = int(rng.integers(0, 500)), int(rng.integers(1, 9)), int(rng.integers(1, 40))
        ph, ln = rng.integers(0, nph, n).astype(dtype), rng.integers(0, nl, n).astype(dtype)
        phase_ok, lane_ok = rng.random(nph) < 0.4, rng.random(nl) < 0.5
        got = retime_fast.select(ph, ln, phase_ok, lane_ok)
        want = np.flatnonzero(phase_ok[ph] & lane_ok[ln])
        assert got is not None and got.dtype == want.dtype and np.array_equal(got, want), f"seed {seed}"
        if n:
            bad = ph.copy()
            bad[n // 2] = -1
            assert retime_fast.select(bad, ln, phase_ok, lane_ok) is None
            bad = ln.copy()
            bad[n // 2] = nl
            assert retime_fast.select(ph, bad, phase_ok, lane_ok) is None
