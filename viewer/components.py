"""Small Dash building blocks every page uses: tables, messages, the run header."""
from __future__ import annotations

from urllib.parse import quote

import pandas as pd
from dash import dcc, html

MAX_TABLE_ROWS = 200


def download_href(run_id: str) -> str:
    return f"/download/{quote(run_id, safe='')}.perfetto-trace"


def error_box(message: str, title: str = "Cannot show this run") -> html.Div:
    return html.Div([html.Div(title, className="msg-title"), html.Div(message, className="msg-body")],
                    className="msg msg-error", role="alert")


def note(message, className: str = "msg msg-note") -> html.Div:
    return html.Div(message, className=className)


def verdict(text: str, id=None, tone: str = "") -> html.Div:
    kw = {"id": id} if id else {}
    return html.Div(text, className=f"verdict {tone}".strip(), **kw)


def card(label: str, value: str, sub: str = "", tone: str = "") -> html.Div:
    return html.Div([html.Div(label, className="card-label"), html.Div(value, className=f"card-value {tone}".strip()),
                     html.Div(sub, className="card-sub")], className="card")


def run_header(entry, extra=None) -> html.Div:
    """Name, one-line description, git, and the Perfetto download link: on every page."""
    m = entry.manifest or {}
    git = m.get("git") or {}
    commit = str(git.get("commit") or "")[:10]
    bits = [html.Span(entry.name, className="run-name")]
    if m.get("description"):
        bits.append(html.Span(str(m["description"]), className="run-desc"))
    meta = []
    if git.get("branch") or commit:
        meta.append(f"{git.get('branch', '?')}@{commit}{' (dirty)' if git.get('dirty') else ''}")
    gpu = m.get("gpu") or {}
    if gpu.get("name"):
        meta.append(f"{gpu.get('count', 1)}× {gpu['name']}")
    if (m.get("workload") or {}).get("kind") == "synthetic":
        meta.append("synthetic run")
    return html.Div([
        html.Div(bits, className="run-title"),
        html.Div(" · ".join(meta), className="run-meta"),
        html.A("⤓ Perfetto trace", href=download_href(entry.run_id), className="btn btn-download",
               id="perfetto-download", **{"data-run": entry.run_id}),
        *( [extra] if extra is not None else [] ),
    ], className="run-header")


def df_table(df: pd.DataFrame, columns: dict | None = None, formats: dict | None = None,
             max_rows: int = MAX_TABLE_ROWS, id=None, row_class=None, className: str = "tbl") -> html.Div:
    """A dense HTML table. columns: {column: header}; formats: {column: callable -> str};
    row_class: callable(row) -> css class or None."""
    columns = columns or {c: c for c in df.columns}
    formats = formats or {}
    head = html.Thead(html.Tr([html.Th(h) for h in columns.values()]))
    rows = []
    shown = df.head(max_rows)
    for rec in shown.to_dict("records"):
        cells = []
        for c in columns:
            v = rec.get(c)
            f = formats.get(c)
            cells.append(html.Td(f(v) if f else ("" if v is None else str(v))))
        cls = row_class(rec) if row_class else None
        rows.append(html.Tr(cells, className=cls) if cls else html.Tr(cells))
    kw = {"id": id} if id else {}
    foot = []
    if len(df) > max_rows:
        foot = [html.Div(f"{len(df) - max_rows:,} more rows not shown (first {max_rows} of {len(df):,})",
                         className="tbl-more")]
    return html.Div([html.Table([head, html.Tbody(rows)], className=className), *foot], className="tbl-wrap", **kw)


def graph(fig: dict, id=None, height: int | None = None, config: dict | None = None) -> dcc.Graph:
    cfg = {"displaylogo": False, "scrollZoom": False}
    cfg.update(config or {})
    kw = {"id": id} if id else {}
    style = {"height": f"{height}px"} if height else None
    return dcc.Graph(figure=fig, config=cfg, style=style, **kw)


def section(title: str, *children, help: str = "") -> html.Div:
    return html.Div([html.Div([html.H3(title), html.Span(help, className="help")], className="section-head"),
                     *children], className="section")
