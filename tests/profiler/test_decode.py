"""profiler.decode.decode on hand-built buffers (built from the generated dtypes: tests/profiler/bufbuild.py)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from profiler import errors as E
from profiler.decode.align import ClockModel, HostClock, RankClock
from profiler.decode.decode import LaunchInfo, decode_buffer, decode_launches
from profiler.generated import layout as L
from profiler.registry.registry import load_all
from profiler.store.schema import validate_events

from tests.needs import needs_module

from .bufbuild import A, B, D, E as END, I, Region, build

REG = load_all()["selftest"]
EP = load_all()["ep_intranode"]
T0 = 1_764_000_000_000_000_000  # a plausible globaltimer value (ns since the epoch)
INFO = LaunchInfo(rank=1, launch=3, kernel="selftest.imbalance", iteration=2, family="selftest")
ITER, WORK, IDLE, TICK = (REG.phase(n).id for n in ("iteration", "work", "idle", "tick"))
GRID = REG.barriers[0].id


def dec(regions, cap=8, wpb=2, reg=REG, info=INFO, **kw):
    return decode_buffer(build(regions, registry_hash=reg.hash, capacity=cap, warps_per_block=wpb, **kw), info, reg)


def kinds(d):
    return [type(w) for w in d.warnings]


def test_good_buffer_spans_instants_barriers():
    r0 = Region([(T0, B, ITER, 7), (T0 + 32, B, WORK, 3), (T0 + 96, END, WORK, 0), (T0 + 128, I, TICK, 1),
                 (T0 + 160, A, GRID, 0), (T0 + 192, D, GRID, 0), (T0 + 256, END, ITER, 0)], sm=17)
    r1 = Region([(T0 + 64, B, ITER, 0), (T0 + 64, B, IDLE, 0), (T0 + 160, END, IDLE, 0),
                 (T0 + 170, A, GRID, 0), (T0 + 192, D, GRID, 0), (T0 + 200, END, ITER, 0)], sm=17)
    d = dec([r0, r1, Region(state=L.REGION_STATE_UNUSED)])
    ev = d.events
    validate_events(ev)
    assert d.warnings == []
    assert list(ev["phase"].astype(str)) == ["iteration", "work", "tick", "grid", "grid", "iteration", "idle", "grid", "grid"]
    assert list(ev["kind"].astype(str)) == ["span", "span", "instant", "arrive", "depart", "span", "span", "arrive", "depart"]
    assert ev["begin_ns"].tolist() == [0, 32, 128, 160, 192, 64, 64, 170, 192]
    assert ev["end_ns"].tolist() == [256, 96, 128, 160, 192, 200, 160, 170, 192]
    assert ev["payload"].tolist() == [7, 3, 1, 0, 0, 0, 0, 0, 0]
    assert ev["block"].tolist() == [0] * 9 and ev["warp"].tolist() == [0] * 5 + [1] * 4
    assert (ev["sm"] == 17).all() and (ev["rank"] == 1).all() and (ev["launch"] == 3).all()
    assert (ev["iteration"] == 2).all() and set(ev["kernel"].astype(str)) == {"selftest.imbalance"}
    assert set(ev["role"].astype(str)) == {"worker"}  # barrier events take the warp's role
    assert not ev["open"].any()
    la = d.launch
    assert (la["gpu_begin_ns"], la["gpu_end_ns"], la["regions"], la["dropped"]) == (0, 256, 2, 0)


def test_block_and_warp_come_from_region_index():
    regs = [Region([(T0 + i, B, WORK, i), (T0 + 100 + i, END, WORK, 0)]) for i in range(6)]
    ev = dec(regs, wpb=4).events
    assert ev["block"].tolist() == [0, 0, 0, 0, 1, 1]
    assert ev["warp"].tolist() == [0, 1, 2, 3, 0, 1]


def test_span_payload_falls_back_to_end_payload():
    ev = dec([Region([(T0, B, WORK, 0), (T0 + 32, END, WORK, 42), (T0 + 64, B, WORK, 5), (T0 + 96, END, WORK, 9)])]).events
    assert ev["payload"].tolist() == [42, 5]


def test_truncated_buffer_names_offsets():
    buf = build([Region([(T0, B, WORK, 0)])] * 3, registry_hash=REG.hash, capacity=4)
    need = L.BUFFERHEADER_SIZE + 3 * (L.REGIONHEADER_SIZE + 4 * L.RECORD_SIZE)
    assert len(buf) == need
    with pytest.raises(E.TruncatedBuffer) as e:
        decode_buffer(buf[:-5], INFO, REG)
    assert e.value.offset == need - 5
    assert str(need) in str(e.value) and str(need - 5) in str(e.value)
    with pytest.raises(E.TruncatedBuffer) as e:
        decode_buffer(buf[:10], INFO, REG)
    assert e.value.offset == 10


def test_bad_magic_newer_version_registry_mismatch():
    good = [Region([(T0, B, WORK, 0), (T0 + 1, END, WORK, 0)])]
    with pytest.raises(E.BadMagic) as e:
        decode_buffer(build(good, registry_hash=REG.hash, capacity=4, magic=0xDEADBEEF), INFO, REG)
    assert e.value.offset == 0 and "0xDEADBEEF" in str(e.value)
    with pytest.raises(E.UnsupportedVersion) as e:
        decode_buffer(build(good, registry_hash=REG.hash, capacity=4, version=L.VERSION + 1), INFO, REG)
    assert e.value.offset == L.BUFFERHEADER_DTYPE.fields["version"][1] and "newer" in str(e.value)
    with pytest.raises(E.RegistryMismatch) as e:
        decode_buffer(build(good, registry_hash=REG.hash, capacity=4), INFO, EP)
    assert e.value.offset == L.BUFFERHEADER_DTYPE.fields["registry_hash"][1]
    assert all(issubclass(c, E.DecodeError) for c in (E.BadMagic, E.UnsupportedVersion, E.RegistryMismatch, E.TruncatedBuffer))


def test_registry_as_manifest_dict_decodes():
    buf = build([Region([(T0, B, WORK, 0), (T0 + 32, END, WORK, 0)])], registry_hash=REG.hash, capacity=4)
    d = decode_buffer(buf, INFO, REG.to_json())
    assert d.events["phase"].astype(str).tolist() == ["work"]


def test_overflowed_regions_exact_drop_counts():
    # capacity 4; region 0 attempted 10 (6 dropped), region 1 attempted 4 (none), region 2 attempted 5 (1)
    r0 = Region([(T0, B, ITER, 0), (T0 + 32, B, WORK, 0), (T0 + 64, END, WORK, 0), (T0 + 96, B, WORK, 0)], attempted=10)
    r1 = Region([(T0, B, ITER, 0), (T0 + 32, END, ITER, 0), (T0 + 64, B, ITER, 0), (T0 + 96, END, ITER, 0)])
    r2 = Region([(T0, B, WORK, 0), (T0 + 32, END, WORK, 0), (T0 + 64, B, WORK, 0), (T0 + 96, END, WORK, 0)], attempted=5)
    d = dec([r0, r1, r2], cap=4, wpb=4)
    assert d.launch["dropped"] == 7
    drop = [w for w in d.warnings if isinstance(w, E.DroppedRecords)]
    assert len(drop) == 1 and drop[0].count == 7 and "2 of 3 regions" in drop[0].detail
    # region 0 lost its ENDs: two open spans ending at the warp's last timestamp
    ub = [w for w in d.warnings if isinstance(w, E.UnmatchedBegin)]
    assert ub[0].count == 2
    op = d.events[d.events["open"]]
    assert op["phase"].astype(str).tolist() == ["iteration", "work"]
    assert op["end_ns"].tolist() == [96, 96]


def test_unfinished_region_decodes_up_to_first_empty_record():
    r = Region([(T0, B, ITER, 0), (T0 + 32, B, WORK, 0), (T0 + 64, END, WORK, 0)], state=L.REGION_STATE_STARTED)
    done = Region([(T0, B, ITER, 0), (T0 + 640, END, ITER, 0)])
    d = dec([r, done], cap=8)
    assert E.UnfinishedRegion in kinds(d) and E.UnmatchedBegin in kinds(d)
    unf = next(w for w in d.warnings if isinstance(w, E.UnfinishedRegion))
    assert unf.count == 1
    ev = d.events
    assert ev["phase"].astype(str).tolist() == ["iteration", "work", "iteration"]
    assert ev["open"].tolist() == [True, False, False]
    assert ev["end_ns"].tolist()[0] == 64  # the aborted warp's last timestamp
    assert d.launch["gpu_end_ns"] == 640


def test_unfinished_region_full_without_empty_record():
    r = Region([(T0 + 32 * i, B if i % 2 == 0 else END, WORK, 0) for i in range(4)], state=L.REGION_STATE_STARTED)
    d = dec([r], cap=4)
    assert len(d.events) == 2 and not d.events["open"].any()


def test_unmatched_begin_and_end():
    r = Region([(T0, END, WORK, 0), (T0 + 32, B, ITER, 0), (T0 + 64, B, WORK, 0), (T0 + 96, END, WORK, 0),
                (T0 + 128, END, IDLE, 0), (T0 + 160, I, TICK, 0)])
    d = dec([r])
    ue = next(w for w in d.warnings if isinstance(w, E.UnmatchedEnd))
    ub = next(w for w in d.warnings if isinstance(w, E.UnmatchedBegin))
    assert (ue.count, ub.count) == (2, 1)
    ev = d.events
    assert ev["phase"].astype(str).tolist() == ["iteration", "work", "tick"]
    assert ev["open"].tolist() == [True, False, False]
    assert ev["end_ns"].tolist() == [160, 96, 160]
    validate_events(ev)


def test_kth_begin_matches_kth_end_within_region_and_phase():
    # two warps interleave the same phase; each span stays in its own region
    r0 = Region([(T0 + 0, B, WORK, 1), (T0 + 100, END, WORK, 0), (T0 + 200, B, WORK, 2), (T0 + 300, END, WORK, 0)])
    r1 = Region([(T0 + 50, B, WORK, 3), (T0 + 150, END, WORK, 0), (T0 + 250, B, WORK, 4), (T0 + 350, END, WORK, 0)])
    ev = dec([r0, r1]).events
    got = sorted(zip(ev["payload"], ev["begin_ns"], ev["end_ns"], ev["warp"]))
    assert got == [(1, 0, 100, 0), (2, 200, 300, 0), (3, 50, 150, 1), (4, 250, 350, 1)]


def test_unknown_ids_warn_and_get_placeholder_names():
    r = Region([(T0, B, 77, 0), (T0 + 32, END, 77, 0), (T0 + 64, A, 9, 1), (T0 + 96, I, 78, 0)])
    d = dec([r])
    w = next(w for w in d.warnings if isinstance(w, E.UnknownPhase))
    assert w.count == 3
    assert d.events["phase"].astype(str).tolist() == ["phase_77", "barrier_9", "phase_78"]


def test_corrupt_kinds_are_skipped_and_counted():
    r = Region([(T0, B, WORK, 0), (T0 + 10, 9, WORK, 0), (T0 + 32, END, WORK, 0)])
    d = dec([r])
    assert next(w for w in d.warnings if isinstance(w, E.CorruptRecords)).count == 1
    assert len(d.events) == 1 and d.events["end_ns"].iloc[0] == 32


def test_bad_region_state_is_a_decode_error_with_offset():
    buf = bytearray(build([Region([(T0, B, WORK, 0)]), Region([(T0, B, WORK, 0)])], registry_hash=REG.hash, capacity=2))
    stride = L.REGIONHEADER_SIZE + 2 * L.RECORD_SIZE
    off = L.BUFFERHEADER_SIZE + stride + L.REGIONHEADER_DTYPE.fields["state"][1]
    buf[off] = 7
    with pytest.raises(E.DecodeError) as e:
        decode_buffer(bytes(buf), INFO, REG)
    assert e.value.offset == off


def test_hires_converts_cycles_per_region():
    # region 0: 2 GHz clock on its SM (clock64 starts at 1e6), region 1: another SM, offset clock64
    gt = T0
    r0 = Region([(1_000_000 + 200, B, WORK, 0), (1_000_000 + 2200, END, WORK, 0)],
                gt_start=gt, gt_end=gt + 2000, clk_start=1_000_000, clk_end=1_004_000)
    r1 = Region([(9_000_000 + 100, B, WORK, 0), (9_000_000 + 300, END, WORK, 0)],
                gt_start=gt + 1000, gt_end=gt + 3000, clk_start=9_000_000, clk_end=9_004_000)
    d = dec([r0, r1], flags=L.FLAGS_HIRES)
    assert d.warnings == []
    assert d.events["begin_ns"].tolist() == [100, 1050]
    assert d.events["end_ns"].tolist() == [1100, 1150]


def test_hires_unfinished_region_falls_back_with_warning():
    r = Region([(500 + 1980, B, WORK, 0)], state=L.REGION_STATE_STARTED, gt_start=T0, clk_start=500)
    d = dec([r], flags=L.FLAGS_HIRES)
    assert E.ClockFallback in kinds(d)
    # 1980 cycles after the warp's start pair at the nominal 1.98 GHz = 1000 ns after gt_start
    assert d.events["begin_ns"].tolist() == [1000]
    assert d.launch["gpu_begin_ns"] == 0


def test_clock_model_maps_to_run_timeline_and_host_rows():
    r = Region([(T0 + 1000, B, WORK, 0), (T0 + 2000, END, WORK, 0)])
    buf = build([r], registry_hash=REG.hash, capacity=4)
    clock = ClockModel({1: RankClock(1, offset_ns=-500.0, drift_ppm=0.0, uncertainty_ns=40.0)}, t0_ns=T0,
                       host=HostClock(host_anchor=10_000, gpu_anchor=T0, slope=1.0, uncertainty_ns=1000.0, rank=1))
    info = LaunchInfo(1, 0, "selftest.x", 0, "selftest", host_begin_ns=10_100, host_end_ns=10_300)
    d = decode_buffer(buf, info, REG, clock)
    ev = d.events
    span = ev[ev["kind"] == "span"]
    assert span["begin_ns"].tolist() == [500] and span["end_ns"].tolist() == [1500]
    host = ev[ev["kind"] == "host"]
    assert len(host) == 1 and host["phase"].astype(str).iloc[0] == "selftest.x"
    assert host["role"].astype(str).iloc[0] == "host" and host["sm"].iloc[0] == -1
    assert (host["begin_ns"].iloc[0], host["end_ns"].iloc[0]) == (-400, -200)
    assert (d.launch["host_begin_ns"], d.launch["host_end_ns"]) == (-400, -200)
    validate_events(ev)


def test_decode_launches_aggregates_and_unions_categories():
    a = build([Region([(T0, B, WORK, 0), (T0 + 32, END, WORK, 0)], attempted=5)], registry_hash=REG.hash, capacity=2)
    b = build([Region([(T0 + 64, B, EP.phase("notify").id, 0), (T0 + 96, END, EP.phase("notify").id, 0)], attempted=4)],
              registry_hash=EP.hash, capacity=2)
    c = build([Region([(T0 + 128, B, WORK, 0), (T0 + 160, END, WORK, 0)], attempted=3)], registry_hash=REG.hash, capacity=2)
    d = decode_launches([(a, LaunchInfo(0, 0, "selftest.x", 0, "selftest")),
                         (b, LaunchInfo(1, 0, "notify", 0, "ep_intranode")),
                         (c, LaunchInfo(0, 1, "selftest.x", 1, "selftest"))],
                        {"selftest": REG, "ep_intranode": EP.to_json()})
    ev = d.events
    validate_events(ev)
    assert ev["phase"].astype(str).tolist() == ["work", "notify", "work"]
    assert ev["kernel"].astype(str).tolist() == ["selftest.x", "notify", "selftest.x"]
    assert ev["role"].astype(str).tolist() == ["worker", "notify", "worker"]
    assert ev["begin_ns"].tolist() == [0, 64, 128]  # earliest raw timestamp of the whole decode is 0
    drops = [w for w in d.warnings if isinstance(w, E.DroppedRecords)]
    assert len(drops) == 1 and drops[0].count == 3 + 2 + 1
    assert d.launches["dropped"].tolist() == [3, 2, 1]
    assert list(d.launches.dtypes.astype(str)) == ["int16", "int32", "category", "int32"] + ["int64"] * 4 + ["int32", "int64"]


def test_decode_launches_unknown_family_is_clear():
    with pytest.raises(KeyError, match="no registry for kernel family 'nope'"):
        decode_launches([(b"", LaunchInfo(0, 0, "k", 0, "nope"))], {"selftest": REG})


def test_empty_buffer_decodes_to_empty_table():
    d = decode_buffer(build([], registry_hash=REG.hash, capacity=4), INFO, REG)
    assert len(d.events) == 0 and d.launch["regions"] == 0 and d.launch["gpu_begin_ns"] == -1
    validate_events(d.events)


def test_accepts_memoryview_and_numpy():
    buf = build([Region([(T0, B, WORK, 0), (T0 + 32, END, WORK, 0)])], registry_hash=REG.hash, capacity=2)
    for b in (memoryview(buf), np.frombuffer(buf, np.uint8), np.frombuffer(buf, np.uint32)):
        assert decode_buffer(b, INFO, REG).events["end_ns"].tolist() == [32]


def test_zero_capacity_regions_count_every_record_as_dropped():
    d = dec([Region([(T0, B, WORK, 0)] * 3), Region([], state=L.REGION_STATE_STARTED)], cap=0)
    assert len(d.events) == 0 and d.launch["dropped"] == 3
    assert {E.DroppedRecords, E.UnfinishedRegion} <= set(kinds(d))


def test_concat_events_unions_categories_and_coerces():
    from profiler.decode.decode import concat_events
    a = dec([Region([(T0, B, WORK, 0), (T0 + 32, END, WORK, 0)])]).events
    b = dec([Region([(T0, I, TICK, 1), (T0 + 32, A, GRID, 0)])], info=LaunchInfo(0, 1, "other", 1, "selftest")).events
    plain = a.astype({c: str for c in ("kernel", "role", "kind", "phase")})  # not categorical
    out = concat_events([b, plain, a.iloc[:0]])
    validate_events(out)
    assert out["kind"].astype(str).tolist() == ["instant", "arrive", "span"]
    assert out["phase"].astype(str).tolist() == ["tick", "grid", "work"]
    assert out["kernel"].astype(str).tolist() == ["other", "other", "selftest.imbalance"]


def test_chunked_decode_equals_whole_decode(monkeypatch):
    import profiler.decode.decode as D
    from .bufbuild import random_buffer
    rng = np.random.default_rng(2)
    buf = bytearray(random_buffer(rng, REG, n_regions=9, capacity=24, warps_per_block=3))
    # plant an unknown phase id in region 7 and an unmatched BEGIN in region 2
    recs = lambda i: np.frombuffer(buf, L.RECORD_DTYPE, count=24,  # noqa: E731
                                   offset=L.BUFFERHEADER_SIZE + i * (L.REGIONHEADER_SIZE + 24 * L.RECORD_SIZE) + L.REGIONHEADER_SIZE)
    r7 = recs(7).copy()
    r7["id"][r7["id"] == WORK] = 99
    at = lambda i: L.BUFFERHEADER_SIZE + i * (L.REGIONHEADER_SIZE + 24 * L.RECORD_SIZE) + L.REGIONHEADER_SIZE  # noqa: E731
    buf[at(7):at(7) + 24 * L.RECORD_SIZE] = r7.tobytes()
    r2 = recs(2).copy()
    r2["kind"][np.flatnonzero(r2["kind"] == END)[0]] = I
    buf[at(2):at(2) + 24 * L.RECORD_SIZE] = r2.tobytes()
    whole = decode_buffer(bytes(buf), INFO, REG)
    monkeypatch.setattr(D, "CHUNK_RECORDS", 30)  # one region (24 records) per chunk
    chunked = decode_buffer(bytes(buf), INFO, REG)
    pd.testing.assert_frame_equal(whole.events, chunked.events)
    assert whole.launch == chunked.launch
    assert [(type(w), w.count) for w in whole.warnings] == [(type(w), w.count) for w in chunked.warnings]
    assert "phase_99" in set(whole.events["phase"].astype(str))
    assert any(isinstance(w, E.UnmatchedBegin) for w in whole.warnings)


def test_accepts_a_torch_tensor():
    torch = needs_module("torch", "pip install torch==2.13.0 (the CPU build is enough)")
    buf = build([Region([(T0, B, WORK, 0), (T0 + 32, END, WORK, 0)])], registry_hash=REG.hash, capacity=2)
    t = torch.frombuffer(bytearray(buf), dtype=torch.uint8)
    assert decode_buffer(t, INFO, REG).events["end_ns"].tolist() == [32]


# -- issue 13: inputs that once decoded to a silent wrong result (tests/profiler/corpus) ----------
def _corpus(name):
    from .corpus.make_corpus import cases
    return cases()[name]


def _strict_decode(buf, **kw):
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy cast / overflow warnings would be bugs
        return decode_buffer(buf, INFO, REG, **kw)


def test_timestamp_above_2_63_is_skipped_not_wrapped():
    d = _strict_decode(_corpus("timestamp-above-int64-max"))
    bad = next(w for w in d.warnings if isinstance(w, E.BadTimestamps))
    assert bad.count == 2  # the BEGIN at >= 2^63 and its END at t = 100, an hour outside the launch
    ev = d.events
    assert ev["phase"].astype(str).tolist() == ["tick", "work"]
    assert ev["begin_ns"].tolist() == [32, 64] and ev["end_ns"].tolist() == [32, 160]
    assert (d.launch["gpu_begin_ns"], d.launch["gpu_end_ns"]) == (0, 160)


def test_region_of_invalid_kinds_stays_out_of_the_time_base():
    d = _strict_decode(_corpus("region-all-invalid-kinds"))
    assert next(w for w in d.warnings if isinstance(w, E.CorruptRecords)).count == 2
    assert d.events["begin_ns"].tolist() == [64] and d.events["end_ns"].tolist() == [160]
    assert (d.launch["gpu_begin_ns"], d.launch["gpu_end_ns"]) == (0, 160)


def test_aborted_regions_without_records_bound_the_launch_by_their_start():
    d = _strict_decode(_corpus("aborted-region-no-records"))
    assert len(d.events) == 0 and kinds(d) == [E.UnfinishedRegion]
    assert (d.launch["gpu_begin_ns"], d.launch["gpu_end_ns"]) == (0, 32)


def test_warps_per_block_out_of_range_is_a_decode_error():
    with pytest.raises(E.DecodeError, match="warps_per_block is 2147483648") as e:
        _strict_decode(_corpus("warps-per-block-2pow31"))
    assert e.value.offset == L.BUFFERHEADER_DTYPE.fields["warps_per_block"][1]


def test_hires_extreme_clock_pair_falls_back_without_numpy_warnings():
    d = _strict_decode(_corpus("hires-extreme-clock-pair"))
    assert [(type(w), w.count) for w in d.warnings] == [(E.ClockFallback, 1)]
    # region 0: 10 and 20 cycles after its start at the nominal 1.98 GHz; region 1: 0.5 ns a cycle
    assert d.events["begin_ns"].tolist() == [5, 50] and d.events["end_ns"].tolist() == [10, 150]
    assert d.launch["gpu_end_ns"] == 2000  # the rejected pair's finish clock (2^40 ns later) is not used


def test_record_an_hour_away_from_its_launch_is_skipped():
    far = T0 + 2 * 3_600 * 10**9
    d = dec([Region([(T0, B, WORK, 0), (T0 + 32, END, WORK, 0), (far, I, TICK, 0)], gt_start=T0, gt_end=T0 + 64)])
    assert [(type(w), w.count) for w in d.warnings] == [(E.BadTimestamps, 1)]
    assert d.events["phase"].astype(str).tolist() == ["work"]


def test_region_clock_outside_the_window_is_ignored_with_a_warning():
    r = [Region([(T0, B, WORK, 0), (T0 + 32, END, WORK, 0)], gt_start=T0, gt_end=T0 + 64),
         Region([(T0 + 64, B, WORK, 0), (T0 + 96, END, WORK, 0)], gt_start=T0, gt_end=T0 + 64),
         Region([], gt_start=5, gt_end=2**63)]  # a warp whose clocks were never written properly
    d = dec(r, wpb=4)
    assert [(type(w), w.count) for w in d.warnings] == [(E.BadRegionClock, 1)]
    assert (d.launch["gpu_begin_ns"], d.launch["gpu_end_ns"]) == (0, 96)


def test_sm_out_of_the_int16_column_is_a_decode_error():
    buf = build([Region([(T0, B, WORK, 0)], sm=40_000)], registry_hash=REG.hash, capacity=2)
    with pytest.raises(E.DecodeError, match="sm 40000") as e:
        decode_buffer(buf, INFO, REG)
    assert e.value.offset == L.BUFFERHEADER_SIZE + L.REGIONHEADER_DTYPE.fields["sm"][1]


def test_launch_info_out_of_the_column_range_is_refused():
    with pytest.raises(ValueError, match="LaunchInfo.rank"):
        LaunchInfo(70_000, 0, "k", 0, "selftest")
    with pytest.raises(ValueError, match="LaunchInfo.iteration"):
        LaunchInfo(0, 0, "k", 2**31, "selftest")


def test_nested_and_interleaved_spans_follow_the_per_phase_rule():
    # iteration{work} nests; idle and work interleave without nesting; a work BEGIN nests in a
    # work span (malformed): the inner BEGIN takes the END, the outer stays open
    r = Region([(T0, B, ITER, 0), (T0 + 32, B, WORK, 0), (T0 + 64, END, WORK, 0), (T0 + 96, B, IDLE, 0),
                (T0 + 128, B, WORK, 0), (T0 + 160, END, IDLE, 0), (T0 + 192, END, WORK, 0),
                (T0 + 224, B, WORK, 0), (T0 + 256, B, WORK, 0), (T0 + 288, END, WORK, 0), (T0 + 320, END, ITER, 0)])
    d = dec([r], cap=16)
    ev = d.events
    assert ev["phase"].astype(str).tolist() == ["iteration", "work", "idle", "work", "work", "work"]
    assert ev["end_ns"].tolist() == [320, 64, 160, 192, 320, 288]
    assert ev["open"].tolist() == [False, False, False, False, True, False]
    assert next(w for w in d.warnings if isinstance(w, E.UnmatchedBegin)).count == 1
