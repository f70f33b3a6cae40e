"""Write the decoder fuzz corpus: minimal buffers for each failure issue 13 listed (found by
mutating valid buffers), checked by tests/profiler/test_decode_fuzz.py against the reference.

    python3 -m tests.profiler.corpus.make_corpus      # rewrites tests/profiler/corpus/*.bin

Each buffer is decoded with the selftest registry; the file name says what it holds.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from profiler.generated import layout as L
from profiler.registry.registry import load_all

from ..bufbuild import B, E, I, Region, build

HERE = Path(__file__).parent
REG = load_all()["selftest"]
T0 = 1_764_000_000_000_000_000
ITER, WORK, TICK = (REG.phase(n).id for n in ("iteration", "work", "tick"))


def _set_header(buf: bytes, field: str, value: int) -> bytes:
    h = np.frombuffer(buf, L.BUFFERHEADER_DTYPE, count=1).copy()
    h[field] = value
    return h.tobytes() + buf[L.BUFFERHEADER_SIZE:]


def cases() -> dict[str, bytes]:
    good = [Region([(T0, B, ITER, 1), (T0 + 32, B, WORK, 2), (T0 + 96, E, WORK, 0), (T0 + 128, E, ITER, 0)], sm=3),
            Region([(T0 + 64, B, WORK, 5), (T0 + 160, E, WORK, 0)], sm=4)]
    out = {}
    # a BEGIN's time >= 2^63 (a flipped top byte): wrapped to a negative int64 in the time shift
    top = [Region([(T0 | (0x67 << 56), B, WORK, 1), (100, E, WORK, 0), (T0 + 32, I, TICK, 0)], gt_start=T0, gt_end=T0 + 64),
           good[1]]
    out["timestamp-above-int64-max"] = build(top, registry_hash=REG.hash, capacity=4, warps_per_block=2)
    # every record of region 0 has an invalid kind: its first/last time (0) entered the launch's bounds
    out["region-all-invalid-kinds"] = build(
        [Region([(T0, 9, WORK, 0), (T0 + 32, 200, WORK, 0)], gt_start=T0, gt_end=T0 + 64), good[1]],
        registry_hash=REG.hash, capacity=4, warps_per_block=2)
    # an aborted warp (STARTED) whose first record is empty: its last time 0 became the launch's end
    out["aborted-region-no-records"] = build(
        [Region([], state=L.REGION_STATE_STARTED, gt_start=T0), Region([], state=L.REGION_STATE_STARTED, gt_start=T0 + 32)],
        registry_hash=REG.hash, capacity=4, warps_per_block=2)
    # warps_per_block >= 2^31: OverflowError casting the warp index
    out["warps-per-block-2pow31"] = _set_header(build(good, registry_hash=REG.hash, capacity=4, warps_per_block=2),
                                              "warps_per_block", 1 << 31)
    # a high-resolution region whose clock pair says 2^40 ns per cycle: cast warnings, garbage times
    hires = [Region([(1000 + 10, B, WORK, 0), (1000 + 20, E, WORK, 0)], gt_start=T0, gt_end=T0 + (1 << 40),
                    clk_start=1000, clk_end=1001),
             Region([(5000 + 100, B, WORK, 0), (5000 + 300, E, WORK, 0)], gt_start=T0, gt_end=T0 + 2000,
                    clk_start=5000, clk_end=9000)]
    out["hires-extreme-clock-pair"] = build(hires, registry_hash=REG.hash, capacity=4, warps_per_block=2,
                                            flags=L.FLAGS_HIRES)
    return out


def main() -> None:
    for name, buf in cases().items():
        (HERE / f"{name}.bin").write_bytes(buf)
        print(f"wrote {name}.bin ({len(buf)} bytes)")


if __name__ == "__main__":
    main()
