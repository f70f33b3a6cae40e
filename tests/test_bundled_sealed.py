"""Every bundled run is sealed and verifies whole (issue 34: `epscope check traces` said "no
checksums: contents not verified" for all 77 showcase runs, the ones the integrity work did not
cover): its manifest's seal, the data files' checksums, every field and row, and its stored
analyses, as `epscope check` checks them."""
from __future__ import annotations

from pathlib import Path

from profiler.analysis import stored
from profiler.store.runreader import check_run

TRACES = Path(__file__).resolve().parents[1] / "traces"


def test_every_bundled_run_is_sealed_and_verified():
    runs = sorted(p.parent for p in TRACES.rglob("manifest.json"))
    assert len(runs) >= 77
    bad = {}
    for r in runs:
        c = check_run(r, deep=True)
        if c.damaged or c.note:
            bad[r.name] = c.problem if c.damaged else c.note
        elif stored.verify(r):
            bad[r.name] = stored.verify(r)
    assert not bad, bad
