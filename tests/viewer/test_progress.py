"""A page whose analysis is still computing (issue 14): drawn at once as the run header and a
progress state, polled, then replaced by the page; a failed analysis is a message in the page;
the timeline draws before its critical path and adds it when it is computed. The analyses are
held on events (never on sleeps), so each state is seen for certain."""
from __future__ import annotations

import json
import re
import threading

import pytest

from viewer import analyses
from viewer.app import NAV, PAGE, RUN_SELECT, URL, create_app
from viewer.pages.progress.ids import Ids as P
from viewer.pages.progress.layout import FIRST_TICK_MS, TICK_MS
from viewer.pages.timeline.ids import Ids as TlIds

from .dashclient import call, post, text_of

T = 60


@pytest.fixture
def app(run_root, tmp_path_factory):
    # ready_wait_s=0: every page not already computed comes as its progress state
    return create_app([run_root], cache_dir=tmp_path_factory.mktemp("viewer-cache"), ready_wait_s=0)


@pytest.fixture
def hold(monkeypatch):
    """hold(name) -> an Event: the analysis `name` computes only once it is set."""
    def make(name, error=None):
        label, accessor, key = analyses.RESULTS[name]
        go = threading.Event()

        def held(run):
            assert go.wait(T)
            if error is not None:
                raise error
            return accessor(run)
        monkeypatch.setitem(analyses.RESULTS, name, (label, held, key))
        return go
    return make


def _route(app, path, run):
    return call(app, [(PAGE, "children"), (NAV, "children"), (RUN_SELECT, "value"), (URL, "search")],
                [(URL, "pathname", path), (URL, "search", f"?run={run}"), (RUN_SELECT, "value", None)],
                changed=["url.pathname"])[PAGE]["children"]


def _poll(app, path, run):
    return call(app, [(P.ROOT, "children"), (P.BOX, "children"), (P.TICK, "max_intervals"), (P.TICK, "interval")],
                [(P.TICK, "n_intervals", 1)], state=[(P.TARGET, "data", {"path": path, "run": run})])


def _ids(component) -> set:
    return set(re.findall(r'"id": "([^"]+)"', json.dumps(component)))


def test_a_page_comes_at_once_as_its_progress_state_then_fills_in(app, hold):
    go = hold("idle")
    page = _route(app, "/idle", "starved")
    text = text_of(page)
    assert "Perfetto trace" in text and "synthetic-starvation" in text      # the run header, at once
    assert "Computing in the background" in text and "idle warps:" in text
    assert P.TICK in _ids(page) and "idle-verdict" not in _ids(page)
    tick = re.search(r'"id": "%s"[^}]*' % P.TICK, json.dumps(page)).group(0)
    assert f'"interval": {FIRST_TICK_MS}' in tick      # the first ask at once: the server's wait paces it
    r = _poll(app, "/idle", "starved")                                       # still computing
    assert P.ROOT not in r and "idle warps:" in text_of(r[P.BOX]["children"])
    assert r[P.TICK]["max_intervals"] == 2      # one tick more after this answer (tick 1), never two in flight
    assert r[P.TICK]["interval"] == TICK_MS     # ... TICK_MS after it
    go.set()
    assert app.catalog.jobs.wait([("starved", "idle")], T)
    done = _poll(app, "/idle", "starved")[P.ROOT]["children"]
    assert "idle-verdict" in _ids(done) and P.TICK not in _ids(done)         # the page; polling ends
    assert "no work" in text_of(done)
    # the other analyses are computed ahead: the next page comes whole
    assert app.catalog.jobs.wait([("starved", n) for n in analyses.RESULTS], T)
    assert "bar-verdict" in _ids(_route(app, "/barriers", "starved"))


def test_two_pages_asking_for_one_analysis_share_its_job(app, hold):
    go = hold("critical")
    _route(app, "/critical-path", "late")
    job = app.catalog.jobs.get(("late", "critical"))
    _route(app, "/critical-path", "late")
    _poll(app, "/critical-path", "late")
    assert app.catalog.jobs.get(("late", "critical")) is job and job.state in ("queued", "running")
    go.set()
    assert app.catalog.jobs.wait([("late", "critical")], T)


def test_a_failed_analysis_is_a_message_in_the_page_and_a_new_visit_tries_again(app, hold, monkeypatch):
    real = analyses.RESULTS["barriers"]
    go = hold("barriers", error=ValueError("the registry declares no barrier"))
    _route(app, "/barriers", "balanced")
    go.set()
    assert app.catalog.jobs.wait([("balanced", "barriers")], T)
    shown = _poll(app, "/barriers", "balanced")[P.ROOT]["children"]
    text = text_of(shown)
    assert "barrier contention: ValueError: the registry declares no barrier" in text and "Traceback" not in text
    failed = app.catalog.jobs.get(("balanced", "barriers"))
    monkeypatch.setitem(analyses.RESULTS, "barriers", real)
    go_again = hold("barriers")                          # held: the new visit sees it computing
    again = _route(app, "/barriers", "balanced")        # a new visit: asked again
    assert "Computing in the background" in text_of(again)
    assert app.catalog.jobs.get(("balanced", "barriers")) is not failed
    go_again.set()
    assert app.catalog.jobs.wait([("balanced", "barriers")], T)
    assert "bar-verdict" in _ids(_poll(app, "/barriers", "balanced")[P.ROOT]["children"])


def test_a_run_that_cannot_load_says_so_through_the_progress_state(app):
    page = _route(app, "/critical-path", "bad~corrupt-events")
    if "Computing" in text_of(page):
        assert app.catalog.jobs.wait([("bad~corrupt-events", "critical")], T)
        page = _poll(app, "/critical-path", "bad~corrupt-events")[P.ROOT]["children"]
    assert "corrupt" in text_of(page).lower() and "Traceback" not in text_of(page)


def _figure(app, run, cp_ready):
    return call(app, [(TlIds.GRAPH, "figure"), (TlIds.INFO, "children"), (TlIds.WINDOW, "data")],
                [(TlIds.RUN, "data", run), (TlIds.LEVEL, "value", "rank"), (TlIds.RANKS, "value", []),
                 (TlIds.BLOCK_LO, "value", 0), (TlIds.BLOCK_HI, "value", 3), (TlIds.CRITICAL, "value", ["on"]),
                 (TlIds.GRAPH, "relayoutData", None), (TlIds.RESET, "n_clicks", None),
                 (TlIds.CP_READY, "data", cp_ready)], state=[(TlIds.WINDOW, "data", None)],
                changed=[f"{TlIds.RUN}.data"])[TlIds.GRAPH]["figure"]


def _cp_state(app, run):
    return call(app, [(TlIds.CP_READY, "data"), (TlIds.CP_TICK, "disabled"), (TlIds.CP_STATE, "children"),
                      (TlIds.CP_STATE, "className"), (TlIds.CP_TICK, "max_intervals")],
                [(TlIds.CP_TICK, "n_intervals", 1)],
                state=[(TlIds.RUN, "data", run)])


def test_the_timeline_draws_before_its_critical_path_and_adds_it_when_computed(app, hold):
    go = hold("critical")
    page = _route(app, "/timeline", "late")
    if "Computing" in text_of(page):      # the timeline index: not held
        assert app.catalog.jobs.wait([("late", "timeline_index")], T)
        page = _poll(app, "/timeline", "late")[P.ROOT]["children"]
    assert TlIds.GRAPH in _ids(page) and "critical path: computing" in text_of(page)
    fig = _figure(app, "late", False)
    assert fig["data"][0]["type"] == "heatmap" and not any(t.get("name") == "critical path" for t in fig["data"])
    st = _cp_state(app, "late")
    assert TlIds.CP_READY not in st and "pending" in st[TlIds.CP_STATE]["className"]
    assert "critical path:" in st[TlIds.CP_STATE]["children"] and st[TlIds.CP_TICK]["max_intervals"] == 2
    go.set()
    assert app.catalog.jobs.wait([("late", "critical")], T)
    st = _cp_state(app, "late")
    assert st[TlIds.CP_READY]["data"] is True and st[TlIds.CP_TICK]["disabled"] is True
    assert any(t.get("name") == "critical path" for t in _figure(app, "late", True)["data"])


def test_the_timeline_says_when_its_critical_path_failed(app, hold):
    go = hold("critical", error=RuntimeError("graph has a cycle"))
    go.set()
    _route(app, "/timeline", "starved")
    _figure(app, "starved", False)
    assert app.catalog.jobs.wait([("starved", "critical")], T)
    st = _cp_state(app, "starved")
    assert st[TlIds.CP_STATE]["children"] == "critical path unavailable: RuntimeError: graph has a cycle"
    assert st[TlIds.CP_TICK]["disabled"] is True and "bad" in st[TlIds.CP_STATE]["className"]


@pytest.mark.parametrize("target", [{"path": "/", "run": "late"}, {"path": "/nowhere", "run": "late"},
                                    {"path": "/idle", "run": "nope"}, {"path": "/idle", "run": ["x"]}, "abc", None])
def test_a_wrong_progress_target_is_a_message_not_a_500(app, target):
    r = post(app, [(P.ROOT, "children"), (P.BOX, "children"), (P.TICK, "max_intervals"), (P.TICK, "interval")],
             [(P.TICK, "n_intervals", 1)], state=[(P.TARGET, "data", target)])
    assert r.status_code == 200 and "Traceback" not in r.get_data(as_text=True)


def test_a_what_if_still_computing_shows_its_progress_then_its_result(app, hold, monkeypatch):
    from viewer.pages.critical_path.ids import Ids as Cp
    go = threading.Event()
    real = analyses.analysis.what_if

    def held(*a, **kw):
        assert go.wait(T)
        return real(*a, **kw)
    monkeypatch.setattr(analyses.analysis, "what_if", held)
    state = [(Cp.RUN, "data", "late"), (Cp.PHASE, "value", "send_chunk"), (Cp.RANK, "value", "all"),
             (Cp.PERCENT, "value", 30)]
    first = call(app, [(Cp.RESULT, "children")], [(Cp.APPLY, "n_clicks", 1)], state=state)[Cp.RESULT]["children"]
    assert "what-if: send_chunk 30% faster" in text_of(first) and Cp.WHATIF_TICK in _ids(first)
    asked = {"run": "late", "phase": "send_chunk", "rank": None, "percent": 30}
    # a poll while it computes writes the progress into the box it came from, not a second box
    pending = call(app, [(Cp.WHATIF_BOX, "children")], [(Cp.WHATIF_TICK, "n_intervals", 1)],
                   state=[(Cp.WHATIF_ASKED, "data", asked)])[Cp.WHATIF_BOX]["children"]
    assert Cp.WHATIF_TICK in _ids(pending) and Cp.WHATIF_BOX not in _ids(pending)
    assert '"max_intervals": 1' in json.dumps(pending)     # its poll ticks once, after this answer
    go.set()
    assert app.catalog.jobs.wait([("late",) + analyses.what_if_key("send_chunk", 0.3, None)], T)
    done = call(app, [(Cp.WHATIF_BOX, "children")], [(Cp.WHATIF_TICK, "n_intervals", 1)],
                state=[(Cp.WHATIF_ASKED, "data", asked)])[Cp.WHATIF_BOX]["children"]
    assert "If send_chunk on every rank were 30% faster, per iteration (mean over" in text_of(done)
    assert "the op latency after entry" in text_of(done)
    bad = call(app, [(Cp.WHATIF_BOX, "children")], [(Cp.WHATIF_TICK, "n_intervals", 1)],
               state=[(Cp.WHATIF_ASKED, "data", dict(asked, phase="no_such_phase"))])[Cp.WHATIF_BOX]["children"]
    if "Computing" in text_of(bad) or "what-if:" in text_of(bad):
        assert app.catalog.jobs.wait([("late",) + analyses.what_if_key("no_such_phase", 0.3, None)], T)
        bad = call(app, [(Cp.WHATIF_BOX, "children")], [(Cp.WHATIF_TICK, "n_intervals", 1)],
                   state=[(Cp.WHATIF_ASKED, "data", dict(asked, phase="no_such_phase"))])[Cp.WHATIF_BOX]["children"]
    assert "What-if not possible" in text_of(bad) and "no_such_phase" in text_of(bad)


def test_a_what_if_in_progress_shows_the_bound_from_the_critical_path_at_once(app, monkeypatch):
    from viewer.pages.critical_path.ids import Ids as CpIds
    app.catalog.jobs.wait([j.key for j in analyses.request(app.catalog, "late", ["critical"])], T)
    go = threading.Event()
    exact = analyses.what_if
    monkeypatch.setattr(analyses, "what_if", lambda *a: go.wait(T) and exact(*a))
    try:
        r = call(app, [(CpIds.RESULT, "children")], [(CpIds.APPLY, "n_clicks", 1)],
                 state=[(CpIds.RUN, "data", "late"), (CpIds.PHASE, "value", "send_chunk"),
                        (CpIds.RANK, "value", "all"), (CpIds.PERCENT, "value", 40)])
        assert "cp-whatif-bound" in _ids(r[CpIds.RESULT]["children"])
        assert "the exact re-timing follows" in text_of(r[CpIds.RESULT]["children"])
    finally:
        go.set()


def test_compare_polls_while_each_runs_samples_are_computed(app, monkeypatch):
    """Compare asks for each run's samples as background jobs: a click answers at once with one
    progress line per run and a running poll; the poll fills the comparison in and stops."""
    from viewer.pages.compare.ids import Ids as Cmp

    go = threading.Event()
    real = analyses._compare_inputs

    def held(run):
        assert go.wait(T)
        return real(run)
    monkeypatch.setattr(analyses, "_compare_inputs", held)
    outs = [(Cmp.RESULT, "children"), (Cmp.TICK, "disabled"), (Cmp.TICK, "max_intervals")]
    state = [(Cmp.A, "value", ["ab~a1"]), (Cmp.B, "value", ["ab~b1"])]
    r = call(app, outs, [(Cmp.GO, "n_clicks", 1), (Cmp.TICK, "n_intervals", None)], state=state)
    assert r[Cmp.TICK]["disabled"] is False and r[Cmp.TICK]["max_intervals"] == 1   # one tick, then its answer
    text = text_of(r[Cmp.RESULT]["children"])
    assert "in the background" in text and text.count("compare samples") == 2, text
    go.set()
    for n in range(1, 200):
        r = call(app, outs, [(Cmp.GO, "n_clicks", 1), (Cmp.TICK, "n_intervals", n)], state=state,
                 changed=[f"{Cmp.TICK}.n_intervals"])
        if r[Cmp.TICK]["disabled"]:
            break
        assert r[Cmp.TICK]["max_intervals"] == n + 1
    assert r[Cmp.TICK]["disabled"] is True and "max_intervals" not in r[Cmp.TICK]
    assert "end-to-end" in text_of(r[Cmp.RESULT]["children"])


def test_compare_of_more_runs_than_the_queue_holds_fills_it_and_finishes(app, monkeypatch):
    """More runs than the job queue's room (viewer.jobs MAX_QUEUED): the rest are asked for by
    later polls, never a Busy error."""
    from viewer.pages.compare.ids import Ids as Cmp

    monkeypatch.setattr(app.catalog.jobs, "max_queued", 1)
    outs = [(Cmp.RESULT, "children"), (Cmp.TICK, "disabled"), (Cmp.TICK, "max_intervals")]
    state = [(Cmp.A, "value", ["ab~a1", "balanced"]), (Cmp.B, "value", ["ab~b1", "late"])]
    r = call(app, outs, [(Cmp.GO, "n_clicks", 1), (Cmp.TICK, "n_intervals", None)], state=state)
    for n in range(1, 400):
        assert "busy" not in text_of(r[Cmp.RESULT]["children"]).lower()
        if r[Cmp.TICK]["disabled"]:
            break
        r = call(app, outs, [(Cmp.GO, "n_clicks", 1), (Cmp.TICK, "n_intervals", n)], state=state,
                 changed=[f"{Cmp.TICK}.n_intervals"])
    assert r[Cmp.TICK]["disabled"] is True
    assert "end-to-end" in text_of(r[Cmp.RESULT]["children"])
