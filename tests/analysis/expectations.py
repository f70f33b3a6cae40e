"""Ground truth of bundled runs recorded before manifests carried an `expect` block: the recorder
self-tests (traces/README.md says what each plants).

The verdict test (test_verdicts.py) reads a run's planted cause from its manifest
(profiler.groundtruth.expect.from_manifest); these runs predate that, so their truth is written here, keyed by
manifest name. A run whose manifest has an expect block never uses this table, and every name
here is a run bundled under traces/ (test_every_annotated_run_is_bundled).
"""
from __future__ import annotations

from profiler.groundtruth.expect import Cause, Expect

BUNDLED = {
    "selftest-grid-barrier": Expect(
        cause=Cause.BARRIER_STRAGGLER, rank=0, kernel="selftest.grid_barrier", phase="grid",
        planted_by="traces/README.md: warp 2 of block 7 works 10,000 extra FMAs"),
    "selftest-starved-warps": Expect(
        cause=Cause.STARVED_WARPS, rank=0, kernel="selftest.imbalance",
        planted_by="traces/README.md: only warp 0 of blocks 0-15 works"),
    "selftest-timer-resolution": Expect(
        cause=Cause.NONE, planted_by="traces/README.md: timer probe, nothing planted"),
}
