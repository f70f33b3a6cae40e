"""The app's callbacks through Dash's HTTP endpoint (no browser): routing, every page on good and
broken runs, timeline zoom, what-if, compare, the Perfetto download route."""
from __future__ import annotations

import pytest

from viewer.app import NAV, PAGE, PAGES, RUN_SELECT, URL, create_app
from viewer.pages.compare.ids import Ids as CmpIds
from viewer.pages.critical_path.ids import Ids as CpIds
from viewer.pages.timeline.ids import Ids as TlIds

from .dashclient import call, text_of

ROUTE_OUT = [(PAGE, "children"), (NAV, "children"), (RUN_SELECT, "value"), (URL, "search")]


@pytest.fixture(scope="module")
def app(run_root, tmp_path_factory):
    return create_app([run_root], cache_dir=tmp_path_factory.mktemp("viewer-cache"))


def route(app, path, run=None, selected=None, changed="url.pathname"):
    search = f"?run={run}" if run else ""
    r = call(app, ROUTE_OUT, [(URL, "pathname", path), (URL, "search", search), (RUN_SELECT, "value", selected)],
             changed=[changed])
    return r


@pytest.mark.parametrize("path", list(PAGES))
def test_every_page_renders_on_a_good_run(app, path):
    r = route(app, path, "late")
    page = text_of(r[PAGE]["children"])
    assert "Cannot show" not in page and "failed" not in page
    assert r[RUN_SELECT]["value"] == "late"
    if path != "/" and path != "/compare":
        assert "Perfetto trace" in page


@pytest.mark.parametrize("path", [p for p in PAGES if p not in ("/", "/compare")])
@pytest.mark.parametrize("rid, words", [("bad~corrupt-events", "corrupt"), ("bad~from-the-future", "newer"),
                                        ("bad~no-events", "corrupt"), ("nope", "Unknown run")])
def test_bad_runs_show_a_message_not_a_traceback(app, path, rid, words):
    page = text_of(route(app, path, rid)[PAGE]["children"])
    assert words.lower() in page.lower()
    assert "Traceback" not in page and "File \"" not in page


def test_runs_page_lists_every_run_with_status(app):
    page = text_of(route(app, "/")[PAGE]["children"])
    for name in ("synthetic-starvation", "synthetic-late_arriver"):
        assert name in page
    assert "newer format v99" in page and "unreadable" in page


def test_run_picker_rewrites_the_url(app):
    r = call(app, ROUTE_OUT, [(URL, "pathname", "/idle"), (URL, "search", "?run=late"),
                              (RUN_SELECT, "value", "starved")], changed=[f"{RUN_SELECT}.value"])
    assert r[URL]["search"] == "?run=starved" and r[RUN_SELECT]["value"] == "starved"


def test_unknown_page(app):
    assert "no page" in text_of(route(app, "/nowhere", "late")[PAGE]["children"])


def _timeline(app, relayout=None, level="rank", changed=None, ranks=None, current=None):
    return call(app, [(TlIds.GRAPH, "figure"), (TlIds.INFO, "children")],
                [(TlIds.RUN, "data", "late"), (TlIds.LEVEL, "value", level), (TlIds.RANKS, "value", ranks or []),
                 (TlIds.BLOCK_LO, "value", 0), (TlIds.BLOCK_HI, "value", 3), (TlIds.CRITICAL, "value", ["on"]),
                 (TlIds.GRAPH, "relayoutData", relayout), (TlIds.RESET, "n_clicks", None)],
                state=[(TlIds.GRAPH, "figure", current)], changed=changed or [f"{TlIds.RUN}.data"])


def test_timeline_zoom_goes_from_aggregate_to_detail(app):
    full = _timeline(app)
    fig = full[TlIds.GRAPH]["figure"]
    assert fig["data"][0]["type"] == "heatmap"
    assert any(t.get("name") == "critical path" for t in fig["data"])
    x0, x1 = fig["layout"]["xaxis"]["range"]
    mid = (x0 + x1) / 2
    zoom = _timeline(app, {"xaxis.range[0]": mid, "xaxis.range[1]": mid + 1.0}, level="warp",
                     changed=[f"{TlIds.GRAPH}.relayoutData"])
    zf = zoom[TlIds.GRAPH]["figure"]
    assert zf["layout"]["xaxis"]["range"] == pytest.approx([mid, mid + 1.0])
    assert "each span drawn" in zoom[TlIds.INFO]["children"]
    assert all(t["type"] != "heatmap" for t in zf["data"])
    # a y-only relayout changes nothing on the server
    assert _timeline(app, {"yaxis.range[0]": 1}, changed=[f"{TlIds.GRAPH}.relayoutData"]) is None
    # changing rows keeps the zoomed window
    kept = _timeline(app, level="block", changed=[f"{TlIds.LEVEL}.value"], current=zf)
    assert kept[TlIds.GRAPH]["figure"]["layout"]["xaxis"]["range"] == pytest.approx([mid, mid + 1.0])


def test_what_if_reports_projected_change(app):
    r = call(app, [(CpIds.RESULT, "children")], [(CpIds.APPLY, "n_clicks", 1)],
             state=[(CpIds.RUN, "data", "late"), (CpIds.PHASE, "value", "send_chunk"), (CpIds.RANK, "value", "all"),
                    (CpIds.PERCENT, "value", 20)])
    text = text_of(r[CpIds.RESULT]["children"])
    assert "If send_chunk on every rank were 20% faster: end-to-end" in text
    bad = call(app, [(CpIds.RESULT, "children")], [(CpIds.APPLY, "n_clicks", 1)],
               state=[(CpIds.RUN, "data", "late"), (CpIds.PHASE, "value", "send_chunk"), (CpIds.RANK, "value", 0),
                      (CpIds.PERCENT, "value", 100)])
    assert "less than 100" in text_of(bad[CpIds.RESULT]["children"])


def _compare(app, a, b):
    r = call(app, [(CmpIds.RESULT, "children")], [(CmpIds.GO, "n_clicks", 1)],
             state=[(CmpIds.A, "value", a), (CmpIds.B, "value", b)])
    return text_of(r[CmpIds.RESULT]["children"])


def test_compare_callback(app):
    assert "Pick at least one run" in _compare(app, ["ab~a1"], [])
    assert "both sides" in _compare(app, ["ab~a1"], ["ab~a1", "ab~b1"])
    text = _compare(app, ["ab~a1"], ["ab~b1"])
    assert "end-to-end" in text and "Per phase" in text
    assert "corrupt" in _compare(app, ["ab~a1"], ["bad~corrupt-events"]).lower()


def test_perfetto_download_route(app):
    c = app.server.test_client()
    r = c.get("/download/late.perfetto-trace")
    assert r.status_code == 200 and len(r.data) > 100
    assert "attachment" in r.headers["Content-Disposition"]
    assert c.get("/download/nope.perfetto-trace").status_code == 404
    # an encoded path does not match the download route at all: Dash's page route answers with
    # the app shell, never a file
    r = c.get("/download/..%2F..%2Fetc%2Fpasswd.perfetto-trace")
    assert "Content-Disposition" not in r.headers and b"root:" not in r.data


def test_timeline_click_drills_down(app):
    outs = [(TlIds.LEVEL, "value"), (TlIds.RANKS, "value"), (TlIds.BLOCK_LO, "value"), (TlIds.BLOCK_HI, "value")]
    r = call(app, outs, [(TlIds.GRAPH, "clickData", {"points": [{"y": 0}]})],
             state=[(TlIds.RUN, "data", "late"), (TlIds.LEVEL, "value", "rank"), (TlIds.RANKS, "value", []),
                    (TlIds.BLOCK_LO, "value", 0), (TlIds.BLOCK_HI, "value", 3)])
    assert r[TlIds.LEVEL]["value"] == "block" and r[TlIds.RANKS]["value"] == [0]
    none = call(app, outs, [(TlIds.GRAPH, "clickData", {"points": [{"y": 0}]})],
                state=[(TlIds.RUN, "data", "late"), (TlIds.LEVEL, "value", "warp"), (TlIds.RANKS, "value", [0]),
                       (TlIds.BLOCK_LO, "value", 0), (TlIds.BLOCK_HI, "value", 0)])
    assert none is None   # a warp row has nothing below it
