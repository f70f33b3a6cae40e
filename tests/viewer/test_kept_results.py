"""Issue 31: what the viewer computes for a run nobody analysed is kept (viewer.results), through
the writers `epscope analyze` uses: in the run when it may write there, else in a cache keyed by
the run's data; a second start then opens every page from them without reading the events, and
the Runs page shows the run as analysed. Kept results stay bound to the data they came from."""
from __future__ import annotations

import shutil

import pandas as pd
import pytest

from profiler.analysis import stored, summary
from viewer import analyses, results
from viewer.app import PAGE, create_app
from viewer.catalog import Catalog
from viewer.pages.runs import logic as RL

from .dashclient import runs_grid, text_of
from .test_app import route

PAGES = ("/critical-path", "/idle", "/barriers")   # a small run's timeline reads its events whatever is stored


@pytest.fixture
def root(run_root, tmp_path):
    """A root holding a copy of the synthetic 'late' run, never analysed."""
    r = tmp_path / "root"
    shutil.copytree(run_root / "late", r / "late", ignore=shutil.ignore_patterns(stored.DIR, summary.FILE))
    assert stored.load(r / "late") is None and summary.load(r / "late") is None
    return r


def _open_every_page(root, tmp_path) -> object:
    app = create_app([root], cache_dir=tmp_path / "viewer-cache", ready_wait_s=600)
    for path in PAGES:
        page = text_of(route(app, path, "late")[PAGE]["children"])
        assert "Cannot show" not in page and "failed" not in page and "Computing" not in page, (path, page[:300])
    return app


def _second_start_reads_no_events(root, tmp_path, first) -> None:
    """A new viewer on the root: every analysis page from the kept results, no event read, the
    same verdicts as the first start's; the Runs page lists the run as analysed."""
    app = _open_every_page(root, tmp_path)
    run = app.catalog.loaded("late")
    assert analyses.stored_results(run) is not None and not run.events_read
    assert app.catalog.jobs.wait([("late", n) for n in ("critical", "idle", "barriers")], 60)
    assert not run.events_read
    for name in ("critical", "idle", "barriers"):
        assert getattr(analyses, name)(run).verdict == getattr(analyses, name)(first).verdict, name
    pd.testing.assert_frame_equal(analyses.critical(run).segments, analyses.critical(first).segments,
                                  check_dtype=False)
    row = runs_grid(app)["rowData"][0]
    assert row["op_latency"] != RL.NOT_ANALYSED and row["verdict"], row


def test_a_run_nobody_analysed_is_kept_in_the_run_and_the_next_start_reads_it(root, tmp_path, monkeypatch):
    monkeypatch.setenv(results.STORE_ENV, "run")
    first = _open_every_page(root, tmp_path).catalog.loaded("late")
    assert first.events_read                                    # computed from the events
    # written as `epscope analyze` writes it: current, with the headline summary beside it
    assert stored.current(root / "late") and summary.load(root / "late") is not None
    assert not any(results.cache_root().iterdir())              # nothing in the cache
    # what `epscope analyze` writes, byte for byte (every table's SHA-256 is in the index)
    twin = tmp_path / "twin" / "late"
    shutil.copytree(root / "late", twin, ignore=shutil.ignore_patterns(stored.DIR, summary.FILE))
    stored.store_run(twin)
    for f in (f"{stored.DIR}/{stored.INDEX}", summary.FILE):
        assert (root / "late" / f).read_bytes() == (twin / f).read_bytes(), f
    _second_start_reads_no_events(root, tmp_path, first)


def test_a_run_the_viewer_cannot_write_is_kept_in_its_cache(root, tmp_path, monkeypatch):
    monkeypatch.setenv(results.STORE_ENV, "run")
    real = results.os.access
    monkeypatch.setattr(results.os, "access", lambda p, mode: False if str(p) == str(root / "late") else real(p, mode))
    before = sorted(p.name for p in (root / "late").iterdir())
    first = _open_every_page(root, tmp_path).catalog.loaded("late")
    assert sorted(p.name for p in (root / "late").iterdir()) == before      # the run is untouched
    d = results.cache_dir(root / "late")
    assert d.parent == results.cache_root() and (d / stored.DIR / stored.INDEX).is_file() and (d / summary.FILE).is_file()
    _second_start_reads_no_events(root, tmp_path, first)


def test_kept_results_are_bound_to_the_data_they_came_from(root, run_root, tmp_path):
    """Results in the cache are served only to a run whose data files hash as they did: another
    run's results moved under this run's key are refused (their own hashes name the other data)."""
    run = Catalog([root]).load("late")
    analyses.critical(run)                                      # computed and kept (cache: conftest)
    assert results.load(root / "late") is not None
    other = tmp_path / "other"
    shutil.copytree(run_root / "starved", other / "starved", ignore=shutil.ignore_patterns(stored.DIR, summary.FILE))
    mine, theirs = results.cache_dir(root / "late"), results.cache_dir(other / "starved")
    assert mine != theirs
    shutil.copytree(mine, theirs)
    assert results.load(other / "starved") is None and results.load_summary(other / "starved") is None


def test_nothing_is_written_when_the_viewer_is_told_so(root, tmp_path, monkeypatch):
    monkeypatch.setenv(results.STORE_ENV, "off")
    before = sorted(p.name for p in (root / "late").iterdir())
    _open_every_page(root, tmp_path)
    assert sorted(p.name for p in (root / "late").iterdir()) == before and not any(results.cache_root().iterdir())
    assert Catalog([root]).load("late") and results.load(root / "late") is None
