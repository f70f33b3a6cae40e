"""Event table -> native Perfetto protobuf trace, streamed from parquet batches to disk.

A Perfetto trace file is a `Trace` message: a sequence of field-1 length-delimited TracePackets,
so the file is written packet by packet and never held in memory. Layout of the trace:

  process track "rank N" (pid N+1: Perfetto reads pid 0 as the idle task); description = clock uncertainty
    ├─ "kernels"                                 one slice per launch (gpu_begin..gpu_end)
    ├─ "host"                                    host spans (kind 'host' rows)
    └─ "block B (SM S)"                          one per (rank, block), ordered by block
         └─ "warp W · role"                      slices per span, instants, barrier events

Descriptors, interned names, launches and the last arriver of each barrier occurrence (which
carries a list of flow ids) are built with perfetto_trace_pb2 messages. Every other row (spans,
instants, host spans, barrier events) is encoded by vectorised numpy code, a block of
same-sized packets at a time (`encode_events`): the Python protobuf runtime (upb) costs ~2.8 us
a packet on the dev machine (100 k packets timed; two packets a slice: 180 k slices/s). The
encoded bytes are checked against perfetto_trace_pb2 parsing in tests/profiler/test_perfetto.py.

Ordering. Rows arrive in record order per warp (a parent's BEGIN before its child's), and each
span is written as its BEGIN packet immediately followed by its END packet. Perfetto's
TraceSorter orders events by (timestamp, allocation id), and allocation ids grow in file order
(google/perfetto src/trace_processor/sorter/trace_sorter.h), so equal timestamps keep file order;
that nests spans correctly, including zero-length spans and spans that start or end on the same
32 ns tick. tests/profiler/test_perfetto.py replays exports that way.

Reading: the rows come from profiler.store.runreader's validated batches (checksum, then every column
checked as `load_run(...).events` checks it), so export accepts exactly the runs load_run
accepts. Writing: into an exclusive, locked temporary beside the output (profiler.store.atomic),
placed in one rename; an existing output is replaced only when asked (force, or the run's own
derived trace) and only when it is a regular file. The same run exports the same bytes (no
clock, no random id, no hash-ordered iteration reaches the file: tests/profiler/test_perfetto.py
exports in two processes with different hash seeds).

Flows: for every barrier occurrence (rank, launch, barrier, occurrence; for scope = "rank"
barriers the rank is left out so the occurrence spans ranks) the last arriver's arrive event
starts one flow to each departing warp's depart event.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd

from ..store.atomic import TempFile, clean_leftovers
from ..store.runreader import TRACE, Run, check_events, iter_event_batches, load_run
from ..store.schema import EVENT_KINDS

SEQ_ID = 1
OPEN_SUFFIX = "(no END)"  # slice name suffix of open spans
_K = {k: i for i, k in enumerate(EVENT_KINDS)}
# Rows per parquet batch: the export's peak RSS is ~0.4 GB whatever the run size at this batch
# size (1 M and 10 M slices: benchmarks/results/profiler-cpu-*.md).
BATCH_ROWS = 262_144
# Rows encoded at once (two packets a span): ~150 bytes of temporaries a row, a few MB.
WRITE_ROWS = 16_384


def _pb():
    # imported lazily: the GPU machine has no perfetto package and imports runstore
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as P
    return P


# -- vectorised protobuf encoding ----------------------------------------------------------------
# Packets of one shape (BEGIN/INSTANT with their name and payload, END, either with a terminating
# flow) are built as a (rows, bytes) uint8 block, one column per byte: every varint of a field is
# written at the width of the field's largest value in the block, its upper bytes redundant
# (0x80 continuations). Protobuf parsers accept that (protozero's ParseVarInt reads up to 10
# bytes; Perfetto's own writer pads message lengths so: WriteRedundantVarInt), and it makes all
# packets of a shape the same size: no per-row offsets, no scatter. The trace grows by the
# padding (~1 byte a packet: bench_profiler.py reports bytes a slice).
ENCODE_ROWS = 1 << 15  # packets encoded at once: ~2.5 MB of temporaries


def _tag(field: int, wire: int) -> int:
    t = (field << 3) | wire
    assert t < 128
    return t


def _tag_bytes(field: int, wire: int) -> bytes:
    t, out = (field << 3) | wire, bytearray()
    while True:
        out.append((t & 0x7F) | (0x80 if t >= 0x80 else 0))
        t >>= 7
        if not t:
            return bytes(out)


def _width(v: np.ndarray) -> int:
    """Bytes of the varint of the largest value (at least 1)."""
    return max(1, (int(v.max()).bit_length() + 6) // 7) if len(v) else 1


class _Columns:
    """The byte columns of one packet shape: constants or (rows,) uint8 arrays."""

    def __init__(self):
        self.cols: list = []

    def const(self, data: bytes) -> "_Columns":
        self.cols += list(data)
        return self

    def varint(self, v: np.ndarray, width: int) -> "_Columns":
        for k in range(width):
            b = (v >> np.uint64(7 * k)).astype(np.uint8) & np.uint8(0x7F)
            if k + 1 < width:
                b |= np.uint8(0x80)
            self.cols.append(b)
        return self

    def fixed64(self, v: np.ndarray) -> "_Columns":
        self.cols += [(v >> np.uint64(8 * k)).astype(np.uint8) for k in range(8)]
        return self

    def __len__(self) -> int:
        return len(self.cols)

    def block(self, n: int) -> np.ndarray:
        out = np.empty((n, len(self.cols)), np.uint8)
        for j, c in enumerate(self.cols):
            out[:, j] = c
        return out


def _shape_block(ts, typ, uuid, name_iid, pl, term, named: bool, da_iid: int, seq: int) -> np.ndarray:
    """Framed TracePackets (Trace.packet entries) of one shape as a (rows, bytes) block."""
    te = _Columns().const(bytes([_tag(9, 0)]))
    if named:
        te.cols.append(typ.astype(np.uint8))
    else:
        te.const(bytes([2]))
    te.const(bytes([_tag(11, 0)])).varint(uuid, _width(uuid))
    if named:
        wp = _width(pl)
        te.const(bytes([_tag(10, 0)])).varint(name_iid, _width(name_iid))
        te.const(bytes([_tag(4, 2), 3 + wp, _tag(1, 0), da_iid, _tag(4, 0)])).varint(pl, wp)
    if term is not None:  # terminating_flow_ids: fixed64
        te.const(_tag_bytes(48, 1)).fixed64(term)
    pkt = _Columns().const(bytes([_tag(8, 0)])).varint(ts, _width(ts)).const(bytes([_tag(11, 2), len(te)]))
    pkt.cols += te.cols
    pkt.const(bytes([_tag(10, 0), seq, _tag(13, 0), 2]))  # sequence id, SEQ_NEEDS_INCREMENTAL_STATE
    assert len(te) < 128 and len(pkt) < 128, "one-byte lengths"
    frame = _Columns().const(bytes([_tag(1, 2), len(pkt)]))
    frame.cols += pkt.cols
    return frame.block(len(ts))


def _encode_spans(ts, typ, uuid, name_iid, pl, da_iid: int, seq: int) -> bytes | None:
    """The usual rows: each END right after its BEGIN, instants between spans. A span's two
    packets side by side are one fixed-size unit, so runs of spans and runs of instants are
    contiguous bytes; None when the rows are not so (or the runs are too short to pay)."""
    ends = np.flatnonzero(typ == 2)
    begins = ends - 1
    inst = np.flatnonzero(typ == 3)
    if 2 * len(ends) + len(inst) != len(typ) or (len(ends) and (begins[0] < 0 or (typ[begins] != 1).any())):
        return None
    if len(inst) > len(typ) // 16:
        return None
    spans = np.hstack([_shape_block(ts[begins], typ[begins], uuid[begins], name_iid[begins], pl[begins], None, True, da_iid, seq),
                       _shape_block(ts[ends], typ[ends], uuid[ends], name_iid[ends], pl[ends], None, False, da_iid, seq)])
    if not len(inst):
        return spans.tobytes()
    inst_b = _shape_block(ts[inst], typ[inst], uuid[inst], name_iid[inst], pl[inst], None, True, da_iid, seq)
    # unit order: instants and span starts by row; runs of one kind are contiguous in their block
    span_unit = np.zeros(len(typ), bool)
    span_unit[begins] = True
    kinds = span_unit[np.sort(np.concatenate([begins, inst]))]
    cut = np.flatnonzero(kinds[1:] != kinds[:-1]) + 1
    bounds = [0, *cut.tolist(), len(kinds)]
    sb, ib = spans.reshape(-1).data, inst_b.reshape(-1).data
    us, ui = spans.shape[1], inst_b.shape[1]
    parts, si, ii = [], 0, 0
    for a, b in zip(bounds[:-1], bounds[1:]):
        k = b - a
        if kinds[a]:
            parts.append(sb[si * us:(si + k) * us])
            si += k
        else:
            parts.append(ib[ii * ui:(ii + k) * ui])
            ii += k
    return b"".join(parts)


def _encode(ts, typ, uuid, name_iid, pl, tf, da_iid: int, seq: int) -> bytes:
    """Rows of every shape into one (rows, widest) block, then the padding of the shorter rows
    squeezed out with one boolean mask (two bytes of temporaries per byte written); spans with
    few instants between them take the faster `_encode_spans`."""
    if tf is None or not tf.any():
        out = _encode_spans(ts, typ, uuid, name_iid, pl, da_iid, seq)
        if out is not None:
            return out
    named = typ != 2
    has_term = np.zeros(len(ts), bool) if tf is None else tf != 0
    shape = named.astype(np.int8) * 2 + has_term
    parts = []
    for sh in np.unique(shape).tolist():
        idx = np.flatnonzero(shape == sh)
        parts.append((idx, _shape_block(ts[idx], typ[idx], uuid[idx], name_iid[idx], pl[idx],
                                        tf[idx] if sh & 1 else None, bool(sh & 2), da_iid, seq)))
    if len(parts) == 1:
        return parts[0][1].tobytes()
    widest = max(b.shape[1] for _, b in parts)
    rows = np.empty((len(ts), widest), np.uint8)
    sizes = np.empty(len(ts), np.int16)
    for idx, b in parts:
        rows[idx, :b.shape[1]] = b
        sizes[idx] = b.shape[1]
    return rows[np.arange(widest, dtype=np.int16) < sizes[:, None]].tobytes()


def encode_events(ts, typ, uuid, name_iid, payload, da_iid: int, seq: int = SEQ_ID, term_flow=None) -> bytes:
    """Length-delimited Trace.packet entries for TrackEvents, one per element, in order.

    typ: 1 SLICE_BEGIN, 2 SLICE_END, 3 INSTANT. BEGIN and INSTANT carry name_iid and a
    debug annotation (name iid da_iid) with the int payload; END carries neither. term_flow:
    optional uint64 per row, nonzero = one terminating_flow_ids entry (fixed64, field 48).
    """
    assert 0 < da_iid < 128 and 0 < seq < 128
    typ = np.asarray(typ)
    ts = np.asarray(ts).astype(np.uint64)
    uuid, iid = np.asarray(uuid).astype(np.uint64), np.asarray(name_iid).astype(np.uint64)
    pl = np.asarray(payload).astype(np.int64).view(np.uint64)  # int64 two's complement, as protobuf
    tf = None if term_flow is None else np.asarray(term_flow).astype(np.uint64)
    parts = []
    for a in range(0, len(typ), ENCODE_ROWS):
        s = slice(a, a + ENCODE_ROWS)
        parts.append(_encode(ts[s], typ[s], uuid[s], iid[s], pl[s], None if tf is None else tf[s], da_iid, seq))
    return b"".join(parts)


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
# uuid = (rank+1) << rank_shift | (block+1) << warp_bits | (warp+1). The compact layout (warp_bits
# 6, rank_shift 24) makes short varints (4 bytes for 8 ranks) in every packet and holds every
# real kernel (warps per block <= 32 on NVIDIA GPUs, blocks < 2^18 - 1); a run with larger ids
# (any the schema allows: int16 warps, int32 blocks) gets the wide layout (16, 48), 8-byte
# varints, instead of an error: export accepts every run load_run accepts. Host and kernel
# tracks are rank | 1 and rank | 2: no warp track collides with them, since GPU rows have
# block >= 0 (profiler.store.schema).
@dataclass(frozen=True)
class TrackIds:
    warp_bits: int
    rank_shift: int

    def fits(self, block: int, warp: int) -> bool:
        return 0 <= warp < (1 << self.warp_bits) - 1 and 0 <= block < (1 << (self.rank_shift - self.warp_bits)) - 1

    def rank(self, rank):
        return (np.asarray(rank).astype(np.uint64) + np.uint64(1)) << np.uint64(self.rank_shift)

    def host(self, rank):
        return self.rank(rank) | np.uint64(1)

    def kernels(self, rank):
        return self.rank(rank) | np.uint64(2)

    def block(self, rank, block):
        return self.rank(rank) | ((np.asarray(block).astype(np.uint64) + np.uint64(1)) << np.uint64(self.warp_bits))

    def warp(self, rank, block, warp):
        return self.block(rank, block) | (np.asarray(warp).astype(np.uint64) + np.uint64(1))


COMPACT, WIDE = TrackIds(6, 24), TrackIds(16, 48)
rank_uuid, host_uuid, kernels_uuid, block_uuid, warp_uuid = (COMPACT.rank, COMPACT.host, COMPACT.kernels,
                                                             COMPACT.block, COMPACT.warp)


# -- the export ----------------------------------------------------------------------------------
def _batches(run: Run, columns: list[str]):
    """Stream the run's events, validated, as {column: numpy array}; categorical columns as
    (codes, categories)."""
    for df in iter_event_batches(run, BATCH_ROWS):
        out = {}
        for name in columns:
            s = df[name]
            if isinstance(s.dtype, pd.CategoricalDtype):
                out[name] = (s.cat.codes.to_numpy(), [str(x) for x in s.cat.categories])
            else:
                out[name] = s.to_numpy()
        yield len(df), out


def _kind_codes(col) -> np.ndarray:
    codes, cats = col
    lut = np.array([_K[c] for c in cats] or [0], np.int8)
    return lut[codes]


def _scan(run: Run, barrier_scope: dict[str, str]):
    """Pass 1: time base, tracks (with their SMs and roles), barrier events for the flows."""
    tmin = None
    tracks: dict[tuple[int, int, int], tuple[set, set]] = {}
    host_ranks: set[int] = set()
    bars = []
    row0 = 0
    cols = ["rank", "launch", "block", "warp", "sm", "role", "kind", "phase", "begin_ns", "payload"]
    for n, c in _batches(run, cols):
        k = _kind_codes(c["kind"])
        if n:
            m = int(c["begin_ns"].min())
            tmin = m if tmin is None else min(tmin, m)
        is_host = k == _K["host"]
        host_ranks.update(np.unique(c["rank"][is_host]).tolist())
        # rows come grouped by warp: only rows where (rank, block, warp, sm, role) changes are new
        r, b, w, sm, role = c["rank"], c["block"], c["warp"], c["sm"], c["role"][0]
        change = np.ones(n, bool)
        if n > 1:
            change[1:] = (r[1:] != r[:-1]) | (b[1:] != b[:-1]) | (w[1:] != w[:-1]) | (sm[1:] != sm[:-1]) | (role[1:] != role[:-1])
        rcats = c["role"][1]
        seen = set()
        for i in np.flatnonzero(change & ~is_host).tolist():
            key = (int(r[i]), int(b[i]), int(w[i]), int(sm[i]), int(role[i]))
            if key in seen:
                continue
            seen.add(key)
            e = tracks.setdefault(key[:3], (set(), set()))
            e[0].add(key[3])
            if rcats[key[4]]:
                e[1].add(rcats[key[4]])
        isb = np.flatnonzero((k == _K["arrive"]) | (k == _K["depart"]))
        if len(isb):
            pc, pcats = c["phase"]
            bars.append(pd.DataFrame({
                "rank": c["rank"][isb], "launch": c["launch"][isb], "block": c["block"][isb], "warp": c["warp"][isb],
                "phase": np.array(pcats, dtype=object)[pc[isb]], "payload": c["payload"][isb],
                "begin_ns": c["begin_ns"][isb], "arrive": k[isb] == _K["arrive"], "row": isb + row0}))
        row0 += n
    flows: dict[int, list[int]] = {}
    term = np.zeros(0, np.int64)
    if bars:
        b = pd.concat(bars, ignore_index=True)
        cross = b["phase"].map(lambda p: barrier_scope.get(p) == "rank").to_numpy(dtype=bool)
        b["grp_rank"] = np.where(cross, -1, b["rank"].to_numpy())
        keys = ["grp_rank", "launch", "phase", "payload"]
        arr = b[b["arrive"]].sort_values(["begin_ns", "row"]).groupby(keys, sort=False).tail(1)
        dep = b[~b["arrive"]].merge(arr[keys + ["row", "rank", "block", "warp"]], on=keys, suffixes=("", "_last"))
        dep = dep[(dep["rank"] != dep["rank_last"]) | (dep["block"] != dep["block_last"]) | (dep["warp"] != dep["warp_last"])]
        for last, rows in dep.groupby("row_last")["row"]:
            flows[int(last)] = (rows.to_numpy() + 1).tolist()
        term = np.sort(dep["row"].to_numpy().astype(np.int64))  # depart rows; their flow id is row + 1
    return tmin, tracks, host_ranks, flows, term


def _merged(run: Run):
    """The run's merged PyTorch traces with at least one aligned rank (issue 30), else None."""
    from ..torchtrace.store import load_merged
    m = load_merged(run)
    return m if m is not None and m.ranks else None


def export_perfetto(run_or_path, out_path=None, *, force: bool = False,
                    opened: Callable[[TempFile], None] | None = None, with_torch: bool = True) -> Path:
    """Write the run's Perfetto trace (default RUN/trace.perfetto-trace); returns its path.
    A run with attached PyTorch traces (`epscope merge`) gets them in the same file: each rank's
    CPU threads and CUDA streams, and flows from every sender warp to the receiver waiting on it
    (profiler/torchtrace/perfetto.py); with_torch=False leaves them out.

    An existing out_path is replaced only with force (the run's own trace, derived from its
    data, always is), and only when it is a regular file: RunExists otherwise. opened(tmp) hears
    of the temporary file once it exists (the CLI shows its size as progress)."""
    P = _pb()
    run = run_or_path if isinstance(run_or_path, Run) else load_run(run_or_path)
    if not run.checked:   # rows repeated across the streamed batches are found by a whole check only
        check_events(run)
    default = run.path / TRACE
    out = Path(out_path) if out_path is not None else default
    replace = force or out == default
    scope = {}
    for fam, reg in sorted((run.manifest.get("registry") or {}).items()):
        for b in (reg.get("barriers") or []) if isinstance(reg, dict) else []:
            if isinstance(b, dict) and isinstance(b.get("name"), str):
                scope[b["name"]] = b.get("scope", "grid")
    tmin, tracks, host_ranks, flows, term = _scan(run, scope)
    merged = _merged(run) if with_torch else None
    if merged is not None:   # the PyTorch ops may start before the first warp: the time base covers them
        tmin = min(([tmin] if tmin is not None else []) + [int(rt.events["begin_ns"].min()) for rt in
                                                            merged.ranks.values() if len(rt.events)])
    launches = run.launches
    lmins = [int(x) for x in (launches["gpu_begin_ns"][launches["gpu_begin_ns"] != -1].min(),) if pd.notna(x)] \
        if len(launches) else []
    base_min = min([v for v in [tmin, *lmins] if v is not None] or [0])
    base = -base_min if base_min < 0 else 0
    ranks = sorted({r for r, _, _ in tracks} | host_ranks | set(launches["rank"].astype(int).tolist()))
    unc = {int(r["rank"]): r.get("uncertainty_ns") for r in (run.manifest.get("clock") or {}).get("ranks") or []}

    ids = COMPACT if all(COMPACT.fits(b, w) for _, b, w in tracks) else WIDE
    clean_leftovers(out)   # temporaries of exports to `out` that died
    with TempFile(out) as t:
        if opened is not None:
            opened(t)
        _write_trace(t.file, P, run, ids, tmin, tracks, host_ranks, flows, term, base, ranks, unc, merged)
        t.place(replace)
    return out


def _write_trace(f, P, run: Run, ids: TrackIds, tmin, tracks, host_ranks, flows, term, base: int, ranks,
                 unc, merged=None) -> None:
    names: dict[str, int] = {}
    launches = run.launches
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
        desc(uuid=int(ids.rank(r)), process=pd_, child_ordering=explicit, **extra)
        desc(uuid=int(ids.kernels(r)), parent_uuid=int(ids.rank(r)), name="kernels", sibling_order_rank=-2)
        if r in host_ranks:
            desc(uuid=int(ids.host(r)), parent_uuid=int(ids.rank(r)), name="host", sibling_order_rank=-1)
    blocks: dict[tuple[int, int], set] = {}
    for (r, b, w), (sms, _) in tracks.items():
        blocks.setdefault((r, b), set()).update(sms)
    for (r, b), sms in sorted(blocks.items()):
        sm = ", ".join(str(s) for s in sorted(sms))
        desc(uuid=int(ids.block(r, b)), parent_uuid=int(ids.rank(r)), name=f"block {b} (SM{'s' if len(sms) > 1 else ''} {sm})",
             sibling_order_rank=b, child_ordering=explicit)
    for (r, b, w), (_, roles) in sorted(tracks.items()):
        role = "/".join(sorted(roles))
        desc(uuid=int(ids.warp(r, b, w)), parent_uuid=int(ids.block(r, b)),
             name=f"warp {w}" + (f" · {role}" if role else ""), sibling_order_rank=w)
    if merged is not None:
        from ..torchtrace import perfetto as TP
        TP.write_tracks(f, P, ids, merged, base, desc)

    # launches on the kernels track
    if len(launches):
        intern(sorted(set(launches["kernel"].astype(str))))
        for l in launches.itertuples(index=False):
            if l.gpu_begin_ns == -1:  # -1: no warp recorded (the schema's "unknown")
                continue
            u = int(ids.kernels(l.rank))
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
    cols = ["rank", "block", "warp", "kind", "phase", "begin_ns", "end_ns", "payload", "open"]
    for n, c in _batches(run, cols):
        for a in range(0, n, WRITE_ROWS):  # a slice at a time: the encoder's temporaries stay small
            part = {k: (v[0][a:a + WRITE_ROWS], v[1]) if isinstance(v, tuple) else v[a:a + WRITE_ROWS] for k, v in c.items()}
            _write_batch(f, P, ids, part, row0 + a, base, names, intern, flows, term)
        row0 += n
    if merged is not None:
        TP.write_slices(f, P, ids, merged, base, intern, names, SEQ_ID, _frame, encode_events)
        TP.write_flows(f, P, ids, TP.wait_flows(run), base, intern, names, SEQ_ID, _frame)


def _write_batch(f, P, ids: TrackIds, c: dict, row0: int, base: int, names, intern, flows, term) -> None:
    k = _kind_codes(c["kind"])
    pcode, pcats = c["phase"]
    intern(pcats)
    iid_lut = np.array([names[x] for x in pcats] or [0], np.uint64)
    rank = c["rank"]
    is_host = k == _K["host"]
    uuid = np.where(is_host, ids.host(rank), ids.warp(rank, c["block"], c["warp"]))
    begin = c["begin_ns"] + np.int64(base)
    end = np.maximum(c["end_ns"] + np.int64(base), begin)
    payload = c["payload"]

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
        iid = iid_lut[pcode[src]]
        opened = c["open"][src]
        if opened.any():  # spans without END (aborted kernel, dropped records) are named so in the trace
            intern([f"{x} {OPEN_SUFFIX}" for x in pcats])
            open_lut = np.array([names[f"{x} {OPEN_SUFFIX}"] for x in pcats], np.uint64)
            iid = np.where(opened, open_lut[pcode[src]], iid)
        f.write(encode_events(ts, typ, uuid[src], iid, payload[src], da_iid=1))

    bar = np.flatnonzero((k == _K["arrive"]) | (k == _K["depart"]))
    if len(bar):
        intern([f"{x} arrive" for x in pcats] + [f"{x} depart" for x in pcats])
        arr_lut = np.array([names[f"{x} arrive"] for x in pcats], np.uint64)
        dep_lut = np.array([names[f"{x} depart"] for x in pcats], np.uint64)
        g = bar + row0
        is_arr = k[bar] == _K["arrive"]
        iid = np.where(is_arr, arr_lut[pcode[bar]], dep_lut[pcode[bar]])
        starts = np.isin(g, np.fromiter(flows.keys(), np.int64, len(flows))) if flows else np.zeros(len(bar), bool)
        pos = np.searchsorted(term, g)
        ends = (pos < len(term)) & (term[np.minimum(pos, len(term) - 1)] == g) if len(term) else np.zeros(len(bar), bool)
        v = ~starts  # vectorised: events without outgoing flows (at most one terminating flow)
        f.write(encode_events(begin[bar[v]], np.full(int(v.sum()), 3), uuid[bar[v]], iid[v], payload[bar[v]], da_iid=1,
                              term_flow=np.where(ends[v], g[v] + 1, 0)))
        chunks = []
        for i, gi, ii, e in zip(bar[starts].tolist(), g[starts].tolist(), iid[starts].tolist(), ends[starts].tolist()):
            # the last arriver of an occurrence: one flow to each departing warp
            pk = P.TracePacket(timestamp=int(begin[i]), trusted_packet_sequence_id=SEQ_ID,
                               sequence_flags=P.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE)
            te = pk.track_event
            te.type = P.TrackEvent.TYPE_INSTANT
            te.track_uuid = int(uuid[i])
            te.name_iid = int(ii)
            te.debug_annotations.add(name_iid=1, int_value=int(payload[i]))
            te.flow_ids.extend(flows[gi])
            if e:
                te.terminating_flow_ids.append(gi + 1)
            chunks.append(_frame(pk))
        f.write(b"".join(chunks))
