"""The frozen format-2 samples: raw profile buffers as the version-2 recorder wrote them.

Run ONCE, at commit b89e61b (layout.toml version 2), before the format moved to version 3:

    python3 -m tests.profiler.formats.make_v2   # writes v2-*.bin and v2-expected.json here

The .bin files are the bytes of that code (bufbuild.build through the version-2 numpy dtypes:
16-byte records of clock64 cycles, ANCHOR records, the overflow sink), and v2-expected.json is
what the version-2 decoder (profiler.decode.decode at b89e61b) made of them. Both are committed and never
regenerated: tests/profiler/test_formats.py decodes the bytes with today's decoder and holds the
table to the frozen one and to the reference decoder. After the format change this file refuses
to run (it would write version-3 dtypes' bytes with a version-2 stamp).
"""
from __future__ import annotations

import json
from pathlib import Path

from profiler.generated import layout as L
from profiler.registry.registry import load_all

from ..bufbuild import A, B, D, E, I, Region, anchor, build
from .make_v1 import expected

HERE = Path(__file__).parent
REG = load_all()["selftest"]
T0 = 1_764_000_000_000_000_000
ITER, WORK, IDLE, TICK = (REG.phase(n).id for n in ("iteration", "work", "idle", "tick"))
GRID = REG.barriers[0].id


def cases() -> dict[str, bytes]:
    # two SMs 7.4 M cycles apart at 1.98 GHz: nested spans, an instant, a barrier with occurrence 70000
    # (a payload wider than 16 bits), an anchor mid-region, an overflowing region (the sink), an aborted
    # region, an unused one
    regs = []
    for k, (sm, c0) in enumerate(((3, 9_000_000_000), (77, 9_007_400_000))):
        g0 = T0 + 1000 * k
        cyc = [0, 40, 130, 400, 500, 600, 990]
        recs = [(c0 + cyc[0], B, ITER, k), (c0 + cyc[1], B, WORK, 5), (c0 + cyc[2], E, WORK, 0),
                (c0 + cyc[3], I, TICK, 2), anchor(g0 + 227, c0 + 450), (c0 + cyc[4], A, GRID, 70000),
                (c0 + cyc[5], D, GRID, 70000), (c0 + cyc[6], E, ITER, 0)]
        regs.append(Region(recs, sm=sm, gt_start=g0, clk_start=c0, gt_end=g0 + 500, clk_end=c0 + 990))
    c0 = 9_003_000_000
    regs.append(Region([(c0 + 10 * j, I, TICK, j) for j in range(8)], sm=9, attempted=13, gt_start=T0 + 50,
                       clk_start=c0, gt_end=T0 + 150, clk_end=c0 + 198))
    regs.append(Region([(c0 + 5, B, IDLE, 0), (c0 + 90, I, TICK, 4)], state=L.REGION_STATE_STARTED, sm=40,
                       gt_start=T0 + 60, clk_start=c0))
    regs.append(Region(state=L.REGION_STATE_UNUSED))
    return {"v2-cycles": build(regs, registry_hash=REG.hash, capacity=8, warps_per_block=1, rank=0, launch_id=6,
                               flags=L.FLAGS_HIRES, version=2)}


def main() -> None:
    if L.VERSION != 2:
        raise SystemExit("make_v2 writes the format-2 freeze and ran once at version 2; the layout is now "
                         f"version {L.VERSION}: the committed v2-*.bin are the samples")
    bufs = cases()
    for name, buf in bufs.items():
        (HERE / f"{name}.bin").write_bytes(buf)
    (HERE / "v2-expected.json").write_text(json.dumps(expected(bufs), indent=1, sort_keys=True, default=int) + "\n")


if __name__ == "__main__":
    main()
