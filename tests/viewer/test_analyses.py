"""viewer/analyses.py: a run above chunked.MAX_EVENTS is analysed in chunks of iterations, and
every page gets the same results as from the whole run (what-if included)."""
from __future__ import annotations

import pandas as pd

from profiler import analysis
from profiler.analysis import chunked
from viewer import analyses
from viewer.catalog import Catalog


def test_a_big_run_is_analysed_in_chunks_with_the_whole_runs_results(run_root, monkeypatch):
    cat = Catalog([run_root / "late"])
    run = cat.load(cat.ids()[0])
    ev, reg, la = analyses.events(run), analyses.registry(run), run.launches
    whole_cp = analysis.critical_path(ev, registry=reg, launches=la)
    whole_idle = analysis.idle_warps(ev, registry=reg, launches=la)
    whole_bar = analysis.barrier_contention(ev, registry=reg, launches=la)
    whole_wi = analysis.what_if(ev, phase="send_chunk", speedup=0.3, rank=0, registry=reg, launches=la,
                                new_path=False).summary
    per_it = int(ev["iteration"].value_counts().max())
    monkeypatch.setattr(chunked, "MAX_EVENTS", per_it)       # one iteration a chunk
    cp = analyses.critical(run)
    assert isinstance(cp.graph, chunked.Summaries)
    assert analyses.run_chunks(run) == ev["iteration"].nunique()
    assert cp.verdict == whole_cp.verdict
    pd.testing.assert_frame_equal(cp.segments, whole_cp.segments, check_dtype=False)
    assert analyses.idle(run).verdict.headline == whole_idle.verdict.headline
    assert analyses.barriers(run).verdict.headline == whole_bar.verdict.headline
    wi = analyses.what_if(run, "send_chunk", 0.3, 0)
    pd.testing.assert_frame_equal(wi, whole_wi, check_dtype=False)


def test_the_what_if_bound_comes_from_the_critical_path_and_holds(run_root):
    from viewer.pages.critical_path import logic
    cat = Catalog([run_root / "late"])
    run = cat.load(cat.ids()[0])
    b = analyses.what_if_bound(run, "send_chunk", 0.5, None)
    exact = analyses.what_if(run, "send_chunk", 0.5, None)
    assert (-exact["change_ns"].to_numpy() <= b["max_saving_ns"].to_numpy() + 1).all()
    assert "the exact re-timing follows" in logic.bound_sentence(b, "send_chunk", None, 50)
