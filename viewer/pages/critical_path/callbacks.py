from __future__ import annotations

from dash import Input, Output, State, dcc, html
from dash.exceptions import PreventUpdate

from ... import analyses, components as C, jobs
from ...catalog import ViewerError
from ...format import ns, pct
from ...inputs import CLICKS, NAME, RANK, RUN_ID, checked, either, mapping, number, one_of, opt
from ..progress import logic as progress_logic
from ..progress.layout import POLL_WAIT_S, poll
from . import logic
from .ids import Ids

SUMMARY_COLS = {"iteration": "iteration", "op_before_ns": "op latency after entry", "op_after_ns": "op after",
                "op_change_ns": "op change", "op_change_pct": "op change %",
                "before_ns": "iteration (wall)", "after_ns": "iteration after", "change_ns": "iteration change",
                "change_pct": "iteration change %", "local_saving_ns": "local saving", "absorbed_pct": "absorbed",
                "path_phase_ns": "phase time on path"}

# the op's columns and the iteration's answer two questions: what the op takes once every rank is
# in (profiler.analysis.timemodel) and what the whole iteration takes, host included
SUMMARY_TIPS = {"before_ns": "iteration", "after_ns": "what-if", "change_ns": "what-if", "change_pct": "what-if",
                "op_before_ns": "op latency after entry", "op_after_ns": "what-if", "op_change_ns": "what-if",
                "op_change_pct": "what-if"}


def _result(summary, phase, rank, percent):
    return html.Div([
        C.verdict(logic.what_if_sentence(summary, phase, rank, float(percent)), id="cp-whatif-verdict"),
        C.df_table(summary, SUMMARY_COLS, {"before_ns": ns, "after_ns": ns, "change_ns": ns,
                                             "local_saving_ns": ns, "change_pct": lambda v: pct(v, 2, True),
                                             "absorbed_pct": pct, "path_phase_ns": ns, "op_before_ns": ns,
                                             "op_after_ns": ns, "op_change_ns": ns,
                                             "op_change_pct": lambda v: pct(v, 2, True)},
                   tips=SUMMARY_TIPS),
    ])


def _failed(error: str):
    title = "What-if not possible" if error.startswith(("ValueError", "KeyError")) else "What-if failed"
    return C.error_box(error.split(": ", 1)[1] if title == "What-if not possible" else error, title=title)


def _first_answer(run, phase, speedup, rank, percent) -> list:
    """While the exact what-if is re-timed: the bound the critical path gives at once (a faster
    phase only; nothing before the critical path is computed)."""
    if run is None or not run.has("critical_path") or not 0 < speedup < 1:
        return []
    try:
        b = analyses.what_if_bound(run, phase, speedup, rank)
    except ValueError:
        return []
    return [html.Div(logic.bound_sentence(b, phase, rank, float(percent)), id="cp-whatif-bound",
                     className="msg msg-note")]


def _answer(catalog, run_id, phase, rank, percent, wait_s, boxed: bool = True):
    """The what-if's result if computed (waiting up to wait_s for its job), else its progress
    state with a poll (WHATIF_TICK) that asks again: inside a WHATIF_BOX when `boxed` (the first
    answer), else as that box's new children (a poll writes into the box it came from: a second
    box there would repeat its id)."""
    speedup = float(percent) / 100.0
    run = catalog.loaded(run_id)
    if run is not None and run.has(analyses.what_if_key(phase, speedup, rank)):
        return _result(analyses.what_if(run, phase, speedup, rank), phase, rank, percent)
    try:
        job = analyses.request_what_if(catalog, run_id, phase, speedup, rank)
    except jobs.Busy as e:
        return C.error_box(str(e), title="Busy")
    catalog.jobs.wait([job.key], wait_s)
    run = catalog.loaded(run_id)
    if run is not None and run.has(analyses.what_if_key(phase, speedup, rank)):
        return _result(analyses.what_if(run, phase, speedup, rank), phase, rank, percent)
    if job.state == jobs.FAILED:
        catalog.jobs.forget(job.key)    # asking again tries again
        return _failed(job.error or "failed")
    step = progress_logic.progress([job], catalog.jobs.active()).steps[0]
    pending = [
        html.Div([html.Span(className="spinner"), html.Span(progress_logic.line(step))],
                 className="pending pending-head msg msg-note", role="status"),
        *_first_answer(run, phase, speedup, rank, percent),
        dcc.Store(id=Ids.WHATIF_ASKED, data={"run": run_id, "phase": phase, "rank": rank, "percent": percent}),
        # a new poll with each answer: it ticks once, TICK_MS after this answer (progress.layout.poll)
        poll(Ids.WHATIF_TICK),
    ]
    return html.Div(pending, id=Ids.WHATIF_BOX) if boxed else pending


PARAMS = {"phase": opt(NAME), "rank": opt(either(one_of("all"), RANK)), "percent": opt(number(-1000, 1000))}


def register(app, catalog) -> None:
    @app.callback(Output(Ids.RESULT, "children"),
                  Input(Ids.APPLY, "n_clicks"),
                  State(Ids.RUN, "data"), State(Ids.PHASE, "value"), State(Ids.RANK, "value"),
                  State(Ids.PERCENT, "value"))
    @checked(lambda msg: C.error_box(msg, title="What-if not possible"), n=CLICKS, run_id=RUN_ID, **PARAMS)
    def project(n, run_id, phase, rank, percent):
        if not n:
            raise PreventUpdate
        if phase is None or percent is None:
            return C.note("Pick a phase and a percentage.")
        if percent >= 100:
            return C.note("A phase cannot become 100% faster or more; pick less than 100.")
        try:
            catalog.entry(run_id)
            return _answer(catalog, run_id, phase, None if rank in (None, "all") else int(rank), percent,
                           catalog.jobs.wait_s)
        except ViewerError as e:
            return C.error_box(str(e))

    @app.callback(Output(Ids.WHATIF_BOX, "children"), Input(Ids.WHATIF_TICK, "n_intervals"),
                  State(Ids.WHATIF_ASKED, "data"), prevent_initial_call=True)
    @checked(lambda msg: C.error_box(msg, title="What-if not possible"), _n=CLICKS,
             asked=mapping(run=RUN_ID, **PARAMS))
    def poll(_n, asked):
        run_id, phase, rank, percent = (asked.get(k) for k in ("run", "phase", "rank", "percent"))
        if not isinstance(run_id, str) or phase is None or percent is None or percent >= 100:
            return C.error_box("Invalid input: this what-if names no run, phase or percentage.",
                               title="What-if not possible")
        try:
            catalog.entry(run_id)
            return _answer(catalog, run_id, phase, rank, percent, POLL_WAIT_S, boxed=False)
        except ViewerError as e:
            return C.error_box(str(e))
