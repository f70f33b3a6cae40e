"""profiler/analysis/run_tables.py: the report's tables computed in the analyses' chunks equal the
whole-table computation `epscope report` used to make (pandas group-bys of the closed event
table, written out below as the reference), on synthetic runs and a timed-out run cut one
iteration a chunk (every bundled run: tests/analysis/test_stored.py, on the analyses it computes); the median selection is exact on skewed and tied durations."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from profiler.analysis import chunked, run_tables as RT, unfinished
from profiler.analysis.spill import Spill
from profiler.store.runstore import load_run
from profiler.groundtruth.synthetic import make_events

TRACES = Path(__file__).resolve().parents[2] / "traces"


def reference_phases(ev: pd.DataFrame) -> pd.DataFrame:
    """The report's phase table as computed on the whole closed table before issue 31."""
    gpu = ev[ev["kind"] != "host"]
    ext = gpu.groupby(["kernel", "rank", "launch", "block", "warp"], observed=True).agg(
        b=("begin_ns", "min"), e=("end_ns", "max"))
    warp_time = (ext["e"] - ext["b"]).groupby(level=["kernel", "rank"], observed=True).sum()
    sp = gpu[gpu["kind"] == "span"].assign(dur=lambda d: d["end_ns"] - d["begin_ns"])
    g = sp.groupby(["kernel", "phase", "rank"], observed=True)["dur"].agg(["count", "sum", "median", "max"]).reset_index()
    g["share"] = g["sum"] / warp_time.reindex(pd.MultiIndex.from_frame(g[["kernel", "rank"]])).to_numpy()
    return g


def reference_unfinished(ev: pd.DataFrame) -> dict | None:
    op = ev[ev["open"].to_numpy()]
    if op.empty:
        return None
    d = op["end_ns"] - op["begin_ns"]
    i = int(d.to_numpy().argmax())
    w = op.iloc[i]
    return {"count": len(op), "rank": int(w["rank"]), "kernel": str(w["kernel"]), "phase": str(w["phase"]),
            "duration_ns": int(d.iloc[i]), "block": int(w["block"]), "warp": int(w["warp"])}


def assert_tables_match(ev: pd.DataFrame, launches, t: RT.RunTables) -> None:
    closed = unfinished.close(ev, launches)
    ref = reference_phases(closed)
    got = t.phases
    assert len(ref) == len(got)
    assert list(got.columns) == RT.PHASE_COLUMNS
    for c in ("kernel", "phase"):
        assert got[c].astype(str).tolist() == ref[c].astype(str).tolist(), c
        np.testing.assert_array_equal(got[f"{c}_order"].to_numpy(), ref[c].cat.codes.to_numpy(), err_msg=c)
    for c in ("rank", "count", "sum", "max"):
        np.testing.assert_array_equal(got[c].to_numpy(np.int64), ref[c].to_numpy(np.int64), err_msg=c)
    for c in ("median", "share"):
        np.testing.assert_array_equal(got[c].to_numpy(float), ref[c].to_numpy(float), err_msg=c)
    kinds = closed["kind"].value_counts()
    assert {k: t.kind_count(k) for k in RT.KINDS} == {k: int(kinds.get(k, 0)) for k in RT.KINDS}
    u = reference_unfinished(closed)
    if u is None:
        assert t.unfinished.empty
    else:
        assert t.unfinished.iloc[0].to_dict() == u


@pytest.mark.parametrize("scenario", ["slow_rank", "starvation", "late_host", "timeout"])
def test_tables_of_a_run_in_chunks_of_one_iteration_equal_the_whole_table(scenario, tmp_path):
    if scenario == "timeout":       # unfinished waits and arrivals in several chunks
        r = load_run(TRACES / "ep-timeout")
        ev, la, reg = r.events, r.launches, r.manifest.get("registry")
    else:
        ev, la, man = make_events(ranks=4, events=60_000, scenario=scenario, iterations=5, seed=3)
        reg = man["registry"]
    spills = chunked.Spills(what_if=Spill(tmp_path / "w"), durations=Spill(tmp_path / "d"))
    res = chunked.analyze(ev, registry=reg, launches=la, max_events=1, spills=spills)
    assert res.chunks == ev["iteration"].nunique()
    assert_tables_match(ev, la, res.run_tables)
    assert not list((tmp_path / "d").iterdir())         # the durations' spill is gone once selected


def _part(groups, durs, name, spill):
    g = np.concatenate([np.full(len(d), i) for i, d in enumerate(durs)]).astype(np.int32)
    x = np.concatenate(durs).astype(np.int64)
    spill.put(name, {"group": g, "duration": x})
    return RT.ChunkPart(kinds=np.zeros(len(RT.KINDS), np.int64), groups=pd.DataFrame({
        "gid": groups, "count": [len(d) for d in durs], "sum": [int(np.sum(d)) for d in durs],
        "max": [int(np.max(d)) for d in durs], "min": [int(np.min(d)) for d in durs]}),
        warp_time=pd.DataFrame(), unfinished=None, kernel_names=(), phase_names=(), name=name)


def test_selection_is_exact_on_skewed_tied_and_wide_durations(monkeypatch):
    rng = np.random.default_rng(7)
    spill = Spill()
    whole = {0: [], 1: [], 2: []}
    parts = []
    for c in range(4):
        d0 = rng.lognormal(10, 3, 1001 + c).astype(np.int64)          # skewed, up to ~1e9
        d1 = np.full(37, 5_000, np.int64) if c % 2 else np.array([5_000, 2**40 + 3], np.int64)  # ties, wide
        d2 = rng.integers(0, 3, 10 + c)                                 # few values
        parts.append(_part([0, 1, 2], [d0, d1, d2], f"c{c}", spill))
        for k, d in enumerate((d0, d1, d2)):
            whole[k].append(d)
    g = RT._groups(parts)
    want = np.array([np.median(np.concatenate(whole[k]).astype(np.float64)) for k in range(3)])
    np.testing.assert_array_equal(RT._medians(parts, spill, g), want)
    n = g["count"].to_numpy()
    ks = [np.zeros(3, np.int64), n - 1, n // 3, (n - 1) // 2]
    for keep in (RT.SELECT_KEEP, 0, 5):          # sorted at once; narrowed to single values; in between
        monkeypatch.setattr(RT, "SELECT_KEEP", keep)
        for k, got in zip(ks, RT.select(parts, spill, g, ks)):
            np.testing.assert_array_equal(got, [np.sort(np.concatenate(whole[i]))[k[i]] for i in range(3)])
