"""Every buffer format the decoder reads: the frozen format-1 samples (tests/profiler/formats/,
written by the version-1 code) decode to what the version-1 decoder made of them and agree with
the reference decoder; format-2 buffers (clock64 records, anchors, the overflow sink) convert
piecewise between anchors and report SM clock changes."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from profiler import errors as E
from profiler.decode import ANCHOR_ERROR_NS, LaunchInfo, decode_buffer, decode_launches
from profiler.generated import layout as L
from profiler.registry import load_all

from .bufbuild import B, E as END, I, Region, anchor, build
from .differential import check

HERE = Path(__file__).parent / "formats"
REG = load_all()["selftest"]
ITER, WORK, TICK = (REG.phase(n).id for n in ("iteration", "work", "tick"))
T0 = 1_764_000_000_000_000_000
C0 = 9_000_000_000  # a plausible clock64 value
NS_PER_CYCLE = 1 / 1.98


def _table(d) -> list[dict]:
    ev = d.events.astype({c: str for c in ("kernel", "role", "phase", "kind")})
    return [{c: (v.item() if hasattr(v, "item") else v) for c, v in row.items()} for row in ev.to_dict("records")]


@pytest.mark.parametrize("name", ["v1-globaltimer", "v1-hires"])
def test_format_1_samples_decode_as_the_version_1_decoder_did(name):
    want = json.loads((HERE / "v1-expected.json").read_text())[name]
    buf = (HERE / f"{name}.bin").read_bytes()
    assert int.from_bytes(buf[4:6], "little") == 1   # really a version-1 buffer
    d = decode_launches([(buf, LaunchInfo(0, 0, name, 0, "selftest"))], {"selftest": REG})
    assert _table(d) == want["events"]
    assert d.launches.to_dict("records") == want["launches"]
    assert {type(w).__name__: w.count for w in d.warnings} == want["warnings"]
    check([(buf, LaunchInfo(0, 0, name, 0, "selftest"))])   # and the reference decoder agrees


def _v2(regions, cap=16, **kw) -> bytes:
    return build(regions, registry_hash=REG.hash, capacity=cap, warps_per_block=1, version=2, **kw)


def _region(cycles, ghz=1.98, anchors=(), c0=C0, g0=T0, span=2000, **kw):
    """A format-2 region: records at `cycles` after c0, anchors at the given cycle offsets, the
    finish pair `span` cycles in; times follow `ghz` (a callable: ns at a cycle offset, for a
    clock that changes)."""
    ns = ghz if callable(ghz) else (lambda c: c / ghz)
    recs = [(c0 + c, B if k % 2 == 0 else END, WORK, 0) for k, c in enumerate(cycles)]
    recs += [anchor(g0 + int(ns(c)), c0 + c) for c in anchors]
    recs.sort(key=lambda r: r[0] if r[1] != L.KIND_ANCHOR else (r[3] | r[2] << 32))
    return Region(recs, gt_start=g0, clk_start=c0, gt_end=g0 + int(ns(span)), clk_end=c0 + span, **kw)


def test_format_2_records_are_cycles_converted_between_the_anchors():
    r = _region([0, 198, 990, 1980], anchors=[1000])
    d = decode_buffer(_v2([r]), LaunchInfo(0, 0, "k", 0, "selftest"), REG)
    assert d.warnings == []
    ev = d.events.sort_values("begin_ns")
    # the table starts at the earliest time (T0): begin 0 ns, END at 100 ns; 500 -> 1000 ns
    assert ev["begin_ns"].tolist() == [0, 500] and ev["end_ns"].tolist() == [100, 1000]
    check([(_v2([r]), LaunchInfo(0, 0, "k", 0, "selftest"))])


def test_format_2_overflow_sink_drops_the_overwritten_last_slot():
    recs = [(C0 + 10 * k, I, TICK, k) for k in range(4)]
    r = Region(recs, attempted=9, gt_start=T0, clk_start=C0, gt_end=T0 + 100, clk_end=C0 + 198)
    d = decode_buffer(_v2([r], cap=4), LaunchInfo(0, 0, "k", 0, "selftest"), REG)
    # 9 attempted into 4 slots: records 0..2 kept, slot 3 held whatever came last -> 6 dropped
    assert d.events["payload"].tolist() == [0, 1, 2]
    assert d.launch["dropped"] == 6
    assert [type(w) for w in d.warnings] == [E.DroppedRecords]


def test_a_clock_change_inside_a_region_is_reported_and_converted_piecewise():
    # 1.98 GHz for the first 1000 cycles, then 1.2 GHz: anchors at 1000 and 3000
    def ns(c):
        return c / 1.98 if c <= 1000 else 1000 / 1.98 + (c - 1000) / 1.2
    r = _region([500, 2000], ghz=ns, anchors=[1000, 3000], span=4000)
    d = decode_buffer(_v2([r]), LaunchInfo(0, 0, "k", 0, "selftest"), REG)
    assert [type(w) for w in d.warnings] == [E.ClockChange]
    ev = d.events
    # END at 2000 cycles lies after the change: 1000 / 1.98 + 1000 / 1.2 = 1338 ns after T0,
    # not the 1010 ns one rate would give
    assert abs(int(ev["end_ns"].iloc[0]) - (int(ns(2000)) - int(ns(500)) + int(ev["begin_ns"].iloc[0]))) <= 2
    check([(_v2([r]), LaunchInfo(0, 0, "k", 0, "selftest"))])


def test_a_region_running_at_another_rate_than_the_launch_is_a_clock_change():
    same = [_region([0, 1000], c0=C0 + 10**6 * k, span=200_000) for k in range(4)]
    slow = _region([0, 1000], ghz=1.5, c0=C0 + 5 * 10**6, span=200_000)
    d = decode_buffer(_v2(same + [slow]), LaunchInfo(0, 0, "k", 0, "selftest"), REG)
    assert [(type(w), w.count) for w in d.warnings] == [(E.ClockChange, 1)]
    d = decode_buffer(_v2(same), LaunchInfo(0, 0, "k", 0, "selftest"), REG)
    assert d.warnings == []


def test_quantised_anchors_are_not_a_clock_change():
    # every globaltimer value floored to 32 ns, anchors 3 us apart: rates differ by < 2 %, within bounds
    def ns(c):
        return (c / 1.98) // 32 * 32
    r = _region(list(range(0, 60_000, 6000)), ghz=ns, anchors=list(range(6000, 60_000, 6000)), span=60_000)
    d = decode_buffer(_v2([r], cap=32), LaunchInfo(0, 0, "k", 0, "selftest"), REG)
    assert d.warnings == []
    assert ANCHOR_ERROR_NS <= 64


def test_bad_anchors_are_ignored_with_a_warning():
    r = _region([0, 1000], anchors=[500])
    r.records.append(anchor(T0 - 10**6, C0 + 1500))     # behind the previous point in globaltimer
    d = decode_buffer(_v2([r]), LaunchInfo(0, 0, "k", 0, "selftest"), REG)
    assert [(type(w), w.count) for w in d.warnings] == [(E.BadAnchors, 1)]
    check([(_v2([r]), LaunchInfo(0, 0, "k", 0, "selftest"))])


def test_format_1_buffers_still_build_and_decode_beside_format_2():
    v1 = build([Region([(T0, B, ITER, 1), (T0 + 64, END, ITER, 0)])], registry_hash=REG.hash, capacity=4)
    v2 = _v2([_region([0, 1980])])
    d = decode_launches([(v1, LaunchInfo(0, 0, "a", 0, "selftest")), (v2, LaunchInfo(0, 1, "b", 0, "selftest"))],
                        {"selftest": REG})
    assert d.warnings == [] and len(d.events) == 2
    assert sorted((d.events["end_ns"] - d.events["begin_ns"]).tolist()) == [64, 1000]
