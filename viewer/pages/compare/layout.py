from __future__ import annotations

from dash import dcc, html

from ..progress.layout import poll
from .ids import Ids


def layout(catalog, run_id):
    opts = [{"label": e.name, "value": e.run_id} for e in catalog.entries() if e.manifest is not None]
    a = [run_id] if run_id in {o["value"] for o in opts} else []
    return html.Div([
        html.Div([html.H2("Compare A vs B"),
                  html.Span("Pick several runs per side (repeated recordings, interleaved A/B): the run is the "
                            "unit of replication, and with one run a side run-to-run noise cannot be estimated. "
                            "Samples are per iteration; differences are B − A with a bootstrap 95% CI over runs, "
                            "then iterations.", className="help")], className="page-head"),
        dcc.Store(id=Ids.RUN, data=run_id),
        html.Div([
            html.Label("A", className="side-a"),
            dcc.Dropdown(id=Ids.A, options=opts, value=a, multi=True, placeholder="runs of side A", className="dd-side"),
            html.Label("B", className="side-b"),
            dcc.Dropdown(id=Ids.B, options=opts, value=[], multi=True, placeholder="runs of side B", className="dd-side"),
            html.Button("compare", id=Ids.GO, className="btn btn-primary"),
        ], className="controls controls-compare"),
        dcc.Loading(html.Div(id=Ids.RESULT), type="dot"),
        poll(Ids.TICK, disabled=True),
    ])
