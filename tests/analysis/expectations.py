"""Ground truth of bundled runs recorded before manifests carried an `expect` block.

The verdict test (test_verdicts.py) reads a run's planted cause from its manifest
(profiler.expect.from_manifest); these runs predate that, so their truth is written here, keyed by
manifest name, each with where it comes from. A run whose manifest has an expect block never uses
this table, and a name whose run is not in the checkout is simply not collected (the catalogue
recorded for issue 8 replaces the ep-* / epscope-trace-* runs).

What was planted and what the recording shows are not always the same; each entry states the
cause the recording carries, checked against its raw rows (host begin times, barrier arrivals),
not against any analysis' output:

* ep-2rank-skewed-routing: the planted hot experts on rank 0 add only 9% to rank 0's copy_out
  busy time (2 ranks, top-8 of 256: almost every token goes to both ranks), far below anything
  the others wait on. What holds the run up is rank 1's host: it enters notify 0.20-0.39 ms after
  rank 0's in every iteration (launches.host_begin_ns), and rank 0's notify waits that long at
  rank_start (rank 0's notify kernel lasts 335 µs against rank 1's 13 µs).
* epscope-trace-2rank-balanced / -skewed: in the first profiled iteration (4) rank 0's host
  enters the op ~92 ms after rank 1's (a one-time extension load on rank 0, ep_core/trace.py
  now lines the ranks up before profiling); rank 1 waits at notify's rank_start for it.
"""
from __future__ import annotations

from profiler.expect import Cause, Expect

BUNDLED = {
    "ep-2rank-balanced-dispatch-combine": Expect(
        cause=Cause.NONE, planted_by="traces/README.md: uniform routing, nothing planted"),
    "ep-2rank-forced-timeout": Expect(
        cause=Cause.TIMEOUT, rank=0, peer=1, kernel="dispatch", phase="wait_data",
        planted_by="traces/README.md: EPSCOPE_TEST_SKIP_SEND_RANK=1, 1 s bound"),
    "epscope-trace-2rank-forced-timeout": Expect(
        cause=Cause.TIMEOUT, rank=0, peer=1, kernel="dispatch", phase="wait_data",
        planted_by="traces/README.md: epscope trace --force-timeout-rank 1 --timeout-s 1"),
    "ep-2rank-skewed-routing": Expect(
        cause=Cause.HOST_BOUND, rank=1, kernel="notify",
        planted_by="observed in the recording (module docstring); planted: skewed routing, hot experts on rank 0"),
    "epscope-trace-2rank-balanced": Expect(
        cause=Cause.HOST_BOUND, rank=0, kernel="notify",
        planted_by="observed in the recording: rank 0's host 92 ms late in iteration 4 (module docstring)"),
    "epscope-trace-2rank-skewed": Expect(
        cause=Cause.HOST_BOUND, rank=0, kernel="notify",
        planted_by="issue 8 / traces/README.md: iteration 4, rank 0's host entered the op late"),
    "selftest-grid-barrier": Expect(
        cause=Cause.BARRIER_STRAGGLER, rank=0, kernel="selftest.grid_barrier", phase="grid",
        planted_by="traces/README.md: warp 2 of block 7 works 10,000 extra FMAs"),
    "selftest-starved-warps": Expect(
        cause=Cause.STARVED_WARPS, rank=0, kernel="selftest.imbalance",
        planted_by="traces/README.md: only warp 0 of blocks 0-15 works"),
    "selftest-timer-resolution": Expect(
        cause=Cause.NONE, planted_by="traces/README.md: timer probe, nothing planted"),
}
