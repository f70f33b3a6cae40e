"""Hand-made event tables for the analysis tests: one tuple per row, schema dtypes applied."""
from __future__ import annotations

import pandas as pd

from profiler.registry import Registry, find_registry
from profiler.schema import coerce_events

FIELDS = ("rank", "launch", "kernel", "iteration", "block", "warp", "role", "kind", "phase",
          "begin_ns", "end_ns", "payload")


def table(rows) -> pd.DataFrame:
    """rows: tuples in FIELDS order; sm is the block, open is False."""
    df = pd.DataFrame([dict(zip(FIELDS, r)) for r in rows], columns=list(FIELDS))
    df["sm"] = df["block"]
    df["open"] = False
    return coerce_events(df)


def span(rank, block, warp, phase, b, e, payload=0, *, kernel="dispatch", launch=0, iteration=0, role="w"):
    return (rank, launch, kernel, iteration, block, warp, role, "span", phase, b, e, payload)


def instant(rank, block, warp, phase, t, payload=0, *, kernel="dispatch", launch=0, iteration=0, role="w"):
    return (rank, launch, kernel, iteration, block, warp, role, "instant", phase, t, t, payload)


def barrier(rank, block, warp, name, arrive, depart, occurrence=0, *, kernel="dispatch", launch=0, iteration=0, role="w"):
    return [(rank, launch, kernel, iteration, block, warp, role, "arrive", name, arrive, arrive, occurrence),
            (rank, launch, kernel, iteration, block, warp, role, "depart", name, depart, depart, occurrence)]


def host(rank, phase, b, e, *, kernel="dispatch", launch=0, iteration=0):
    return (rank, launch, kernel, iteration, -1, -1, "host", "host", phase, b, e, 0)


EP_REGISTRY = Registry.load(find_registry("ep_intranode")).to_json()
SELFTEST_REGISTRY = Registry.load(find_registry("selftest")).to_json()
