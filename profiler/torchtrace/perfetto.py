"""The merged Perfetto trace: the run's own tracks (profiler.export.perfetto) plus, per rank with a
PyTorch trace, its CPU threads and CUDA streams on the run timeline, and flows from each sender
warp to the waiting receiver. One file, openable at ui.perfetto.dev.

    process "rank N"
      ├─ "CPU thread T"        cpu_op / record_function / python_function slices, nested as recorded
      ├─ "CUDA stream S"       kernels, copies, memsets (the instrumented kernels named by their launch)
      ├─ "kernels", "host"     epscope's launches and host calls (as before)
      └─ "block B (SM S)" / "warp W · role"   epscope's warp lanes

Flows (wait edges of the dependency graph, profiler.analysis.edges): a wait span's end on the
receiving warp <- the sender's release record (the latest record of the wait's `waits_for` phase
on the peer, whose payload is the waiting rank): a flow from the sender's warp at the release to
the receiver's warp at the wait's end. Ids start at FLOW_BASE, clear of the barrier flows' (row
numbers + 1).

Slices of one track are written in an order Perfetto's sorter keeps nested (it orders by
timestamp, then file order): at one timestamp ends before begins, longer begins first, later-begun
ends first; a zero-length range is an instant. Encoded by perfetto_export.encode_events (passed in by perfetto_export, which imports this module).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from . import kineto as K

FLOW_BASE = 1 << 40
HOST_KINDS = (K.CPU_OP, K.USER, K.PYTHON)
GPU_KINDS = (K.KERNEL, K.MEMCPY, K.MEMSET)
CORRELATION_IID = 2   # debug annotation name iid of the torch slices' correlation (1 is "payload")


def torch_uuid(ids, rank: int, kind: int, index: int) -> int:
    """Track uuid of a torch track of `rank`: kind 1 = CPU thread, 2 = CUDA stream; `index` its
    position. Inside the rank's id space, at block ids no kernel reaches (the top of the block range)."""
    top = (1 << (ids.rank_shift - ids.warp_bits)) - 2 - (kind - 1) * 4096 - index
    return int(ids.block(rank, top))


def _tracks(rt) -> tuple[list, list]:
    ev = rt.events
    host = ev[ev["kind"].isin(HOST_KINDS)]
    gpu = ev[ev["kind"].isin(GPU_KINDS)]
    threads = sorted({(int(p), int(t)) for p, t in zip(host["pid"], host["tid"])})
    streams = sorted({int(s) for s in gpu["tid"]})
    return threads, streams


def write_tracks(f, P, ids, merged, base: int, desc) -> None:
    """Track descriptors of every merged rank's threads and streams (under the rank's process)."""
    for r, rt in sorted(merged.ranks.items()):
        threads, streams = _tracks(rt)
        for i, (pid, tid) in enumerate(threads):
            desc(uuid=torch_uuid(ids, r, 1, i), parent_uuid=int(ids.rank(r)), name=f"CPU thread {tid} (pid {pid})",
                 sibling_order_rank=-1000 + i)
        for i, s in enumerate(streams):
            desc(uuid=torch_uuid(ids, r, 2, i), parent_uuid=int(ids.rank(r)), name=f"CUDA stream {s}",
                 sibling_order_rank=-500 + i)


def _slices(rt, ids, r: int, joined_names: dict) -> pd.DataFrame:
    """[uuid, begin, end, name, corr] of one rank's torch events on its tracks."""
    ev = rt.events
    threads, streams = _tracks(rt)
    th = {k: torch_uuid(ids, r, 1, i) for i, k in enumerate(threads)}
    st = {k: torch_uuid(ids, r, 2, i) for i, k in enumerate(streams)}
    host = ev[ev["kind"].isin(HOST_KINDS)]
    gpu = ev[ev["kind"].isin(GPU_KINDS)]
    names_h = host["name"].astype(str).to_numpy()
    names_g = gpu["name"].astype(str).to_numpy()
    corr_g = gpu["correlation"].to_numpy()
    # an instrumented kernel is named by its launch: "dispatch (launch 12) · <CUDA name>"
    names_g = np.array([joined_names.get(int(c), n) for c, n in zip(corr_g, names_g)], dtype=object)
    out = pd.DataFrame({
        "uuid": np.r_[[th[(int(p), int(t))] for p, t in zip(host["pid"], host["tid"])],
                      [st[int(s)] for s in gpu["tid"]]].astype(np.uint64),
        "begin": np.r_[host["begin_ns"].to_numpy(), gpu["begin_ns"].to_numpy()].astype(np.int64),
        "end": np.r_[host["end_ns"].to_numpy(), gpu["end_ns"].to_numpy()].astype(np.int64),
        "name": [str(n) for n in np.r_[names_h, names_g]], "corr": np.r_[host["correlation"].to_numpy(), corr_g].astype(np.int64)})
    return out


def _ordered(s: pd.DataFrame) -> pd.DataFrame:
    """BEGIN/END/INSTANT rows of the slices in an order the sorter keeps nested (module docstring)."""
    zero = s["end"] <= s["begin"]
    # (callables: assigning a Series to an empty frame would give it the Series' rows)
    inst = s[zero].assign(ts=lambda d: d["begin"], typ=3, k1=1, k2=0)
    rng = s[~zero]
    b = rng.assign(ts=lambda d: d["begin"], typ=1, k1=1, k2=lambda d: -(d["end"] - d["begin"]))
    e = rng.assign(ts=lambda d: d["end"], typ=2, k1=0, k2=lambda d: -d["begin"])
    allr = pd.concat([b, e, inst], ignore_index=True)
    return allr.sort_values(["ts", "k1", "k2"], kind="stable")


def write_slices(f, P, ids, merged, base: int, intern, names: dict, seq: int, frame, encode_events) -> None:
    """Every merged rank's torch slices (perfetto_export's vectorised `encode_events`; `frame`: its
    packet framing; both passed in: this module is perfetto_export's, one floor up)."""
    pk = P.TracePacket(trusted_packet_sequence_id=seq, sequence_flags=P.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE)
    pk.interned_data.debug_annotation_names.add(iid=CORRELATION_IID, name="correlation")
    f.write(frame(pk))
    for r, rt in sorted(merged.ranks.items()):
        j = rt.joined
        joined_names = {int(c): f"epscope launch {int(la)} · {n}" for c, la, n in
                        zip(j["correlation"], j["launch"], j["kernel_name"])}
        s = _ordered(_slices(rt, ids, r, joined_names))
        if s.empty:
            continue
        intern(list(dict.fromkeys(s["name"])))
        iid = np.array([names[n] for n in s["name"]], np.uint64)
        f.write(encode_events(s["ts"].to_numpy(np.int64) + np.int64(base), s["typ"].to_numpy(np.int64),
                              s["uuid"].to_numpy(np.uint64), iid, np.maximum(s["corr"].to_numpy(np.int64), 0),
                              da_iid=CORRELATION_IID, seq=seq))


def wait_flows(run) -> pd.DataFrame:
    """[src_rank, src_block, src_warp, src_t, dst_rank, dst_block, dst_warp, dst_t] of every
    released wait (the graph's wait edges: sender's release -> receiver's wait end)."""
    from ..analysis import graph as G
    from ..analysis.intervals import WAIT
    g = G.build(run.events, run.manifest.get("registry"), run.launches)
    p = np.flatnonzero((g.src >= 0) & (g.seg_kind == WAIT))
    L = g.lane
    sl, dl = g.pt_lane[g.src[p]], g.pt_lane[p]
    return pd.DataFrame({"src_rank": L["rank"].to_numpy()[sl], "src_block": L["block"].to_numpy()[sl],
                         "src_warp": L["warp"].to_numpy()[sl], "src_t": g.rel_t[p],
                         "dst_rank": L["rank"].to_numpy()[dl], "dst_block": L["block"].to_numpy()[dl],
                         "dst_warp": L["warp"].to_numpy()[dl], "dst_t": g.pt_t[p]})


def write_flows(f, P, ids, flows: pd.DataFrame, base: int, intern, names: dict, seq: int, frame) -> None:
    """One flow per wait edge: an instant 'send' on the sender's warp, 'received' on the receiver's."""
    if flows.empty:
        return
    intern(["send", "received"])
    chunks = []
    rows = flows.sort_values("src_t", kind="stable").reset_index(drop=True)
    for i, r in enumerate(rows.itertuples(index=False)):
        fid = FLOW_BASE + i
        for t, rank, block, warp, name, start in ((r.src_t, r.src_rank, r.src_block, r.src_warp, "send", True),
                                                  (r.dst_t, r.dst_rank, r.dst_block, r.dst_warp, "received", False)):
            pk = P.TracePacket(timestamp=int(t) + base, trusted_packet_sequence_id=seq,
                               sequence_flags=P.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE)
            te = pk.track_event
            te.type = P.TrackEvent.TYPE_INSTANT
            te.track_uuid = int(ids.warp(int(rank), int(block), int(warp)))
            te.name_iid = names[name]
            (te.flow_ids if start else te.terminating_flow_ids).append(fid)
            chunks.append(frame(pk))
    f.write(b"".join(chunks))
