"""Unfinished waits: spans and barrier waits a kernel never ended (a timeout, an aborted kernel).

The decoder keeps a BEGIN without END as an open span (`open = True`) ending at its warp's last
record, which for a warp stuck polling is the BEGIN itself; a barrier arrival without departure
has no row for its end at all. Both are waits that lasted until the kernel stopped recording:
`close` ends them there, so every analysis and the timeline see them as the waiting they were.

Where the kernel stopped: the launch's GPU end from the launch table (the recorder's end stamp,
taken after the wait gave up at its timeout), else the launch's last record on that rank.
The closed rows keep `open = True`, which is what marks them unfinished downstream.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from .keys import isin_names, pack


def stop_times(events: pd.DataFrame, launches: pd.DataFrame | None = None) -> pd.Series:
    """Per (rank, launch) of the GPU rows: when the kernel stopped recording (ns)."""
    gpu = events["block"].to_numpy() >= 0
    last = pd.Series(np.maximum(events["begin_ns"].to_numpy()[gpu], events["end_ns"].to_numpy()[gpu])).groupby(
        [events["rank"].to_numpy()[gpu], events["launch"].to_numpy()[gpu]]).max()
    if launches is not None and len(launches):
        ge = launches.set_index(["rank", "launch"])["gpu_end_ns"]
        ge = ge[ge >= 0]    # -1: unknown (schema)
        ge = ge.reindex(last.index)
        last = pd.Series(np.fmax(last.to_numpy(float), ge.to_numpy(float)).astype(np.int64), index=last.index)
    return last


def _kind_rows(events: pd.DataFrame, kind: str) -> np.ndarray:
    """Rows of one kind; a categorical column compared by its code (one pass over int8 codes:
    keys.isin_names' np.isin widens them to intp first, 2.2 ms of a 2.5 M-event chunk's 9.5)."""
    col = events["kind"]
    if not isinstance(col.dtype, pd.CategoricalDtype):
        return np.flatnonzero(isin_names(col, [kind]))
    cats = list(col.cat.categories)
    if kind not in cats:
        return np.zeros(0, np.int64)
    return np.flatnonzero(col.cat.codes.to_numpy() == cats.index(kind))


def _unmatched_arrivals(events: pd.DataFrame) -> np.ndarray:
    """Rows of barrier arrivals that have no departure of the same warp, barrier and occurrence."""
    arr = _kind_rows(events, "arrive")
    if len(arr) == 0:
        return arr
    dep = _kind_rows(events, "depart")
    cols = ("rank", "launch", "block", "warp", "payload")
    phase = events["phase"]
    pc = phase.cat.codes.to_numpy() if isinstance(phase.dtype, pd.CategoricalDtype) else pd.factorize(phase)[0]
    rows = np.concatenate([arr, dep])
    sel = [events[c].to_numpy()[rows].astype(np.int64) for c in cols]
    keys = pack([v - int(v.min()) for v in sel] + [pc[rows].astype(np.int64) + 1])
    return arr[~np.isin(keys[: len(arr)], keys[len(arr):])]


def close(events: pd.DataFrame, launches: pd.DataFrame | None = None) -> pd.DataFrame:
    """The table with every unfinished wait ended where its kernel stopped recording.

    Open spans end at max(their end, the stop time of their launch); each arrival without a
    departure gets an open departure row at the stop time. Returns `events` itself (the same
    object, so caches keyed on it still hit) when nothing is unfinished.
    """
    if len(events) == 0:
        return events
    is_open = events["open"].to_numpy(bool)
    loose = _unmatched_arrivals(events)
    if not is_open.any() and len(loose) == 0:
        return events
    stop = stop_times(events, launches)
    out = events.copy()
    if is_open.any():
        rows = np.flatnonzero(is_open)
        st = stop.reindex(pd.MultiIndex.from_arrays([events["rank"].to_numpy()[rows],
                                                     events["launch"].to_numpy()[rows]])).to_numpy()
        end = out["end_ns"].to_numpy().copy()
        ok = ~np.isnan(st.astype(float))
        end[rows[ok]] = np.maximum(end[rows[ok]], st[ok].astype(np.int64))
        out["end_ns"] = end
    if len(loose):
        dep = events.iloc[loose].copy()
        st = stop.reindex(pd.MultiIndex.from_arrays([dep["rank"].to_numpy(), dep["launch"].to_numpy()])).to_numpy()
        t = np.maximum(dep["begin_ns"].to_numpy(), np.nan_to_num(st.astype(float), nan=0).astype(np.int64))
        dep["kind"] = pd.Categorical(["depart"] * len(dep), categories=events["kind"].cat.categories) \
            if isinstance(events["kind"].dtype, pd.CategoricalDtype) else "depart"
        dep["begin_ns"] = t
        dep["end_ns"] = t
        dep["open"] = True
        out = pd.concat([out, dep], ignore_index=True)
        for c in ("kernel", "role", "kind", "phase"):
            if isinstance(events[c].dtype, pd.CategoricalDtype):
                out[c] = out[c].astype(events[c].dtype)
    return out
