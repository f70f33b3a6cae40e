"""The poll of a page drawn as a progress state: FIRST_TICK_MS after it is drawn, then TICK_MS after
its last answer, it asks for the page again (waiting up to POLL_WAIT_S for its jobs) and either
updates the progress lines (and allows one more tick: layout.again) or swaps in the page."""
from __future__ import annotations

from dash import Input, Output, State, no_update

from ... import components as C
from ...catalog import ViewerError
from ...jobs import Busy
from ...inputs import MAX_ID, checked, integer, mapping, opt, text
from .ids import Ids
from .layout import POLL_WAIT_S, TICK_MS, again, is_pending, wait_override


def register(app, catalog, layouts: dict) -> None:
    """layouts: page path -> its layout(catalog, run_id) (the same the router calls)."""

    @app.callback(Output(Ids.ROOT, "children"), Output(Ids.BOX, "children"), Output(Ids.TICK, "max_intervals"),
                  Output(Ids.TICK, "interval"), Input(Ids.TICK, "n_intervals"), State(Ids.TARGET, "data"),
                  prevent_initial_call=True)
    @checked(lambda msg: (C.error_box(msg), no_update, no_update, no_update), n=opt(integer(0)),
             target=mapping(path=text(256), run=text(MAX_ID)))
    def poll(n, target):
        layout = layouts.get(target.get("path"))
        run_id = target.get("run")
        if layout is None or not isinstance(run_id, str):
            return C.error_box("Invalid input: this progress state names no page."), no_update, no_update, no_update
        token = wait_override.set(POLL_WAIT_S)
        try:
            page = layout(catalog, run_id, retry=False)
        except ViewerError as e:
            return C.error_box(str(e)), no_update, no_update, no_update
        except Busy as e:
            return C.error_box(str(e), title="Busy"), no_update, no_update, no_update
        finally:
            wait_override.reset(token)
        if is_pending(page):
            box = page.children[[getattr(c, "id", None) for c in page.children].index(Ids.BOX)].children
            return no_update, box, again(n), TICK_MS
        return page, no_update, no_update, no_update
