"""The recording session on CPU: buffers are CPU tensors filled here the way a kernel would fill
them (through the generated dtypes only), then saved, reloaded and checked."""
from __future__ import annotations

import numpy as np
import pytest

from profiler.decode.decode import LaunchInfo
from profiler.generated import layout as L
from profiler.generated import selftest_phases as P
from profiler.record.session import (Session, SessionError, build_clock_model, buffer_bytes, first_gpu_start,
                                     write_from_raw)
from profiler.store.runstore import load_run
from tests.profiler.bufbuild import meta3

T0 = 1_800_000_000_000_000_000
ITER, WORK, IDLE = (next(k for k, v in P.PHASES.items() if v == n) for n in ("iteration", "work", "idle"))


CLK0 = 9_000_000_000  # a clock64 value


def fill(buf, spans, *, capacity, t0=T0, attempted=None):
    """spans: per region a list of (phase_id, begin_offset, end_offset) -> BEGIN/END records, as the
    format-3 recorder writes them: clock64 bits 31..0, here one cycle a ns (the region's clock pair
    says so), so each offset is also the record's time in ns after t0."""
    a = buf.numpy()
    stride = L.REGIONHEADER_SIZE + capacity * L.RECORD8_SIZE
    hdr = a[: L.BUFFERHEADER_SIZE].view(L.BUFFERHEADER_DTYPE)[0]
    for r, sp in enumerate(spans):
        off = L.BUFFERHEADER_SIZE + r * stride
        recs = []
        for pid, b, e in sp:
            recs += [(b, meta3(L.KIND_BEGIN, pid, 7)), (e, meta3(L.KIND_END, pid, 7))]
        # in time order, as a warp writes them (format 3 completes each clock from the record before)
        recs = [((CLK0 + t) & 0xFFFF_FFFF, meta) for t, meta in sorted(recs, key=lambda x: x[0])]
        rh = a[off: off + L.REGIONHEADER_SIZE].view(L.REGIONHEADER_DTYPE)
        rh["sm"], rh["block"], rh["warp"] = r, r // int(hdr["warps_per_block"]), r % int(hdr["warps_per_block"])
        rh["state"], rh["gt_start"], rh["gt_end"] = L.REGION_STATE_FINISHED, t0, t0 + 10_000
        rh["clk_start"], rh["clk_end"] = CLK0, CLK0 + 10_000
        rh["attempted"] = len(recs) if attempted is None else attempted
        rv = a[off + L.REGIONHEADER_SIZE: off + stride].view(L.RECORD8_DTYPE)
        for i, rec in enumerate(recs[:capacity]):
            rv[i] = rec


def test_buffer_header_from_the_generated_layout(tmp_path):
    s = Session(tmp_path, name="r", description="d", device="cpu", rank=0, capacity=16, hires=True)
    b0 = s.buffer("selftest.imbalance", "selftest", 3, 2, iteration=0)
    b1 = s.buffer("selftest.imbalance", "selftest", 1, 4, iteration=1, capacity=5)
    assert b0.numel() == buffer_bytes(6, 16) == 64 + 6 * (64 + 16 * 8)   # format 3: 8-byte record slots
    h = b0.numpy()[:64].view(L.BUFFERHEADER_DTYPE)[0]
    assert (h["magic"], h["version"], h["flags"], h["registry_hash"]) == (L.MAGIC, L.VERSION, L.FLAGS_HIRES, P.REGISTRY_HASH)
    assert (h["num_regions"], h["region_capacity"], h["rank"], h["launch_id"], h["warps_per_block"]) == (6, 16, 0, 0, 2)
    h1 = b1.numpy()[:64].view(L.BUFFERHEADER_DTYPE)[0]
    assert (h1["launch_id"], h1["region_capacity"], h1["num_regions"]) == (1, 6, 4)   # 5 asked: one slot more (region_capacity)
    assert not b0.numpy()[64:].any(), "regions start zeroed"


def test_session_rejects_misuse(tmp_path):
    with pytest.raises(SessionError, match="unknown kernel family 'nope'"):
        Session(tmp_path, name="r", description="d", device="cpu").buffer("k", "nope", 1, 1, 0)
    with pytest.raises(SessionError, match="rank 2 outside"):
        Session(tmp_path, name="r", description="d", device="cpu", rank=2, world_size=2)
    with pytest.raises(SessionError, match="plain directory name"):
        Session(tmp_path, name="../x", description="d", device="cpu")
    s = Session(tmp_path, name="r", description="d", device="cpu")
    with pytest.raises(SessionError, match="positive"):
        s.buffer("k", "selftest", 0, 1, 0)


def test_save_writes_a_run_with_host_rows_and_manifest(tmp_path):
    # saving computes the run's analyses to store them with it (issue 20); this hand-filled run's
    # clocks put its host rows ~1e18 ns from its GPU rows, too wide to analyse: the save says so
    # and keeps the run (tests/analysis/test_stored.py stores a run that analyses)
    with pytest.warns(UserWarning, match="could not store its analyses.*TooWideToAnalyse"), \
            Session(tmp_path, name="run-a", description="two launches", device="cpu", capacity=8,
                    workload={"kind": "selftest", "test": "x"}, config={"sms": 4}) as s:
        for it in range(2):
            with s.host_span("selftest.imbalance", it):
                buf = s.buffer("selftest.imbalance", "selftest", 2, 1, it)
            fill(buf, [[(ITER, 0, 900), (WORK, 32, 800)], [(ITER, 0, 900), (IDLE, 64, 896)]], capacity=8)
        # host clock: host ns == gpu ns - 5_000 exactly (pairs 1 us wide)
        hb = [h for h in range(s.start_host_ns, s.start_host_ns + 10_000_000, 1_000_000)]
        s.add_host_pairs([(h, h + 5_000 + 500, h + 1_000) for h in hb])
    run = load_run(tmp_path / "run-a")
    m = run.manifest
    assert m["name"] == "run-a" and m["status"] == "ok" and m["error"] is None
    assert m["workload"] == {"kind": "selftest", "test": "x"} and m["config"]["sms"] == 4
    assert m["registry"]["selftest"]["family"] == "selftest"
    assert set(m["git"]) == {"branch", "commit", "dirty"}
    assert m["clock"]["host"]["uncertainty_ns"] < 2_000
    assert m["headline"]["launches"] == 2 and m["headline"]["median_kernel_us"]["selftest.imbalance"] == 10.0
    ev = run.events
    spans = ev[ev["kind"] == "span"]
    assert len(spans) == 8 and set(spans["phase"]) == {"iteration", "work", "idle"}
    assert (spans["end_ns"] - spans["begin_ns"]).max() == 900
    assert (ev["kind"] == "host").sum() == 2


@pytest.mark.parametrize("how", ["argument", "environment"])
def test_saving_without_analyses_when_asked(tmp_path, monkeypatch, how):
    from profiler.analysis import stored, summary
    if how == "environment":
        monkeypatch.setenv("EPSCOPE_NO_ANALYZE", "1")
    with Session(tmp_path, name="run-n", description="d", device="cpu", capacity=4,
                 analyze=how != "argument") as s:
        buf = s.buffer("selftest.imbalance", "selftest", 1, 1, 0)
        fill(buf, [[(WORK, 0, 100)]], capacity=4)
    assert load_run(tmp_path / "run-n").num_events > 0
    assert not (tmp_path / "run-n" / stored.DIR).exists() and not (tmp_path / "run-n" / summary.FILE).exists()


def test_exception_saves_a_partial_run_with_the_error(tmp_path):
    with pytest.raises(RuntimeError, match="kernel hung"):
        with Session(tmp_path, name="run-b", description="d", device="cpu", capacity=4) as s:
            buf = s.buffer("selftest.grid_barrier", "selftest", 1, 1, 0)
            fill(buf, [[(WORK, 0, 100)]], capacity=4)
            raise RuntimeError("kernel hung")
    m = load_run(tmp_path / "run-b").manifest
    assert m["status"] == "error" and "kernel hung" in m["error"]


def test_drops_reach_the_manifest(tmp_path):
    with Session(tmp_path, name="run-c", description="d", device="cpu", capacity=2) as s:
        buf = s.buffer("selftest.imbalance", "selftest", 1, 1, 0)
        fill(buf, [[(WORK, 0, 100), (IDLE, 200, 300)]], capacity=2, attempted=4)
    m = load_run(tmp_path / "run-c").manifest
    # 4 attempted into 2 slots: the last slot is the overflow sink (formats 2-3), so 1 kept, 3 dropped
    assert m["drops"]["total"] == 3
    assert any(w["type"] == "DroppedRecords" and w["count"] == 3 for w in m["warnings"])
    assert m["clock"]["gpu_time"]["format_versions"] == [L.VERSION]


def test_raw_dir_roundtrip(tmp_path):
    with Session(tmp_path / "a", name="run-d", description="d", device="cpu", capacity=4, raw_dir=tmp_path / "raw") as s:
        buf = s.buffer("selftest.imbalance", "selftest", 1, 1, 0)
        fill(buf, [[(WORK, 0, 100)]], capacity=4)
        s.headline_extra["x"] = 1
    raw = tmp_path / "raw" / "run-d.rawbuf"
    assert raw.exists()
    again = write_from_raw(raw, tmp_path / "b")
    a, b = load_run(tmp_path / "a" / "run-d"), load_run(again)
    assert a.events.equals(b.events) and b.manifest["headline"]["x"] == 1


def test_clock_model_from_two_rank_samples():
    # rank 1's clock = rank 0's + 1_000_000 ns; one-way latency 700 ns; 3 ppm drift over 1 s
    def samples(t, theta):
        return np.array([[t + i * 1000, t + i * 1000 + 700 + theta, t + i * 1000 + 800 + theta, t + i * 1000 + 1500]
                         for i in range(8)], np.int64)

    theta0, theta1 = 1_000_000, 1_000_003
    info = LaunchInfo(1, 0, "k", 0, "selftest")
    payloads = [
        {"rank": 0, "clock": {1: {"start": [samples(T0, theta0)], "end": [samples(T0 + 10**9, theta1)]}},
         "host_pairs": [], "launches": [], "start_host_ns": 0},
        {"rank": 1, "clock": {}, "host_pairs": [], "launches": [(info, np.zeros(10, np.uint8))], "start_host_ns": 0},
    ]
    model, notes = build_clock_model(payloads, 2)
    assert not notes
    c = model.clock(1)
    assert abs(c.offset_ns + theta0) < 64 and abs(c.drift_ppm + 0.003) < 0.01
    assert c.uncertainty_ns < 2_000


def test_missing_samples_fall_back_with_a_warning():
    payloads = [{"rank": 0, "clock": {}, "host_pairs": [], "launches": [], "start_host_ns": 0},
                {"rank": 1, "clock": {}, "host_pairs": [], "launches": [], "start_host_ns": 0}]
    model, notes = build_clock_model(payloads, 2)
    assert model.clock(1).offset_ns == 0 and notes[0]["type"] == "ClockFallback"


def test_first_gpu_start_reads_region_headers(tmp_path):
    s = Session(tmp_path, name="r", description="d", device="cpu", capacity=4)
    buf = s.buffer("selftest.imbalance", "selftest", 2, 1, 0)
    assert first_gpu_start(buf.numpy()) is None  # nothing started
    fill(buf, [[(WORK, 0, 10)]], capacity=4, t0=T0 + 5)
    assert first_gpu_start(buf.numpy()) == T0 + 5
    assert first_gpu_start(np.zeros(8, np.uint8)) is None


def test_sync_clocks_sequence_bases_and_samples(tmp_path, monkeypatch):
    """Every rank derives the same seq_base per window; rank 0 keeps (t0..t3) per peer."""
    import profiler.record.clocks as clocks

    calls = []

    def fake_ping_pong(rank, world, my, peers, *, n, seq_base, timeout_ns):
        calls.append((rank, seq_base, n))
        return {k: np.tile([[1, 2, 3, 4]], (n, 1)) for k in range(1, world)} if rank == 0 else {0: np.zeros((n, 4))}

    monkeypatch.setattr(clocks, "ping_pong", fake_ping_pong)
    s0 = Session(tmp_path, name="r", description="d", device="cpu", rank=0, world_size=3)
    s2 = Session(tmp_path, name="r", description="d", device="cpu", rank=2, world_size=3)
    for s in (s0, s2):
        s.sync_clocks(1, {0: 2, 1: 3, 2: 4}, "start", n=8)
        s.sync_clocks(1, {0: 2, 1: 3, 2: 4}, "end", n=8)
    assert calls == [(0, 0, 8), (0, 24, 8), (2, 0, 8), (2, 24, 8)]
    assert sorted(s0._clock) == [1, 2] and [a.shape for a in s0._clock[2]["end"]] == [(8, 4)]
    assert s2._clock == {}
    with pytest.raises(SessionError, match="when"):
        s0.add_clock_samples(1, np.zeros((1, 4)), "middle")


def test_reserve_makes_each_geometry_one_slab_outside_the_calls(tmp_path, monkeypatch):
    import profiler.record.session as S

    monkeypatch.setattr(S, "POOL_SLOTS", 4)
    s = Session(tmp_path, name="reserved", description="pool", device="cpu", capacity=8, host_pairs=0)
    s.launch_slot("selftest.imbalance", "selftest", 2, 1, 0)  # a geometry profiled before the reserve
    assert [sl.count for sl in s._slabs] == [4]
    s.reserve(10)  # 3 slots left < 10: the next slab is made here, not in a later call
    assert [sl.count for sl in s._slabs] == [4, 10] and s._slabs[1].used == 0
    made = len(s._slabs)
    addrs = [s.launch_slot("selftest.imbalance", "selftest", 2, 1, it) for it in range(1, 11)]
    assert len(s._slabs) == made, "reserved launches take no new slab"
    assert [a - addrs[0] for a in addrs] == [i * buffer_bytes(2, 8) for i in range(10)]
    # a geometry first seen after the reserve gets one slab of the reserved size at its first launch
    other = [s.launch_slot("selftest.imbalance", "selftest", 3, 1, it) for it in range(10)]
    assert [sl.count for sl in s._slabs] == [4, 10, 10] and len(set(other)) == 10
    # enough free slots: reserve makes nothing; the slab size stays capped by max_device_bytes
    s.reserve(0)
    assert len(s._slabs) == 3
    small = Session(tmp_path, name="small", description="pool", device="cpu", capacity=8, host_pairs=0,
                    max_device_bytes=4 * 3 * buffer_bytes(2, 8))
    small.reserve(100)
    small.launch_slot("selftest.imbalance", "selftest", 2, 1, 0)
    assert [sl.count for sl in small._slabs] == [3]
    with pytest.raises(SessionError, match="launches"):
        s.reserve(-1)


def test_launch_slots_come_from_stamped_zeroed_slabs_and_save_like_buffers(tmp_path, monkeypatch):
    import profiler.record.session as S

    monkeypatch.setattr(S, "POOL_SLOTS", 4)
    s = Session(tmp_path, name="pooled", description="pool", device="cpu", capacity=8, host_pairs=0)
    addrs = []
    for it in range(5):  # 5 launches of one geometry: a second slab after 4
        t0, first = 1000 * it, s.num_launches
        addrs.append(s.launch_slot("selftest.imbalance", "selftest", 2, 1, it))
        s.host_call("selftest.imbalance", it, t0, t0 + 500, first)
    s.host_call("idle host work", 9, 7000, 7100, s.num_launches)  # no launch: a host row
    assert len(s._slabs) == 2 and [sl.used for sl in s._slabs] == [4, 1]
    slot = buffer_bytes(2, 8)
    assert [a - addrs[0] for a in addrs[:4]] == [0, slot, 2 * slot, 3 * slot]
    views = []
    for lid, a in enumerate(addrs):
        sl = s._slabs[s._order[lid] >> S._SLAB_SHIFT]
        off = a - sl.base
        v = sl.device[off: off + slot]
        h = v.numpy()[: L.BUFFERHEADER_SIZE].view(L.BUFFERHEADER_DTYPE)[0]
        assert (h["magic"], h["num_regions"], h["region_capacity"], h["warps_per_block"], h["launch_id"]) == \
            (L.MAGIC, 2, 8, 1, lid)
        assert not v.numpy()[L.BUFFERHEADER_SIZE:].any(), "regions start zeroed"
        views.append(v)
    for it, v in enumerate(views):  # "the kernel" writes each slot
        fill(v, [[(ITER, 0, 900 + it)], [(WORK, 10, 500)]], capacity=8)
    path = s.save()
    run = load_run(path)
    la = run.launches.sort_values("launch")
    assert list(la["iteration"]) == [0, 1, 2, 3, 4]
    # each launch got the host times of its call (placed on the timeline only with host pairs)
    infos = [info for info, _ in s._launch_list()]
    assert [(i.host_begin_ns, i.host_end_ns) for i in infos] == [(1000 * i, 1000 * i + 500) for i in range(5)]
    assert [i.launch for i in infos] == list(range(5)) and not s._launches, "no Python object per pool launch"
    assert s._host_spans == [("idle host work", 9, 7000, 7100)]
    spans = run.events[run.events["kind"] == "span"]
    assert sorted(spans.groupby("launch", observed=True).size().tolist()) == [2] * 5


def test_an_odd_capacity_gets_one_more_slot_so_every_header_stays_16_byte_aligned(tmp_path):
    """Format 3's RegionHeader is a 16-byte struct stored with 16-byte STGs: the region stride
    64 + 8 * capacity must be a multiple of 16. ep_core's bound (R + 4) * units + 32 is odd at one
    rank; such a request faulted the first format-3 GPU run (misaligned address). Every capacity a
    session hands out is even, every slot and region header 16-byte aligned, and a header with an
    odd capacity is refused where it is made."""
    from profiler.record.pool import make_header, region_capacity

    assert [region_capacity(c) for c in (1, 2, 37, 4096)] == [2, 2, 38, 4096]
    s = Session(tmp_path, name="odd", description="odd capacity", device="cpu", capacity=4096, host_pairs=0)
    addrs = [s.launch_slot("selftest.imbalance", "selftest", 3, 2, it, capacity=37) for it in range(3)]
    pool = s._pools[("selftest.imbalance", "selftest", 3, 2, 37)]
    assert pool.capacity == 38 and pool.slot_bytes == buffer_bytes(6, 38)
    base = s._slabs[0].base
    for a in addrs:
        assert (a - base) % 16 == 0
        assert all((a - base + L.BUFFERHEADER_SIZE + r * (L.REGIONHEADER_SIZE + 38 * L.RECORD8_SIZE)) % 16 == 0
                   for r in range(6))
        hdr = s._slabs[0].device.numpy()[a - base: a - base + L.BUFFERHEADER_SIZE].view(L.BUFFERHEADER_DTYPE)[0]
        assert int(hdr["region_capacity"]) == 38
    b = s.buffer("selftest.imbalance", "selftest", 1, 1, 0, capacity=5)
    assert b.numel() == buffer_bytes(1, 6)
    with pytest.raises(SessionError, match="odd"):
        make_header(registry_hash=P.REGISTRY_HASH, num_regions=1, capacity=7, rank=0, launch_id=0,
                    warps_per_block=1, hires=False)
