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
