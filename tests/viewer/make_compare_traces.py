"""Write the synthetic A/A and A/B groups under traces/synthetic-compare/
(python -m tests.viewer.make_compare_traces).

Until the ground-truth catalogue's A/A and A/B recordings are bundled, the Compare page's browser
test and the verdict test (tests/analysis/test_verdicts.py) use these. The run is the unit of
replication, so each side has three runs (simulated with their own seeds, as recordings differ):
* `same-code-a1..3` vs `same-code-b1..3`: the same simulated code (ab scenario, variant a):
  Compare must say "within noise";
* `knob-a1..3` vs `knob-b1..3`: variant a against variant b, whose dispatch send_chunk copies
  1.6x slower: Compare must find dispatch/send_chunk slower.
Each manifest carries its `expect` block (profiler.groundtruth.expect: cause none, and its place in the
comparison); workload.kind = synthetic.
"""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

from profiler.groundtruth.expect import Cause, ComparisonExpect, Direction, Expect
from profiler.store.runstore import write_run
from profiler.groundtruth.synthetic import make_events

ROOT = Path(__file__).resolve().parents[2] / "traces" / "synthetic-compare"
# 8 iterations a run: samples are per (run, iteration), three runs a side
COMMON = dict(ranks=2, events=12_000, scenario="ab", iterations=8, blocks=16)
PLANTER = "python -m tests.viewer.make_compare_traces"


def _runs():
    same = dict(group="synthetic-same-code", outcome=Cause.SAME_CODE)
    knob = dict(group="synthetic-send-chunk", outcome=Cause.KNOB_CHANGE, knob="ab_factor", kernel="dispatch",
                phase="send_chunk", direction=Direction.SLOWER)
    for i in range(3):
        yield f"same-code-a{i + 1}", dict(variant="a", seed=11 + i), ComparisonExpect(side="A", replicate=i, **same)
        yield f"same-code-b{i + 1}", dict(variant="a", seed=14 + i), ComparisonExpect(side="B", replicate=i, **same)
        yield f"knob-a{i + 1}", dict(variant="a", seed=21 + i), ComparisonExpect(side="A", replicate=i, value=1.0, **knob)
        yield f"knob-b{i + 1}", dict(variant="b", seed=24 + i, ab_factor=1.6), \
            ComparisonExpect(side="B", replicate=i, value=1.6, **knob)


def main(root: Path = ROOT) -> None:
    if root.exists():
        shutil.rmtree(root)
    for name, kw, cmp in _runs():
        ev, launches, manifest = make_events(**COMMON, **kw)
        manifest["name"] = name
        manifest["expect"] = Expect(cause=Cause.NONE, comparison=cmp, planted_by=PLANTER,
                                    note="synthetic: profiler.groundtruth.synthetic ab scenario").to_json()
        print(write_run(root / name, ev, launches, manifest, perfetto=False))


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT)
