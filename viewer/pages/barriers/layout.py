from __future__ import annotations

from dash import html

from ... import analyses, components as C
from ..analysis_page import analysis_page
from ...format import ns, share
from . import logic
from .ids import Ids

SUMMARY_COLS = {"kernel": "kernel", "barrier": "barrier", "scope": "scope", "occurrences": "occurrences",
                "arrivals": "arrivals", "useless_arrivals": "useless", "useless_share": "useless share",
                "mean_spread_ns": "mean spread", "max_spread_ns": "max spread", "total_wait_ns": "wait (sum over warps)",
                "last": "last arriver", "last_share": "last share"}
RANK_COLS = {"kernel": "kernel", "barrier": "barrier", "rank": "rank", "occurrences": "occurrences",
             "times_last": "times last", "last_share": "last share", "mean_lateness_ns": "mean lateness",
             "total_wait_ns": "wait (sum over warps)"}
OCC_COLS = {"kernel": "kernel", "iteration": "iteration", "rank": "rank", "barrier": "barrier",
            "occurrence": "occurrence", "arrivals": "arrivals", "useless_arrivals": "useless", "spread_ns": "spread",
            "lateness_ns": "lateness", "total_wait_ns": "wait (sum over warps)", "unfinished": "unfinished",
            "last": "last arriver"}
TIPS = {"useless_share": "useless", "mean_spread_ns": "spread", "max_spread_ns": "spread",
        "rank": "-1 (rank, block, warp)"}


def _with_last(df):
    df = df.copy()
    df["last"] = [logic.who(r, b, w) for r, b, w in zip(df["last_rank"], df["last_block"], df["last_warp"])]
    return df


def layout(catalog, run_id, retry=True):
    return analysis_page(catalog, run_id, "/barriers", "barriers", _page, retry)


def _page(entry, run, rep):
    fmt = {k: ns for k in ("mean_spread_ns", "max_spread_ns", "total_wait_ns", "mean_lateness_ns", "spread_ns",
                           "lateness_ns")}
    fmt.update(useless_share=share, last_share=share, unfinished=lambda v: str(v) if v else "")
    if rep.summary.empty:
        return html.Div([C.run_header(entry), C.verdict_box(analyses.verdict(run, "barriers"), id=Ids.VERDICT),
                         C.note("This run recorded no barrier events.")])
    lines = run.cached("bar_sentences", lambda: logic.sentences(rep))
    occ = run.cached("bar_occ", lambda: _with_last(rep.occurrences).sort_values("lateness_ns", ascending=False).head(100))
    return html.Div([
        C.run_header(entry),
        C.verdict_box(analyses.verdict(run, "barriers"), id=Ids.VERDICT),
        C.section("Per barrier", html.Div([html.Div(l, className="verdict-line") for l in lines]),
                  C.df_table(_with_last(rep.summary), SUMMARY_COLS, fmt, id=Ids.SUMMARY, tips=TIPS),
                  help="rank -1: a cross-rank barrier (every rank meets there); waits are warp time"),
        html.Div([
            C.section("Spread per occurrence", C.graph(run.cached("bar_occ_fig", lambda: logic.occurrences_figure(rep))),
                      help="marker size grows with the number of arrivals"),
            C.section("Who holds everyone up", C.graph(run.cached("bar_wait_fig", lambda: logic.wait_by_arriver_figure(rep)))),
        ], className="grid-2"),
        *([C.section("Cross-rank barriers per rank", C.df_table(rep.per_rank, RANK_COLS, fmt, tips=TIPS))]
          if len(rep.per_rank) else []),
        C.section("Occurrences, latest last arriver first", C.df_table(occ, OCC_COLS, fmt, max_rows=100,
                                                                        id=Ids.OCCURRENCES, tips=TIPS)),
    ])
