from __future__ import annotations

from dash import dcc, html

from ... import analyses, components as C
from ...catalog import ViewerError
from . import logic
from .ids import Ids


def layout(catalog, run_id):
    entry = catalog.entry(run_id)
    try:
        run = catalog.load(run_id)
    except ViewerError as e:
        return html.Div([C.run_header(entry), C.error_box(str(e))])
    ix = analyses.timeline_index(run)
    analyses.warm(run)
    n_blocks = int(ix.lane_block.max(initial=0)) + 1
    controls = html.Div([
        html.Label("rows"),
        dcc.RadioItems(id=Ids.LEVEL, options=[{"label": " ranks", "value": "rank"},
                                              {"label": " blocks", "value": "block"},
                                              {"label": " warps", "value": "warp"}],
                       value="rank", inline=True, className="radio"),
        html.Label("ranks"),
        dcc.Dropdown(id=Ids.RANKS, options=[{"label": f"rank {r}", "value": r} for r in ix.ranks],
                     value=[], multi=True, placeholder="all", className="dd-ranks"),
        html.Label("blocks (warps view)"),
        dcc.Input(id=Ids.BLOCK_LO, type="number", value=0, min=0, debounce=True, className="num"),
        html.Span("–"),
        dcc.Input(id=Ids.BLOCK_HI, type="number", value=min(n_blocks - 1, 1), min=0, debounce=True, className="num"),
        dcc.Checklist(id=Ids.CRITICAL, options=[{"label": " critical path", "value": "on"}], value=["on"],
                      inline=True, className="check"),
        html.Button("reset zoom", id=Ids.RESET, className="btn"),
    ], className="controls")
    timeout = logic.unfinished_note(ix)
    return html.Div([
        C.run_header(entry),
        *([C.note(timeout, className="msg msg-warn")] if timeout else []),
        dcc.Store(id=Ids.RUN, data=run_id),
        controls,
        html.Div(id=Ids.INFO, className="info-line"),
        dcc.Loading(dcc.Graph(id=Ids.GRAPH, config={"displaylogo": False, "scrollZoom": True},
                              className="timeline-graph"), type="dot", delay_show=300),
        html.Div("Drag to zoom in time (server re-aggregates the window), double-click to reset. "
                 "Zoomed out, each cell shows the phase with the most busy time in it, shaded by busy share; "
                 "zoomed in, every span is drawn. Click a rank row to open its blocks, a block row to open its warps. "
                 "The red line is the critical path.", className="help"),
    ])
