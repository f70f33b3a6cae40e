"""Every buffer format the decoder reads: the frozen format-1 and format-2 samples
(tests/profiler/formats/, written by the version-1 and version-2 code) decode to what those
decoders made of them and agree with the reference decoder; format-2 buffers (clock64 records,
anchors, the overflow sink) convert piecewise between anchors and report SM clock changes;
format-3 buffers (8-byte records: 32 clock bits completed from the record before, PAYLOAD and
two-slot anchors) decode to the table format 2 gives for the same records."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from profiler import errors as E
from profiler.decode.decode import ANCHOR_ERROR_NS, LaunchInfo, decode_buffer, decode_launches
from profiler.generated import layout as L
from profiler.registry.registry import Registry, load_all

from .bufbuild import A, B, D, E as END, I, Region, anchor, build, meta3
from .differential import check

HERE = Path(__file__).parent / "formats"
REG = load_all()["selftest"]
# The selftest registry the frozen samples were recorded with (before its grid barrier declared a
# 32-bit payload): a run carries its registry in its manifest, the samples carry it here.
FROZEN_REG = Registry.from_dict(json.loads((HERE / "selftest-registry.json").read_text()))
ITER, WORK, TICK = (REG.phase(n).id for n in ("iteration", "work", "tick"))
T0 = 1_764_000_000_000_000_000
C0 = 9_000_000_000  # a plausible clock64 value
NS_PER_CYCLE = 1 / 1.98


def _table(d) -> list[dict]:
    ev = d.events.astype({c: str for c in ("kernel", "role", "phase", "kind")})
    return [{c: (v.item() if hasattr(v, "item") else v) for c, v in row.items()} for row in ev.to_dict("records")]


@pytest.mark.parametrize("name", ["v1-globaltimer", "v1-hires", "v2-cycles"])
def test_frozen_samples_decode_as_their_version_decoder_did(name):
    version = int(name[1])
    want = json.loads((HERE / f"v{version}-expected.json").read_text())[name]
    buf = (HERE / f"{name}.bin").read_bytes()
    assert int.from_bytes(buf[4:6], "little") == version   # really a buffer of that version
    d = decode_launches([(buf, LaunchInfo(0, 0, name, 0, "selftest"))], {"selftest": FROZEN_REG})
    assert _table(d) == want["events"]
    assert d.launches.to_dict("records") == want["launches"]
    assert {type(w).__name__: w.count for w in d.warnings} == want["warnings"]
    check([(buf, LaunchInfo(0, 0, name, 0, "selftest"))], {"selftest": FROZEN_REG})   # and the reference agrees


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


# -- format 3 ----------------------------------------------------------------------------------
GRID = REG.barriers[0].id


def _v3(regions, cap=16, **kw) -> bytes:
    return build(regions, registry_hash=REG.hash, capacity=cap, warps_per_block=1, version=3, **kw)


def _both(regions, cap=16):
    """The same regions as a format-2 and a format-3 buffer."""
    return _v2(regions, cap), _v3(regions, cap)


def _decode(buf):
    return decode_buffer(buf, LaunchInfo(0, 0, "k", 0, "selftest"), REG)


def _nested(c0=C0, g0=T0, span=2000, **kw):
    recs = [(c0, B, ITER, 3), (c0 + 40, B, WORK, 5), (c0 + 130, END, WORK, 0), (c0 + 400, I, TICK, 2),
            (c0 + 500, A, GRID, 70000), (c0 + 600, D, GRID, 70000), (c0 + 990, END, ITER, 0)]
    return Region(recs, gt_start=g0, clk_start=c0, gt_end=g0 + int(span / 1.98), clk_end=c0 + span, **kw)


def test_format_3_decodes_to_the_table_format_2_gives():
    regions = [_nested(sm=3), _nested(c0=C0 + 7_400_000, g0=T0 + 1000, sm=77),
               Region([(C0 + 5, B, ITER, 0), (C0 + 90, I, TICK, 4)], state=L.REGION_STATE_STARTED, gt_start=T0,
                      clk_start=C0)]
    v2, v3 = _both(regions)
    d2, d3 = _decode(v2), _decode(v3)
    assert _table(d3) == _table(d2) and len(d3.events) == 12
    assert d3.events.query("phase == 'grid'")["payload"].tolist() == [70000] * 4   # the PAYLOAD slots
    assert [type(w) for w in d3.warnings] == [type(w) for w in d2.warnings]
    assert len(v3) - 64 == (len(v2) - 64 - 3 * 64) // 2 + 3 * 64   # half the bytes a record
    check([(v3, LaunchInfo(0, 0, "k", 0, "selftest"))])


def test_format_3_completes_32_bit_clocks_across_wraps():
    # a region of 5 * 2^31 cycles (5.4 s at 1.98 GHz): each record 2^31 cycles after the one before
    step = 1 << 31
    recs = [(C0 + k * step, I, TICK, k) for k in range(6)]
    r = Region(recs, gt_start=T0, clk_start=C0, gt_end=T0 + int(5 * step / 1.98), clk_end=C0 + 5 * step + 10)
    d = _decode(_v3([r]))
    assert d.warnings == []
    assert d.events["begin_ns"].tolist() == [round(k * step * (5 * step // 1.98) / (5 * step + 10)) for k in range(6)]
    check([(_v3([r]), LaunchInfo(0, 0, "k", 0, "selftest"))])


def test_a_gap_of_more_than_2_32_cycles_is_reported_unless_anchors_close_it():
    far = 3 << 31   # 6.4 G cycles: 1.5 wraps
    recs = [(C0, B, ITER, 0), (C0 + far, END, ITER, 0)]
    r = Region(recs, gt_start=T0, clk_start=C0, gt_end=T0 + int((far + 99) / 1.98), clk_end=C0 + far + 99)
    d = _decode(_v3([r]))
    assert [(type(w), w.count) for w in d.warnings] == [(E.AmbiguousClock, 1)]   # END placed a wrap early
    # anchors on both sides of the long gap pin every record (the BEGIN before it, the END after it)
    with_anchor = Region(recs[:1] + [anchor(T0 + 5, C0 + 10), anchor(T0 + int((far - 10) / 1.98), C0 + far - 10)]
                         + recs[1:], gt_start=T0, clk_start=C0, gt_end=r.gt_end, clk_end=r.clk_end)
    d = _decode(_v3([with_anchor]))
    assert d.warnings == [] and int(d.events["end_ns"].iloc[0]) == int((far - 10) / 1.98) + 5
    check([(_v3([r]), LaunchInfo(0, 0, "k", 0, "selftest")), (_v3([with_anchor]), LaunchInfo(0, 1, "k", 0, "selftest"))])


def test_format_3_side_slots_saturation_and_orphans():
    recs = [(C0, I, TICK, 0xFFFF),                           # saturated by the recorder? (no PAYLOAD slot)
            (C0 + 10, I, TICK, 1 << 20),                     # a 32-bit payload: record + PAYLOAD slot
            (7, meta3(L.KIND_PAYLOAD, ITER)),                # a PAYLOAD of another id: corrupt
            (C0 & 0xFFFF_FFFF, meta3(L.KIND_ANCHOR, 0)),     # an ANCHOR without its ANCHOR_NS: cannot anchor
            (C0 + 30, I, TICK, 3), (5, meta3(L.KIND_ANCHOR_NS, 0)), (0, meta3(11, 0))]
    r = Region(recs, gt_start=T0, clk_start=C0, gt_end=T0 + 1000, clk_end=C0 + 1980)
    d = _decode(_v3([r]))
    assert d.events["payload"].tolist() == [0xFFFF, 1 << 20, 3]
    assert {type(w).__name__: w.count for w in d.warnings} == {"PayloadSaturated": 1, "CorruptRecords": 3,
                                                              "BadAnchors": 1}
    check([(_v3([r]), LaunchInfo(0, 0, "k", 0, "selftest"))])


def test_a_format_3_record_past_its_finish_clock_is_a_bad_timestamp():
    recs = [(C0 + 10, I, TICK, 0), (C0 + 100, I, TICK, 1), (C0 + 3000, I, TICK, 2)]   # the finish is at 2000
    r = Region(recs, gt_start=T0, clk_start=C0, gt_end=T0 + 1010, clk_end=C0 + 2000)
    d = _decode(_v3([r]))
    assert d.events["payload"].tolist() == [0, 1]
    assert [(type(w), w.count) for w in d.warnings] == [(E.BadTimestamps, 1)]
    check([(_v3([r]), LaunchInfo(0, 0, "k", 0, "selftest"))])


def test_format_3_overflow_sink_counts_slots():
    recs = [(C0 + 10 * k, I, TICK, k) for k in range(4)]
    r = Region(recs, attempted=9, gt_start=T0, clk_start=C0, gt_end=T0 + 100, clk_end=C0 + 198)
    d = _decode(_v3([r], cap=4))
    assert d.events["payload"].tolist() == [0, 1, 2] and d.launch["dropped"] == 6
    check([(_v3([r], cap=4), LaunchInfo(0, 0, "k", 0, "selftest"))])
