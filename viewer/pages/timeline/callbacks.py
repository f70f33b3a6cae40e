from __future__ import annotations

from dash import Input, Output, State, ctx, html, no_update
from dash.exceptions import PreventUpdate

from profiler.errors import RunError

from ... import analyses, jobs
from ...catalog import ViewerError
from ...inputs import (BLOCK, CLICKS, RANK, RUN_ID, X_RANGE, checked, list_of, mapping, number, one_of, opt,
                       text)
from ..progress import logic as progress_logic
from ..progress.layout import again
from . import logic, torch_logic
from .ids import Ids

LEVEL = opt(one_of(*logic.LEVELS))
ROWS = {"level": LEVEL, "ranks": opt(list_of(RANK)), "blo": opt(BLOCK), "bhi": opt(BLOCK)}


def _unchanged(message: str):
    raise PreventUpdate   # a drill-down with a bad value changes nothing (its outputs are controls)


def register(app, catalog) -> None:
    @app.callback(Output(Ids.LEVEL, "value"), Output(Ids.RANKS, "value"), Output(Ids.BLOCK_LO, "value"),
                  Output(Ids.BLOCK_HI, "value"),
                  Input(Ids.GRAPH, "clickData"),
                  State(Ids.RUN, "data"), State(Ids.LEVEL, "value"), State(Ids.RANKS, "value"),
                  State(Ids.BLOCK_LO, "value"), State(Ids.BLOCK_HI, "value"), prevent_initial_call=True)
    @checked(_unchanged, click=opt(mapping(points=list_of(mapping(y=number())))), run_id=RUN_ID, **ROWS)
    def drill(click, run_id, level, ranks, blo, bhi):
        try:
            row = int(round(float(click["points"][0]["y"])))
            ix = analyses.timeline_index(catalog.load(run_id))
        except (KeyError, IndexError, TypeError, ValueError, ViewerError):
            raise PreventUpdate
        to = logic.drill_down(ix, level or "rank", ranks, (int(blo or 0), int(bhi if bhi is not None else 0)), row)
        if to is None:
            raise PreventUpdate
        lvl, rk, (lo, hi) = to
        return lvl, rk, lo, hi

    @app.callback(Output(Ids.GRAPH, "figure"), Output(Ids.INFO, "children"), Output(Ids.WINDOW, "data"),
                  Input(Ids.RUN, "data"), Input(Ids.LEVEL, "value"), Input(Ids.RANKS, "value"),
                  Input(Ids.BLOCK_LO, "value"), Input(Ids.BLOCK_HI, "value"), Input(Ids.CRITICAL, "value"),
                  Input(Ids.GRAPH, "relayoutData"), Input(Ids.RESET, "n_clicks"), Input(Ids.CP_READY, "data"),
                  State(Ids.WINDOW, "data"))
    @checked(lambda msg: (no_update, msg, no_update), run_id=RUN_ID, crit=opt(list_of(text(16), 4)), _reset=CLICKS,
             relayout=opt(mapping(**{"xaxis.range[0]": number(), "xaxis.range[1]": number(), "xaxis.range": X_RANGE})),
             current=opt(X_RANGE), **ROWS)
    def update(run_id, level, ranks, blo, bhi, crit, relayout, _reset, _cp_ready, current):
        t0 = t1 = None
        if ctx.triggered_id == Ids.GRAPH:
            win = logic.parse_relayout(relayout)
            if win is not None:
                t0, t1 = win
            elif current:
                raise PreventUpdate          # a y-only zoom or a resize: the browser handles it
            # else no view drawn yet: plotly's autosize on mounting the empty graph came while the
            # page's first request was in flight, and Dash keeps only the newest request's answer
            # for the same outputs, so this one draws the first view (answering nothing left the
            # timeline blank when the first answer was slow: 100 M events, after a drill-down)
        elif ctx.triggered_id != Ids.RESET and current:
            t0, t1 = float(current[0]) * 1e3, float(current[1]) * 1e3   # keep the time window when the rows change
        try:
            run = catalog.load(run_id)
        except ViewerError as e:
            return no_update, str(e), no_update
        ix = analyses.timeline_index(run)
        blocks = (int(blo or 0), int(bhi if bhi is not None else blo or 0))
        try:
            view = analyses.timeline_view(run, level or "rank", ranks or None, blocks, t0, t1)
        except RunError as e:     # a window's events unreadable (the run damaged or rewritten since it was opened)
            return no_update, catalog.shown(str(e)), no_update
        segs = None
        if crit and "on" in crit:
            if run.has(analyses.RESULTS["critical"][2]):
                segs = analyses.critical(run).segments
            else:   # drawn without it now; the tick below redraws when it is computed
                analyses.request(catalog, run_id, ("critical",))
        return logic.figure(view, ix, segs), logic.describe(view), [view.t0 / 1e3, view.t1 / 1e3]

    _register_torch(app, catalog)

    @app.callback(Output(Ids.CP_READY, "data"), Output(Ids.CP_TICK, "disabled"), Output(Ids.CP_STATE, "children"),
                  Output(Ids.CP_STATE, "className"), Output(Ids.CP_TICK, "max_intervals"),
                  Input(Ids.CP_TICK, "n_intervals"), State(Ids.RUN, "data"), prevent_initial_call=True)
    @checked(lambda msg: (no_update, True, msg, "cp-state bad", no_update), n=CLICKS, run_id=RUN_ID)
    def critical_state(n, run_id):
        run = catalog.loaded(run_id)
        if run is not None and run.has(analyses.RESULTS["critical"][2]):
            return True, True, "", "cp-state", no_update
        try:
            job = analyses.request(catalog, run_id, ("critical",))[0]
        except ViewerError as e:
            return no_update, True, str(e), "cp-state bad", no_update
        if job.state == jobs.FAILED:
            return no_update, True, f"critical path unavailable: {job.error}", "cp-state bad", no_update
        step = progress_logic.progress([job], catalog.jobs.active()).steps[0]
        # one tick more after this answer (progress.layout.poll)
        return no_update, no_update, progress_logic.line(step), "cp-state pending", again(n)


def _register_torch(app, catalog) -> None:
    """The PyTorch panel (runs with merged traces): redrawn whenever the lanes' window changes."""
    @app.callback(Output(Ids.TORCH_GRAPH, "figure"), Output(Ids.TORCH_NOTES, "children"),
                  Input(Ids.WINDOW, "data"), State(Ids.RUN, "data"), prevent_initial_call=True)
    @checked(lambda msg: (no_update, [html.Li(msg)]), window=opt(X_RANGE), run_id=RUN_ID)
    def torch_panel(window, run_id):
        try:
            run = catalog.load(run_id)
            merged, blame = analyses.torch_blame(run)
        except (ViewerError, RunError) as e:
            return no_update, [html.Li(str(e))]
        if merged is None or window is None:
            raise PreventUpdate
        t0, t1 = float(window[0]) * 1e3, float(window[1]) * 1e3
        notes = [html.Li(s) for s in torch_logic.sentences(blame)] or [html.Li("no late entry on the merged ranks")]
        notes += [html.Li(f"rank {r}: not merged: {e}") for r, e in sorted(merged.errors.items())]
        return torch_logic.figure(torch_logic.rows(merged, t0, t1), t0, t1), notes
