"""Hand-made event tables for the analysis tests: one tuple per row, schema dtypes applied."""
from __future__ import annotations

import pandas as pd

from profiler.registry.registry import Registry, load_family
from profiler.store.schema import coerce_events

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


EP_REGISTRY = load_family("ep_intranode").to_json()
SELFTEST_REGISTRY = load_family("selftest").to_json()

# The phases the hand-made tables below use, with their semantics declared (the analyses read
# semantics from a registry only): a ring-buffer variant of the EP kernels (wait_space released by
# the receiver's publish_head) and one barrier of each scope.
TEST_REGISTRY = Registry.from_dict({
    "family": "test_ep", "version": 1, "roles": [],
    "phases": [
        {"name": "notify", "id": 1}, {"name": "send_chunk", "id": 2},
        {"name": "wait_space", "id": 3, "wait": True, "waits_for": "publish_head"},
        {"name": "publish_tail", "id": 4, "kind": "instant"},
        {"name": "wait_data", "id": 5, "wait": True, "waits_for": "publish_tail"},
        {"name": "copy_out", "id": 6}, {"name": "publish_head", "id": 7, "kind": "instant"},
        {"name": "reduce", "id": 8},
        {"name": "idle", "id": 9, "idle": True},
    ],
    "barriers": [{"name": "rank_start", "id": 1, "scope": "rank"}, {"name": "rank_layout", "id": 2, "scope": "rank"},
                 {"name": "grid", "id": 3, "scope": "grid"}, {"name": "block_sync", "id": 4, "scope": "block"}],
}).to_json()
