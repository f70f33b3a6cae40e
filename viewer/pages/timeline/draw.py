"""One view of the lanes drawn: the figure, the line under the controls and the window, as the
page's first answer (layout.py) and every later one (callbacks.py) draw it."""
from __future__ import annotations

from dataclasses import dataclass

from ... import analyses
from . import logic


@dataclass(frozen=True)
class Drawn:
    figure: dict
    info: str
    window: list    # [t0, t1] in µs since the run's start: what Ids.WINDOW keeps


def draw(catalog, run_id: str, run, level: str | None, ranks: list[int] | None, blocks: tuple[int, int],
         t0: float | None, t1: float | None, crit: list[str] | None) -> Drawn:
    """The view of (level, ranks, blocks) over [t0, t1] ns (None: the whole run). With `crit` on
    and the critical path not computed yet, it is asked for and drawn later (the page's tick).
    Raises RunError when the window's events cannot be read."""
    ix = analyses.timeline_index(run)
    view = analyses.timeline_view(run, level or "rank", ranks or None, blocks, t0, t1)
    segs = None
    if crit and "on" in crit:
        if run.has(analyses.RESULTS["critical"][2]):
            segs = analyses.critical(run).segments
        else:   # drawn without it now; the tick redraws when it is computed
            analyses.request(catalog, run_id, ("critical",))
    assert view.t1 >= view.t0, (view.t0, view.t1)
    return Drawn(logic.figure(view, ix, segs), logic.describe(view), [view.t0 / 1e3, view.t1 / 1e3])
