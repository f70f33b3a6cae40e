"""The Dash app: a header (pages, run picker), one page at a time, the Perfetto download route.

The URL holds the state a user may want to share: /<page>?run=<run id>. Run ids are keys of the
Catalog built from the configured roots; the download route and every page look ids up there
and never build a path from browser input. Requests are bounded (MAX_REQUEST_BYTES) and every
callback checks its arguments (viewer.inputs), answering a wrong one with a message in the page.
"""
from __future__ import annotations

import gc
import inspect
import logging
import re
from pathlib import Path
from urllib.parse import parse_qs, urlencode

import dash
import flask
from dash import Input, Output, ctx, dcc, html, no_update

from profiler.store.atomic import open_regular
from profiler.errors import EpscopeError

from . import components as C
from . import server as server_limits
from .catalog import Catalog, ViewerError
from .inputs import checked, opt, text
from .jobs import Busy
from .pages.barriers import callbacks as barriers_cb, layout as barriers_layout
from .pages.compare import callbacks as compare_cb, layout as compare_layout
from .pages.critical_path import callbacks as critical_cb, layout as critical_layout
from .pages.idle import callbacks as idle_cb, layout as idle_layout
from .pages.progress import callbacks as progress_cb
from .pages.runs import callbacks as runs_cb, layout as runs_layout
from .pages.timeline import callbacks as timeline_cb, layout as timeline_layout

ASSETS = Path(__file__).parent / "assets"
# plotly.js for dcc.Graph: the cartesian partial bundle (scatter, bar, box, heatmap: every trace
# the pages draw), vendored with its licence (viewer/plotlyjs/README.md): 1.5 MB against the full
# bundle's 4.8 MB that Dash serves from the plotly package, the first plotly figure of a fresh page
# waited ~1.1 s of the renderer compiling the full one (benchmarks/NOTES.md, cold pages round 2).
PLOTLY_JS = Path(__file__).parent / "plotlyjs" / "plotly-cartesian.min.js"
PLOTLY_JS_VERSION = "4.1.1"
# The URL dcc.Graph loads plotly.js from when window.Plotly is not defined yet (dash-renderer sets
# window._dashPlotlyJSURL to it when serving locally, Dash 2.13+); served here instead of Dash's file.
PLOTLY_JS_URL = "/_dash-component-suites/plotly/package_data/plotly.min.js"
# Dash puts @babel/polyfill 7.12.1 (core-js 2 and regenerator-runtime) first on every page, for
# browsers older than the ones the viewer supports (any current Chromium, Firefox or Safari). On a
# fresh page it cost 40-340 ms of the renderer's main thread before Dash could ask for the layout
# (a Chromium trace of each analysis page at 10 M events, load ~9: benchmarks/NOTES.md, issue 31
# session 5), and core-js 2 replaces String.prototype.trim (it finds U+180E not trimmed, as no
# current engine does) with a regex in JavaScript that plotly calls for every label it draws. What
# the Dash bundles need of it is the global regeneratorRuntime (dash-renderer's and dcc's loader of
# lazy components: dcc.Graph, dcc.Dropdown, dcc.Markdown): regenerator-runtime 0.14.1, vendored
# unchanged (viewer/regenerator/README.md), in the polyfill's place.
REGENERATOR_JS = Path(__file__).parent / "regenerator" / "runtime.js"
REGENERATOR_JS_URL = "/_epscope/regenerator-runtime-0.14.1.js"
_POLYFILL_TAG = re.compile(r'<script src="[^"]*/deps/polyfill@[^"]*"></script>\n?')

# path -> (nav label, layout module, callbacks module)
PAGES = {
    "/": ("Runs", runs_layout, runs_cb),
    "/timeline": ("Timeline", timeline_layout, timeline_cb),
    "/critical-path": ("Critical path", critical_layout, critical_cb),
    "/idle": ("Idle warps", idle_layout, idle_cb),
    "/barriers": ("Barriers", barriers_layout, barriers_cb),
    "/compare": ("Compare", compare_layout, compare_cb),
}

URL, PAGE, NAV, RUN_SELECT = "url", "page", "nav", "run-select"
# Largest legitimate request: the timeline sends its current figure back as state, up to 2.1 MB
# (160 rows x 320 bins heatmap of an 8-rank 1 M-event synthetic run, measured); 8 MB leaves room
# (the server refuses larger bodies before the app runs: viewer.server.MAX_BODY_BYTES).
MAX_REQUEST_BYTES = server_limits.MAX_BODY_BYTES
MAX_PATH = 256   # characters of a URL path or query a page accepts


def _run_from_search(search: str | None) -> str | None:
    q = parse_qs((search or "").lstrip("?"))
    v = q.get("run")
    return v[0] if v else None


def _nav(pathname: str, run_id: str | None) -> list:
    q = ("?" + urlencode({"run": run_id})) if run_id else ""
    return [dcc.Link(label, href=path + q, className="nav-link active" if path == pathname else "nav-link",
                     id=f"nav-{label.lower().replace(' ', '-')}")
            for path, (label, _, _) in PAGES.items()]


class _Dash(dash.Dash):
    """Dash, its page without @babel/polyfill: regenerator-runtime alone in its place (why: at
    REGENERATOR_JS). interpolate_index is Dash's documented hook for the page's HTML."""

    def interpolate_index(self, **kwargs):
        scripts, n = _POLYFILL_TAG.subn("", kwargs.get("scripts", ""))
        assert n <= 1, "Dash's page has the polyfill twice"
        kwargs["scripts"] = f'<script src="{REGENERATOR_JS_URL}"></script>\n' + scripts
        return super().interpolate_index(**kwargs)


def create_app(roots, cache_dir: Path | None = None, **catalog_options) -> dash.Dash:
    catalog = Catalog([Path(r) for r in roots], cache_dir=cache_dir, **catalog_options)
    # plotly.js preloaded from the page's head (it downloads beside Dash's scripts); assets/
    # plotly_early.js runs it once the first callback request is sent, while the page waits on the
    # server, instead of after the page's first figure asked for it (then dcc.Graph finds window.Plotly)
    app = _Dash(__name__, assets_folder=str(ASSETS), title="epscope",
                    suppress_callback_exceptions=True, update_title=None,
                    external_stylesheets=[{"rel": "preload", "as": "script", "href": PLOTLY_JS_URL}])
    app.catalog = catalog   # tests and the benchmark reach the catalog through the app
    app.server.config["MAX_CONTENT_LENGTH"] = MAX_REQUEST_BYTES   # larger bodies get HTTP 413

    def layout():
        catalog.refresh()
        options = [{"label": label, "value": rid} for rid, label in catalog.labels().items()]
        return html.Div([
            dcc.Location(id=URL, refresh=False),
            html.Header([
                html.Div([html.Span("ep", className="logo-a"), html.Span("scope", className="logo-b")],
                         className="logo"),
                html.Nav(_nav("/", None), id=NAV, className="nav"),
                dcc.Dropdown(id=RUN_SELECT, options=options, value=None, clearable=False,
                             placeholder="run…", className="run-select"),
            ], className="topbar"),
            html.Main(id=PAGE, className="page"),
        ], className="app")

    app.layout = layout

    @app.callback(Output(PAGE, "children"), Output(NAV, "children"), Output(RUN_SELECT, "value"),
                  Output(URL, "search"),
                  Input(URL, "pathname"), Input(URL, "search"), Input(RUN_SELECT, "value"))
    @checked(lambda msg: (C.error_box(msg, title="Not found"), _nav("/", None), None, no_update),
             pathname=opt(text(MAX_PATH)), search=opt(text(MAX_PATH)), selected=opt(text(MAX_PATH)))
    def route(pathname, search, selected):
        pathname = pathname if pathname in PAGES else ("/" if pathname in (None, "", "/runs") else pathname)
        run_id = _run_from_search(search)
        new_search = no_update
        if ctx.triggered_id == RUN_SELECT and selected and selected != run_id:
            run_id = selected
            new_search = "?" + urlencode({"run": run_id})
        if pathname not in PAGES:
            page = C.error_box(f"There is no page {pathname!r}.", title="Not found")
            return page, _nav(pathname, run_id), run_id, new_search
        if run_id is None and pathname != "/":
            run_id = catalog.default_id()
        _, layout_mod, _ = PAGES[pathname]
        try:
            page = layout_mod.layout(catalog, run_id)
        except ViewerError as e:
            page = C.error_box(str(e))
        except Busy as e:
            page = C.error_box(str(e), title="Busy")
        except Exception as e:   # a page bug must still not show a stack trace to the user
            logging.getLogger("epscope.viewer").exception("page %s failed", pathname)
            page = C.error_box(f"{type(e).__name__}: {e}", title="This page failed")
        return page, _nav(pathname, run_id), run_id, new_search

    for _, _, cb in PAGES.values():
        cb.register(app, catalog)
    # a page drawn as a progress state asks for itself again until its results are computed
    progress_cb.register(app, catalog, {path: mod.layout for path, (_, mod, _) in PAGES.items()
                                         if "retry" in inspect.signature(mod.layout).parameters})

    @app.server.route(PLOTLY_JS_URL)   # a static rule: werkzeug matches it before Dash's component route
    def plotly_js():
        return flask.send_file(PLOTLY_JS, mimetype="text/javascript", max_age=0)

    @app.server.route(REGENERATOR_JS_URL)   # the version in the URL: a browser may keep it a day
    def regenerator_js():
        return flask.send_file(REGENERATOR_JS, mimetype="text/javascript", max_age=86400)

    server_limits.install_request_checks(app)   # malformed framework requests: 4xx, never 500
    _download_route(app, catalog)
    return app


def _download_route(app: dash.Dash, catalog: Catalog) -> None:
    """/download/<run id>.perfetto-trace: the run's trace (the catalog's, by id only), opened as a
    regular file (never a FIFO put there since it was found)."""
    @app.server.route("/download/<run_file>")
    def download(run_file: str):
        run_id = run_file.removesuffix(".perfetto-trace")
        try:
            path = catalog.perfetto_trace(run_id)
            f = open_regular(path)   # a regular file only, opened without blocking (never a FIFO put there since)
        except ViewerError as e:
            return flask.Response(str(e), status=404, mimetype="text/plain")
        except (OSError, EpscopeError) as e:
            return flask.Response(catalog.shown(f"Run '{run_id[:80]}': its trace cannot be read ({e})"), status=404,
                                  mimetype="text/plain")
        return flask.send_file(f, as_attachment=True, download_name=f"{run_id[:200]}.perfetto-trace",
                               mimetype="application/octet-stream")


def serve(roots, host: str = "127.0.0.1", port: int = 8050) -> None:
    """Serve the viewer until interrupted, on viewer.server's waitress server (requests read whole
    before a worker sees them, its limits set) instead of Dash's app.run, which starts werkzeug's
    development server."""
    server_limits.limit_malloc_arenas()   # before the job and request threads start
    app = create_app(roots)
    srv = server_limits.make_server(app.server, host, port)   # binds now: a port in use is an OSError, one line in the CLI
    # what importing Dash, pandas and pyarrow made lives as long as the server: out of the collector's
    # way (a full collection, as release_memory makes, went through ~150 k such objects: 70-90 ms)
    gc.collect()
    gc.freeze()
    n, bad = len(app.catalog.entries()), sum(e.problem is not None for e in app.catalog.entries())
    print(f"epscope viewer: {n} runs under {', '.join(map(str, app.catalog.roots))}"
          + (f" ({bad} cannot be read: see the Runs page)" if bad else "")
          + (f"; {len(app.catalog.notes)} directories skipped" if app.catalog.notes else ""), flush=True)
    # flushed: with stdout piped (a service's log, a test) the lines would wait in the buffer for
    # as long as the server runs
    print(f"open http://{host}:{port}/", flush=True)
    try:
        srv.run()
    except KeyboardInterrupt:
        pass
    finally:
        srv.close()
