"""Small Dash building blocks every page uses: tables, messages, the run header, the verdict.

Definitions are where they are read: a table header, a card label or a segment kind whose text is
a term of profiler.analysis.glossary gets that term's definition as its tooltip (the `title`
attribute), the same text docs/glossary.md holds.
"""
from __future__ import annotations

import math

from html import escape
from urllib.parse import quote

import dash_ag_grid as dag
import numpy as np
import pandas as pd
from dash import dcc, html

from profiler.analysis import glossary
from profiler.groundtruth.expect import Cause, Direction

from .format import ns, pct

MAX_TABLE_ROWS = 2000
# A grid is as tall as its rows up to GRID_HEIGHT_PX; a longer one scrolls and draws only the rows
# in view.
GRID_HEIGHT_PX = 420
GRID_MIN_ROWS = 30
GRID_ROW_PX = 24
GRID_HEADER_PX = 30


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


def term(text: str, term_name: str | None = None, className: str = "term") -> html.Span:
    """`text` with the glossary definition of `term_name` (default: the text itself) as tooltip."""
    t = glossary.TERMS.get(term_name or text)
    return html.Span(text, title=t, className=className) if t else html.Span(text)


def verdict_flag(v) -> tuple[str, str]:
    """(flag, tone) of a verdict box. A difference between A and B (Compare's knob_change) is an
    alarm by its fields, but B faster is an improvement: green, and named so; B slower a regression
    (issue 29: an improvement was shown as a red ALARM)."""
    if v.cause is Cause.KNOB_CHANGE and v.direction is not None:
        return ("IMPROVEMENT", "good") if v.direction is Direction.FASTER else ("REGRESSION", "bad")
    if v.alarm:
        return "ALARM", "bad"
    return "no alarm", "good" if v.cause in (Cause.NONE, Cause.SAME_CODE) else ""


def verdict_fields(v) -> list:
    """The verdict's structured fields as small labelled chips (each with its glossary tooltip)."""
    chips = [("cause", v.cause.value, v.cause.value)]
    if v.rank is not None:
        chips.append(("rank", str(v.rank), None))
    if v.peer is not None:
        chips.append(("peer", str(v.peer), "peer"))
    if v.kernel or v.phase:
        chips.append(("where", "/".join(x for x in (v.kernel, v.phase) if x), None))
    if v.direction is not None:
        chips.append(("direction", v.direction.value, None))
    d = v.decisions[0] if v.decisions else None
    if d is not None and math.isfinite(d.threshold):
        # the decision the verdict is (its facts say it in words): quantity, mean share, interval, band
        chips.append((d.quantity, f"{ns(d.mean_ns)} ({pct(100 * d.share, 0)})", d.quantity))
        chips.append(("band", f"{d.band} · interval {d.interval()}", "band"))
    elif v.magnitude_ns is not None:
        size = ns(v.magnitude_ns) + (f" ({pct(100 * v.share, 0)})" if v.share is not None else "")
        chips.append(("size", size, None))
    if v.iteration is not None:
        chips.append(("iteration", str(v.iteration), "iteration"))
    elif v.n and v.page == "compare":
        chips.append(("runs a side", str(v.n), "run"))
    elif v.n:
        chips.append(("n", str(v.n), "mean over n iterations"))
    return [html.Span([html.Span(k, className="chip-k"), " ", html.Span(val, className="chip-v")],
                      className="chip", title=glossary.TERMS.get(t) if t else None) for k, val, t in chips]


def verdict_box(v, id=None) -> html.Div:
    """A page's headline: the structured verdict's sentence, its fields, further findings, warnings."""
    kw = {"id": id} if id else {}
    flag, tone = verdict_flag(v)
    head = html.Div([html.Span(flag, className="verdict-flag", title=glossary.TERMS["alarm"]), " ",
                     html.Span(v.headline, className="verdict-text", title=glossary.TERMS.get(v.cause.value))],
                    className="verdict-line")
    parts = [head, html.Div(verdict_fields(v), className="verdict-fields")]
    if v.facts:
        parts.append(html.Ul([html.Li(f) for f in v.facts], className="verdict-facts"))
    if v.notes:
        parts.append(html.Ul([html.Li(n) for n in v.notes], className="verdict-notes"))
    if v.warnings:
        parts.append(html.Ul([html.Li(str(w), className="warn") for w in v.warnings], className="verdict-warnings"))
    return html.Div(parts, className=f"verdict {tone}".strip(), **kw)


def card(label: str, value: str, sub: str = "", tone: str = "", tip: str | None = None) -> html.Div:
    """A labelled number; `tip`: the glossary term of the label (default: the label itself)."""
    return html.Div([html.Div(term(label, tip), className="card-label"),
                     html.Div(value, className=f"card-value {tone}".strip()),
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
    status = str(m.get("status") or "ok")
    if status != "ok":
        bits.append(html.Span(status, className="run-status bad", title=str(m.get("error") or status)))
    note = getattr(entry, "note", None)
    if note:   # what `epscope check` says is not verified, said where the run is shown
        bits.append(html.Span("not verified", className="run-status bad", title=note, id="run-not-verified"))
    return html.Div([
        html.Div(bits, className="run-title"),
        html.Div(" · ".join(meta), className="run-meta"),
        html.A("⤓ Perfetto trace", href=download_href(entry.run_id), className="btn btn-download",
               id="perfetto-download", **{"data-run": entry.run_id}),
        *( [extra] if extra is not None else [] ),
    ], className="run-header")


def _cell(v):
    """A value as the grid sorts and filters it: numbers stay numbers, missing is None."""
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, (int, float, np.integer, np.floating)):
        return None if pd.isna(v) else v.item() if hasattr(v, "item") else v
    if isinstance(v, np.bool_):
        return bool(v)
    return None if pd.isna(v) is True else str(v)


def _static_table(defs: list, rows: list, className: str) -> dcc.Markdown:
    """A short table as one HTML block (escaped): one component for the browser to draw, where a
    grid instance costs ~0.2 s of browser CPU and each html.Td a Dash component of its own."""
    head = "".join(f'<th title="{escape(d["headerTooltip"])}">{escape(d["headerName"])}</th>' if d.get("headerTooltip")
                   else f'<th>{escape(d["headerName"])}</th>' for d in defs)
    body = []
    for r in rows:
        cls = f' class="{escape(r["_class"])}"' if r.get("_class") else ""
        cells = "".join(f'<td class="num">{escape(r[d["field"] + "_t"])}</td>' if d.get("type") == "rightAligned"
                        else f'<td>{escape(r[d["field"] + "_t"])}</td>' for d in defs)
        body.append(f"<tr{cls}>{cells}</tr>")
    return dcc.Markdown(f'<table class="{escape(className)}"><thead><tr>{head}</tr></thead>'
                        f'<tbody>{"".join(body)}</tbody></table>', dangerously_allow_html=True)


def df_table(df: pd.DataFrame, columns: dict | None = None, formats: dict | None = None,
             max_rows: int = MAX_TABLE_ROWS, id=None, row_class=None, className: str = "tbl",
             tips: dict | None = None) -> html.Div:
    """A dense table. Longer than GRID_MIN_ROWS rows: a virtualised grid (dash-ag-grid: the browser
    draws only the rows in view, so thousands of rows cost what a screenful does; issue 14 measured
    2.9 s of browser time for ~2,000 html.Td cells), sortable and filterable by column. Shorter: one
    static HTML block (a grid's fixed cost is more than such a table's).

    columns: {column: header}; formats: {column: callable -> str}: the text shown, while sorting
    and filtering use the value itself; row_class: callable(row) -> css class or None; tips:
    {column: glossary term} for headers whose text is not itself a glossary term (a header that
    is gets its definition as tooltip)."""
    columns = columns or {c: c for c in df.columns}
    formats = formats or {}
    tips = tips or {}
    fields = {c: f"c{i}" for i, c in enumerate(columns)}   # column names may hold dots AG Grid reads as paths
    rows, classes = [], set()
    for rec in df.head(max_rows).to_dict("records"):
        row = {}
        for c, f in fields.items():
            v = rec.get(c)
            fmt = formats.get(c)
            row[f] = _cell(v)
            row[f + "_t"] = fmt(v) if fmt else ("" if v is None else str(v))
        cls = row_class(rec) if row_class else None
        if cls:
            row["_class"] = cls
            classes.add(cls)
        rows.append(row)
    defs = []
    for c, h in columns.items():
        f = fields[c]
        numeric = c in df.columns and pd.api.types.is_numeric_dtype(df[c]) and not pd.api.types.is_bool_dtype(df[c])
        defs.append({"headerName": h, "field": f, "headerTooltip": glossary.TERMS.get(tips.get(c, h)),
                     "valueFormatter": {"function": f"params.data ? params.data.{f}_t : ''"},
                     "filter": "agNumberColumnFilter" if numeric else "agTextColumnFilter",
                     "type": "rightAligned" if numeric else None})
    for d in defs:
        if d["type"] is None:
            del d["type"]
    kw = {"id": id} if id else {}
    foot = []
    if len(df) > max_rows:
        foot = [html.Div(f"{len(df) - max_rows:,} more rows not shown (first {max_rows} of {len(df):,})",
                         className="tbl-more")]
    if len(rows) <= GRID_MIN_ROWS:
        return html.Div([_static_table(defs, rows, className), *foot], className="tbl-wrap", **kw)
    # a fixed height (a short table's rows and header, else GRID_HEIGHT_PX): AG Grid then lays out
    # without measuring its rows, and columns share the width by flex instead of being measured
    # (autoSize and autoHeight cost ~0.25 s of browser CPU per grid, measured on the 2-core machine)
    height = min(GRID_HEIGHT_PX, GRID_HEADER_PX + GRID_ROW_PX * max(len(rows), 1) + 2)
    grid = dag.AgGrid(
        rowData=rows, columnDefs=defs, className=className,
        defaultColDef={"sortable": True, "resizable": True, "flex": 1, "minWidth": 80},
        rowClassRules={k: f"params.data && params.data._class === '{k}'" for k in sorted(classes)},
        dashGridOptions={"rowHeight": GRID_ROW_PX, "headerHeight": GRID_HEADER_PX, "tooltipShowDelay": 300,
                         "enableCellTextSelection": True, "animateRows": False},
        style={"height": f"{height}px", "width": "100%"})
    # AG Grid's own theme in its dark mode (its colour scheme follows this attribute of a parent)
    return html.Div([grid, *foot], className="tbl-wrap tbl-grid", **{"data-ag-theme-mode": "dark"}, **kw)


def graph(fig: dict, id=None, height: int | None = None, config: dict | None = None) -> dcc.Graph:
    cfg = {"displaylogo": False, "scrollZoom": False}
    cfg.update(config or {})
    kw = {"id": id} if id else {}
    style = {"height": f"{height}px"} if height else None
    return dcc.Graph(figure=fig, config=cfg, style=style, **kw)


def section(title: str, *children, help: str = "") -> html.Div:
    return html.Div([html.Div([html.H3(title), html.Span(help, className="help")], className="section-head"),
                     *children], className="section")
