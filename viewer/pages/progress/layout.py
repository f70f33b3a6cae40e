"""A page that needs background results: drawn whole when they are computed, else at once as the
run header and a progress state that polls (callbacks.py) and is replaced by the page when done.

    def layout(catalog, run_id):
        return when_ready(catalog, run_id, "/idle", ("idle",), build)   # build(entry, run) -> page
"""
from __future__ import annotations

from contextvars import ContextVar

from dash import dcc, html

from ... import analyses, components as C
from ...catalog import ViewerError
from . import logic
from .ids import Ids

TICK_MS = 400           # how often a waiting page asks again (each ask also waits: POLL_WAIT_S)
POLL_WAIT_S = 0.3
# None: the catalog's jobs.wait_s (a page request); the poll sets POLL_WAIT_S
wait_override: ContextVar[float | None] = ContextVar("wait_override", default=None)


def is_pending(page) -> bool:
    return getattr(page, "id", None) == Ids.ROOT


def box(catalog, run_id: str, wanted) -> html.Div:
    p = logic.progress(wanted, catalog.jobs.active())
    return html.Div([
        html.Div([html.Span(className="spinner"), html.Span("Computing in the background: this page fills in "
                                                            "when it is done.", className="pending-title")],
                    className="pending-head"),
        html.Ul([html.Li(logic.line(s), className=f"pending-step step-{s.state}") for s in p.steps]),
    ], className="pending msg msg-note", role="status")


def pending(catalog, entry, path: str, wanted) -> html.Div:
    summary = logic.run_summary(entry)
    return html.Div([
        C.run_header(entry),
        *([html.Div(summary, className="info-line run-summary")] if summary else []),
        dcc.Store(id=Ids.TARGET, data={"path": path, "run": entry.run_id}),
        html.Div(box(catalog, entry.run_id, wanted), id=Ids.BOX),
        dcc.Interval(id=Ids.TICK, interval=TICK_MS),
    ], id=Ids.ROOT)


def when_ready(catalog, run_id, path: str, needs: tuple[str, ...], build, retry: bool = True):
    """build(entry, run) when every result in `needs` (viewer.analyses.RESULTS) is computed (asked
    for as background jobs, waited for up to the catalog's wait); else the progress state, or the
    error of a job that failed. retry: a job that failed before is tried again (a new visit)."""
    entry = catalog.entry(run_id)
    run = analyses.ready(catalog, run_id, needs)
    if run is None:
        wanted = analyses.request(catalog, run_id, needs, retry=retry)
        wait = wait_override.get()
        catalog.jobs.wait([j.key for j in wanted], catalog.jobs.wait_s if wait is None else wait)
        run = analyses.ready(catalog, run_id, needs)
        if run is None:
            wanted = analyses.request(catalog, run_id, needs)   # the same jobs, or their failure
            p = logic.progress(wanted, [])
            if p.error:   # the record stays: the next visit (retry) asks again
                return html.Div([C.run_header(entry), C.error_box(p.error)])
            return pending(catalog, entry, path, wanted)
    analyses.warm(catalog, run_id)
    try:
        return build(entry, run)
    except ViewerError as e:
        return html.Div([C.run_header(entry), C.error_box(str(e))])
