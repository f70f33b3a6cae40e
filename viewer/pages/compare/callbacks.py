from __future__ import annotations

from dash import Input, Output, State, ctx, html, no_update
from dash.exceptions import PreventUpdate

from profiler import analysis
from profiler.analysis.compare import RELATIVE_BASE_SHARE, WARMUP_SHARE

from ... import analyses, components as C
from ...catalog import ViewerError
from ...format import ns, pct, share
from ...inputs import CLICKS, RUN_ID, checked, integer, list_of, opt
from ..progress import logic as progress
from ..progress.layout import POLL_WAIT_S, again
from . import logic
from .ids import Ids

PHASE_COLS = {"kernel": "kernel", "phase": "phase", "runs_a": "runs A", "runs_b": "runs B", "n_a": "n A",
              "n_b": "n B", "median_a_ns": "median A", "median_b_ns": "median B", "diff_ns": "B − A",
              "diff_pct": "B − A %", "ci_low_ns": "CI low", "ci_high_ns": "CI high", "noise_ns": "A-vs-A spread",
              "mde_ns": "MDE", "runs_needed": "runs needed", "heavy_tail": "heavy tail", "verdict": "verdict"}
RANK_COLS = {"rank": "rank", "runs_a": "runs A", "runs_b": "runs B", "median_a_ns": "median A",
             "median_b_ns": "median B", "diff_ns": "B − A", "diff_pct": "B − A %", "verdict": "verdict"}
TIPS = {"runs_a": "runs", "runs_b": "runs", "n_a": "n", "n_b": "n", "median_a_ns": "median", "median_b_ns": "median",
        "mde_ns": "MDE", "runs_needed": "runs needed",
        "diff_pct": "B − A", "ci_low_ns": "CI", "ci_high_ns": "CI", "verdict": "within noise",
        "phase": "kernel time (compare)"}
CP_COLS = {"kernel": "kernel", "phase": "phase", "share_a": "path share A", "share_b": "path share B",
           "change": "critical path"}
CP_TIPS = {"share_a": "path share", "share_b": "path share"}
DIFF_COLS = {"field": "manifest field", "a": "A", "b": "B"}
WARM_COLS = {"side": "side", "name": "run", "iteration": "iteration", "value_ns": "end-to-end",
             "rest_median_ns": "median of the later iterations", "excess_pct": "slower by"}
WARM_TIPS = {"value_ns": "end-to-end", "rest_median_ns": "end-to-end", "excess_pct": "warm-up"}
FMT = {"median_a_ns": ns, "median_b_ns": ns, "diff_ns": ns, "ci_low_ns": ns, "ci_high_ns": ns, "noise_ns": ns,
       "mde_ns": ns, "runs_needed": logic.runs_needed, "value_ns": ns, "rest_median_ns": ns,
       "excess_pct": lambda v: pct(v, 0, True),
       "diff_pct": lambda v: pct(v, 1, True), "share_a": share, "share_b": share,
       "heavy_tail": lambda v: "heavy tail" if v else "", "phase": lambda v: v or "(op latency after entry)"}


def _tone(rec):
    return {"faster": "row-good", "slower": "row-bad"}.get(rec.get("verdict"))


def _pending(wanted) -> html.Div:
    p = progress.progress(wanted, [])
    return html.Div([
        html.Div([html.Span(className="spinner"),
                  html.Span("Computing each run's samples in the background (once per run: the "
                            "comparison fills in when they are done).", className="pending-title")],
                 className="pending-head"),
        html.Ul([html.Li(f"{i + 1}. " + progress.line(st), className=f"pending-step step-{st.state}")
                 for i, st in enumerate(p.steps)]),
    ], className="pending msg msg-note", role="status")


def register(app, catalog) -> None:
    # answers: (result, the poll disabled, its max_intervals: one tick more while pending, progress.layout.poll)
    @app.callback(Output(Ids.RESULT, "children"), Output(Ids.TICK, "disabled"), Output(Ids.TICK, "max_intervals"),
                  Input(Ids.GO, "n_clicks"), Input(Ids.TICK, "n_intervals"), State(Ids.A, "value"), State(Ids.B, "value"))
    @checked(lambda msg: (C.error_box(msg, title="Cannot compare these runs"), True, no_update), n=CLICKS,
             tick=opt(integer(0)), a_ids=opt(list_of(RUN_ID, 64)), b_ids=opt(list_of(RUN_ID, 64)))
    def run_compare(n, tick, a_ids, b_ids):
        result, done = _compare(catalog, n, tick, a_ids, b_ids)
        return result, done, no_update if done else again(tick)


def _compare(catalog, n, tick, a_ids, b_ids):
    """(what the result shows, whether the poll stops): the comparison, its progress state while
    the runs' samples are computed, or a message."""
    if not n:
        raise PreventUpdate
    msg = logic.sides_ok(a_ids, b_ids)
    if msg:
        return C.note(msg), True
    # each run's samples once, in the background (a 10 M-event run takes its analyses' time;
    # a run whose samples are cached or stored is ready at once); the page polls until done
    ids = list(dict.fromkeys(a_ids + b_ids))
    polling = ctx.triggered_id == Ids.TICK
    try:
        for r in ids:
            catalog.entry(r)
        wanted = analyses.request_compare_inputs(catalog, ids, retry=not polling)
    except ViewerError as e:
        return C.error_box(str(e)), True
    if not analyses.compare_inputs_ready(catalog, ids):
        catalog.jobs.wait([j.key for j in wanted], POLL_WAIT_S if polling else catalog.jobs.wait_s)
    if not analyses.compare_inputs_ready(catalog, ids):
        err = progress.progress(wanted, []).error
        if err:
            return C.error_box(err, title="Cannot compare these runs"), True
        return _pending(wanted), False
    try:
        a_in = [analyses.compare_inputs(catalog, r) for r in a_ids]
        b_in = [analyses.compare_inputs(catalog, r) for r in b_ids]
        cmp = analysis.compare(a_in, b_in)
    except ViewerError as e:
        return C.error_box(str(e)), True
    except Exception as e:   # a message in the page, never a 500
        return C.error_box(f"{type(e).__name__}: {e}", title="Cannot compare these runs"), True
    if cmp.refused:
        return html.Div([C.verdict_box(cmp.verdict, id=Ids.VERDICT),
                         C.note("Compare refuses runs whose workloads differ: " + "; ".join(cmp.refused))]), True
    return _result(catalog, cmp, a_ids, b_ids), True


def _cards(e2e: dict) -> html.Div:
    tone = {"faster": "good", "slower": "bad"}.get(e2e.get("verdict"), "")
    k = logic.cards(e2e)
    return html.Div([
        C.card("end-to-end A (median)", k.median_a, tip="end-to-end",
               sub=f"{e2e.get('runs_a', 0)} run(s), n = {e2e.get('n_a', 0)}"),
        C.card("end-to-end B (median)", k.median_b, tip="end-to-end",
               sub=f"{e2e.get('runs_b', 0)} run(s), n = {e2e.get('n_b', 0)}"),
        C.card("B − A", k.diff, tone=tone),
        C.card("95% CI of B − A", k.ci, tip="CI"),
        C.card("A-vs-A spread", k.spread),
        C.card("smallest detectable change", k.mde, tip="power", sub=k.mde_sub),
        C.card("verdict", str(e2e.get("verdict", "—")), tone=tone, tip="within noise"),
    ], className="cards")


def _before_entry(catalog, a_ids, b_ids) -> list:
    """Per side, what each run's late rank ran before entry, in the sentence every page states
    (viewer.analyses.before_entry, computed with the compare inputs); nothing when no run names one."""
    named = {side: [(catalog.entry(r).name, analyses.before_entry(catalog, r)) for r in ids]
             for side, ids in (("A", a_ids), ("B", b_ids))}
    view = logic.before_entry_view(named["A"], named["B"])
    if view is None:
        return []
    differ = [html.Div(view.differ, id=Ids.BEFORE_DIFFER, className="verdict-line")] if view.differ else []
    sides = [html.Div([html.Span(f"{side}: ", className="help"),
                       html.Ul([html.Li(line) for line in lines], className="verdict-facts")])
             for side, lines in view.sides.items()]
    return [html.Div(C.section("Before entry", *differ, *sides,
                               help="per run, the op its late rank ran before its longest late entry, from the "
                                    "run's merged PyTorch traces, as every page and `epscope report` name it"),
                     id=Ids.BEFORE_ENTRY)]


def _result(catalog, cmp, a_ids, b_ids) -> html.Div:
    sa, sb = logic.side_samples(cmp.samples, "A"), logic.side_samples(cmp.samples, "B")
    e2e = cmp.end_to_end.iloc[0].to_dict() if len(cmp.end_to_end) else {}
    traces = html.Div([html.Span("Perfetto traces: ", className="help")] + [
        html.A(f"⤓ {side} {catalog.entry(r).name}", href=C.download_href(r), className="mini-link")
        for side, runs in (("A", a_ids), ("B", b_ids)) for r in runs], className="info-line")
    warm = logic.warmup_table(cmp.warmup)
    return html.Div([
        C.verdict_box(cmp.verdict, id=Ids.VERDICT),
        *_before_entry(catalog, a_ids, b_ids),
        traces,
        _cards(e2e),
        C.section("Distributions: the rows that decided",
                  C.graph(logic.distribution_figure(sa, sb, logic.plot_phases(cmp.verdict.where, cmp.per_phase))),
                  help="end-to-end, then the rows the verdict names; one point per (run, iteration), warm-up set "
                       "aside; boxes show median and quartiles"),
        *([C.section("Warm-up set aside", C.df_table(warm, WARM_COLS, FMT, tips=WARM_TIPS),
                     help=f"a run's leading iterations more than {100 * WARMUP_SHARE:.0f}% above the median of "
                          f"those after them (op latency after entry): left out of every row")] if len(warm) else []),
        C.section("What differs between the sides",
                  C.df_table(cmp.manifest_diff, DIFF_COLS, {}) if len(cmp.manifest_diff) else
                  C.note("no manifest field differs between the sides"),
                  help="every manifest field (workload, config, git, gpu) whose values differ between A and B"),
        C.section("Per rank: time in the op after the last rank entered, per iteration",
                  C.df_table(cmp.per_rank, RANK_COLS, FMT, row_class=_tone, tips=TIPS),
                  help="each rank's kernel time from the last rank's entry (wall time), summed over the "
                       "iteration's launches; a wait for a late peer is the entry skew rows'"),
        C.section("Per phase and kernel",
                  C.df_table(logic.phase_table(cmp.per_phase, e2e.get("median_a_ns")), PHASE_COLS, FMT,
                             row_class=_tone, tips=TIPS),
                  help="phase '(op latency after entry)': the kernel's occurrences from the last rank's entry to "
                       "the last warp end (wall time); 'entry skew': how late the last rank entered; a phase: "
                       "its mean span duration per iteration (waits on a peer from the last rank's entry on); "
                       "MDE: the smallest change the row could have seen; B − A % blank where A's median is under "
                       f"{100 * RELATIVE_BASE_SHARE:.0f}% of the op's latency (read B − A)"),
        C.section("Critical path changes", C.df_table(cmp.critical_path_changes, CP_COLS, FMT, tips=CP_TIPS)),
    ])
