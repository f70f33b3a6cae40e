from __future__ import annotations

from dash import Input, Output, State, html
from dash.exceptions import PreventUpdate

from ... import analyses, components as C
from ...catalog import ViewerError
from ...format import ns, pct
from ...inputs import CLICKS, NAME, RANK, RUN_ID, checked, either, number, one_of, opt
from . import logic
from .ids import Ids

SUMMARY_COLS = {"iteration": "iteration", "before_ns": "before", "after_ns": "after", "change_ns": "change",
                "change_pct": "change %", "local_saving_ns": "local saving", "absorbed_pct": "absorbed",
                "path_phase_ns": "phase time on path"}


def register(app, catalog) -> None:
    @app.callback(Output(Ids.RESULT, "children"),
                  Input(Ids.APPLY, "n_clicks"),
                  State(Ids.RUN, "data"), State(Ids.PHASE, "value"), State(Ids.RANK, "value"),
                  State(Ids.PERCENT, "value"))
    @checked(lambda msg: C.error_box(msg, title="What-if not possible"), n=CLICKS, run_id=RUN_ID,
             phase=opt(NAME), rank=opt(either(one_of("all"), RANK)), percent=opt(number(-1000, 1000)))
    def project(n, run_id, phase, rank, percent):
        if not n:
            raise PreventUpdate
        if phase is None or percent is None:
            return C.note("Pick a phase and a percentage.")
        if percent >= 100:
            return C.note("A phase cannot become 100% faster or more; pick less than 100.")
        try:
            run = catalog.load(run_id)
            r = None if rank in (None, "all") else int(rank)
            w = analyses.what_if(run, phase, float(percent) / 100.0, r)
        except ViewerError as e:
            return C.error_box(str(e))
        except (ValueError, KeyError) as e:
            return C.error_box(str(e), title="What-if not possible")
        except Exception as e:   # a message in the page, never a 500
            return C.error_box(f"{type(e).__name__}: {e}", title="What-if failed")
        return html.Div([
            C.verdict(logic.what_if_sentence(w.summary, phase, r, float(percent)), id="cp-whatif-verdict"),
            C.df_table(w.summary, SUMMARY_COLS, {"before_ns": ns, "after_ns": ns, "change_ns": ns,
                                                 "local_saving_ns": ns, "change_pct": lambda v: pct(v, 2, True),
                                                 "absorbed_pct": pct, "path_phase_ns": ns},
                       tips={"before_ns": "iteration", "after_ns": "what-if", "change_ns": "what-if",
                             "change_pct": "what-if"}),
        ])
