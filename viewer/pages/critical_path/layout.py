from __future__ import annotations

from dash import dcc, html

from profiler.analysis import glossary

from ... import analyses, components as C
from ..analysis_page import analysis_page
from ...format import ns, pct, share
from . import logic
from .ids import Ids

SEG_COLS = {"iteration": "iteration", "rank": "rank", "kernel": "kernel", "block": "block", "warp": "warp",
            "role": "role", "phase": "phase", "kind": "kind", "begin_ns": "begin", "duration_ns": "duration",
            "share": "share", "peer": "peer", "unfinished": "unfinished"}
SEG_TIPS = {"kind": "segment", "block": "-1 (rank, block, warp)", "warp": "-1 (rank, block, warp)"}
SLACK_COLS = {"rank": "rank", "kernel": "kernel", "block": "block", "warp": "warp", "role": "role",
              "busy_ns": "busy", "slack_ns": "slack", "on_path": "warps on the path"}
KINDS = ("work", "wait", "barrier", "gap", "launch", "host")


def layout(catalog, run_id, retry=True):
    return analysis_page(catalog, run_id, "/critical-path", "critical", _page, retry)


def _kind_legend() -> html.Div:
    """The segment kinds with their definitions as tooltips, where the figures use them."""
    return html.Div([html.Span("segment kinds:")] + [
        html.Span(k, title=glossary.TERMS[k], style={"color": logic.KIND_COLOURS[k]}) for k in KINDS],
        className="kind-legend")


def _page(entry, run, cp):
    h = logic.headline(cp)
    phases = analyses.span_phases(run)
    ranks = analyses.ranks(run)
    default_phase = next((p for p in ("copy_out", "send_chunk", "work", "reduce") if p in phases), phases[0] if phases else None)
    whatif = html.Div([
        html.Label("what if"),
        dcc.Dropdown(id=Ids.PHASE, options=phases, value=default_phase, clearable=False, className="dd-phase"),
        html.Label("on"),
        dcc.Dropdown(id=Ids.RANK, options=[{"label": "every rank", "value": "all"}] +
                     [{"label": f"rank {r}", "value": r} for r in ranks], value="all", clearable=False,
                     className="dd-rank"),
        html.Label("becomes"),
        dcc.Input(id=Ids.PERCENT, type="number", value=20, min=-500, max=99, step=1, className="num"),
        html.Label("% faster"),
        html.Button("project", id=Ids.APPLY, className="btn btn-primary"),
    ], className="controls")
    return html.Div([
        C.run_header(entry),
        dcc.Store(id=Ids.RUN, data=entry.run_id),
        C.verdict_box(analyses.verdict(run, "critical_path"), id=Ids.SUMMARY),
        html.Div([
            C.card("iterations", f"{h['iterations']}", tip="iteration"),
            C.card(logic.median_label(h), ns(h["median_iteration_ns"]), tip="median over n iterations"),
            C.card("pacing rank", f"rank {h['pacing_rank']}" if h["pacing_rank"] >= 0 else "—"),
            C.card("path spent waiting", pct(h["wait_share"] * 100)),
            C.card("warps on the path", f"{h['warps_on_path']}"),
            *([C.card("unfinished on the path", ns(h["unfinished_ns"]), tone="bad", tip="unfinished")]
              if h["unfinished_ns"] else []),
        ], className="cards"),
        html.Div(logic.largest_segments(cp), className="info-line"),
        C.section("What-if", whatif, dcc.Loading(html.Div(id=Ids.RESULT, className="whatif-result"), type="dot"),
                  help="re-times the same dependency graph: a saving that a rendezvous absorbs shows up here"),
        _kind_legend(),
        html.Div([
            C.section("Critical path per rank", C.graph(run.cached("cp_by_rank_fig", lambda: logic.path_by_rank_figure(cp)))),
            C.section("Path of the first iteration", C.graph(run.cached("cp_gantt_fig", lambda: logic.path_gantt_figure(cp)))),
        ], className="grid-2"),
        C.section("Longest segments on the path", C.df_table(
            run.cached("cp_segments_table", lambda: logic.segments_table(cp, limit=100)), SEG_COLS,
            {"begin_ns": ns, "duration_ns": ns, "share": share, "peer": lambda v: "" if v is None or v < 0 else str(v),
             "unfinished": lambda v: "unfinished" if v else ""}, id=Ids.SEGMENTS, tips=SEG_TIPS,
            row_class=lambda r: "row-bad" if r.get("unfinished") else None),
            help="begin: from the start of the segment's iteration; block and warp -1: a host segment or a "
                 "rank's late entry (no warp of its own)"),
        C.section("Slack per warp", C.df_table(
            run.cached("cp_slack_table", lambda: logic.slack_table(cp, limit=60)), SLACK_COLS,
            {"busy_ns": ns, "slack_ns": ns, "on_path": lambda v: "●" if v else ""},
            row_class=lambda r: "row-hot" if r.get("on_path") else None),
            help="busy and slack: summed over launches, slack the smallest over launches"),
    ])
