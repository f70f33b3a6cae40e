"""The chunk tables' compiled loops (profiler/analysis/tables_fast.py, read through lane_totals and
compare.event_samples) against their numpy paths: every table of chunked._tables equal to the bit
(values, dtypes, order) on synthetic runs and on every bundled run, and the event samples on
random tables with the awkward cases (missing names, cuts missing, NaN, duplicated or not
integral, times too large to be exact)."""
from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from profiler.analysis import chunked as CH, graph as G, lane_totals as LT, tables_fast, unfinished
from profiler.analysis import timemodel as TM
from profiler.analysis.semantics import semantics
from profiler.groundtruth.synthetic import make_events
from profiler.store.runstore import load_run

CMP = importlib.import_module("profiler.analysis.compare")
pytestmark = pytest.mark.skipif(not tables_fast.enabled(), reason="no compiled loops here (numba absent)")
TRACES = Path(__file__).resolve().parents[2] / "traces"


@pytest.fixture
def engine(monkeypatch):
    def set_(name):
        monkeypatch.setattr(tables_fast, "ENGINE", name)
    return set_


def _same(a, b, what: str) -> None:
    """a and b equal to the bit: frames and series with their dtypes, index and order."""
    if isinstance(a, pd.DataFrame):
        assert isinstance(b, pd.DataFrame) and list(a.dtypes) == list(b.dtypes), f"{what}: columns or dtypes differ"
        pd.testing.assert_frame_equal(a, b, check_exact=True, obj=what)
    elif isinstance(a, pd.Series):
        pd.testing.assert_series_equal(a, b, check_exact=True, obj=what)
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and np.array_equal(a, b), f"{what} differs"
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), f"{what}: keys differ"
        for k in a:
            _same(a[k], b[k], f"{what}[{k}]")
    elif dataclasses.is_dataclass(a) and not isinstance(a, type):
        for f in dataclasses.fields(a):
            if f.name != "graph":
                _same(getattr(a, f.name), getattr(b, f.name), f"{what}.{f.name}")
    else:
        assert a == b, f"{what} differs: {a!r} != {b!r}"


def _graph(ev, launches, sem):
    closed = unfinished.close(ev, launches)
    return closed, G._build(closed, sem)


def _tables_both(ev, launches, registry, engine) -> tuple[dict, dict]:
    """chunked._tables of one graph computed on the numpy path, then on the compiled one."""
    sem = semantics(registry)
    out = []
    for name in ("numpy", "auto"):
        engine(name)
        closed, g = _graph(ev, launches, sem)
        g.table_ref = closed
        g.derived["run_ranks"] = int(pd.unique(ev["rank"]).size)
        out.append(CH._tables(g, np.arange(len(ev))))
    # the launches' extents by sorted segments, as pandas' group-bys make them
    _same(TM._launch_extents_pandas(g), TM._launch_extents(g), "launch extents")
    return out[0], out[1]


SCENARIOS = [("balanced", {}), ("slow_rank", {}), ("late_host", {}), ("starvation", {"active_blocks": 2}),
             ("late_arriver", {})]


@pytest.mark.parametrize("scenario,kw", SCENARIOS)
def test_tables_match_numpy_on_synthetic_runs(scenario, kw, engine):
    ev, la, m = make_events(ranks=4, events=20_000, scenario=scenario, seed=3, **kw)
    want, got = _tables_both(ev, la, m.get("registry"), engine)
    _same(want, got, scenario)


@pytest.mark.parametrize("name", sorted(p.name for p in TRACES.iterdir() if (p / "manifest.json").exists()
                                         and (p / "events.parquet").exists()))
def test_bundled_tables_match_numpy(name, engine):
    r = load_run(TRACES / name)
    want, got = _tables_both(r.events, r.launches, r.manifest.get("registry"), engine)
    _same(want, got, name)


def test_the_test_fails_when_the_paths_diverge(engine, monkeypatch):
    """A compiled wait split that counts the time after the cut as before must be caught."""
    ev, la, m = make_events(ranks=4, events=20_000, scenario="late_host", seed=3)
    real, real_void = tables_fast.run, tables_fast.run_void

    def swapped(name, *args):
        tot = real(name, *args)
        if name == "entry_sums":
            before, after = args[-3], args[-2]
            before += after
        return tot

    def swapped_void(name, *args):   # the entry sums made in one pass with the points' (lane_totals)
        real_void(name, *args)
        if name == "point_entry_sums":
            before, after = args[-4], args[-3]
            before += after
    monkeypatch.setattr(tables_fast, "run", swapped)
    monkeypatch.setattr(tables_fast, "run_void", swapped_void)
    want, got = _tables_both(ev, la, m.get("registry"), engine)
    with pytest.raises(AssertionError):
        _same(want, got, "late_host")


def test_lane_totals_fall_back_where_a_sum_could_round(engine):
    """Times beyond 2**53 ns: the compiled passes do not run, the numpy sums answer."""
    ev, la, m = make_events(ranks=2, events=4000, scenario="balanced", seed=1)
    sem = semantics(m.get("registry"))
    big = ev.assign(begin_ns=ev["begin_ns"] + 2 ** 54, end_ns=ev["end_ns"] + 2 ** 54)
    engine("auto")
    _, g = _graph(big, None, sem)
    assert not LT._times_exact(g)
    engine("numpy")
    _, g2 = _graph(big, None, sem)
    _same(LT.points(g2), LT.points(g), "points")
    _same(LT.intervals(g2), LT.intervals(g), "intervals")


class _Sem:
    """The registry facts event_samples reads: which waits a peer releases."""
    def __init__(self, waits):
        self.waits = waits


def _events(rng, n: int, wide: bool, missing: bool) -> pd.DataFrame:
    kind = pd.Categorical(np.array(["span", "host", "instant"], dtype=object)[rng.integers(0, 3, n)],
                          categories=["instant", "span", "host", "arrive"])
    kernels = np.array(["dispatch", "combine", "notify"], dtype=object)[rng.integers(0, 3, n)]
    phases = np.array(["copy", "wait_data", "send", "wait_space"], dtype=object)[rng.integers(0, 4, n)]
    if missing:
        kernels[rng.random(n) < 0.05] = None
        phases[rng.random(n) < 0.05] = None
    b = rng.integers(0, 10**7, n)
    it_t, rk_t, la_t = (np.int64, np.int64, np.int64) if wide else (np.int32, np.int16, np.int32)
    return pd.DataFrame({
        "rank": rng.integers(0, 4, n).astype(rk_t), "launch": rng.integers(0, 12, n).astype(la_t),
        "kernel": pd.Categorical(kernels, categories=["notify", "unused", "dispatch", "combine"]),
        "iteration": rng.integers(3, 9, n).astype(it_t), "kind": kind,
        "phase": pd.Categorical(phases, categories=["send", "copy", "wait_data", "idle", "wait_space"]),
        "begin_ns": b, "end_ns": b + rng.integers(0, 10**5, n)})


def _cuts(rng, how: str) -> pd.Series:
    r, la = np.meshgrid(np.arange(4), np.arange(10), indexing="ij")
    v = rng.integers(0, 10**7, r.size).astype(float)
    v[rng.random(r.size) < 0.2] = np.nan
    if how == "fractional":
        v += 0.5
    r, la = r.ravel(), la.ravel()
    if how == "duplicated":
        r, la, v = np.r_[r, r[:1]], np.r_[la, la[:1]], np.r_[v, v[:1]]
    if how == "empty":
        r, la, v = r[:0], la[:0], v[:0]
    return pd.Series(v, index=pd.MultiIndex.from_arrays([r, la], names=["rank", "launch"]))


@pytest.mark.parametrize("wide", [False, True])
@pytest.mark.parametrize("missing", [False, True])
@pytest.mark.parametrize("cuts", ["plain", "empty", "fractional", "duplicated"])
def test_event_samples_match_numpy(wide, missing, cuts, engine):
    rng = np.random.default_rng(11)
    ev = _events(rng, 20_000, wide, missing)
    sem = _Sem({"wait_data": "publish", "wait_space": ""})
    c = _cuts(rng, cuts)
    engine("numpy")
    try:
        want = CMP.event_samples(ev, sem, c)
    except ValueError:                      # duplicated cuts: pandas' reindex refuses them
        engine("auto")
        assert CMP._fast_samples(ev, sem, c) is None
        return
    engine("auto")
    fast = CMP._fast_samples(ev, sem, c)
    assert (fast is None) == (cuts == "fractional"), "the compiled pass runs on integral cuts only"
    _same(want, CMP.event_samples(ev, sem, c), f"samples {cuts}")


def test_event_samples_fall_back_where_times_are_not_exact(engine):
    rng = np.random.default_rng(5)
    ev = _events(rng, 2000, False, False)
    ev = ev.assign(begin_ns=ev["begin_ns"] + 2 ** 53, end_ns=ev["end_ns"] + 2 ** 53)
    engine("auto")
    assert CMP._fast_samples(ev, _Sem({"wait_data": "publish"}), _cuts(rng, "plain")) is None


def test_points_and_entry_in_one_pass_match_the_two_passes(engine, monkeypatch):
    """lane_totals' merged pass over the points (the entry totals asked for first, as chunked._tables
    does) against the points' and the entry's own compiled passes."""
    ev, la, m = make_events(ranks=4, events=20_000, scenario="late_host", seed=3)
    sem = semantics(m.get("registry"))
    engine("auto")
    calls, real_void = [], tables_fast.run_void
    monkeypatch.setattr(tables_fast, "run_void", lambda name, *a: (calls.append(name), real_void(name, *a)))
    got = []
    for merged in (True, False):
        _, g = _graph(ev, la, sem)
        g.derived["run_ranks"] = 4
        if not merged:
            LT.points(g)                     # the points first: each pass on its own
        TM.launch_rows(g)
        got.append((LT.points(g), g.derived["lane_totals.entry"]))
        assert ("point_entry_sums" in calls) == merged, "the merged pass ran where it should not, or not"
        calls.clear()
    _same(got[0][0], got[1][0], "points")
    _same(got[0][1], got[1][1], "entry")
