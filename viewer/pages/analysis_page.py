"""The frame every analysis page shares: its analysis computed in the background (the progress
state until it is done: pages.progress), a clear message instead of a stack trace, the other
analyses warmed, the built page cached."""
from __future__ import annotations

from .. import analyses
from .progress.layout import when_ready


def analysis_page(catalog, run_id, path: str, name: str, build, retry: bool = True):
    """`name`: the page's result in viewer.analyses.RESULTS; `build(entry, run, result)` -> page."""
    _, accessor, _ = analyses.RESULTS[name]
    return when_ready(catalog, run_id, path, (name,),
                      lambda entry, run: run.cached(f"page:{name}", lambda: build(entry, run, accessor(run))),
                      retry=retry)
