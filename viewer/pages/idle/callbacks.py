from __future__ import annotations

from dash import Input, Output, State, no_update

from ... import analyses
from ...catalog import ViewerError
from ...inputs import NAME, RUN_ID, checked, figure_message, opt
from . import logic
from .ids import Ids


def register(app, catalog) -> None:
    @app.callback(Output(Ids.HEATMAP, "figure"), Input(Ids.KERNEL, "value"), State(Ids.RUN, "data"),
                  prevent_initial_call=True)
    @checked(figure_message, k=opt(NAME), run_id=RUN_ID)
    def kernel(k, run_id):
        try:
            run = catalog.load(run_id)
            rep = analyses.idle(run)
            return run.cached(("idle_fig", k), lambda: logic.heatmap_figure(rep, k))
        except ViewerError:
            return no_update
