"""The timeline overview's and the run tables' compiled loops (profiler/analysis/timeline_fast.py)
against their numpy paths: the same stored overview (every float bit for bit), the same chunk parts
and spills, the same selected order statistics, on random tables (stored and int64 widths, rows
sorted by iteration or not, spans ending before they begin, host rows, missing phases and roles)
and on bundled runs' closed tables."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from profiler.analysis import run_tables as RT, timeline_fast as TF, timeline_overview as TO, unfinished
from profiler.analysis.spill import Spill
from profiler.store.runstore import load_run

pytestmark = pytest.mark.skipif(not TF.enabled(), reason="no compiled loops here (numba absent)")
TRACES = Path(__file__).resolve().parents[2] / "traces"
KINDS = ["span", "instant", "arrive", "depart", "host"]


@pytest.fixture
def engine(monkeypatch):
    def set_(name):
        monkeypatch.setattr(TF, "ENGINE", name)
    return set_


def _cat(codes: np.ndarray, names: list[str]) -> pd.Categorical:
    return pd.Categorical.from_codes(codes, categories=names)


def _table(rng, n: int, wide: bool, by_iteration: bool, sparse: bool = False) -> pd.DataFrame:
    """A random closed event table: spans (some ending before they begin), instants, barriers and
    host rows over a few ranks, blocks, warps and iterations; non-span rows may lack a phase."""
    n_it = int(rng.integers(1, 4))
    it = np.sort(rng.integers(0, n_it, n)) if by_iteration else rng.integers(0, n_it, n)
    if sparse:
        it = it * 10_000_000                      # too sparse for dense tables: the numpy path runs
    kind = rng.choice(len(KINDS), n, p=[0.55, 0.25, 0.05, 0.05, 0.1]).astype(np.int8)
    phases = [f"p{i}" for i in range(int(rng.integers(1, 9)))]
    phase = rng.integers(0, len(phases), n).astype(np.int8)
    phase[(kind != 0) & (rng.random(n) < 0.3)] = -1
    role = rng.integers(-1, 3, n).astype(np.int8)
    begin = rng.integers(0, 50_000, n) + it.astype(np.int64) * 60_000
    end = begin + rng.integers(-30, 4_000, n)
    w = (lambda d: np.int64) if wide else (lambda d: d)
    return pd.DataFrame({
        "rank": rng.integers(0, 4, n).astype(w(np.int16)), "launch": rng.integers(0, 3, n).astype(w(np.int32)),
        "kernel": _cat(rng.integers(0, 2, n).astype(np.int8), ["dispatch", "combine"]),
        "iteration": it.astype(w(np.int32)), "block": rng.integers(0, 5, n).astype(w(np.int32)),
        "warp": rng.integers(0, 4, n).astype(w(np.int16)), "role": _cat(role, ["send", "recv", "meta"]),
        "kind": _cat(kind, KINDS), "phase": _cat(phase, phases), "begin_ns": begin, "end_ns": end,
        "payload": np.zeros(n, np.int64), "open": rng.random(n) < 0.02})


def _stored_overview(ev: pd.DataFrame) -> tuple[dict, dict]:
    return TO.to_stored(TO.overview(ev))


def assert_same_overview(ev: pd.DataFrame, engine) -> None:
    engine("numpy")
    meta_a, a = _stored_overview(ev)
    engine("auto")
    meta_b, b = _stored_overview(ev)
    assert meta_a == meta_b
    for name in TO.TABLES:
        pd.testing.assert_frame_equal(a[name], b[name], check_exact=True, obj=name)
    for name in ("fine", "coarse"):
        assert a[name]["busy"].to_numpy().tobytes() == b[name]["busy"].to_numpy().tobytes(), name


def _part(ev: pd.DataFrame):
    spill = Spill()
    p = RT.chunk_part(ev, len(ev), np.arange(len(ev)), spill, "d")
    return p, spill.get("d")


def assert_same_part(ev: pd.DataFrame, engine) -> None:
    engine("numpy")
    a, sa = _part(ev)
    engine("auto")
    b, sb = _part(ev)
    assert np.array_equal(a.kinds, b.kinds) and a.unfinished == b.unfinished
    assert (a.kernel_names, a.phase_names) == (b.kernel_names, b.phase_names)
    for name in ("groups", "warp_time"):
        pd.testing.assert_frame_equal(getattr(a, name), getattr(b, name), check_exact=True, obj=name)
    for k in ("group", "duration"):
        assert sa[k].dtype == sb[k].dtype and np.array_equal(sa[k], sb[k]), k


@pytest.mark.parametrize("seed", range(30))
def test_overview_and_chunk_part_match_numpy_on_random_tables(seed, engine):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 3000))
    ev = _table(rng, n, wide=seed % 3 == 1, by_iteration=seed % 2 == 0, sparse=seed % 10 == 9)
    if seed % 4 == 0:                             # each lane one run of rows, as the decoder writes them
        ev = ev.sort_values(["rank", "launch", "kernel", "block", "warp", "begin_ns"], kind="stable")
    if seed % 5 == 3:
        ev = ev[ev["kind"] != "span"]            # no spans: empty tiles and groups
        if not len(ev):
            return
    assert_same_overview(ev, engine)
    assert_same_part(ev, engine)


def test_the_compiled_paths_run_where_they_should(engine, monkeypatch):
    """Stored widths and int64 both take the compiled loops; sparse iterations fall back; a run
    table of lanes in one run each and the median selection take theirs."""
    rng = np.random.default_rng(1)
    calls = []
    for name in ("scan", "span_groups", "lane_runs", "hist", "keep"):
        real = getattr(TF, name)
        monkeypatch.setattr(TF, name, lambda *a, _n=name, _f=real: calls.append(_n) or _f(*a))
    widths = []
    for wide, sparse in ((False, False), (True, False), (False, True)):
        ev = _table(rng, 500, wide, True, sparse)
        widths.append(TF.lane_columns(*(ev[c].to_numpy() for c in ("rank", "block", "warp", "iteration")))[0])
        TO.overview(ev)
    assert calls == ["scan", "scan"] and widths[:2] == ["schema", "wide"]
    run = load_run(TRACES / "ll-split-a2")
    calls.clear()
    ev = unfinished.close(run.events, run.launches)
    spill = Spill()
    p = RT.chunk_part(ev, len(ev), np.arange(len(ev)), spill, "d")
    monkeypatch.setattr(RT, "SELECT_KEEP", 0)
    RT.finish([p], spill, run.launches)
    assert calls[:2] == ["span_groups", "lane_runs"] and "hist" in calls and "keep" in calls


@pytest.mark.parametrize("wide", [False, True])
def test_selection_matches_numpy_and_the_sorted_values(wide, engine, monkeypatch):
    rng = np.random.default_rng(11 + wide)
    spill, parts, whole = Spill(), [], {g: [] for g in range(5)}
    for c in range(4):
        ds = [rng.lognormal(8, 2, int(rng.integers(1, 800))).astype(np.int64) for _ in range(5)]
        if wide:
            ds[1] = np.r_[ds[1], 2**40 + c]       # a duration past int32: the int64 spill
        gi = np.concatenate([np.full(d.size, g, np.int32) for g, d in enumerate(ds)])
        dur = np.concatenate(ds)
        order = rng.permutation(gi.size)
        spill.put(f"c{c}", {"group": gi[order], "duration": dur[order] if wide else dur[order].astype(np.int32)})
        parts.append(RT.ChunkPart(kinds=np.zeros(5, np.int64), groups=pd.DataFrame({
            "gid": np.arange(5, dtype=np.int64), "count": [d.size for d in ds], "sum": [int(d.sum()) for d in ds],
            "max": [int(d.max()) for d in ds], "min": [int(d.min()) for d in ds]}), warp_time=pd.DataFrame(),
            unfinished=None, kernel_names=(), phase_names=(), name=f"c{c}"))
        for g, d in enumerate(ds):
            whole[g].append(d)
    g = RT._groups(parts)
    n = g["count"].to_numpy()
    ks = [[(n - 1) // 2, n // 2], [np.zeros(5, np.int64), n - 1, n // 3]]
    srt = [np.sort(np.concatenate(whole[i])) for i in range(5)]
    for keep in (RT.SELECT_KEEP, 0, 50):          # sorted at once; narrowed to single values; in between
        monkeypatch.setattr(RT, "SELECT_KEEP", keep)
        for k in ks:
            engine("numpy")
            want = RT.select(parts, spill, g, k)
            engine("auto")
            got = RT.select(parts, spill, g, k)
            for kk, x, y in zip(k, want, got):
                assert np.array_equal(x, y) and np.array_equal(y, [srt[i][kk[i]] for i in range(5)])


@pytest.mark.parametrize("name", ["ep-timeout", "ep-host-late", "ll-split-a2", "ep-barrier-straggler", "ll-host-a0"])
def test_bundled_runs_closed_tables_match_numpy(name, engine):
    run = load_run(TRACES / name)
    ev = unfinished.close(run.events, run.launches)
    assert_same_overview(ev, engine)
    assert_same_part(ev, engine)


@pytest.mark.parametrize("r", [1, 2, 3, 4, 8, 16, 24, 64, 128])
def test_coarse_means_are_numpys_mean_bit_for_bit(r):
    """The tiles' coarse grids: numpy's mean over r bins (its pairwise sum) on the same view."""
    rng = np.random.default_rng(r)
    n_keys, nc = 12, 5
    nb = nc * r
    flat = rng.random(3 + n_keys * (nb + 1)) * rng.choice([0.0, 1e-9, 1.0, 1e6], 3 + n_keys * (nb + 1))
    grid = flat[3:].reshape(n_keys, nb + 1)[:, :nb]
    want = grid.reshape(n_keys, nc, r).mean(axis=2)
    got = TF.coarse_means(flat, 3, n_keys, nb, r).reshape(n_keys, nc)
    assert got.tobytes() == want.tobytes()
    assert TF.coarse_means(flat, 3, n_keys, nb * 2, 256) is None     # past one pairwise block: numpy's
