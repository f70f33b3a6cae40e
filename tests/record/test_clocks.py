"""Host-side helpers of the clock pairing (the kernels themselves run in tests/gpu)."""
from __future__ import annotations

from profiler.record.clocks import filter_pairs


def test_filter_pairs_drops_wide_pairs():
    pairs = [(0, 5, 10), (100, 106, 112), (200, 250, 300), (400, 404, 409)]
    assert filter_pairs(pairs) == [(0, 5, 10), (100, 106, 112), (400, 404, 409)]
    assert filter_pairs([]) == []
    assert filter_pairs([(0, 0, 0), (5, 5, 5)]) == [(0, 0, 0), (5, 5, 5)]  # zero width keeps itself
