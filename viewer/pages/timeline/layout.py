from __future__ import annotations

from dash import dcc, html

from ... import analyses, components as C
from ..progress.layout import poll, when_ready
from . import logic
from .ids import Ids

CP_TICK_MS = 500   # how often the page asks whether the critical path (drawn in red) is computed


def layout(catalog, run_id, retry=True):
    return when_ready(catalog, run_id, "/timeline", ("timeline_index",), _page, retry)


def _page(entry, run):
    ix = analyses.timeline_index(run)
    cp_ready = run.has(analyses.RESULTS["critical"][2])
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
        html.Span("" if cp_ready else "critical path: computing…", id=Ids.CP_STATE,
                  className="cp-state" if cp_ready else "cp-state pending"),
        html.Button("reset zoom", id=Ids.RESET, className="btn"),
    ], className="controls")
    timeout = logic.unfinished_note(ix)
    return html.Div([
        C.run_header(entry),
        *([C.note(timeout, className="msg msg-warn")] if timeout else []),
        dcc.Store(id=Ids.RUN, data=entry.run_id),
        # the window on screen, for the rows' callbacks to keep: read instead of the figure, whose
        # hundreds of KB a State would upload with every zoom (benchmarks/NOTES.md, issue 20)
        dcc.Store(id=Ids.WINDOW, data=None),
        # the critical path is computed in the background: the figure is drawn without it first
        # and again with it when this turns true (callbacks.py)
        dcc.Store(id=Ids.CP_READY, data=cp_ready),
        poll(Ids.CP_TICK, CP_TICK_MS, disabled=cp_ready),
        controls,
        html.Div(id=Ids.INFO, className="info-line"),
        html.Div([html.Span([html.Span(className="swatch", style={"background": colour}), name], className="legend-item")
                  for name, colour in logic.phase_legend(ix)], className="phase-legend"),
        dcc.Loading(dcc.Graph(id=Ids.GRAPH, config={"displaylogo": False, "scrollZoom": True},
                              className="timeline-graph"), type="dot", delay_show=300),
        html.Div("Drag to zoom in time (server re-aggregates the window), double-click to reset. "
                 "Zoomed out, each cell shows the phase with the most busy time in it, shaded by busy share; "
                 "zoomed in, every span is drawn. Click a rank row to open its blocks, a block row to open its warps. "
                 "The red line is the critical path.", className="help"),
        *_torch_panel(run),
    ])


def _torch_panel(run) -> list:
    """The step's PyTorch ops under the warp lanes, in the same window (runs with `epscope merge`d traces)."""
    if not analyses.has_torch_traces(run.manifest):
        return []
    return [html.H3("The step's PyTorch ops (CPU threads and CUDA streams, merged traces)"),
            html.Ul(id=Ids.TORCH_NOTES, className="torch-notes"),
            dcc.Loading(dcc.Graph(id=Ids.TORCH_GRAPH, config={"displaylogo": False}), type="dot", delay_show=300),
            html.Div("The same time window as the warp lanes above (drag there to zoom). Red: the profiled "
                     "kernels whose warps the lanes show; orange: other kernels, with the op that launched them "
                     "in the sentences; blue: CPU ops and record_function ranges, nested by depth; light: Python "
                     "frames.", className="help")]
