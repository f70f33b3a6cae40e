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
            "median_busy_ns": "median busy", "ratio": "max / median"}


def layout(catalog, run_id):
    return analysis_page(catalog, run_id, "idle", analyses.idle, _page)


def _page(entry, run, rep):
    h = run.cached("idle_headline", lambda: logic.headline(rep))
    ks = run.cached("idle_kernels", lambda: logic.kernels(rep))
    fmt = {"kernel_ns": ns, "busy_ns": ns, "wait_ns": ns, "idle_ns": ns, "max_busy_ns": ns, "median_busy_ns": ns,
           "busy_share": share, "ratio": ratio, "did_work": lambda v: "yes" if v else "no"}
    blocks = run.cached("idle_blocks", lambda: rep.per_block.sort_values(["busy_share", "rank", "block"])
                        if len(rep.per_block) else rep.per_block)
    evidence = run.cached("idle_evidence", lambda: rep.evidence.sort_values(["did_work", "busy_ns", "rank", "block", "warp"])
                          if len(rep.evidence) else rep.evidence)
    return html.Div([
        C.run_header(entry),
        dcc.Store(id=Ids.RUN, data=entry.run_id),
        C.verdict(rep.verdict or "No idle warps: every warp did work.", id=Ids.VERDICT,
                  tone="bad" if len(evidence) and not evidence["did_work"].all() else "good"),
        html.Div([
            C.card("warps (kernels with work)", f"{h['warps']:,}"),
            C.card("warps with no work", f"{h['idle_warps']:,}", tone="bad" if h["idle_warps"] else ""),
            C.card("blocks with no work", f"{h['idle_blocks']:,} / {h['blocks']:,}"),
            C.card("worst imbalance (max/median busy)", ratio(h["worst_ratio"])),
        ], className="cards"),
        html.Div([html.Label("kernel"),
                  dcc.RadioItems(id=Ids.KERNEL, options=ks, value=ks[0] if ks else None, inline=True, className="radio")],
                 className="controls"),
        dcc.Graph(id=Ids.HEATMAP, figure=run.cached(("idle_fig", ks[0] if ks else None),
                                                    lambda: logic.heatmap_figure(rep, ks[0] if ks else None)),
                  config={"displaylogo": False}),
        C.section("Evidence", C.df_table(evidence, WARP_COLS, fmt, id=Ids.EVIDENCE, max_rows=100,
                                         row_class=lambda r: None if r.get("did_work") else "row-bad"),
                  help="the warps of the (rank, kernel) pairs the verdict names"),
        html.Div([
            C.section("Imbalance per rank and role", C.df_table(rep.imbalance, IMB_COLS, fmt)),
            C.section("Blocks, least busy first", C.df_table(blocks, BLOCK_COLS, fmt, max_rows=60)),
        ], className="grid-2"),
    ])
