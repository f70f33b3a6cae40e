"""The Runs grid's rows: AG Grid's infinite row model asks for a block of rows under its sort and
filter models (getRowsRequest); the server answers from the runs table (query.py)."""
from __future__ import annotations

from dash import Input, Output

from ... import components as C
from ...inputs import Invalid
from . import logic, query
from .ids import Ids

SORTABLE = frozenset(logic.KINDS)
EMPTY = {"rowData": [], "rowCount": 0}


def register(app, catalog) -> None:
    table = logic.table_of(catalog)

    @app.callback(Output(Ids.TABLE, "getRowsResponse"), Output(Ids.MESSAGE, "children"),
                  Input(Ids.TABLE, "getRowsRequest"), prevent_initial_call=True)
    def rows(request):
        try:
            req = query.parse_request(request, logic.KINDS, SORTABLE)
        except Invalid as e:   # an empty grid and the sentence, never an HTTP 500
            return EMPTY, C.error_box(f"Invalid input: {e}.", title="Cannot list the runs")
        got, count = table.answer(catalog.entries(), req)
        return {"rowData": logic.grid_rows(got, C.download_href), "rowCount": count}, None
