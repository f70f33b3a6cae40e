"""viewer/analyses.py with stored results (profiler.analysis.stored): a run that carries current
ones opens every analysis page without reading its event table; the exact what-if still works
(the graph is built then); a run with stale ones, or none (earlier runs), computes as before."""
from __future__ import annotations

import shutil

import pandas as pd
import pytest

from profiler import analysis
from profiler.analysis import stored, summary
from viewer import analyses
from viewer.app import PAGE, create_app
from viewer.catalog import Catalog
from viewer.pages.critical_path.ids import Ids as CpIds

from .dashclient import call, text_of
from .test_app import route

PAGES = ("/critical-path", "/idle", "/barriers")


@pytest.fixture
def root(run_root, tmp_path):
    """A root holding a copy of the synthetic 'late' run with its results stored."""
    r = tmp_path / "root"
    shutil.copytree(run_root / "late", r / "late")
    stored.store_run(r / "late")
    return r


def test_a_run_with_stored_results_opens_every_analysis_page_without_reading_its_events(root, tmp_path):
    app = create_app([root], cache_dir=tmp_path / "cache", ready_wait_s=600)
    cat = app.catalog
    for path in PAGES:
        page = text_of(route(app, path, "late")[PAGE]["children"])
        assert "Cannot show" not in page and "failed" not in page and "Computing" not in page, path
    run = cat.loaded("late")
    assert run is not None and analyses.stored_results(run) is not None
    # background warming of the other results read no events either
    assert cat.jobs.wait([("late", n) for n in ("critical", "idle", "barriers")], 60)
    assert not run.events_read and run.run._events is None
    # the pages drew the stored results, which are the analyses of the events
    ev = analyses.events(run)
    reg, la = analyses.registry(run), run.launches
    assert analyses.critical(run).verdict == analysis.critical_path(ev, registry=reg, launches=la).verdict
    assert analyses.idle(run).verdict.headline == analysis.idle_warps(ev, registry=reg, launches=la).verdict.headline
    assert analyses.barriers(run).verdict.headline == analysis.barrier_contention(
        ev, registry=reg, launches=la).verdict.headline
    assert analyses.span_phases(run) == stored.span_phases(ev) and analyses.ranks(run) == stored.ranks_of(ev)


def test_the_exact_what_if_builds_the_graph_when_the_path_came_from_storage(root):
    cat = Catalog([root])
    run = cat.load("late")
    assert analyses.critical(run).graph is None
    bound = analyses.what_if_bound(run, "send_chunk", 0.3, 0)      # instant: from the stored path
    assert not run.events_read
    got = analyses.what_if(run, "send_chunk", 0.3, 0)
    ev = analyses.events(run)
    want = analysis.what_if(ev, phase="send_chunk", speedup=0.3, rank=0, registry=analyses.registry(run),
                            launches=run.launches, new_path=False).summary
    pd.testing.assert_frame_equal(got, want, check_dtype=False)
    assert (-got["change_ns"].to_numpy() <= bound["max_saving_ns"].to_numpy()).all()


def test_the_what_if_box_answers_on_a_run_with_stored_results(root, tmp_path):
    app = create_app([root], cache_dir=tmp_path / "cache", ready_wait_s=600)
    route(app, "/critical-path", "late")
    r = call(app, [(CpIds.RESULT, "children")], [(CpIds.APPLY, "n_clicks", 1)],
             state=[(CpIds.RUN, "data", "late"), (CpIds.PHASE, "value", "send_chunk"), (CpIds.RANK, "value", "all"),
                    (CpIds.PERCENT, "value", 20)])
    assert "If send_chunk on every rank were 20% faster" in text_of(r[CpIds.RESULT]["children"])


def test_stale_stored_results_are_computed_again_not_served(root, monkeypatch):
    monkeypatch.setattr(summary, "ANALYSIS_VERSION", summary.ANALYSIS_VERSION + 1)
    run = Catalog([root]).load("late")
    assert analyses.stored_results(run) is None
    assert analyses.critical(run).graph is not None          # computed from the events
    assert run.events_read


def test_a_run_without_stored_results_still_opens(run_root, tmp_path):
    assert not (run_root / "late" / stored.DIR).exists()      # written by earlier versions: none
    app = create_app([run_root / "late"], cache_dir=tmp_path / "cache", ready_wait_s=600)
    rid = app.catalog.ids()[0]
    for path in PAGES:
        page = text_of(route(app, path, rid)[PAGE]["children"])
        assert "Cannot show" not in page and "failed" not in page, path
    assert app.catalog.loaded(rid).events_read


def test_a_run_stored_in_several_chunks_answers_the_exact_what_if_without_reading_events(run_root, tmp_path,
                                                                                         monkeypatch):
    """issue 31: the what-if of a run analysed in several chunks re-times each chunk from its stored
    input (no event read, no graph built), with the whole table's answer."""
    from profiler.analysis import chunked
    r = tmp_path / "root"
    shutil.copytree(run_root / "late", r / "late")
    monkeypatch.setattr(chunked, "MAX_EVENTS", 1)            # one iteration a chunk
    stored.store_run(r / "late")
    run = Catalog([r]).load("late")
    assert analyses.stored_results(run).what_if is not None
    got = analyses.what_if(run, "send_chunk", 0.3, 0)
    assert not run.events_read and run.run._events is None
    ev = analyses.events(run)
    want = analysis.what_if(ev, phase="send_chunk", speedup=0.3, rank=0, registry=analyses.registry(run),
                            launches=run.launches, new_path=False).summary
    pd.testing.assert_frame_equal(got, want, check_dtype=False)
