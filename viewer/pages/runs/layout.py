from __future__ import annotations

from urllib.parse import urlencode

from dash import dcc, html

from ... import components as C
from ...format import ns
from .ids import Ids
from .logic import COLUMNS, runs_table


def _skipped(catalog) -> list:
    """Directories under the roots that could not be read: named, never in the way."""
    notes = list(getattr(catalog, "notes", []))
    if not notes:
        return []
    return [C.note("Skipped (could not be read): " + "; ".join(notes[:20])
                   + (f"; and {len(notes) - 20} more" if len(notes) > 20 else ""))]


def layout(catalog, run_id=None):
    df = runs_table(catalog.entries())
    if df.empty:
        roots = ", ".join(map(str, catalog.roots))
        return html.Div([html.H2("Runs"), C.note(f"No runs found under {roots}. Record one with "
                                                 "`epscope trace` or point `epscope view` at run directories."),
                         *_skipped(catalog)])
    body = []
    for r in df.to_dict("records"):
        q = "?" + urlencode({"run": r["run_id"]})
        # runs that share a name are told apart by where they live
        where = [html.Div(f"in {r['directory']}", className="cell-sub run-dir")] if r["shared_name"] else []
        name = html.Div([dcc.Link(r["name"], href="/timeline" + q, className="run-link"), *where,
                         html.Div(r["description"], className="cell-sub")])
        cells = [html.Td(name)]
        for c in list(COLUMNS)[1:]:
            v = r[c]
            if c == "clock":
                v = ns(v) if v is not None else "—"
            elif c == "drops":
                v = f"{v:,}"
            cells.append(html.Td(v, className=f"col-{c}"))
        links = html.Td([dcc.Link(lbl, href=p + q, className="mini-link")
                         for p, lbl in (("/critical-path", "path"), ("/idle", "idle"), ("/barriers", "barriers"))]
                        + [html.A("⤓", href=C.download_href(r["run_id"]), className="mini-link", title="Perfetto trace")])
        body.append(html.Tr(cells + [links], className="" if r["ok"] else "row-bad"))
    head = html.Thead(html.Tr([html.Th(h) for h in COLUMNS.values()] + [html.Th("")]))
    return html.Div([
        html.Div([html.H2("Runs"), html.Span(f"{len(df)} runs under {', '.join(map(str, catalog.roots))}",
                                             id=Ids.COUNT, className="help")], className="page-head"),
        *_skipped(catalog),
        html.Div(html.Table([head, html.Tbody(body)], className="tbl tbl-runs"), className="tbl-wrap tbl-wrap-full", id=Ids.TABLE),
    ])
