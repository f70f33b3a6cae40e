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
# A page's first ask, right after its progress state is drawn: the server's wait (POLL_WAIT_S)
# paces it, and the usual cause of the progress state is stored results that took longer to read
# than the page request waits (jobs.READY_WAIT_S; 0.4-0.6 s for the timeline's at 10 M events on
# the loaded 2-core VM), so the page is ready then: with TICK_MS the page waited 0.4 s more for
# nothing (benchmarks/NOTES.md, issue 31 session 5). Later asks come every TICK_MS.
FIRST_TICK_MS = 50


# A poll asks again only once its answer is in. dash-renderer keeps the newest request of a
# callback and drops the answer of one still in flight when the same callback is asked again; a
# dcc.Interval ticking on its own asked every TICK_MS whatever the server did, so once an answer
# took longer than TICK_MS (a 0.13 s Compare verdict, 0.3 s with POLL_WAIT_S, on a loaded 2-core
# machine, or a page built slowly) every answer was dropped for the next tick's and the page
# polled forever with no error: the A/A Compare test's hang in full CI runs (issue 34). Each
# poll's Interval may tick once (max_intervals=1) and each answer allows one tick more.
def poll(id, interval: int = TICK_MS, **kw) -> dcc.Interval:
    """A dcc.Interval that ticks once; its callback's answer sets `max_intervals` to
    `again(n_intervals)` for one tick more, so at most one of its requests is in flight."""
    return dcc.Interval(id=id, interval=interval, max_intervals=1, **kw)


def again(n_intervals) -> int:
    """The poll's max_intervals that lets it tick once more after this answer."""
    return (n_intervals or 0) + 1
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
        poll(Ids.TICK, FIRST_TICK_MS),
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
