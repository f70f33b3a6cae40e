"""The merged Perfetto trace parsed back with the perfetto protos: the torch tracks under each
rank (CPU thread, CUDA stream), their slices nested as recorded once sorted as Perfetto sorts
(timestamp, then file order), the instrumented kernels named by their launch, and flows from
sender warps to receiving warps."""
from __future__ import annotations

from collections import defaultdict

import pytest

from tests.needs import needs_module

needs_module("perfetto", "pip install -e . (a base dependency)", module_level=True)

from profiler.export.perfetto import export_perfetto  # noqa: E402
from profiler.torchtrace.attach import attach  # noqa: E402


@pytest.fixture(scope="module")
def parsed(upstream, tmp_path_factory):
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as P
    attach(upstream["run"], upstream["traces"])
    out = export_perfetto(upstream["run"], tmp_path_factory.mktemp("pf") / "merged.perfetto-trace")
    t = P.Trace()
    t.ParseFromString(out.read_bytes())
    return t, P


def _names(t):
    names = {}
    for pk in t.packet:
        for n in pk.interned_data.event_names:
            names[n.iid] = n.name
    return names


def test_torch_tracks_sit_under_each_rank(parsed):
    t, _ = parsed
    desc = {pk.track_descriptor.uuid: pk.track_descriptor for pk in t.packet if pk.HasField("track_descriptor")}
    procs = {u: d.process.process_name for u, d in desc.items() if d.HasField("process")}
    torch_tracks = [(d.name, procs.get(d.parent_uuid)) for d in desc.values()
                    if d.name.startswith(("CPU thread", "CUDA stream"))]
    assert sorted(torch_tracks) == [("CPU thread 4242 (pid 4242)", "rank 0"), ("CPU thread 4242 (pid 4242)", "rank 1"),
                                    ("CUDA stream 7", "rank 0"), ("CUDA stream 7", "rank 1")]


def test_slices_nest_and_name_the_ops_and_the_instrumented_kernels(parsed):
    t, P = parsed
    names = _names(t)
    ev = [(pk.timestamp, i, pk.track_event) for i, pk in enumerate(t.packet) if pk.HasField("track_event")]
    ev.sort(key=lambda x: (x[0], x[1]))           # Perfetto's sorter: timestamp, then file order
    stacks, seen = defaultdict(list), set()
    for ts, _, te in ev:
        if te.type == P.TrackEvent.TYPE_SLICE_BEGIN:
            stacks[te.track_uuid].append((ts, names.get(te.name_iid, "")))
            seen.add(names.get(te.name_iid, ""))
        elif te.type == P.TrackEvent.TYPE_SLICE_END:
            assert stacks[te.track_uuid], "an END with no open slice on its track"
            b, _ = stacks[te.track_uuid].pop()
            assert ts >= b
    assert not any(stacks.values()), "slices left open"
    assert "aten::mm" in seen and "examples/moe.py(112): forward" in seen
    assert any(n.startswith("epscope launch ") and "dispatch_kernel" in n for n in seen)
    assert "nvjet_tst_128x256_64x4_2x1_v_bz_coopA_NNT" in seen


def test_the_python_frame_encloses_its_op(parsed):
    t, P = parsed
    names = _names(t)
    spans = defaultdict(list)
    open_ = {}
    ev = sorted(((pk.timestamp, i, pk.track_event) for i, pk in enumerate(t.packet) if pk.HasField("track_event")),
                key=lambda x: (x[0], x[1]))
    for ts, _, te in ev:
        key = te.track_uuid
        if te.type == P.TrackEvent.TYPE_SLICE_BEGIN:
            open_.setdefault(key, []).append((names.get(te.name_iid), ts, len(open_.get(key, []))))
        elif te.type == P.TrackEvent.TYPE_SLICE_END:
            n, b, depth = open_[key].pop()
            spans[n].append((b, ts, depth))
    mm, frame = spans["aten::mm"], spans["examples/moe.py(112): forward"]
    assert mm and frame
    assert all(any(fb <= b and e <= fe and fd < d for fb, fe, fd in frame) for b, e, d in mm)


def test_flows_go_from_sender_warps_to_receiving_warps(parsed):
    t, P = parsed
    names = _names(t)
    starts, ends = {}, {}
    for pk in t.packet:
        te = pk.track_event
        for fid in te.flow_ids:
            if fid >= (1 << 40):
                starts[fid] = (pk.timestamp, names.get(te.name_iid), te.track_uuid)
        for fid in te.terminating_flow_ids:
            if fid >= (1 << 40):
                ends[fid] = (pk.timestamp, names.get(te.name_iid), te.track_uuid)
    assert starts and set(starts) == set(ends)
    for fid, (ts, n, u) in starts.items():
        te_, n2, u2 = ends[fid]
        assert (n, n2) == ("send", "received") and te_ >= ts and u != u2
    # cross-rank flows exist (rank id is the high bits of the warp track uuid)
    assert any((starts[f][2] >> 24) != (ends[f][2] >> 24) for f in starts)
