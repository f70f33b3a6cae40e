"""path_verdict's vectorised pieces of `crossings` against the per-row arithmetic they replaced
(a pandas filter per crossing; ~1 s at 1.7 k crossings on a 10 M-event run): random rendezvous,
iteration starts and merged GPU intervals, ties and empty cases included."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from profiler.analysis import path_verdict as PV


def _gpu_time(iv, a, b):
    if iv is None or len(iv) == 0 or b <= a:
        return 0
    return int(np.clip(np.minimum(iv[:, 1], b) - np.maximum(iv[:, 0], a), 0, None).sum())


def _per_row_begin(allrv, tot, it, wb):
    before = allrv[(allrv["iteration"] == it) & (allrv["release_ns"] < wb)]
    ws = int(before["release_ns"].max()) if len(before) else int(tot.get(it, wb))
    return min(ws, wb)


@pytest.mark.parametrize("seed", range(6))
def test_stretch_begins_equal_the_per_row_rule(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 60))
    allrv = pd.DataFrame({"iteration": rng.integers(0, 4, n), "release_ns": rng.integers(0, 1000, n)})
    allrv = allrv.sort_values(["iteration", "release_ns"], kind="stable").reset_index(drop=True)
    # some iterations have no start (the rule falls back to the wait's begin), one starts late
    its = np.array([0, 1, 3])
    total = pd.DataFrame({"iteration": its, "begin_ns": rng.integers(-50, 1200, len(its))})
    q_it = rng.integers(0, 5, 80)
    q_wb = rng.integers(-10, 1100, 80)
    q_wb[:5] = allrv["release_ns"].to_numpy()[:5]   # a wait beginning exactly at a release: not before it
    q_it[:5] = allrv["iteration"].to_numpy()[:5]
    got = PV._stretch_begins(allrv, total, q_it.astype(np.int64), q_wb.astype(np.int64))
    tot = total.set_index("iteration")["begin_ns"]
    want = [_per_row_begin(allrv, tot, int(i), int(w)) for i, w in zip(q_it, q_wb)]
    assert got.tolist() == want


@pytest.mark.parametrize("seed", range(6))
def test_gpu_times_equal_the_interval_sum(seed):
    rng = np.random.default_rng(100 + seed)
    spans = pd.DataFrame({"rank": rng.integers(0, 3, 40), "b": rng.integers(0, 900, 40)})
    spans["e"] = spans["b"] + rng.integers(1, 120, 40)
    gpu = {}
    for r, s in spans.groupby("rank"):   # merged as _gpu_intervals merges them
        merged = []
        for b, e in sorted(zip(s["b"], s["e"])):
            if merged and b <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], e)
            else:
                merged.append([b, e])
        gpu[int(r)] = np.asarray(merged, np.int64).reshape(-1, 2)
    gpu[4] = np.zeros((0, 2), np.int64)
    ranks = rng.integers(0, 6, 200).astype(np.int64)   # rank 5: no intervals at all
    a = rng.integers(-50, 1100, 200).astype(np.int64)
    b = a + rng.integers(-30, 400, 200)
    got = PV._gpu_times(gpu, ranks, a, b)
    want = [_gpu_time(gpu.get(int(r)), int(x), int(y)) for r, x, y in zip(ranks, a, b)]
    assert got.tolist() == want
