"""Every page on every bundled trace renders without an error message (through the app's
callback endpoint, no browser): real recordings exercise shapes synthetic runs do not (open
spans of a timed-out run, host-paced launches, high-resolution clocks)."""
from __future__ import annotations

from pathlib import Path

import pytest

from viewer.app import NAV, PAGE, PAGES, RUN_SELECT, URL, create_app

from .dashclient import call, text_of

TRACES = Path(__file__).resolve().parents[2] / "traces"


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    assert any(TRACES.rglob("manifest.json")), "traces/ is tracked in git: its runs must be in the checkout"
    return create_app([TRACES], cache_dir=tmp_path_factory.mktemp("viewer-cache"))


def test_every_page_on_every_bundled_trace(app):
    failures = []
    for e in app.catalog.entries():
        for path in PAGES:
            r = call(app, [(PAGE, "children"), (NAV, "children"), (RUN_SELECT, "value"), (URL, "search")],
                     [(URL, "pathname", path), (URL, "search", f"?run={e.run_id}"), (RUN_SELECT, "value", None)])
            text = text_of(r[PAGE]["children"])
            if "Cannot show" in text or "This page failed" in text:
                failures.append(f"{e.run_id} {path}: {text[:300]}")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("stored_results", ["current", "stale"])
def test_one_graph_per_run(monkeypatch, stored_results):
    """issue 20: the critical path and idle built separate dependency graphs of one run (the graph
    cache keys on the launch table, and only idle was given it): every page's analysis of a run
    reads the same graph, and so the same time model. With current stored results no page builds
    one; the what-if's graph (analyses.graph) is then built once, the same the analyses build."""
    from profiler.analysis import graph as G
    from profiler.analysis import summary
    from viewer import analyses
    from viewer.catalog import Catalog
    if stored_results == "stale":
        monkeypatch.setattr(summary, "ANALYSIS_VERSION", summary.ANALYSIS_VERSION + 1)
    cat = Catalog([TRACES / "ep-host-late"])
    run = cat.load(cat.ids()[0])
    cp, iw, bc = analyses.critical(run), analyses.idle(run), analyses.barriers(run)
    assert (analyses.stored_results(run) is None) == (stored_results == "stale")
    assert run.events_read == (stored_results == "stale")
    if stored_results == "stale":
        # analysed once, as `epscope analyze` does (issue 31: and kept): every page's report and the
        # what-if's graph come from that one analysis, one graph and its time model
        res = analyses._analysed(run)
        assert cp is res.critical and iw is res.idle and bc is res.barriers
        assert analyses.graph(run) is cp.graph and isinstance(cp.graph.graph, G.Graph)
        assert cp.graph.graph.derived.get("time_model") is res.time_model
        return
    g = G.build(analyses.events(run), analyses.registry(run), run.launches)
    assert cp.graph is None
    assert analyses.graph(run) is g
    assert G.build(analyses.events(run), analyses.registry(run), run.launches) is g
    assert g.derived.get("time_model") is not None           # read by the pages, computed once
