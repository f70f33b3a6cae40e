"""Cached dispatch and combine captured in a CUDA graph and replayed, with and without recording
on (issue 9); the checks live in tests/gpu/ep_graph_checks.py."""
import pytest

from ep_core.launch import run_ranks
from tests.gpu import ep_graph_checks

pytestmark = [pytest.mark.gpu, pytest.mark.multigpu]


def test_graph_replays_match_the_reference_with_and_without_recording(tmp_path):
    out = run_ranks(ep_graph_checks.run_graphs, 2, str(tmp_path), timeout_s=600)
    r0 = out[0]
    # rank 0's saved run: the captured barrier / dispatch / combine launches hold the last replay's records
    assert r0["graph_kernels"] == ["barrier", "combine", "dispatch"], r0
    assert r0["graph_spans"] > 0 and r0["dropped"] == 0, r0
    # 33 eager profiled steps in a block that reserved its calls: no slab made after the first step,
    # and all 4 launches of every step (barrier, dispatch, barrier, combine) on rank 0 hold records
    assert all(r["slabs_made_in_calls"] == 0 for r in out), out
    assert r0["eager_launches"] == 4 * 33 and r0["eager_launches_recorded"] == 4 * 33, r0
