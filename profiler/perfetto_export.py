"""Event table -> native Perfetto protobuf trace, streamed from parquet batches to disk.

A Perfetto trace file is a `Trace` message: a sequence of field-1 length-delimited TracePackets,
so the file is written packet by packet and never held in memory. Layout of the trace:

  process track "rank N" (pid N)                 one per rank; description = clock uncertainty
    ├─ "kernels"                                 one slice per launch (gpu_begin..gpu_end)
    ├─ "host"                                    host spans (kind 'host' rows)
    └─ "block B (SM S)"                          one per (rank, block), ordered by block
         └─ "warp W · role"                      slices per span, instants, barrier events

Descriptors, interned names, launches and barrier events (which carry flow ids) are built with
perfetto_trace_pb2 messages. The bulk (span / instant / host rows) is encoded by vectorised
numpy varint code: the python protobuf runtime costs ~2.8 us a packet on the dev machine (two
packets per slice: 180 k slices/s), far below the 500 k slices/s target; the encoded bytes are
checked against perfetto_trace_pb2 parsing in tests/profiler/test_perfetto.py.

Ordering. Rows arrive in record order per warp (a parent's BEGIN before its child's), and each
span is written as its BEGIN packet immediately followed by its END packet. Perfetto sorts
packets by timestamp keeping file order for equal timestamps, which then nests spans correctly,
including zero-length spans and spans that start or end on the same 32 ns tick.

Flows: for every barrier occurrence (rank, launch, barrier, occurrence; for scope = "rank"
barriers the rank is left out so the occurrence spans ranks) the last arriver's arrive event
starts one flow to each departing warp's depart event.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd

from .runstore import TRACE, Run, iter_event_batches, load_run
from .schema import EVENT_KINDS

SEQ_ID = 1
_K = {k: i for i, k in enumerate(EVENT_KINDS)}
BATCH_ROWS = 262_144  # ~25 MB of encoding scratch per batch (measured in bench_profiler.py)


def _pb():
    # imported lazily: the GPU machine has no perfetto package and imports runstore
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as P
    return P


# -- vectorised protobuf encoding ----------------------------------------------------------------
def _varint(v: np.ndarray, present: np.ndarray | None = None):
    """(bytes matrix (n, w), valid mask (n, w), encoded length (n,)) of unsigned varints."""
    v = np.asarray(v).astype(np.uint64)
    n = len(v)
    nb = np.ones(n, np.int64)
    for k in range(1, 10):
        nb += v >= np.uint64(1 << (7 * k))
    w = int(nb.max()) if n else 1
    mat = np.empty((n, w), np.uint8)
    for k in range(w):
        b = ((v >> np.uint64(7 * k)) & np.uint64(0x7F)).astype(np.uint8)
        mat[:, k] = b | ((nb > k + 1).astype(np.uint8) << 7)
    mask = np.arange(w)[None, :] < nb[:, None]
    if present is not None:
        mask &= present[:, None]
        nb = np.where(present, nb, 0)
    return mat, mask, nb


def _const(b: int, n: int, present: np.ndarray | None = None):
    mat = np.full((n, 1), b, np.uint8)
    mask = np.ones((n, 1), bool) if present is None else present[:, None].copy()
    return mat, mask, (np.ones(n, np.int64) if present is None else present.astype(np.int64))


def _assemble(pieces) -> bytes:
    mats = np.hstack([p[0] for p in pieces])
    mask = np.hstack([p[1] for p in pieces])
    return mats[mask].tobytes()


def _tag(field: int, wire: int) -> int:
    t = (field << 3) | wire
    assert t < 128
    return t


def encode_events(ts, typ, uuid, name_iid, payload, da_iid: int, seq: int = SEQ_ID) -> bytes:
    """Length-delimited Trace.packet entries for TrackEvents, one per element.

    typ: 1 SLICE_BEGIN, 2 SLICE_END, 3 INSTANT. BEGIN and INSTANT carry name_iid and a
    debug annotation (name iid da_iid) with the int payload; END carries neither.
    """
    n = len(ts)
    named = typ != 2
    pl = np.asarray(payload).astype(np.int64).view(np.uint64)  # int64 two's complement, as protobuf
    t_type = _const(_tag(9, 0), n), _varint(typ)
    t_uuid = _const(_tag(11, 0), n), _varint(uuid)
    t_name = _const(_tag(10, 0), n, named), _varint(name_iid, named)
    da_name = _const(_tag(1, 0), n), _varint(np.full(n, da_iid))
    da_val = _const(_tag(4, 0), n), _varint(pl)
    da_len = sum(p[2] for p in (*da_name, *da_val))
    da_len_v = _varint(da_len, named)
    da_name = tuple((m, k & named[:, None], np.where(named, l, 0)) for m, k, l in da_name)
    da_val = tuple((m, k & named[:, None], np.where(named, l, 0)) for m, k, l in da_val)
    t_da = (_const(_tag(4, 2), n, named), da_len_v, *da_name, *da_val)
    body = (*t_type, *t_uuid, *t_name, *t_da)
    te_len = sum(p[2] for p in body)
    te_len_v = _varint(te_len)
    head = (_const(_tag(8, 0), n), _varint(ts), _const(_tag(11, 2), n), te_len_v)
    tail = (_const(_tag(10, 0), n), _varint(np.full(n, seq)), _const(_tag(13, 0), n), _varint(np.full(n, 2)))
    pkt = (*head, *body, *tail)
    pkt_len = sum(p[2] for p in pkt)
    return _assemble((_const(_tag(1, 2), n), _varint(pkt_len), *pkt))


def _frame(msg) -> bytes:
    """One Trace.packet entry (tag, varint length, bytes) for a pb2 TracePacket."""
    data = msg.SerializeToString()
    n = len(data)
    out = bytearray([0x0A])
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            break
    return bytes(out) + data


# -- track ids ---------------------------------------------------------------------------------------
def rank_uuid(rank):
    return (np.asarray(rank, np.uint64) + np.uint64(1)) << np.uint64(40)


def host_uuid(rank):
    return rank_uuid(rank) | np.uint64(1)


def kernels_uuid(rank):
    return rank_uuid(rank) | np.uint64(2)


def block_uuid(rank, block):
    return rank_uuid(rank) | ((np.asarray(block).astype(np.uint64) + np.uint64(1)) << np.uint64(8))


def warp_uuid(rank, block, warp):
    return block_uuid(rank, block) | (np.asarray(warp).astype(np.uint64) + np.uint64(1))


# -- the export ----------------------------------------------------------------------------------
def _kind_codes(s: pd.Series) -> np.ndarray:
    cats = s.cat.categories
    lut = np.array([_K[str(c)] for c in cats] or [0], np.int8)
    return lut[s.cat.codes.to_numpy()]


def _scan(path: Path, barrier_scope: dict[str, str]):
    """Pass 1: time base, tracks (with their SMs and roles), barrier events for the flows."""
    tmin = None
    tracks: dict[tuple[int, int, int], tuple[set, set]] = {}
    host_ranks: set[int] = set()
    bars = []
    row0 = 0
    cols = ["rank", "launch", "block", "warp", "sm", "role", "kind", "phase", "begin_ns", "payload"]
    for df in iter_event_batches(path, BATCH_ROWS, columns=cols):
        k = _kind_codes(df["kind"])
        if len(df):
            m = int(df["begin_ns"].min())
            tmin = m if tmin is None else min(tmin, m)
        is_host = k == _K["host"]
        host_ranks.update(np.unique(df["rank"].to_numpy()[is_host]).tolist())
        t = df.loc[~is_host, ["rank", "block", "warp", "sm", "role"]].drop_duplicates()
        for r, b, w, sm, role in t.itertuples(index=False):
            e = tracks.setdefault((int(r), int(b), int(w)), (set(), set()))
            e[0].add(int(sm))
            if isinstance(role, str) and role:
                e[1].add(role)
        isb = (k == _K["arrive"]) | (k == _K["depart"])
        if isb.any():
            b = df.loc[isb, ["rank", "launch", "block", "warp", "phase", "payload", "begin_ns"]].copy()
            b["phase"] = b["phase"].astype(str)
            b["arrive"] = k[isb] == _K["arrive"]
            b["row"] = np.flatnonzero(isb) + row0
            bars.append(b)
        row0 += len(df)
    flows: dict[int, list[int]] = {}
    term: dict[int, int] = {}
    if bars:
        b = pd.concat(bars, ignore_index=True)
        cross = b["phase"].map(lambda p: barrier_scope.get(p) == "rank").to_numpy()
        b["grp_rank"] = np.where(cross, -1, b["rank"].to_numpy())
        keys = ["grp_rank", "launch", "phase", "payload"]
        arr = b[b["arrive"]].sort_values(["begin_ns", "row"]).groupby(keys, sort=False).tail(1)
        dep = b[~b["arrive"]].merge(arr[keys + ["row", "rank", "block", "warp"]], on=keys, suffixes=("", "_last"))
        dep = dep[(dep["rank"] != dep["rank_last"]) | (dep["block"] != dep["block_last"]) | (dep["warp"] != dep["warp_last"])]
        for last, rows in dep.groupby("row_last")["row"]:
            flows[int(last)] = (rows.to_numpy() + 1).tolist()
        term = {int(r): int(r) + 1 for r in dep["row"].to_numpy()}
    return tmin, tracks, host_ranks, flows, term


def export_perfetto(run_or_path, out_path=None) -> Path:
    """Write the run's Perfetto trace (default RUN/trace.perfetto-trace); returns its path."""
    P = _pb()
    run = run_or_path if isinstance(run_or_path, Run) else load_run(run_or_path)
    out = Path(out_path) if out_path is not None else run.path / TRACE
    scope = {b["name"]: b.get("scope", "grid") for reg in run.manifest.get("registry", {}).values()
             if isinstance(reg, dict) for b in reg.get("barriers", [])}
    tmin, tracks, host_ranks, flows, term = _scan(run.path, scope)
    launches = run.launches
    lmins = [int(x) for x in (launches["gpu_begin_ns"][launches["gpu_begin_ns"] >= 0].min(),) if pd.notna(x)] \
        if len(launches) else []
    base_min = min([v for v in [tmin, *lmins] if v is not None] or [0])
    base = -base_min if base_min < 0 else 0
    names: dict[str, int] = {}
    ranks = sorted({r for r, _, _ in tracks} | host_ranks | set(launches["rank"].astype(int).tolist()))
    unc = {int(r["rank"]): r.get("uncertainty_ns") for r in run.manifest.get("clock", {}).get("ranks", [])}

    tmp = out.with_name(out.name + ".tmp")
    with open(tmp, "wb") as f:
        # first packet of the sequence: clears incremental state, interns the debug annotation name
        first = P.TracePacket(trusted_packet_sequence_id=SEQ_ID, first_packet_on_sequence=True,
                              sequence_flags=P.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED)
        first.interned_data.debug_annotation_names.add(iid=1, name="payload")
        f.write(_frame(first))

        def intern(new: list[str]) -> None:
            todo = [s for s in dict.fromkeys(new) if s not in names]
            if not todo:
                return
            pk = P.TracePacket(trusted_packet_sequence_id=SEQ_ID, sequence_flags=P.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE)
            for s in todo:
                names[s] = len(names) + 1
                pk.interned_data.event_names.add(iid=names[s], name=s)
            f.write(_frame(pk))

        def desc(**kw) -> None:
            pk = P.TracePacket()
            pk.track_descriptor.CopyFrom(P.TrackDescriptor(**kw))
            f.write(_frame(pk))

        explicit = P.TrackDescriptor.ChildTracksOrdering.Value("EXPLICIT")
        for r in ranks:
            u = unc.get(r)
            pd_ = P.ProcessDescriptor(pid=r + 1, process_name=f"rank {r}")
            extra = {"description": f"clock uncertainty ±{u:.0f} ns vs rank 0"} if u is not None else {}
            desc(uuid=int(rank_uuid(r)), process=pd_, child_ordering=explicit, **extra)
            desc(uuid=int(kernels_uuid(r)), parent_uuid=int(rank_uuid(r)), name="kernels", sibling_order_rank=-2)
            if r in host_ranks:
                desc(uuid=int(host_uuid(r)), parent_uuid=int(rank_uuid(r)), name="host", sibling_order_rank=-1)
        blocks: dict[tuple[int, int], set] = {}
        for (r, b, w), (sms, _) in tracks.items():
            blocks.setdefault((r, b), set()).update(sms)
        for (r, b), sms in sorted(blocks.items()):
            sm = ", ".join(str(s) for s in sorted(sms))
            desc(uuid=int(block_uuid(r, b)), parent_uuid=int(rank_uuid(r)), name=f"block {b} (SM{'s' if len(sms) > 1 else ''} {sm})",
                 sibling_order_rank=b, child_ordering=explicit)
        for (r, b, w), (_, roles) in sorted(tracks.items()):
            if w > 254:
                raise ValueError(f"warp index {w} > 254 does not fit the track id scheme")
            role = "/".join(sorted(roles))
            desc(uuid=int(warp_uuid(r, b, w)), parent_uuid=int(block_uuid(r, b)),
                 name=f"warp {w}" + (f" · {role}" if role else ""), sibling_order_rank=w)

        # launches on the kernels track
        if len(launches):
            intern(sorted(set(launches["kernel"].astype(str))))
            for l in launches.itertuples(index=False):
                if l.gpu_begin_ns < 0:
                    continue
                u = int(kernels_uuid(l.rank))
                b = P.TracePacket(timestamp=int(l.gpu_begin_ns) + base, trusted_packet_sequence_id=SEQ_ID,
                                  sequence_flags=P.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE)
                b.track_event.type = P.TrackEvent.TYPE_SLICE_BEGIN
                b.track_event.track_uuid = u
                b.track_event.name_iid = names[str(l.kernel)]
                for k, v in (("launch", l.launch), ("iteration", l.iteration), ("dropped", l.dropped)):
                    b.track_event.debug_annotations.add(name=k, int_value=int(v))
                e = P.TracePacket(timestamp=int(max(l.gpu_end_ns, l.gpu_begin_ns)) + base, trusted_packet_sequence_id=SEQ_ID,
                                  sequence_flags=P.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE)
                e.track_event.type = P.TrackEvent.TYPE_SLICE_END
                e.track_event.track_uuid = u
                f.write(_frame(b) + _frame(e))

        row0 = 0
        for df in iter_event_batches(run.path, BATCH_ROWS):
            _write_batch(f, P, df, row0, base, names, intern, flows, term)
            row0 += len(df)
    os.replace(tmp, out)
    return out


def _write_batch(f, P, df: pd.DataFrame, row0: int, base: int, names, intern, flows, term) -> None:
    k = _kind_codes(df["kind"])
    pcats = [str(c) for c in df["phase"].cat.categories]
    intern(pcats)
    pcode = df["phase"].cat.codes.to_numpy()
    iid_lut = np.array([names[c] for c in pcats] or [0], np.uint64)
    rank = df["rank"].to_numpy()
    is_host = k == _K["host"]
    uuid = np.where(is_host, host_uuid(rank), warp_uuid(rank, df["block"].to_numpy(), df["warp"].to_numpy()))
    begin = df["begin_ns"].to_numpy() + base
    end = np.maximum(df["end_ns"].to_numpy() + base, begin)
    payload = df["payload"].to_numpy()

    vec = np.flatnonzero((k == _K["span"]) | (k == _K["instant"]) | is_host)
    if len(vec):
        two = k[vec] != _K["instant"]
        npk = np.where(two, 2, 1)
        at = np.cumsum(npk) - npk  # first packet of each row
        tot = int(npk.sum())
        ts = np.empty(tot, np.int64)
        typ = np.empty(tot, np.int64)
        src = np.empty(tot, np.int64)
        ts[at], typ[at], src[at] = begin[vec], np.where(two, 1, 3), vec
        e_at = at[two] + 1
        ts[e_at], typ[e_at], src[e_at] = end[vec[two]], 2, vec[two]
        f.write(encode_events(ts, typ, uuid[src], iid_lut[pcode[src]], payload[src], da_iid=1))

    bar = np.flatnonzero((k == _K["arrive"]) | (k == _K["depart"]))
    if len(bar):
        intern([f"{c} arrive" for c in pcats] + [f"{c} depart" for c in pcats])
        chunks = []
        for i in bar:
            g = row0 + int(i)
            word = "arrive" if k[i] == _K["arrive"] else "depart"
            pk = P.TracePacket(timestamp=int(begin[i]), trusted_packet_sequence_id=SEQ_ID,
                               sequence_flags=P.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE)
            te = pk.track_event
            te.type = P.TrackEvent.TYPE_INSTANT
            te.track_uuid = int(uuid[i])
            te.name_iid = names[f"{pcats[pcode[i]]} {word}"]
            te.debug_annotations.add(name_iid=1, int_value=int(payload[i]))
            if g in flows:
                te.flow_ids.extend(flows[g])
            if g in term:
                te.terminating_flow_ids.append(term[g])
            chunks.append(_frame(pk))
        f.write(b"".join(chunks))
