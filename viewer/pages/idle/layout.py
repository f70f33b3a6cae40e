from __future__ import annotations

from dash import dcc, html

from ... import analyses, components as C
from ..analysis_page import analysis_page
from ...format import ns, ratio, share
from . import logic
from .ids import Ids

WARP_COLS = {"rank": "rank", "kernel": "kernel", "block": "block", "warp": "warp", "role": "role",
             "kernel_ns": "kernel time", "busy_ns": "busy", "wait_ns": "waiting", "idle_ns": "idle",
             "busy_share": "busy share", "did_work": "did work"}
BLOCK_COLS = {"rank": "rank", "kernel": "kernel", "block": "block", "warps": "warps", "working_warps": "working",
              "busy_ns": "busy", "idle_ns": "idle", "busy_share": "busy share"}
IMB_COLS = {"rank": "rank", "kernel": "kernel", "role": "role", "warps": "warps", "max_busy_ns": "max busy",
            "median_busy_ns": "median busy", "ratio": "max busy / median busy"}
RANK_COLS = {"kernel": "kernel", "role": "role", "rank": "rank", "warps": "warps", "spans": "work spans",
             "busy_ns": "busy (role, all warps)", "kernel_ns": "kernel time", "waited_on_ns": "waited on",
             "busy_ratio": "busy ratio"}
TIPS = {"max_busy_ns": "max busy / median busy", "median_busy_ns": "max busy / median busy", "warps": "did work"}


def layout(catalog, run_id, retry=True):
    return analysis_page(catalog, run_id, "/idle", "idle", _page, retry)


def _page(entry, run, rep):
    h = run.cached("idle_headline", lambda: logic.headline(rep))
    ks = run.cached("idle_kernels", lambda: logic.kernels(rep))
    fmt = {"kernel_ns": ns, "busy_ns": ns, "wait_ns": ns, "idle_ns": ns, "max_busy_ns": ns, "median_busy_ns": ns,
           "busy_share": share, "ratio": ratio, "did_work": lambda v: "yes" if v else "no"}
    blocks = run.cached("idle_blocks", lambda: rep.per_block.sort_values(["busy_share", "rank", "block"])
                        if len(rep.per_block) else rep.per_block)
    evidence = run.cached("idle_evidence", lambda: logic.evidence(rep))
    fmt.update(busy_ratio=ratio, waited_on_ns=ns)
    ranks = C.section("Across ranks: what each rank carries", C.df_table(
        run.cached("idle_ranks", lambda: logic.ranks_table(rep)), RANK_COLS, fmt, max_rows=100,
        row_class=lambda r: "row-bad" if r.get("busy_ratio", 0) >= logic.RANK_IMBALANCE_RATIO else None),
        help="per kernel and role; busy and kernel time summed over warps and launches")
    lead = [ranks] if logic.imbalance_first(rep) else []
    return html.Div([
        C.run_header(entry),
        dcc.Store(id=Ids.RUN, data=entry.run_id),
        C.verdict_box(analyses.verdict(run, "idle"), id=Ids.VERDICT),
        *lead,
        html.Div([
            C.card("warps (kernels with work)", f"{h['warps']:,}", tip="did work"),
            C.card("warps with no work", f"{h['idle_warps']:,}", tone="bad" if h["idle_warps"] else "", tip="did work"),
            C.card("blocks with no work", f"{h['idle_blocks']:,} / {h['blocks']:,}", tip="did work"),
            C.card("worst imbalance within a rank", ratio(h["worst_ratio"]), tip="max busy / median busy"),
        ], className="cards"),
        html.Div([html.Label("kernel"),
                  dcc.RadioItems(id=Ids.KERNEL, options=ks, value=ks[0] if ks else None, inline=True, className="radio")],
                 className="controls"),
        dcc.Graph(id=Ids.HEATMAP, figure=run.cached(("idle_fig", ks[0] if ks else None),
                                                    lambda: logic.heatmap_figure(rep, ks[0] if ks else None)),
                  config={"displaylogo": False}),
        C.section("Evidence", C.df_table(evidence, logic.evidence_columns(rep, WARP_COLS, RANK_COLS), fmt,
                                         id=Ids.EVIDENCE, max_rows=100, tips=TIPS,
                                         row_class=lambda r: "row-bad" if r.get("did_work") is False else None),
                  help="what the verdict names: the warps of its (rank, kernel), or the ranks of its kernel; "
                       "times summed over launches"),
        *([] if lead else [ranks]),
        html.Div([
            C.section("Within a rank: busiest warp per role", C.df_table(rep.imbalance, IMB_COLS, fmt, tips=TIPS)),
            C.section("Blocks, least busy first", C.df_table(blocks, BLOCK_COLS, fmt, max_rows=60, tips=TIPS)),
        ], className="grid-2"),
    ])
