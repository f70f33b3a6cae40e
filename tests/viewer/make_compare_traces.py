"""Write the synthetic A/B pair under traces/synthetic-compare/ (python -m tests.viewer.make_compare_traces).

Until two real recordings of the same code and of a changed kernel are bundled, the Compare
page's browser test uses these: `same-code-a1` and `same-code-a2` are the same simulated code
with different noise seeds (Compare must say "within noise"); `slower-send-chunk-b` is the 'b'
variant of profiler.synthetic's ab scenario, whose dispatch send_chunk is 1.6x slower (Compare
must find a significant difference). Their manifests say workload.kind = synthetic.
"""
from __future__ import annotations

import sys
from pathlib import Path

from profiler.synthetic import make_run

ROOT = Path(__file__).resolve().parents[2] / "traces" / "synthetic-compare"
# 12 iterations: the comparison's samples are per iteration, and a bootstrap CI needs a dozen
COMMON = dict(ranks=2, events=24_000, scenario="ab", iterations=12, blocks=16, perfetto=False)
RUNS = {
    "same-code-a1": dict(variant="a", seed=11),
    "same-code-a2": dict(variant="a", seed=12),
    "slower-send-chunk-b": dict(variant="b", seed=13, ab_factor=1.6),
}


def main(root: Path = ROOT) -> None:
    for name, kw in RUNS.items():
        p = make_run(root / name, **COMMON, **kw)
        print(p)


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT)
