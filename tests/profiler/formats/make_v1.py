"""The frozen format-1 samples: raw profile buffers as the version-1 recorder wrote them.

Run ONCE, at commit 89485aa (layout.toml version 1), before the format moved to version 2:

    python3 -m tests.profiler.formats.make_v1   # writes v1-*.bin and v1-expected.json here

The .bin files are the bytes of that code (bufbuild.build through the version-1 numpy dtypes),
and v1-expected.json is what the version-1 decoder (profiler.decode.decode at 89485aa) made of them.
Both are committed and never regenerated: tests/profiler/test_formats.py decodes the bytes with
today's decoder and holds the table to the frozen one and to the reference decoder. Rerunning
this file after the format change would write version-2 dtypes' bytes with a version-1 stamp,
which is exactly what the freeze is there to avoid; it refuses.
"""
from __future__ import annotations

import json
from pathlib import Path

from profiler.decode.decode import LaunchInfo, decode_launches
from profiler.generated import layout as L
from profiler.registry.registry import load_all

from ..bufbuild import A, B, D, E, I, Region, build

HERE = Path(__file__).parent
REG = load_all()["selftest"]
T0 = 1_764_000_000_000_000_000
ITER, WORK, IDLE, TICK = (REG.phase(n).id for n in ("iteration", "work", "idle", "tick"))
GRID = REG.barriers[0].id


def cases() -> dict[str, bytes]:
    # globaltimer records: nested spans, an instant, a barrier, drops, an aborted and an unused warp
    gt = [Region([(T0, B, ITER, 7), (T0 + 32, B, WORK, 3), (T0 + 96, E, WORK, 0), (T0 + 128, I, TICK, 1),
                  (T0 + 160, A, GRID, 0), (T0 + 192, D, GRID, 0), (T0 + 256, E, ITER, 0)], sm=17),
          Region([(T0 + 64, B, ITER, 0), (T0 + 64, B, IDLE, 0), (T0 + 160, E, IDLE, 0), (T0 + 170, A, GRID, 0),
                  (T0 + 192, D, GRID, 0), (T0 + 200, E, ITER, 0)], sm=5, attempted=11),
          Region([(T0 + 96, B, WORK, 2), (T0 + 320, I, TICK, 9)], state=L.REGION_STATE_STARTED, sm=40),
          Region(state=L.REGION_STATE_UNUSED)]
    # hires (flag HIRES): clock64 cycles per record, converted with each region's clock pair;
    # two SMs whose counters are 7.4 M cycles apart (measured-facts.md), 1.98 GHz
    hi = []
    for k, (sm, c0) in enumerate(((3, 9_000_000_000), (77, 9_007_400_000))):
        g0 = T0 + 1000 * k
        cyc = [0, 40, 130, 400, 990]
        recs = [(c0 + cyc[0], B, ITER, k), (c0 + cyc[1], B, WORK, 5), (c0 + cyc[2], E, WORK, 0),
                (c0 + cyc[3], I, TICK, 2), (c0 + cyc[4], E, ITER, 0)]
        hi.append(Region(recs, sm=sm, gt_start=g0, clk_start=c0, gt_end=g0 + 500, clk_end=c0 + 990))
    return {"v1-globaltimer": build(gt, registry_hash=REG.hash, capacity=8, warps_per_block=2, rank=0, launch_id=4,
                                    version=1),
            "v1-hires": build(hi, registry_hash=REG.hash, capacity=8, warps_per_block=1, rank=0, launch_id=5,
                              flags=L.FLAGS_HIRES, version=1)}


def expected(bufs: dict[str, bytes]) -> dict:
    out = {}
    for name, buf in bufs.items():
        d = decode_launches([(buf, LaunchInfo(0, 0, name, 0, "selftest"))], {"selftest": REG})
        ev = d.events
        out[name] = {"events": [{c: (v.item() if hasattr(v, "item") else v) for c, v in row.items()}
                                for row in ev.astype({c: str for c in ("kernel", "role", "phase", "kind")})
                                .to_dict("records")],
                     "launches": d.launches.to_dict("records"),
                     "warnings": {type(w).__name__: w.count for w in d.warnings}}
    return out


def main() -> None:
    if L.VERSION != 1:
        raise SystemExit("make_v1 writes the format-1 freeze and ran once at version 1; the layout is now "
                         f"version {L.VERSION}: the committed v1-*.bin are the samples")
    bufs = cases()
    for name, buf in bufs.items():
        (HERE / f"{name}.bin").write_bytes(buf)
    (HERE / "v1-expected.json").write_text(json.dumps(expected(bufs), indent=1, sort_keys=True, default=int) + "\n")


if __name__ == "__main__":
    main()
