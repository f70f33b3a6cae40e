"""profiler.export.perfetto: every export is parsed back with perfetto_trace_pb2 and checked."""
from __future__ import annotations

from collections import defaultdict

import numpy as np
import pandas as pd
import pytest

from tests.needs import needs_module

needs_module("perfetto", "pip install -e . (a base dependency)", module_level=True)
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as P  # noqa: E402

from profiler.export import perfetto as PE  # noqa: E402
from profiler.decode.align import ClockModel, HostClock, RankClock  # noqa: E402
from profiler.decode.decode import LaunchInfo, decode_launches  # noqa: E402
from profiler.registry.registry import load_all  # noqa: E402
from profiler.store.runstore import load_run, write_run  # noqa: E402

from .bufbuild import A, B, D, E, I, Region, build, random_buffer  # noqa: E402

REG = load_all()["selftest"]
EP = load_all()["ep_intranode"]
T0 = 1_764_000_000_000_000_000
ITER, WORK, IDLE, TICK = (REG.phase(n).id for n in ("iteration", "work", "idle", "tick"))
GRID = REG.barrier_names and REG.barriers[0].id


def parse(path) -> P.Trace:
    tr = P.Trace()
    tr.ParseFromString(open(path, "rb").read())
    return tr


def replay(tr: P.Trace):
    """What a trace processor does: intern names, sort by timestamp (stable), replay slice stacks."""
    names, tracks, events = {}, {}, []
    for i, p in enumerate(tr.packet):
        for n in p.interned_data.event_names:
            names[n.iid] = n.name
        if p.HasField("track_descriptor"):
            tracks[p.track_descriptor.uuid] = p.track_descriptor
        if p.HasField("track_event"):
            assert p.trusted_packet_sequence_id == PE.SEQ_ID
            events.append((p.timestamp, i, p.track_event))
    events.sort(key=lambda e: (e[0], e[1]))
    stacks = defaultdict(list)
    slices, instants = [], []
    for ts, _, te in events:
        assert te.track_uuid in tracks, "event on an undeclared track"
        if te.type == P.TrackEvent.TYPE_SLICE_BEGIN:
            stacks[te.track_uuid].append((names[te.name_iid], ts, te))
        elif te.type == P.TrackEvent.TYPE_SLICE_END:
            name, b, bte = stacks[te.track_uuid].pop()
            slices.append(dict(track=te.track_uuid, name=name, begin=b, end=ts, depth=len(stacks[te.track_uuid]), te=bte))
        else:
            instants.append(dict(track=te.track_uuid, name=names[te.name_iid], ts=ts, te=te,
                                 depth=len(stacks[te.track_uuid])))
    assert all(not s for s in stacks.values()), "unclosed slices"
    return names, tracks, slices, instants


def payload_of(te) -> int:
    (da,) = [d for d in te.debug_annotations if d.name_iid == 1]
    return da.int_value


@pytest.fixture
def run(tmp_path):
    # rank 0: block 0 warp 0 does iteration{work, tick}, arrives last at the grid barrier;
    # block 0 warp 1 idles; block 1 warp 0 is zero-length work at the same tick as its iteration
    r00 = Region([(T0, B, ITER, 0), (T0, B, WORK, 5), (T0 + 320, E, WORK, 0), (T0 + 352, I, TICK, 9),
                  (T0 + 384, A, GRID, 0), (T0 + 416, D, GRID, 0), (T0 + 448, E, ITER, 0)], sm=17)
    r01 = Region([(T0 + 32, B, ITER, 0), (T0 + 32, B, IDLE, 0), (T0 + 64, E, IDLE, 0),
                  (T0 + 96, A, GRID, 0), (T0 + 416, D, GRID, 0), (T0 + 448, E, ITER, 0)], sm=17)
    r10 = Region([(T0 + 64, B, ITER, 0), (T0 + 64, B, WORK, 0), (T0 + 64, E, WORK, 0), (T0 + 96, E, ITER, 0),
                  (T0 + 128, A, GRID, 0), (T0 + 448, D, GRID, 0)], sm=40)
    b0 = build([r00, r01, r10], registry_hash=REG.hash, capacity=16, warps_per_block=2)
    # rank 1: another launch, clock 1000 ns ahead
    r1 = Region([(T0 + 1000 + 100, B, WORK, 1), (T0 + 1000 + 200, E, WORK, 0)], sm=3)
    b1 = build([r1], registry_hash=REG.hash, capacity=4, warps_per_block=1)
    clock = ClockModel({0: RankClock(0, 0.0, 0.0, 0.0), 1: RankClock(1, -1000.0, 0.0, 96.0)}, t0_ns=T0,
                       host=HostClock(0, T0 - 5000, 1.0, 800.0, 0))
    d = decode_launches([(b0, LaunchInfo(0, 0, "selftest.barrier", 0, "selftest", 100, 900)),
                         (b1, LaunchInfo(1, 0, "selftest.barrier", 0, "selftest", 200, 700))],
                        {"selftest": REG}, clock)
    man = {"name": "t", "registry": {"selftest": REG.to_json()},
           "clock": {"ranks": [{"rank": 0, "uncertainty_ns": 0.0}, {"rank": 1, "uncertainty_ns": 96.0}]}}
    return write_run(tmp_path / "run", d.events, d.launches, man, perfetto=False), d


def test_round_trip_tracks_slices_nesting(run):
    path, d = run
    out = PE.export_perfetto(path)
    assert out == path / "trace.perfetto-trace"
    tr = parse(out)
    first = tr.packet[0]
    assert first.sequence_flags & P.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
    assert first.trusted_packet_sequence_id == PE.SEQ_ID
    names, tracks, slices, instants = replay(tr)

    procs = {t.uuid: t for t in tracks.values() if t.HasField("process")}
    assert sorted(t.process.process_name for t in procs.values()) == ["rank 0", "rank 1"]
    assert "±96 ns" in procs[int(PE.rank_uuid(1))].description
    by_name = {t.name: t for t in tracks.values() if t.name}
    assert by_name["block 0 (SM 17)"].parent_uuid == PE.rank_uuid(0)
    assert by_name["block 1 (SM 40)"].parent_uuid == PE.rank_uuid(0)
    assert by_name["warp 1 · worker"].parent_uuid == by_name["block 0 (SM 17)"].uuid
    assert tracks[int(PE.host_uuid(0))].name == "host" and tracks[int(PE.kernels_uuid(1))].name == "kernels"

    ev = d.events
    base = -min(0, int(ev["begin_ns"].min()))  # Perfetto timestamps are unsigned: the export shifts
    assert base == 4900  # the host span of rank 0 starts 4900 ns before the run's first GPU timestamp
    spans = ev[ev["kind"] == "span"]
    warp_slices = [s for s in slices if tracks[s["track"]].name.startswith("warp ")]
    assert len(warp_slices) == len(spans)
    got = sorted((s["track"], s["name"], s["begin"], s["end"]) for s in warp_slices)
    want = sorted((int(PE.warp_uuid(r.rank, r.block, r.warp)), str(r.phase), r.begin_ns + base, r.end_ns + base)
                  for r in spans.itertuples())
    assert got == want
    depth = {(s["name"], s["begin"], s["track"]): s["depth"] for s in warp_slices}
    w00 = int(PE.warp_uuid(0, 0, 0))
    assert depth[("iteration", base, w00)] == 0 and depth[("work", base, w00)] == 1
    w10 = int(PE.warp_uuid(0, 1, 0))
    assert depth[("work", base + 64, w10)] == 1  # zero-length child on its parent's first tick still nests
    work = next(s for s in warp_slices if s["name"] == "work" and s["track"] == w00)
    assert payload_of(work["te"]) == 5
    tick = next(i for i in instants if i["name"] == "tick")
    assert (tick["ts"], tick["depth"], payload_of(tick["te"])) == (base + 352, 1, 9)

    host = [s for s in slices if s["track"] == PE.host_uuid(0)]
    assert [(s["name"], s["begin"] - base, s["end"] - base) for s in host] == [("selftest.barrier", -4900, -4100)]
    kern = [s for s in slices if s["track"] in (PE.kernels_uuid(0), PE.kernels_uuid(1))]
    assert sorted((s["begin"] - base, s["end"] - base) for s in kern) == sorted(
        zip(d.launches["gpu_begin_ns"], d.launches["gpu_end_ns"]))


def test_flows_from_last_arriver_to_departing_warps(run):
    path, _ = run
    _, _, _, instants = replay(parse(PE.export_perfetto(path)))
    arrives = [i for i in instants if i["name"] == "grid arrive"]
    departs = [i for i in instants if i["name"] == "grid depart"]
    assert len(arrives) == 3 and len(departs) == 3
    last = max(arrives, key=lambda i: i["ts"])
    assert last["track"] == PE.warp_uuid(0, 0, 0)
    others = [i for i in departs if i["track"] != last["track"]]
    assert sorted(last["te"].flow_ids) == sorted(i["te"].terminating_flow_ids[0] for i in others)
    assert all(len(i["te"].flow_ids) == 0 for i in arrives if i is not last)
    assert all(len(i["te"].terminating_flow_ids) == 0 for i in departs if i["track"] == last["track"])


def test_cross_rank_barrier_flows_span_ranks(tmp_path):
    rs = EP.barriers[0]
    assert rs.scope == "rank"
    bufs = []
    for rank, t_arrive in ((0, 100), (1, 900)):
        r = Region([(T0 + t_arrive, A, rs.id, 0), (T0 + 1000, D, rs.id, 0)])
        bufs.append((build([r], registry_hash=EP.hash, capacity=4), LaunchInfo(rank, 0, "notify", 0, "ep_intranode")))
    d = decode_launches(bufs, {"ep_intranode": EP})
    path = write_run(tmp_path / "x", d.events, d.launches, {"registry": {"ep_intranode": EP.to_json()}}, perfetto=False)
    _, _, _, inst = replay(parse(PE.export_perfetto(path, tmp_path / "t.pftrace")))
    last = max((i for i in inst if i["name"] == "rank_start arrive"), key=lambda i: i["ts"])
    assert last["track"] == PE.warp_uuid(1, 0, 0)
    dep0 = next(i for i in inst if i["name"] == "rank_start depart" and i["track"] == PE.warp_uuid(0, 0, 0))
    assert list(last["te"].flow_ids) == list(dep0["te"].terminating_flow_ids)


def test_streaming_in_small_batches_gives_the_same_trace(run, monkeypatch, tmp_path):
    path, _ = run
    big = replay(parse(PE.export_perfetto(path, tmp_path / "big")))
    monkeypatch.setattr(PE, "BATCH_ROWS", 2)
    small = replay(parse(PE.export_perfetto(path, tmp_path / "small")))
    key = lambda s: (s["track"], s["begin"], s["end"], s["name"], s["depth"])  # noqa: E731
    assert sorted(map(key, big[2])) == sorted(map(key, small[2]))
    ikey = lambda i: (i["track"], i["ts"], i["name"], tuple(i["te"].flow_ids), tuple(i["te"].terminating_flow_ids))  # noqa: E731
    assert sorted(map(ikey, big[3])) == sorted(map(ikey, small[3]))


def test_random_runs_round_trip_counts(tmp_path):
    rng = np.random.default_rng(3)
    items = [(random_buffer(rng, REG, n_regions=6, capacity=40), LaunchInfo(r, l, "selftest.imbalance", l, "selftest"))
             for r in range(2) for l in range(2)]
    d = decode_launches(items, {"selftest": REG})
    path = write_run(tmp_path / "r", d.events, d.launches, {"registry": {"selftest": REG.to_json()}}, perfetto=True)
    names, tracks, slices, instants = replay(parse(path / "trace.perfetto-trace"))
    ev = d.events
    assert len([s for s in slices if tracks[s["track"]].name.startswith("warp")]) == int((ev["kind"] == "span").sum())
    assert len(instants) == int(ev["kind"].isin(["instant", "arrive", "depart"]).sum())
    # nesting: every work slice sits inside an iteration slice? (random buffers do not nest) -> begin <= end
    assert all(s["begin"] <= s["end"] for s in slices)


def test_negative_times_are_shifted_to_a_non_negative_base(tmp_path):
    r = Region([(T0, B, WORK, 0), (T0 + 64, E, WORK, 0)])
    clock = ClockModel({0: RankClock(0, 0.0, 0.0, 0.0)}, t0_ns=T0 + 1000)
    d = decode_launches([(build([r], registry_hash=REG.hash, capacity=2), LaunchInfo(0, 0, "k", 0, "selftest"))],
                        {"selftest": REG}, clock)
    assert d.events["begin_ns"].min() == -1000
    path = write_run(tmp_path / "n", d.events, d.launches, {}, perfetto=False)
    _, _, slices, _ = replay(parse(PE.export_perfetto(path)))
    s = next(s for s in slices if s["name"] == "work")
    assert (s["begin"], s["end"]) == (0, 64)


@pytest.mark.parametrize("seed", range(3))
def test_vectorised_encoder_matches_protobuf(seed):
    rng = np.random.default_rng(seed)
    n = 500
    ts = rng.integers(0, 2**62, n, dtype=np.int64) >> rng.integers(0, 62, n)
    typ = rng.integers(1, 4, n)
    uuid = rng.integers(0, 2**63, n, dtype=np.int64).astype(np.uint64) >> rng.integers(0, 63, n).astype(np.uint64)
    iid = rng.integers(1, 2**20, n)
    payload = rng.integers(-2**40, 2**40, n)
    tr = P.Trace()
    term = np.where(rng.random(n) < 0.3, rng.integers(1, 2**63, n, dtype=np.int64), 0).astype(np.uint64)
    tr.ParseFromString(PE.encode_events(ts, typ, uuid, iid, payload, da_iid=3, term_flow=term))
    assert len(tr.packet) == n
    for i, p in enumerate(tr.packet):
        te = p.track_event
        assert (p.timestamp, te.type, te.track_uuid) == (ts[i], typ[i], uuid[i])
        assert list(te.terminating_flow_ids) == ([int(term[i])] if term[i] else [])
        assert p.trusted_packet_sequence_id == PE.SEQ_ID
        assert p.sequence_flags == P.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE
        if typ[i] == 2:
            assert not te.HasField("name_iid") and len(te.debug_annotations) == 0
        else:
            assert te.name_iid == iid[i]
            (da,) = te.debug_annotations
            assert (da.name_iid, da.int_value) == (3, payload[i])


@pytest.mark.parametrize("every", [0, 3, 20])
def test_span_pairs_with_rare_instants_encode_in_order(every):
    """The span fast path (BEGIN then its END, few instants between): packets parse back in order."""
    rng = np.random.default_rng(every)
    typ = []
    for i in range(400):
        typ += [3] if every and i % every == every - 1 else [1, 2]
    typ = np.array(typ)
    n = len(typ)
    ts = np.cumsum(rng.integers(0, 2**20, n))
    uuid = rng.integers(1, 2**40, n).astype(np.uint64)
    iid, payload = rng.integers(1, 300, n), rng.integers(-5, 2**33, n)
    tr = P.Trace()
    tr.ParseFromString(PE.encode_events(ts, typ, uuid, iid, payload, da_iid=1))
    assert [(p.timestamp, p.track_event.type, p.track_event.track_uuid) for p in tr.packet] == list(zip(ts, typ, uuid))
    named = [(p.track_event.name_iid, p.track_event.debug_annotations[0].int_value) for p in tr.packet if p.track_event.type != 2]
    assert named == [(int(a), int(b)) for a, b, t in zip(iid, payload, typ) if t != 2]


def test_export_of_missing_run_is_a_run_error(tmp_path):
    from profiler.errors import RunNotFound
    with pytest.raises(RunNotFound):
        PE.export_perfetto(tmp_path / "nope")


def test_open_spans_are_named_as_such(tmp_path):
    r = Region([(T0, B, ITER, 0), (T0 + 32, B, WORK, 0), (T0 + 64, E, WORK, 0)], state=2, attempted=5)
    d = decode_launches([(build([r], registry_hash=REG.hash, capacity=3), LaunchInfo(0, 0, "k", 0, "selftest"))],
                        {"selftest": REG})
    assert d.events["open"].tolist() == [True, False]
    path = write_run(tmp_path / "o", d.events, d.launches, {}, perfetto=False)
    _, _, slices, _ = replay(parse(PE.export_perfetto(path)))
    got = sorted((s["name"], s["begin"], s["end"]) for s in slices if s["name"] != "k")
    assert got == [(f"iteration {PE.OPEN_SUFFIX}", 0, 64), ("work", 32, 64)]


def test_failed_export_leaves_no_partial_file(run, monkeypatch, tmp_path):
    path, _ = run

    def boom(*a, **k):
        raise RuntimeError("disk full")
    monkeypatch.setattr(PE, "_write_batch", boom)
    out = tmp_path / "t.perfetto-trace"
    with pytest.raises(RuntimeError, match="disk full"):
        PE.export_perfetto(path, out)
    assert list(tmp_path.glob("t.perfetto-trace*")) == []


def test_the_same_run_exports_the_same_bytes(tmp_path):
    """Issue 21: `epscope export` of a committed run must not change its bytes. Two processes
    with different hash seeds (set and dict orders) export a bundled run with barriers and host
    spans, and a synthetic one, byte for byte alike."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[2]
    from profiler.groundtruth.synthetic import make_run
    synth = make_run(tmp_path / "s", ranks=2, events=3000, scenario="balanced",
                     perfetto=False)
    runs = [root / "traces" / "ep-barrier-straggler", root / "traces" / "ll-host-a0", synth]
    outs = []
    for seed in ("1", "2"):
        code = ("import sys; sys.path.insert(0, %r); from profiler.export.perfetto import export_perfetto; "
                "[export_perfetto(r, o) for r, o in zip(sys.argv[1:4], sys.argv[4:])]") % str(root)
        dests = [tmp_path / f"{i}-{seed}.pftrace" for i in range(len(runs))]
        subprocess.run([sys.executable, "-c", code, *map(str, runs), *map(str, dests)], check=True,
                       env={**os.environ, "PYTHONHASHSEED": seed})
        outs.append([d.read_bytes() for d in dests])
    assert outs[0] == outs[1] and all(len(b) > 1000 for b in outs[0])
