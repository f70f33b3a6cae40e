from __future__ import annotations

import dash_ag_grid as dag
from dash import html

from ... import components as C, jobs
from .ids import Ids
from .logic import GRID, table_of
from .query import BLOCK

ROW_PX = 44          # a run's name over its description (two lines of the name cell)
HEADER_PX = 30


def _skipped(catalog) -> list:
    """Directories under the roots that could not be read: named, never in the way."""
    notes = list(getattr(catalog, "notes", []))
    if not notes:
        return []
    return [C.note("Skipped (could not be read): " + "; ".join(notes[:20])
                   + (f"; and {len(notes) - 20} more" if len(notes) > 20 else ""))]


def column_defs() -> list[dict]:
    """The grid's columns (logic.GRID): sorted and filtered by the server (query.py), each cell's
    text from its row (a duration sorts by its ns, shows as "561 µs"); the last, the run's pages."""
    defs = []
    for c in GRID:
        d = {"field": c.field, "headerName": c.header, "width": c.width,
             "filter": "agNumberColumnFilter" if c.kind == "number" else "agTextColumnFilter"}
        if c.kind == "number":
            d["type"] = "rightAligned"
        if c.shown:
            d["valueFormatter"] = {"function": f"params.data ? params.data.{c.shown} : ''"}
        if c.renderer:
            d["cellRenderer"] = c.renderer
        if c.field == "name":
            d["pinned"] = "left"     # the run's name stays in view while the columns scroll
        if c.tooltip:
            d["tooltipField"] = c.tooltip
        defs.append(d)
    defs.append({"field": "pages", "headerName": "", "cellRenderer": "RunPages", "width": 200,
                 "sortable": False, "filter": False})
    return defs


def grid(n_runs: int) -> dag.AgGrid:
    """The runs as one grid whose rows come from the server a block at a time (callbacks.py):
    the browser draws the rows in view, whatever the number of runs."""
    return dag.AgGrid(
        id=Ids.TABLE, rowModelType="infinite", columnDefs=column_defs(), className="tbl-runs",
        defaultColDef={"sortable": True, "resizable": True, "minWidth": 60,
                       "filterParams": {"maxNumConditions": 2, "buttons": ["reset"]}},
        rowClassRules={"row-bad": "params.data && !params.data.ok"},
        dashGridOptions={"rowHeight": ROW_PX, "headerHeight": HEADER_PX, "cacheBlockSize": BLOCK,
                         "infiniteInitialRowCount": min(n_runs, BLOCK), "maxConcurrentDatasourceRequests": 1,
                         "tooltipShowDelay": 300, "enableCellTextSelection": True, "animateRows": False},
        # as tall as its rows, up to the window less the page's head; a longer list scrolls inside
        style={"height": f"min(calc(100vh - 150px), {HEADER_PX + ROW_PX * max(n_runs, 1) + 20}px)",
               "minHeight": "200px", "width": "100%"})


def layout(catalog, run_id=None):
    entries = catalog.entries()
    roots = ", ".join(map(str, catalog.roots))
    if not entries:
        return html.Div([html.H2("Runs"), C.note(f"No runs found under {roots}. Record one with "
                                                 "`epscope trace` or point `epscope view` at run directories."),
                         *_skipped(catalog)])
    # the grid asks for its first rows once the browser has built it (0.3-0.6 s on the 2-core
    # machine): the server reads them meanwhile, in the background
    table = table_of(catalog)
    catalog.jobs.submit(("runs", "table"), lambda: table.warm(entries), "runs table", jobs.AHEAD)
    return html.Div([
        html.Div([html.H2("Runs"), html.Span(f"{len(entries)} runs under {roots}", id=Ids.COUNT, className="help")],
                 className="page-head"),
        *_skipped(catalog),
        html.Div(id=Ids.MESSAGE),
        # AG Grid's own theme in its dark mode (its colour scheme follows this attribute of a parent)
        html.Div(grid(len(entries)), className="tbl-grid", **{"data-ag-theme-mode": "dark"}),
    ])
