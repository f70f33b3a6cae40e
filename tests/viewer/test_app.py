"""The app's callbacks through Dash's HTTP endpoint (no browser): routing, every page on good and
broken runs, timeline zoom, what-if, compare, the Perfetto download route; and what a client
may send: wrong-typed values get a message in the page, never an HTTP 500; requests and caches
are bounded; files linked out of the roots are never served."""
from __future__ import annotations

import json

import pytest

from viewer.app import MAX_REQUEST_BYTES, NAV, PAGE, PAGES, RUN_SELECT, URL, create_app
from viewer.pages.compare.ids import Ids as CmpIds
from viewer.pages.critical_path.ids import Ids as CpIds
from viewer.pages.idle.ids import Ids as IdleIds
from viewer.pages.runs import logic as RL
from viewer.pages.runs.ids import Ids as RunsIds
from viewer.pages.timeline.ids import Ids as TlIds

from .dashclient import call, post, runs_grid, text_of

PARAM_CACHE_BYTES = 4 << 20   # small, so that the tests see the ceiling

ROUTE_OUT = [(PAGE, "children"), (NAV, "children"), (RUN_SELECT, "value"), (URL, "search")]


@pytest.fixture(scope="module")
def app(run_root, tmp_path_factory):
    # pages wait for their background jobs (viewer.jobs) instead of drawing a progress state: these
    # tests read whole pages; tests/viewer/test_progress.py covers the progress state
    return create_app([run_root], cache_dir=tmp_path_factory.mktemp("viewer-cache"),
                      param_cache_bytes=PARAM_CACHE_BYTES, ready_wait_s=600)


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
                                        ("bad~no-events", "corrupt"), ("nope", "Unknown run"),
                                        ("bad~git-string", "field 'git'"), ("bad~clock-list", "field 'clock'"),
                                        ("bad~drops-many", "field 'drops.total'"), ("bad~deep-manifest", "nested"),
                                        ("bad~row-count-mismatch", "says 3 events"),
                                        ("links~link-manifest", "outside"), ("links~link-events", "outside")])
def test_bad_runs_show_a_message_not_a_traceback(app, path, rid, words):
    page = text_of(route(app, path, rid)[PAGE]["children"])
    assert words.lower() in page.lower()
    assert "Traceback" not in page and "File \"" not in page


def _runs_rows(app) -> dict[str, str]:
    """The Runs page's rows as text (every cell's text and the name's sub-lines), by run id."""
    assert RunsIds.TABLE in json.dumps(route(app, "/")[PAGE]["children"])   # the page holds the grid
    return {r["run_id"]: " ".join(str(r[k]) for k in ("name", "where", "description", "workload", "verdict",
                                                     "status")) for r in runs_grid(app)["rowData"]}


def test_runs_page_lists_every_run_with_status(app):
    rows = _runs_rows(app)
    assert set(rows) == set(app.catalog.ids())
    for rid in ("balanced", "starved", "late", "ab~a1"):
        assert rows[rid].endswith(" ok"), rows[rid]
    expect = {"bad~from-the-future": "newer format", "bad~bad-manifest": "unreadable: ",
              "bad~git-string": "field 'git'", "bad~clock-list": "field 'clock'",
              "bad~drops-many": "field 'drops.total'", "bad~deep-manifest": "nested deeper",
              "bad~corrupt-events": "corrupt: ", "bad~no-events": "corrupt: ",
              "bad~row-count-mismatch": "says 3 events", "bad~empty-run": "empty",
              "timed-out": "TIMEOUT: rank 0: dispatch timed out", "links~link-manifest": "outside",
              "links~link-events": "outside"}
    for rid, words in expect.items():
        assert words in rows[rid], (rid, rows[rid])


def test_one_bad_manifest_does_not_break_the_runs_page(app):
    rows = _runs_rows(app)
    assert "synthetic-balanced" in rows["balanced"] and "Traceback" not in " ".join(rows.values())


def test_runs_sharing_a_name_are_told_apart_by_directory(app):
    rows = _runs_rows(app)
    assert "in balanced" in rows["balanced"] and "in copy-of-balanced" in rows["copy-of-balanced"]
    assert "in late" not in rows["late"]           # a unique name needs no directory
    options = route(app, "/")  # the run picker labels them apart too
    labels = app.catalog.labels()
    assert labels["balanced"] != labels["copy-of-balanced"] and labels["late"] == app.catalog.entry("late").name
    assert options is not None


def test_runs_grid_pages_sorts_and_filters_on_the_server(app):
    """The grid asks for a block of rows at a time under its sort and filter models (AG Grid's
    infinite row model); the server answers those rows and how many pass the filters."""
    whole = runs_grid(app)
    ids = [r["run_id"] for r in whole["rowData"]]
    assert whole["rowCount"] == len(ids) == len(app.catalog.ids()) and ids == app.catalog.ids()
    for lo, hi in ((0, 5), (5, 12), (len(ids) - 2, len(ids) + 50)):
        block = runs_grid(app, {"startRow": lo, "endRow": hi})
        assert [r["run_id"] for r in block["rowData"]] == ids[lo:hi] and block["rowCount"] == len(ids)
    by_id = {r["run_id"]: r for r in whole["rowData"]}
    assert by_id["late"]["q"] == "?run=late" and by_id["late"]["download"] == "/download/late.perfetto-trace"
    assert by_id["late"]["ok"] and not by_id["bad~corrupt-events"]["ok"] and not by_id["timed-out"]["ok"]
    # sorted on the server: dropped records descending (the missing last), then names ascending
    got = runs_grid(app, {"startRow": 0, "endRow": 1000, "sortModel": [{"colId": "drops", "sort": "desc"},
                                                                       {"colId": "name", "sort": "asc"}]})["rowData"]
    key = [(-r["drops"], r["name"].lower()) for r in got]
    assert key == sorted(key) and len(got) == len(ids)
    # by a stored headline (every run's read once a sort needs them): analysed runs first, largest first
    from profiler.analysis import summary
    from profiler.store.runstore import load_run
    for rid in ("late", "starved"):
        if summary.load(app.catalog.entry(rid).path) is None:
            summary.store(load_run(app.catalog.entry(rid).path))
    got = runs_grid(app, {"startRow": 0, "endRow": 1000, "sortModel": [{"colId": "op_latency_ns", "sort": "desc"}]})
    lat = [r["op_latency_ns"] for r in got["rowData"]]
    known = [v for v in lat if v is not None]
    assert known and known == sorted(known, reverse=True) and lat == known + [None] * (len(lat) - len(known))
    assert {r["op_latency"] for r in got["rowData"] if r["op_latency_ns"] is None} <= {RL.NOT_ANALYSED, "—"}
    # filtered: a text filter (AG Grid's are case-insensitive), two conditions joined by OR
    got = runs_grid(app, {"startRow": 0, "endRow": 1000, "filterModel": {"status": {
        "filterType": "text", "operator": "OR", "conditions": [{"filterType": "text", "type": "startsWith", "filter": "CORRUPT"},
                                                               {"filterType": "text", "type": "contains", "filter": "newer"}]}}})
    want = {rid for rid, r in by_id.items() if r["status"].startswith("corrupt") or "newer" in r["status"]}
    assert {r["run_id"] for r in got["rowData"]} == want and got["rowCount"] == len(want) >= 3
    # a number filter on a column shown as text: the clock uncertainty in ns
    clocks = {rid: r["clock"] for rid, r in by_id.items()}
    got = runs_grid(app, {"startRow": 0, "endRow": 1000,
                          "filterModel": {"clock": {"filterType": "number", "type": "notBlank"}}})["rowData"]
    assert {r["run_id"] for r in got} == {rid for rid, c in clocks.items() if c is not None}


@pytest.mark.parametrize("request_, words", [
    ({"startRow": 0, "endRow": 10**6}, "endRow must be from startRow"),
    ({"startRow": "a"}, "startRow must be a whole number"),
    ({"sortModel": [{"colId": "nope", "sort": "asc"}]}, "names no sortable column"),
    ({"sortModel": [{"colId": "drops", "sort": "sideways"}]}, "must be one of"),
    ({"filterModel": {"drops": {"filterType": "text", "type": "contains", "filter": "x"}}}, "'text' filter on a number"),
    ({"filterModel": {"status": {"filterType": "text", "type": "contains", "filter": 5}}}, "must be text"),
    ({"filterModel": {"status": {"filterType": "text", "type": "regex", "filter": ".*"}}}, "must be one of"),
    ({"filterModel": {"nope": {"filterType": "text", "type": "contains", "filter": "x"}}}, "no column 'nope'"),
    ({"filterModel": {"status": {"operator": "OR", "conditions": [{"type": "blank"}] * 9}}}, "1 to 4 conditions"),
    ({"filterModel": {"clock": {"filterType": "number", "type": "inRange", "filter": 1}}}, "filterTo must be a number"),
])
def test_runs_grid_refuses_a_wrong_request_in_words(app, request_, words):
    r = call(app, [(RunsIds.TABLE, "getRowsResponse"), (RunsIds.MESSAGE, "children")],
             [(RunsIds.TABLE, "getRowsRequest", request_)])
    assert r[RunsIds.TABLE]["getRowsResponse"] == {"rowData": [], "rowCount": 0}
    shown = text_of(r[RunsIds.MESSAGE]["children"])
    assert "Invalid input" in shown and words in shown, shown


def test_run_picker_rewrites_the_url(app):
    r = call(app, ROUTE_OUT, [(URL, "pathname", "/idle"), (URL, "search", "?run=late"),
                              (RUN_SELECT, "value", "starved")], changed=[f"{RUN_SELECT}.value"])
    assert r[URL]["search"] == "?run=starved" and r[RUN_SELECT]["value"] == "starved"


def test_unknown_page(app):
    assert "no page" in text_of(route(app, "/nowhere", "late")[PAGE]["children"])


def _timeline(app, relayout=None, level="rank", changed=None, ranks=None, current=None):
    return call(app, [(TlIds.GRAPH, "figure"), (TlIds.INFO, "children"), (TlIds.WINDOW, "data")],
                [(TlIds.RUN, "data", "late"), (TlIds.LEVEL, "value", level), (TlIds.RANKS, "value", ranks or []),
                 (TlIds.BLOCK_LO, "value", 0), (TlIds.BLOCK_HI, "value", 3), (TlIds.CRITICAL, "value", ["on"]),
                 (TlIds.GRAPH, "relayoutData", relayout), (TlIds.RESET, "n_clicks", None),
                 (TlIds.CP_READY, "data", True)],
                state=[(TlIds.WINDOW, "data", current)], changed=changed or [f"{TlIds.RUN}.data"])


def test_timeline_zoom_goes_from_aggregate_to_detail(app):
    route(app, "/critical-path", "late")   # the critical path computed (the red line is drawn once it is)
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
    # once a view is drawn, a y-only relayout or a resize changes nothing on the server
    win = zoom[TlIds.WINDOW]["data"]
    assert _timeline(app, {"yaxis.range[0]": 1}, changed=[f"{TlIds.GRAPH}.relayoutData"], current=win) is None
    assert _timeline(app, {"autosize": True}, changed=[f"{TlIds.GRAPH}.relayoutData"], current=win) is None
    # changing rows keeps the zoomed window
    assert zoom[TlIds.WINDOW]["data"] == pytest.approx([mid, mid + 1.0])
    kept = _timeline(app, level="block", changed=[f"{TlIds.LEVEL}.value"], current=zoom[TlIds.WINDOW]["data"])
    assert kept[TlIds.GRAPH]["figure"]["layout"]["xaxis"]["range"] == pytest.approx([mid, mid + 1.0])


def test_timeline_autosize_before_the_first_view_draws_it(app):
    """plotly's autosize on mounting the empty graph can come while the page's first request is in
    flight; Dash keeps only the newest request's answer for the same outputs, so that answer must
    be the first view (it was "no update": a blank timeline on a 100 M-event run)."""
    first = _timeline(app)
    again = _timeline(app, {"autosize": True}, changed=[f"{TlIds.GRAPH}.relayoutData"], current=None)
    assert again is not None
    assert again[TlIds.INFO]["children"] == first[TlIds.INFO]["children"]
    assert again[TlIds.WINDOW]["data"] == pytest.approx(first[TlIds.WINDOW]["data"])
    assert again[TlIds.GRAPH]["figure"]["data"][0]["type"] == first[TlIds.GRAPH]["figure"]["data"][0]["type"]


def test_what_if_reports_projected_change(app):
    r = call(app, [(CpIds.RESULT, "children")], [(CpIds.APPLY, "n_clicks", 1)],
             state=[(CpIds.RUN, "data", "late"), (CpIds.PHASE, "value", "send_chunk"), (CpIds.RANK, "value", "all"),
                    (CpIds.PERCENT, "value", 20)])
    text = text_of(r[CpIds.RESULT]["children"])
    assert "If send_chunk on every rank were 20% faster, per iteration (mean over 4 iterations): the op latency after entry" in text
    assert "the iteration (wall time, host included)" in text
    bad = call(app, [(CpIds.RESULT, "children")], [(CpIds.APPLY, "n_clicks", 1)],
               state=[(CpIds.RUN, "data", "late"), (CpIds.PHASE, "value", "send_chunk"), (CpIds.RANK, "value", 0),
                      (CpIds.PERCENT, "value", 100)])
    assert "less than 100" in text_of(bad[CpIds.RESULT]["children"])


CMP_OUT = [(CmpIds.RESULT, "children"), (CmpIds.TICK, "disabled"), (CmpIds.TICK, "max_intervals")]


def _compare(app, a, b):
    r = call(app, CMP_OUT, [(CmpIds.GO, "n_clicks", 1), (CmpIds.TICK, "n_intervals", None)],
             state=[(CmpIds.A, "value", a), (CmpIds.B, "value", b)])
    assert r[CmpIds.TICK]["disabled"] is True       # done: the page stops polling
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
    try:
        assert r.status_code == 200 and len(r.data) > 100
        assert "attachment" in r.headers["Content-Disposition"]
    finally:
        r.close()   # the response streams the exported file: a WSGI server closes it after sending
    assert c.get("/download/nope.perfetto-trace").status_code == 404
    # an encoded path does not match the download route at all: Dash's page route answers with
    # the app shell, never a file
    r = c.get("/download/..%2F..%2Fetc%2Fpasswd.perfetto-trace")
    assert "Content-Disposition" not in r.headers and b"root:" not in r.data


def test_a_trace_linked_out_of_the_roots_is_not_served(app):
    """issue 13: trace.perfetto-trace -> a password file outside the roots was sent as the download."""
    for rid in ("links~link-trace", "links~link-manifest", "links~link-events"):
        r = app.server.test_client().get(f"/download/{rid}.perfetto-trace")
        assert r.status_code == 404 and b"root:" not in r.data, (rid, r.data[:200])
        assert b"outside" in r.data


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


# -- what a client may send ---------------------------------------------------------------------
WRONG = ["abc", "zzz", {}, [{}], [1, "x"], -1, 10**30, float("nan"), True, "x" * 5000, {"a": [{}]}]
TL_OUT = [(TlIds.GRAPH, "figure"), (TlIds.INFO, "children"), (TlIds.WINDOW, "data")]
TL_IN = [(TlIds.RUN, "data", "late"), (TlIds.LEVEL, "value", "rank"), (TlIds.RANKS, "value", []),
         (TlIds.BLOCK_LO, "value", 0), (TlIds.BLOCK_HI, "value", 3), (TlIds.CRITICAL, "value", ["on"]),
         (TlIds.GRAPH, "relayoutData", None), (TlIds.RESET, "n_clicks", None), (TlIds.CP_READY, "data", True)]
DRILL_OUT = [(TlIds.LEVEL, "value"), (TlIds.RANKS, "value"), (TlIds.BLOCK_LO, "value"), (TlIds.BLOCK_HI, "value")]
# every callback with valid values: (outputs, inputs, state)
CALLBACKS = {
    "route": (ROUTE_OUT, [(URL, "pathname", "/idle"), (URL, "search", "?run=late"), (RUN_SELECT, "value", None)], []),
    "timeline": (TL_OUT, TL_IN, [(TlIds.WINDOW, "data", None)]),
    "drill": (DRILL_OUT, [(TlIds.GRAPH, "clickData", {"points": [{"y": 0}]})],
              [(TlIds.RUN, "data", "late"), (TlIds.LEVEL, "value", "rank"), (TlIds.RANKS, "value", []),
               (TlIds.BLOCK_LO, "value", 0), (TlIds.BLOCK_HI, "value", 3)]),
    "what-if": ([(CpIds.RESULT, "children")], [(CpIds.APPLY, "n_clicks", 1)],
                [(CpIds.RUN, "data", "late"), (CpIds.PHASE, "value", "send_chunk"), (CpIds.RANK, "value", "all"),
                 (CpIds.PERCENT, "value", 20)]),
    "idle-kernel": ([(IdleIds.HEATMAP, "figure")], [(IdleIds.KERNEL, "value", "dispatch")],
                    [(IdleIds.RUN, "data", "late")]),
    "runs-grid": ([(RunsIds.TABLE, "getRowsResponse"), (RunsIds.MESSAGE, "children")],
                  [(RunsIds.TABLE, "getRowsRequest", {"startRow": 0, "endRow": 100})], []),
    "compare": (CMP_OUT, [(CmpIds.GO, "n_clicks", 1), (CmpIds.TICK, "n_intervals", None)],
                [(CmpIds.A, "value", ["ab~a1"]), (CmpIds.B, "value", ["ab~b1"])]),
}
CASES = [(cb, part, i, v) for cb, (_, ins, st) in CALLBACKS.items()
         for part, items in (("inputs", ins), ("state", st)) for i in range(len(items)) for v in WRONG]


def _with(cb, part, i, value):
    outs, ins, st = CALLBACKS[cb]
    ins, st = list(ins), list(st)
    items = ins if part == "inputs" else st
    cid, prop, _ = items[i]
    items[i] = (cid, prop, value)
    return outs, ins, st


@pytest.mark.parametrize("cb, part, i, value", CASES,
                         ids=[f"{cb}-{CALLBACKS[cb][1 if p == 'inputs' else 2][i][0]}-{repr(v)[:12]}"
                              for cb, p, i, v in CASES])
def test_a_wrong_value_never_gives_an_http_500(app, cb, part, i, value):
    outs, ins, st = _with(cb, part, i, value)
    r = post(app, outs, ins, st)
    assert r.status_code in (200, 204), r.get_data(as_text=True)[:500]
    assert "Traceback" not in r.get_data(as_text=True)


@pytest.mark.parametrize("cb, part, i, value, out, words", [
    ("what-if", "state", 3, "abc", (CpIds.RESULT, "children"), "Invalid input: percent must be a number"),
    ("what-if", "state", 2, {}, (CpIds.RESULT, "children"), "Invalid input: rank"),
    ("timeline", "inputs", 1, "zzz", (TlIds.INFO, "children"), "Invalid input: level must be one of"),
    ("timeline", "inputs", 2, [{}], (TlIds.INFO, "children"), "Invalid input: ranks[0] must be a whole number"),
    ("timeline", "inputs", 6, {"xaxis.range[0]": "abc", "xaxis.range[1]": 3}, (TlIds.INFO, "children"),
     "must be a number"),
    ("compare", "state", 0, [{}], (CmpIds.RESULT, "children"), "Invalid input: a ids[0] must be text"),
    ("route", "inputs", 0, "/" + "x" * 1000, (PAGE, "children"), "at most 256"),
    ("idle-kernel", "inputs", 0, "k" * 5_000_000, (IdleIds.HEATMAP, "figure"), "at most 200"),
])
def test_wrong_values_get_a_message_in_the_page(app, cb, part, i, value, out, words):
    outs, ins, st = _with(cb, part, i, value)
    r = call(app, outs, ins, st)
    shown = json.dumps(r[out[0]][out[1]])
    assert words in shown, shown[:500]
    assert len(shown) < 10_000        # the value is not echoed back whole


def test_requests_are_bounded(app):
    c = app.server.test_client()
    body = json.dumps({"output": "x", "inputs": [{"id": "url", "property": "pathname",
                                                   "value": "/" + "x" * (20 << 20)}]})
    r = c.post("/_dash-update-component", data=body, content_type="application/json")
    assert r.status_code == 413 and len(r.data) < 10_000       # a 20 MB pathname is not echoed
    assert MAX_REQUEST_BYTES < (20 << 20)


def test_results_keyed_by_client_values_stay_under_a_ceiling(app):
    """issue 13: 300 distinct what-if percentages took the server from 469 MB to 984 MB."""
    params = app.catalog._params
    for pct in range(1, 60):
        outs, ins, st = _with("what-if", "state", 3, pct)
        assert "the iteration (wall time" in text_of(call(app, outs, ins, st)[CpIds.RESULT]["children"])
    # each keeps its summary only (its re-timed event table is a copy of the run's)
    assert 0 < params.nbytes <= PARAM_CACHE_BYTES
    before = params.nbytes
    for n in range(10):   # kernel names a client invents: refused before anything is cached
        outs, ins, st = _with("idle-kernel", "inputs", 0, f"{n}" * 300)
        call(app, outs, ins, st)
    assert params.nbytes <= max(before, PARAM_CACHE_BYTES)


def test_plotly_js_is_the_vendored_partial_bundle_preloaded_by_the_page(app):
    """dcc.Graph loads plotly.js from Dash's URL for the plotly package's file (4.8 MB, every trace
    type); the viewer serves its vendored cartesian bundle there (viewer/plotlyjs/README.md) and
    the page preloads it and runs it early (assets/plotly_early.js)."""
    from viewer.app import PLOTLY_JS, PLOTLY_JS_URL, PLOTLY_JS_VERSION
    c = app.server.test_client()
    r = c.get(PLOTLY_JS_URL)
    assert r.status_code == 200 and r.data == PLOTLY_JS.read_bytes()
    assert r.mimetype in ("text/javascript", "application/javascript")
    assert f"plotly.js (cartesian - minified) v{PLOTLY_JS_VERSION}".encode() in r.data[:200]
    assert (PLOTLY_JS.parent / "LICENSE").read_text().startswith("MIT License")
    assert PLOTLY_JS_VERSION in (PLOTLY_JS.parent / "README.md").read_text()
    index = c.get("/").data.decode()
    assert f'<link rel="preload" as="script" href="{PLOTLY_JS_URL}">' in index
    assert "/assets/plotly_early.js" in index and PLOTLY_JS_URL in c.get("/assets/plotly_early.js").data.decode()


def test_the_page_has_regenerator_runtime_in_place_of_dash_s_polyfill(app):
    """Dash's @babel/polyfill is left out of the page and the vendored regenerator-runtime is served
    first in its place (viewer/regenerator/README.md: what Dash's bundles use of the polyfill);
    the lazy chunk assets/plotly_early.js preloads is a file Dash serves."""
    import hashlib
    import re

    from viewer.app import REGENERATOR_JS, REGENERATOR_JS_URL
    c = app.server.test_client()
    index = c.get("/timeline").data.decode()
    scripts = re.findall(r'<script src="([^"]+)"', index)
    assert scripts[0] == REGENERATOR_JS_URL and not any("polyfill" in s for s in scripts)
    r = c.get(REGENERATOR_JS_URL)
    assert r.status_code == 200 and r.data == REGENERATOR_JS.read_bytes() and b"regeneratorRuntime = runtime" in r.data
    readme = (REGENERATOR_JS.parent / "README.md").read_text()
    assert hashlib.sha256(r.data).hexdigest() in readme and REGENERATOR_JS_URL.split("-")[-1][:-3] in readme
    assert (REGENERATOR_JS.parent / "LICENSE").read_text().startswith("MIT License")
    early = c.get("/assets/plotly_early.js").data.decode()
    chunks = re.findall(r'"(/_dash-component-suites/[^"]+/async-[a-z]+\.js)"', early)
    assert chunks == ["/_dash-component-suites/dash/dcc/async-graph.js"]
    assert all(c.get(u).status_code == 200 for u in chunks)
