"""The frame every analysis page shares: load the run, compute (or fetch) its analysis, show a
clear message instead of a stack trace, warm the other analyses, cache the built page."""
from __future__ import annotations

from dash import html

from .. import analyses, components as C
from ..catalog import ViewerError


def analysis_page(catalog, run_id, key: str, analyse, build):
    """`analyse(run)` -> result (an accessor of viewer.analyses); `build(entry, run, result)` -> page."""
    entry = catalog.entry(run_id)
    try:
        run = catalog.load(run_id)
        result = analyse(run)
    except ViewerError as e:
        return html.Div([C.run_header(entry), C.error_box(str(e))])
    analyses.warm(run)
    return run.cached(f"page:{key}", lambda: build(entry, run, result))
