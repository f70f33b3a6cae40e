from __future__ import annotations

from dash import html

from ... import analyses, components as C
from ..analysis_page import analysis_page
from ...format import ns, share
from . import logic
from .ids import Ids

SUMMARY_COLS = {"kernel": "kernel", "barrier": "barrier", "scope": "scope", "occurrences": "occurrences",
                "arrivals": "arrivals", "useless_arrivals": "useless", "useless_share": "useless share",
                "mean_spread_ns": "mean spread", "max_spread_ns": "max spread", "total_wait_ns": "total wait",
                "last": "last arriver", "last_share": "last share"}
RANK_COLS = {"kernel": "kernel", "barrier": "barrier", "rank": "rank", "occurrences": "occurrences",
             "times_last": "times last", "last_share": "last share", "mean_lateness_ns": "mean lateness",
             "total_wait_ns": "total wait"}
OCC_COLS = {"kernel": "kernel", "iteration": "it", "rank": "rank", "barrier": "barrier", "occurrence": "#",
            "arrivals": "arrivals", "useless_arrivals": "useless", "spread_ns": "spread", "total_wait_ns": "wait",
            "last": "last arriver"}


def _with_last(df):
    df = df.copy()
    df["last"] = [logic.who(r, b, w) for r, b, w in zip(df["last_rank"], df["last_block"], df["last_warp"])]
    return df


def layout(catalog, run_id):
    return analysis_page(catalog, run_id, "barriers", analyses.barriers, _page)


def _page(entry, run, rep):
    fmt = {k: ns for k in ("mean_spread_ns", "max_spread_ns", "total_wait_ns", "mean_lateness_ns", "spread_ns")}
    fmt.update(useless_share=share, last_share=share)
    if rep.summary.empty:
        return html.Div([C.run_header(entry), C.note("This run recorded no barrier events.")])
    lines = run.cached("bar_sentences", lambda: logic.sentences(rep))
    occ = run.cached("bar_occ", lambda: _with_last(rep.occurrences).sort_values("spread_ns", ascending=False).head(100))
    return html.Div([
        C.run_header(entry),
        html.Div([html.Div(l, className="verdict-line") for l in lines], className="verdict", id=Ids.VERDICT),
        C.section("Per barrier", C.df_table(_with_last(rep.summary), SUMMARY_COLS, fmt, id=Ids.SUMMARY)),
        html.Div([
            C.section("Spread per occurrence", C.graph(run.cached("bar_occ_fig", lambda: logic.occurrences_figure(rep))),
                      help="marker size grows with the number of arrivals"),
            C.section("Who holds everyone up", C.graph(run.cached("bar_wait_fig", lambda: logic.wait_by_arriver_figure(rep)))),
        ], className="grid-2"),
        *([C.section("Cross-rank barriers per rank", C.df_table(rep.per_rank, RANK_COLS, fmt))] if len(rep.per_rank) else []),
        C.section("Occurrences, widest spread first", C.df_table(occ, OCC_COLS, fmt, max_rows=100, id=Ids.OCCURRENCES)),
    ])
