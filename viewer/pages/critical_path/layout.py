from __future__ import annotations

from dash import dcc, html

from ... import analyses, components as C
from ..analysis_page import analysis_page
from ...format import ns, pct, share
from . import logic
from .ids import Ids

SEG_COLS = {"iteration": "it", "rank": "rank", "kernel": "kernel", "block": "block", "warp": "warp", "role": "role",
            "phase": "phase", "kind": "kind", "begin_ns": "begin", "duration_ns": "duration", "share": "share"}
SLACK_COLS = {"rank": "rank", "kernel": "kernel", "block": "block", "warp": "warp", "role": "role",
              "busy_ns": "busy", "slack_ns": "slack (min)", "on_path": "on path"}


def layout(catalog, run_id):
    return analysis_page(catalog, run_id, "critical_path", analyses.critical, _page)


def _page(entry, run, cp):
    h = logic.headline(cp)
    phases = run.cached("span_phases", lambda: logic.phase_options(run.events))
    ranks = run.cached("ranks", lambda: sorted(int(r) for r in run.events["rank"].unique()))
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
        html.Div([
            C.card("iterations", f"{h['iterations']}"),
            C.card("median iteration", ns(h["median_iteration_ns"])),
            C.card("pacing rank", f"rank {h['pacing_rank']}" if h["pacing_rank"] >= 0 else "—", tone="accent"),
            C.card("path spent waiting", pct(h["wait_share"] * 100)),
            C.card("warps on the path", f"{h['warps_on_path']}"),
        ], className="cards"),
        C.verdict(logic.pacing_sentence(cp), id=Ids.SUMMARY),
        C.section("What-if", whatif, dcc.Loading(html.Div(id=Ids.RESULT, className="whatif-result"), type="dot"),
                  help="re-times the same dependency graph: a saving that a rendezvous absorbs shows up here"),
        html.Div([
            C.section("Critical path per rank", C.graph(run.cached("cp_by_rank_fig", lambda: logic.path_by_rank_figure(cp)))),
            C.section("Path of the first iteration", C.graph(run.cached("cp_gantt_fig", lambda: logic.path_gantt_figure(cp)))),
        ], className="grid-2"),
        C.section("Longest segments on the path", C.df_table(
            run.cached("cp_segments_table", lambda: logic.segments_table(cp, limit=100)), SEG_COLS,
            {"begin_ns": ns, "duration_ns": ns, "share": share}, id=Ids.SEGMENTS)),
        C.section("Slack per warp", C.df_table(
            run.cached("cp_slack_table", lambda: logic.slack_table(cp, limit=60)), SLACK_COLS,
            {"busy_ns": ns, "slack_ns": ns, "on_path": lambda v: "●" if v else ""},
            row_class=lambda r: "row-hot" if r.get("on_path") else None),
            help="how much later a warp could finish without delaying anyone"),
    ])
