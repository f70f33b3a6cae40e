"""Raw profile buffers -> the tidy event table (profiler.schema), vectorised with numpy.

The buffer layout comes only from profiler/generated/layout.py (generated from layout.toml): no
offset in this file is written by hand. Every record is touched by numpy array operations; the
Python loops run per launch, per chunk of ~128 k records (whole regions) and per phase id.

Span matching. Within one warp region, the BEGINs and ENDs of one phase are taken in record
order (= time order; a stable ordering by the u16 phase id keeps it) and a BEGIN
immediately followed by an END of the same phase in the same region forms a span. A phase never
nests in itself (registry rule), so this is exactly "the k-th BEGIN with the k-th END" on
well-formed data, and on malformed data it can never produce a span that ends before it begins.
A BEGIN with no END becomes an open span (open=True) ending at the warp's last timestamp
(UnmatchedBegin); an END with no BEGIN is dropped and counted (UnmatchedEnd).

No torch / perfetto / dash imports: this runs on the recording path of the GPU machine.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from pandas.api.types import union_categoricals

from . import errors as E
from .align import ClockModel, sm_cycles_to_ns
from .generated import layout as L
from .registry import Registry
from .schema import CATEGORICAL, COLUMNS, EVENT_KINDS, LAUNCH_COLUMNS, coerce_events, empty_events

_HDR = L.BUFFERHEADER_DTYPE
_RH = L.REGIONHEADER_DTYPE
_REC = L.RECORD_DTYPE
# A region header occupies a whole number of record slots, which lets the region area be viewed
# as a (regions, slots) record array whose first slots are the header.
assert L.REGIONHEADER_SIZE % L.RECORD_SIZE == 0, "region header must be a multiple of the record size"
_RH_SLOTS = L.REGIONHEADER_SIZE // L.RECORD_SIZE
_MAX_KIND = max(L.KIND_NAMES)

_K_SPAN, _K_INSTANT, _K_ARRIVE, _K_DEPART, _K_HOST = (EVENT_KINDS.index(k) for k in ("span", "instant", "arrive", "depart", "host"))


def _field_offset(dtype: np.dtype, name: str) -> int:
    return dtype.fields[name][1]


@dataclass(frozen=True)
class LaunchInfo:
    """What the host knows about one launch; it is authoritative over the buffer header's rank/launch_id."""

    rank: int
    launch: int
    kernel: str
    iteration: int
    family: str
    host_begin_ns: int = -1  # host clock ns (time.perf_counter_ns) or -1
    host_end_ns: int = -1


@dataclass
class DecodedLaunch:
    events: pd.DataFrame
    launch: dict
    warnings: list = field(default_factory=list)


@dataclass
class Decoded:
    events: pd.DataFrame
    launches: pd.DataFrame
    warnings: list = field(default_factory=list)


# -- registry lookup tables ---------------------------------------------------------------------
class _Tables:
    """id -> category code lookups of one registry, as 65536-entry arrays (ids are u16)."""

    def __init__(self, reg: Registry):
        self.registry = reg
        self.hash = reg.hash
        self.names: list[str] = []
        index: dict[str, int] = {}

        def code(name: str) -> int:
            if name not in index:
                index[name] = len(self.names)
                self.names.append(name)
            return index[name]

        self.phase_code = np.full(1 << 16, -1, np.int32)
        self.barrier_code = np.full(1 << 16, -1, np.int32)
        self.roles = ["", *reg.roles, "host"]
        self.phase_role = np.zeros(1 << 16, np.int16)
        for p in sorted(reg.phases, key=lambda p: p.id):
            self.phase_code[p.id] = code(p.name)
            self.phase_role[p.id] = self.roles.index(p.role) if p.role else 0
        for b in sorted(reg.barriers, key=lambda b: b.id):
            self.barrier_code[b.id] = code(b.name)
        self._index = index
        self.span_ids = np.array(sorted(p.id for p in reg.phases if p.kind == "span"), np.uint16)

    def extend(self, names: list[str], extra: list[str]) -> tuple[list[str], dict[str, int]]:
        out = list(names)
        idx = dict(self._index)
        for n in extra:
            if n not in idx:
                idx[n] = len(out)
                out.append(n)
        return out, idx


_TABLES: dict[int, _Tables] = {}


def _tables(registry) -> _Tables:
    reg = registry if isinstance(registry, Registry) else Registry.from_dict(registry)
    h = reg.hash
    if h not in _TABLES:
        _TABLES[h] = _Tables(reg)
    return _TABLES[h]


# -- buffer parsing -------------------------------------------------------------------------------
def _as_bytes(buf) -> np.ndarray:
    if not isinstance(buf, (np.ndarray, bytes, bytearray, memoryview)) and hasattr(buf, "numpy"):
        buf = buf.detach().cpu().numpy() if hasattr(buf, "detach") else buf.numpy()  # a torch tensor, untyped
    if isinstance(buf, np.ndarray):
        return np.ascontiguousarray(buf).reshape(-1).view(np.uint8)
    return np.frombuffer(buf, dtype=np.uint8)


def _header(arr: np.ndarray, tables: _Tables):
    n = arr.size
    if n < L.BUFFERHEADER_SIZE:
        raise E.TruncatedBuffer(f"buffer ends at byte {n}, before the end of its {L.BUFFERHEADER_SIZE}-byte header", n)
    h = arr[: L.BUFFERHEADER_SIZE].view(_HDR)[0]
    magic = int(h["magic"])
    if magic != L.MAGIC:
        raise E.BadMagic(f"bad magic 0x{magic:08X}, expected 0x{L.MAGIC:08X}: not an epscope profile buffer",
                         _field_offset(_HDR, "magic"))
    version = int(h["version"])
    if version > L.VERSION or version < 1:
        what = "newer than" if version > L.VERSION else "not supported by"
        raise E.UnsupportedVersion(f"buffer format version {version} is {what} this decoder (version {L.VERSION})",
                                   _field_offset(_HDR, "version"))
    rh = int(h["registry_hash"])
    if rh != tables.hash:
        raise E.RegistryMismatch(
            f"buffer registry_hash 0x{rh:08X} != 0x{tables.hash:08X} of registry {tables.registry.family!r}: "
            "decode with the registry the buffer was recorded with (the run manifest embeds it)",
            _field_offset(_HDR, "registry_hash"))
    nreg, cap, wpb = int(h["num_regions"]), int(h["region_capacity"]), int(h["warps_per_block"])
    if nreg and wpb == 0:
        raise E.DecodeError("warps_per_block is 0 but the buffer has regions", _field_offset(_HDR, "warps_per_block"))
    stride = L.REGIONHEADER_SIZE + cap * L.RECORD_SIZE
    need = L.BUFFERHEADER_SIZE + nreg * stride
    if n < need:
        raise E.TruncatedBuffer(
            f"buffer ends at byte {n} but its header (num_regions={nreg}, region_capacity={cap}) "
            f"says data runs to byte {need}", n)
    return h, nreg, cap, wpb, stride, need


def _stable_order(keys: np.ndarray, likely: np.ndarray) -> np.ndarray:
    """Stable argsort of u16 phase ids. A kernel family has a handful of span phases (`likely`):
    one compare-and-compress pass per phase beats numpy's stable sort (37 vs 63 ms for 2.5 M keys
    of 9 values on the dev machine); ids outside `likely` (unknown phases) fall back to it."""
    if len(likely) > 12 or len(keys) == 0:
        return np.argsort(keys, kind="stable")
    parts = [np.flatnonzero(keys == v) for v in likely]
    if sum(map(len, parts)) != len(keys):
        return np.argsort(keys, kind="stable")
    return np.concatenate(parts)


# Records are decoded in chunks of whole regions of about this many records, straight into the
# preallocated output columns: a chunk's temporaries (~80 bytes a record) stay in cache and in
# reused heap memory, and every output byte is written once. Decoding a launch in one piece spent
# more time in page faults than in numpy on the dev VM (ru_stime > ru_utime).
CHUNK_RECORDS = 1 << 17

_KIND_LUT = np.zeros(256, np.int8)
_KIND_LUT[L.KIND_BEGIN] = _K_SPAN
_KIND_LUT[L.KIND_INSTANT] = _K_INSTANT
_KIND_LUT[L.KIND_BARRIER_ARRIVE] = _K_ARRIVE
_KIND_LUT[L.KIND_BARRIER_DEPART] = _K_DEPART


class _Plan:
    """One launch after its header and region headers are read: everything needed to size and
    fill its slice of the output."""

    def __init__(self, buf, info: LaunchInfo, tables: _Tables):
        self.info, self.tables = info, tables
        arr = _as_bytes(buf)
        h, nreg, cap, wpb, stride, need = _header(arr, tables)
        self.cap, self.hires = cap, bool(int(h["flags"]) & L.FLAGS_HIRES)
        self.warnings: list[E.DecodeWarning] = []
        self.where = where = f"rank {info.rank} launch {info.launch} ({info.kernel})"
        body = arr[L.BUFFERHEADER_SIZE:need]
        rh = np.ascontiguousarray(body.reshape(nreg, stride)[:, : L.REGIONHEADER_SIZE]).view(_RH).reshape(nreg)
        state = rh["state"]
        bad_state = ~np.isin(state, (L.REGION_STATE_UNUSED, L.REGION_STATE_STARTED, L.REGION_STATE_FINISHED))
        if bad_state.any():
            i = int(np.flatnonzero(bad_state)[0])
            raise E.DecodeError(f"region {i}: state {int(state[i])} is not a region_state",
                                L.BUFFERHEADER_SIZE + i * stride + _field_offset(_RH, "state"))
        finished = state == L.REGION_STATE_FINISHED
        started = state == L.REGION_STATE_STARTED
        attempted = rh["attempted"].astype(np.int64)
        n = np.where(finished, np.minimum(attempted, cap), 0)
        over = np.where(finished, np.maximum(attempted - cap, 0), 0)
        self.dropped = int(over.sum())
        if self.dropped:
            self.warnings.append(E.DroppedRecords(self.dropped, f"{where}: {self.dropped} records past capacity {cap} "
                                                                f"in {int((over > 0).sum())} of {nreg} regions"))
        # records as a (nreg, slots) structured view; a region's first _RH_SLOTS slots are its header
        self.rec2 = body.view(_REC).reshape(nreg, _RH_SLOTS + cap)[:, _RH_SLOTS:]
        if started.any():
            si = np.flatnonzero(started)
            empty = self.rec2["kind"][si] == L.KIND_EMPTY
            n[si] = np.where(empty.any(axis=1), empty.argmax(axis=1), cap) if cap else 0
            self.warnings.append(E.UnfinishedRegion(len(si), f"{where}: {len(si)} regions never finished "
                                                             "(aborted kernel?); decoded up to their first empty record"))
        self.n, self.rh, self.finished, self.used = n, rh, finished, finished | started
        ar = np.arange(nreg, dtype=np.int32)
        self.block, self.warp, self.sm = ar // max(wpb, 1), (ar % max(wpb, 1)).astype(np.int16), rh["sm"].astype(np.int16)
        if self.hires:
            clk_ok = finished & (rh["clk_end"] > rh["clk_start"])
            self.clk_end = np.where(clk_ok, rh["clk_end"], rh["clk_start"])  # equal pair -> nominal rate
            used_bad = ~clk_ok & (n > 0)
            if used_bad.any():
                self.warnings.append(E.ClockFallback(int(used_bad.sum()), f"{where}: high-res regions without an end "
                                                                          "clock pair converted at the nominal SM clock"))
        # chunks of whole regions; the output is sized by the record count (an upper bound of the
        # event count: ENDs make no row) and trimmed after decoding; untouched pages cost nothing
        step = max(1, CHUNK_RECORDS // max(cap, 1))
        self.chunks = [r0 for r0 in range(0, nreg, step) if n[r0:r0 + step].any()]
        self.n_records = int(n.sum())
        self.step = step
        self.first_t = np.zeros(nreg, np.int64)
        self.last_t = np.zeros(nreg, np.int64)
        self.counts = {"bad": 0, "ub": 0, "ue": 0, "back": 0}
        self.unknown: list[tuple[np.ndarray, np.ndarray]] = []

    def decode_into(self, out: dict, off: int) -> int:
        """Write this launch's events into out[c][off:...] chunk by chunk; returns the event count."""
        o = off
        for r0 in self.chunks:
            o += self._chunk(out, o, r0)
        self.n_events = o - off
        c, where = self.counts, self.where
        if c["bad"]:
            self.warnings.append(E.CorruptRecords(c["bad"], f"{where}: records with kind outside 1..{_MAX_KIND} skipped"))
        if c["ue"]:
            self.warnings.append(E.UnmatchedEnd(c["ue"], f"{where}: ENDs without BEGIN dropped"))
        if c["ub"]:
            self.warnings.append(E.UnmatchedBegin(c["ub"], f"{where}: BEGINs without END kept as open spans"))
        if c["back"]:
            self.warnings.append(E.CorruptRecords(c["back"], f"{where}: spans ending before they begin; end set to begin"))
        has, used, rh = self.n > 0, self.used, self.rh
        gb = ge = -1
        if used.any():
            gb = int(rh["gt_start"][used].astype(np.int64).min())
            ge = int(np.where(self.finished, rh["gt_end"].astype(np.int64), self.last_t)[used].max())
        if has.any():
            lo, hi = int(self.first_t[has].min()), int(self.last_t[has].max())
            gb = lo if gb < 0 else min(gb, lo)
            ge = max(ge, hi)
        self.gpu_begin, self.gpu_end = gb, ge
        return self.n_events

    def _chunk(self, out: dict, o: int, r0: int) -> int:
        cap, tables = self.cap, self.tables
        n = self.n[r0:r0 + self.step]
        rec2 = self.rec2[r0:r0 + self.step]
        nreg = len(n)
        m = int(n.sum())
        valid = None if m == nreg * cap else np.arange(cap)[None, :] < n[:, None]

        def column(name):  # one strided pass per field into a contiguous array
            a = rec2[name]
            return a.reshape(-1) if valid is None else a[valid]

        kind = column("kind")
        region = np.repeat(np.arange(nreg, dtype=np.int32), n)
        bad = (kind - np.uint8(1)) >= np.uint8(_MAX_KIND)  # kind 0 wraps to 255
        n_bad = int(np.count_nonzero(bad))
        keep = None
        if n_bad:
            self.counts["bad"] += n_bad
            keep = ~bad
            kind, region = kind[keep], region[keep]
            n = np.bincount(region, minlength=nreg).astype(np.int64)
        ids = column("id") if keep is None else column("id")[keep]
        payload = column("payload") if keep is None else column("payload")[keep]
        traw = column("t") if keep is None else column("t")[keep]
        if self.hires:
            g = region + r0
            rh = self.rh
            t = sm_cycles_to_ns(traw, rh["clk_start"][g], rh["gt_start"][g], self.clk_end[g], rh["gt_end"][g])
        else:
            t = traw.view(np.int64)

        # first / last timestamp of each region (records are in time order within a region)
        rstart = np.cumsum(n) - n
        has = n > 0
        last_t = np.zeros(nreg, np.int64)
        last_t[has] = t[rstart[has] + n[has] - 1]
        self.last_t[r0:r0 + nreg] = last_t
        self.first_t[r0:r0 + nreg][has] = t[rstart[has]]

        # -- spans: stable order of BEGIN/END by phase id keeps region-major record order --------
        n_begin, n_end = int(np.count_nonzero(kind == L.KIND_BEGIN)), int(np.count_nonzero(kind == L.KIND_END))
        be = np.flatnonzero(kind <= L.KIND_END)
        s = be[_stable_order(ids[be], tables.span_ids)]
        ks, is_, rs = kind[s], ids[s], region[s]
        pair = (ks[:-1] == L.KIND_BEGIN) & (ks[1:] == L.KIND_END) & (is_[:-1] == is_[1:]) & (rs[:-1] == rs[1:])
        pi = np.flatnonzero(pair)
        b_pos, e_pos = s[pi], s[pi + 1]
        n_ub = n_begin - len(b_pos)
        self.counts["ue"] += n_end - len(b_pos)

        # -- events in record order: every record but the ENDs ----------------------------------
        is_end = kind == L.KIND_END
        src = np.flatnonzero(~is_end)
        e = len(src)
        ends_before = np.cumsum(is_end, dtype=np.int32)  # record p (not an END) is event p - ends_before[p]
        k_src = kind[src]
        ids_src = ids[src]
        ev_region = region[src]
        begin_t = out["begin_ns"][o:o + e]
        end_t = out["end_ns"][o:o + e]
        pl = out["payload"][o:o + e]
        is_open = out["open"][o:o + e]
        np.take(t, src, out=begin_t)
        end_t[:] = begin_t
        pl[:] = payload[src]
        is_open[:] = False
        if n_ub:
            self.counts["ub"] += n_ub
            ub = s[(ks == L.KIND_BEGIN) & ~np.r_[pair, False]]
            ui = ub - ends_before[ub]
            end_t[ui] = last_t[region[ub]]
            is_open[ui] = True
        bi = b_pos - ends_before[b_pos]
        end_t[bi] = t[e_pos]
        back = end_t < begin_t
        if back.any():  # only corrupt timestamps do this: globaltimer and per-SM clock64 never run backwards
            self.counts["back"] += int(back.sum())
            np.maximum(end_t, begin_t, out=end_t)
        # a span's payload is its BEGIN's, or its END's when the BEGIN carried 0 (counts known at the end)
        z = np.flatnonzero(pl[bi] == 0)
        pl[bi[z]] = payload[e_pos[z]]
        code = tables.phase_code[ids_src]
        role = self.role_by_id[ids_src]  # global role codes; 0 is '' everywhere
        is_bar = k_src >= L.KIND_BARRIER_ARRIVE
        if is_bar.any():
            code[is_bar] = tables.barrier_code[ids_src[is_bar]]
            # barrier events take the role of the warp's first role-bearing event
            role[is_bar] = 0
            rr = np.flatnonzero(role > 0)
            reg_rr = ev_region[rr]
            firsts = np.flatnonzero(np.r_[True, reg_rr[1:] != reg_rr[:-1]]) if len(rr) else rr
            region_role = np.zeros(nreg, np.int32)
            region_role[reg_rr[firsts]] = role[rr[firsts]]
            role[is_bar] = region_role[ev_region[is_bar]]
        unknown = np.flatnonzero(code < 0)
        if len(unknown):  # named once the whole launch is decoded
            self.unknown.append((unknown + o, ids_src[unknown].astype(np.int64) * 2 + is_bar[unknown]))
        out["phase"][o:o + e] = code
        out["role"][o:o + e] = role
        out["kind"][o:o + e] = _KIND_LUT[k_src]
        g = ev_region + r0
        np.take(self.block, g, out=out["block"][o:o + e])
        np.take(self.warp, g, out=out["warp"][o:o + e])
        np.take(self.sm, g, out=out["sm"][o:o + e])
        return e


def _union(lists) -> tuple[list[str], dict[str, int]]:
    idx: dict[str, int] = {}
    for lst in lists:
        for x in lst:
            idx.setdefault(x, len(idx))
    return list(idx), idx


def _host_span(info: LaunchInfo, clock: ClockModel | None):
    """The launch's host span on the run timeline, or None (no host clock or an incomplete span)."""
    if clock is None or clock.host is None:
        return None, -1, -1
    hb, he = (int(v) for v in clock.host_to_run_timeline(np.array([info.host_begin_ns, info.host_end_ns])))
    hb, he = (hb if info.host_begin_ns >= 0 else -1), (he if info.host_end_ns >= 0 else -1)
    # a host row only for a complete host span (a recorder may add its own host rows instead)
    return ((hb, he) if 0 <= info.host_begin_ns <= info.host_end_ns else None), hb, he


def _decode(plans: list[_Plan], clock: ClockModel | None) -> tuple[pd.DataFrame, list[dict]]:
    """Decode planned launches into one event table, every column allocated once."""
    kernels, kidx = _union([[p.info.kernel] for p in plans])
    roles, ridx = _union([p.tables.roles for p in plans])
    names, nidx = _union([p.tables.names for p in plans])
    hosts = [_host_span(p.info, clock) for p in plans]
    total = sum(p.n_records + (1 if h[0] else 0) for p, h in zip(plans, hosts))
    out = {c: np.empty(total, np.int32 if COLUMNS[c] == "category" else COLUMNS[c]) for c in COLUMNS}
    out["kind"] = np.empty(total, np.int8)
    launches, off = [], 0
    for p, (host, hb, he) in zip(plans, hosts):
        info = p.info
        p.role_by_id = np.array([ridx[r] for r in p.tables.roles], np.int32)[p.tables.phase_role]
        k = p.decode_into(out, off)
        local_names = p.tables.names
        if p.unknown:
            uk = np.unique(np.concatenate([key for _, key in p.unknown]))
            extra = [f"{'barrier' if v & 1 else 'phase'}_{v >> 1}" for v in uk.tolist()]
            local_names, idx = p.tables.extend(local_names, extra)
            lut = np.array([idx[x] for x in extra], np.int32)
            for pos, key in p.unknown:
                out["phase"][pos] = lut[np.searchsorted(uk, key)]
            p.warnings.append(E.UnknownPhase(sum(len(x) for x, _ in p.unknown),
                                             f"{p.where}: ids not in registry {p.tables.registry.family!r}: {', '.join(extra)}"))
        for x in local_names:
            nidx.setdefault(x, len(nidx))
        ph = out["phase"][off:off + k]
        ph[:] = np.array([nidx[x] for x in local_names], np.int32)[ph]
        gb, ge = p.gpu_begin, p.gpu_end
        if clock is not None:
            for c in ("begin_ns", "end_ns"):
                out[c][off:off + k] = clock.to_run_timeline(info.rank, out[c][off:off + k])
            if gb >= 0:
                gb, ge = (int(v) for v in clock.to_run_timeline(info.rank, np.array([gb, ge])))
        out["rank"][off:off + k + (1 if host else 0)] = info.rank
        out["launch"][off:off + k + (1 if host else 0)] = info.launch
        out["kernel"][off:off + k + (1 if host else 0)] = kidx[info.kernel]
        out["iteration"][off:off + k + (1 if host else 0)] = info.iteration
        off += k
        if host:
            nidx.setdefault(info.kernel, len(nidx))
            row = {"sm": -1, "block": -1, "warp": -1, "payload": 0, "open": False, "kind": _K_HOST,
                   "role": ridx.setdefault("host", len(ridx)), "phase": nidx[info.kernel],
                   "begin_ns": host[0], "end_ns": host[1]}
            for c, v in row.items():
                out[c][off] = v
            off += 1
        launches.append({"rank": info.rank, "launch": info.launch, "kernel": info.kernel, "iteration": info.iteration,
                         "host_begin_ns": hb, "host_end_ns": he, "gpu_begin_ns": gb, "gpu_end_ns": ge,
                         "regions": int(p.used.sum()), "dropped": p.dropped})
    out = {c: a[:off] for c, a in out.items()}
    if clock is None:  # each rank's own globaltimer minus the earliest timestamp of the decode
        starts = [la["gpu_begin_ns"] for la in launches if la["gpu_begin_ns"] >= 0]
        if starts:
            shift = np.int64(min(starts))
            out["begin_ns"] -= shift  # int64 arithmetic: corrupt timestamps wrap instead of raising
            out["end_ns"] -= shift
            for la in launches:
                if la["gpu_begin_ns"] >= 0:
                    la["gpu_begin_ns"], la["gpu_end_ns"] = (int(v) for v in np.array(
                        [la["gpu_begin_ns"], la["gpu_end_ns"]], np.int64) - shift)
    cat = {"kernel": kernels, "phase": list(nidx), "role": list(ridx), "kind": list(EVENT_KINDS)}
    frame = {c: pd.Categorical.from_codes(out[c], categories=cat[c]) if c in cat else out[c] for c in COLUMNS}
    return pd.DataFrame(frame, copy=False), launches


def decode_buffer(buf, info: LaunchInfo, registry, clock: ClockModel | None = None) -> DecodedLaunch:
    """Decode one launch's profile buffer.

    buf: bytes | memoryview | np.ndarray (any dtype, viewed as bytes); registry: Registry or its
    to_json() dict. With a ClockModel, times are on the run timeline (ns since run start, rank 0
    clock) and the launch's host span becomes a kind='host' row (phase = kernel name); without
    one, times are this buffer's globaltimer minus its earliest timestamp. Raises DecodeError
    subclasses for unreadable buffers; recoverable problems come back in .warnings.
    """
    plan = _Plan(buf, info, _tables(registry))
    events, launches = _decode([plan], clock)
    return DecodedLaunch(events, launches[0], plan.warnings)


def aggregate_warnings(warns) -> list[E.DecodeWarning]:
    """One warning per type, counts summed, the first details kept."""
    by: dict[type, list] = {}
    for w in warns:
        by.setdefault(type(w), []).append(w)
    out = []
    for cls, ws in by.items():
        details = [w.detail for w in ws if w.detail]
        detail = "; ".join(details[:5]) + (f"; and {len(details) - 5} more" if len(details) > 5 else "")
        out.append(cls(sum(w.count for w in ws), detail))
    return out


def concat_events(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """Concatenate event tables, taking the union of each categorical column's categories."""
    frames = [f for f in frames if len(f)]
    frames = [f if all(isinstance(f[c].dtype, pd.CategoricalDtype) for c in CATEGORICAL) else coerce_events(f)
              for f in frames]
    if not frames:
        return empty_events()
    if len(frames) == 1:
        return frames[0][list(COLUMNS)].reset_index(drop=True)
    out = {}
    for c, t in COLUMNS.items():
        if c == "kind":  # fixed categories: map each frame's codes onto EVENT_KINDS
            codes = [np.array([EVENT_KINDS.index(str(k)) for k in f[c].cat.categories] or [0], np.int8)[f[c].cat.codes.to_numpy()]
                     for f in frames]
            out[c] = pd.Categorical.from_codes(np.concatenate(codes), categories=list(EVENT_KINDS))
        elif t == "category":
            out[c] = union_categoricals([f[c] for f in frames])
        else:
            out[c] = np.concatenate([f[c].to_numpy() for f in frames]).astype(t, copy=False)
    return pd.DataFrame(out)


def launches_frame(rows: list[dict]) -> pd.DataFrame:
    df = pd.DataFrame(rows, columns=list(LAUNCH_COLUMNS))
    return df.astype(LAUNCH_COLUMNS)


def decode_launches(items, registries, clocks: ClockModel | None = None) -> Decoded:
    """Decode many launches (of any ranks and kernel families) into one table.

    items: iterable of (buf, LaunchInfo); registries: {family: Registry | to_json dict}. Without
    a clock model every rank's times are its own globaltimer minus the earliest raw timestamp of
    the whole decode (only meaningful across ranks that share one clock). Warnings are
    aggregated: one per type, counts summed.
    """
    tabs = {fam: _tables(r) for fam, r in registries.items()}
    plans = []
    for buf, info in items:
        if info.family not in tabs:
            raise KeyError(f"no registry for kernel family {info.family!r} (have {sorted(tabs)})")
        plans.append(_Plan(buf, info, tabs[info.family]))
    events, launches = _decode(plans, clocks)
    return Decoded(events, launches_frame(launches), aggregate_warnings([w for p in plans for w in p.warnings]))
