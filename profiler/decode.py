"""Raw profile buffers -> the tidy event table (profiler.schema), vectorised with numpy.

The buffer layout comes only from profiler/generated/layout.py (generated from layout.toml): no
offset in this file is written by hand. Every record is touched by numpy array operations; the
only Python loops are per launch and per warning type.

Span matching. Within one warp region, the BEGINs and ENDs of one phase are taken in record
order (= time order; a stable radix argsort on the u16 phase id keeps it) and a BEGIN
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
from .schema import COLUMNS, EVENT_KINDS, LAUNCH_COLUMNS, coerce_events, empty_events

_HDR = L.BUFFERHEADER_DTYPE
_RH = L.REGIONHEADER_DTYPE
_REC = L.RECORD_DTYPE
# A region header occupies a whole number of record slots, which lets the region area be viewed
# as one flat record array (headers included) instead of a strided 2-D structure.
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


def _decode_raw(buf, info: LaunchInfo, tables: _Tables):
    """Decode to columns with raw int64 timestamps (each rank's own globaltimer)."""
    arr = _as_bytes(buf)
    h, nreg, cap, wpb, stride, need = _header(arr, tables)
    hires = bool(int(h["flags"]) & L.FLAGS_HIRES)
    warns: list[E.DecodeWarning] = []
    where = f"rank {info.rank} launch {info.launch} ({info.kernel})"

    slots = _RH_SLOTS + cap
    flat = arr[L.BUFFERHEADER_SIZE:need].view(_REC)  # region headers included, as record slots
    rh = arr[L.BUFFERHEADER_SIZE:need].view(np.uint8).reshape(nreg, stride)[:, : L.REGIONHEADER_SIZE] \
        if nreg else np.zeros((0, L.REGIONHEADER_SIZE), np.uint8)
    rh = np.ascontiguousarray(rh).view(_RH).reshape(nreg)
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
    dropped = int(over.sum())
    if dropped:
        warns.append(E.DroppedRecords(dropped, f"{where}: {dropped} records past capacity {cap} in "
                                               f"{int((over > 0).sum())} of {nreg} regions"))
    if started.any():
        si = np.flatnonzero(started)
        kinds = flat["kind"].reshape(nreg, slots)[si, _RH_SLOTS:]
        empty = kinds == L.KIND_EMPTY
        n[si] = np.where(empty.any(axis=1), empty.argmax(axis=1), cap)
        warns.append(E.UnfinishedRegion(len(si), f"{where}: {len(si)} regions never finished (aborted kernel?); "
                                                 "decoded up to their first empty record"))

    # valid record slots: [_RH_SLOTS, _RH_SLOTS + n) of each region
    if cap and n.any():
        col = np.arange(slots, dtype=np.int64)
        mask = ((col[None, :] >= _RH_SLOTS) & (col[None, :] < (_RH_SLOTS + n)[:, None])).reshape(-1)
        rec = flat[mask]
    else:
        rec = flat[:0]
    region = np.repeat(np.arange(nreg, dtype=np.int32), n)
    kind = rec["kind"]
    bad = (kind == L.KIND_EMPTY) | (kind > _MAX_KIND)
    if bad.any():
        warns.append(E.CorruptRecords(int(bad.sum()), f"{where}: records with kind outside 1..{_MAX_KIND} skipped"))
        keep = ~bad
        rec, region, kind = rec[keep], region[keep], kind[keep]
    ids = rec["id"]
    payload = rec["payload"].astype(np.int64)
    t_raw = rec["t"]
    if hires:
        clk_ok = finished & (rh["clk_end"] > rh["clk_start"])
        used_bad = ~clk_ok & (n > 0)
        if used_bad.any():
            warns.append(E.ClockFallback(int(used_bad.sum()), f"{where}: high-res regions without an end clock pair "
                                                              "converted at the nominal SM clock"))
        ce = np.where(clk_ok, rh["clk_end"], rh["clk_start"])  # equal pair -> nominal rate
        t = sm_cycles_to_ns(t_raw, rh["clk_start"][region], rh["gt_start"][region], ce[region], rh["gt_end"][region])
    else:
        t = t_raw.view(np.int64)
    m = len(t)

    # last timestamp of each region (open spans end there)
    last_t = np.zeros(nreg, np.int64)
    if m:
        starts = np.flatnonzero(np.r_[True, region[1:] != region[:-1]])
        last_t[region[starts]] = np.maximum.reduceat(t, starts)

    # -- spans ---------------------------------------------------------------------------------
    be = np.flatnonzero(kind <= L.KIND_END)
    s = be[np.argsort(ids[be], kind="stable")]
    kk, rg, pp = kind[s], region[s], ids[s]
    pair = (kk[:-1] == L.KIND_BEGIN) & (kk[1:] == L.KIND_END) & (rg[:-1] == rg[1:]) & (pp[:-1] == pp[1:])
    b_pos, e_pos = s[:-1][pair], s[1:][pair]
    starts_pair = np.r_[pair, False] if len(s) else np.zeros(0, bool)
    ends_pair = np.r_[False, pair] if len(s) else np.zeros(0, bool)
    ub = s[(kk == L.KIND_BEGIN) & ~starts_pair]
    n_ue = int(((kk == L.KIND_END) & ~ends_pair).sum())
    if len(ub):
        warns.append(E.UnmatchedBegin(len(ub), f"{where}: BEGINs without END kept as open spans"))
    if n_ue:
        warns.append(E.UnmatchedEnd(n_ue, f"{where}: ENDs without BEGIN dropped"))
    ins = np.flatnonzero(kind == L.KIND_INSTANT)
    bar = np.flatnonzero(kind >= L.KIND_BARRIER_ARRIVE)

    src = np.concatenate([b_pos, ub, ins, bar])
    end_src_t = np.concatenate([t[e_pos], last_t[region[ub]], t[ins], t[bar]])
    ev_kind = np.concatenate([np.full(len(b_pos) + len(ub), _K_SPAN, np.int8), np.full(len(ins), _K_INSTANT, np.int8),
                              np.where(kind[bar] == L.KIND_BARRIER_ARRIVE, _K_ARRIVE, _K_DEPART).astype(np.int8)])
    pl_end = np.concatenate([payload[e_pos], np.zeros(len(ub) + len(ins) + len(bar), np.int64)])
    is_open = np.concatenate([np.zeros(len(b_pos), bool), np.ones(len(ub), bool), np.zeros(len(ins) + len(bar), bool)])
    # restore record order (region-major, time order; a parent's BEGIN precedes its child's)
    slot = np.full(m, -1, np.int64)
    slot[src] = np.arange(len(src))
    order = slot[slot >= 0]
    src, end_t, ev_kind, pl_end, is_open = src[order], end_src_t[order], ev_kind[order], pl_end[order], is_open[order]

    ev_ids = ids[src]
    is_bar = ev_kind >= _K_ARRIVE
    code = np.where(is_bar, tables.barrier_code[ev_ids], tables.phase_code[ev_ids])
    names = tables.names
    unknown = code < 0
    if unknown.any():
        uk = np.unique(np.stack([ev_ids[unknown].astype(np.int64), is_bar[unknown].astype(np.int64)]), axis=1)
        extra = [f"{'barrier' if b else 'phase'}_{i}" for i, b in uk.T]
        names, idx = tables.extend(names, extra)
        for (i, b), nm in zip(uk.T, extra):
            code[unknown & (ev_ids == i) & (is_bar == bool(b))] = idx[nm]
        warns.append(E.UnknownPhase(int(unknown.sum()), f"{where}: ids not in registry "
                                                         f"{tables.registry.family!r}: {', '.join(extra)}"))
    ev_region = region[src]
    # role: the phase's; barrier events take the role of the warp's first role-bearing record
    rec_role = np.where(kind <= L.KIND_INSTANT, tables.phase_role[ids], 0)
    region_role = np.zeros(nreg, np.int16)
    rr = np.flatnonzero(rec_role > 0)
    if len(rr):
        u, first = np.unique(region[rr], return_index=True)
        region_role[u] = rec_role[rr[first]]
    role = np.where(is_bar, region_role[ev_region], tables.phase_role[ev_ids])
    pl = payload[src]
    pl = np.where((pl == 0) & (ev_kind == _K_SPAN), pl_end, pl)

    used = finished | started
    gpu_begin = int(rh["gt_start"][used].astype(np.int64).min()) if used.any() else -1
    ends = np.where(finished, rh["gt_end"].astype(np.int64), last_t)[used]
    gpu_end = int(ends.max()) if used.any() else -1
    if m:
        gpu_begin = min(gpu_begin, int(t.min())) if gpu_begin >= 0 else int(t.min())
        gpu_end = max(gpu_end, int(t.max()))
    cols = {
        "block": (ev_region // wpb).astype(np.int32) if wpb else ev_region.astype(np.int32),
        "warp": (ev_region % wpb).astype(np.int16) if wpb else np.zeros(len(src), np.int16),
        "sm": rh["sm"][ev_region].astype(np.int16),
        "role": role.astype(np.int16),
        "kind": ev_kind,
        "phase": code.astype(np.int32),
        "begin_ns": t[src],
        "end_ns": end_t,
        "payload": pl,
        "open": is_open,
    }
    launch = {
        "rank": info.rank, "launch": info.launch, "kernel": info.kernel, "iteration": info.iteration,
        "host_begin_ns": int(info.host_begin_ns), "host_end_ns": int(info.host_end_ns),
        "gpu_begin_ns": gpu_begin, "gpu_end_ns": gpu_end,
        "regions": int(used.sum()), "dropped": dropped,
    }
    return cols, names, tables.roles, launch, warns


def _to_timeline(cols, launch, info: LaunchInfo, clock: ClockModel | None, shift: int):
    """Map raw times in place; returns the host row (or None)."""
    gb, ge = launch["gpu_begin_ns"], launch["gpu_end_ns"]
    if clock is not None:
        for c in ("begin_ns", "end_ns"):
            cols[c] = clock.to_run_timeline(info.rank, cols[c])
        if gb >= 0:
            launch["gpu_begin_ns"] = int(clock.to_run_timeline(info.rank, np.array([gb]))[0])
            launch["gpu_end_ns"] = int(clock.to_run_timeline(info.rank, np.array([ge]))[0])
        if clock.host is not None and info.host_begin_ns >= 0 and info.host_end_ns >= info.host_begin_ns:
            hb, he = clock.host_to_run_timeline(np.array([info.host_begin_ns, info.host_end_ns]))
            launch["host_begin_ns"], launch["host_end_ns"] = int(hb), int(he)
            return int(hb), int(he)
        launch["host_begin_ns"] = launch["host_end_ns"] = -1
        return None
    cols["begin_ns"] = cols["begin_ns"] - np.int64(shift)
    cols["end_ns"] = cols["end_ns"] - np.int64(shift)
    if gb >= 0:
        launch["gpu_begin_ns"], launch["gpu_end_ns"] = gb - shift, ge - shift
    launch["host_begin_ns"] = launch["host_end_ns"] = -1  # no host clock to map them with
    return None


def _frame(cols, names, roles, info: LaunchInfo, host) -> pd.DataFrame:
    k = len(cols["begin_ns"])
    kind, phase, role = cols["kind"], cols["phase"], cols["role"]
    begin, end, payload, opn = cols["begin_ns"], cols["end_ns"], cols["payload"], cols["open"]
    sm, block, warp = cols["sm"], cols["block"], cols["warp"]
    if host is not None:
        if info.kernel not in names:
            names = [*names, info.kernel]
        kind = np.r_[kind, _K_HOST].astype(np.int8)
        phase = np.r_[phase, names.index(info.kernel)].astype(np.int32)
        role = np.r_[role, roles.index("host")].astype(np.int16)
        begin, end = np.r_[begin, host[0]], np.r_[end, host[1]]
        payload, opn = np.r_[payload, 0], np.r_[opn, False]
        sm, block, warp = np.r_[sm, -1].astype(np.int16), np.r_[block, -1].astype(np.int32), np.r_[warp, -1].astype(np.int16)
        k += 1
    return pd.DataFrame({
        "rank": np.full(k, info.rank, np.int16),
        "launch": np.full(k, info.launch, np.int32),
        "kernel": pd.Categorical.from_codes(np.zeros(k, np.int8), categories=[info.kernel]),
        "iteration": np.full(k, info.iteration, np.int32),
        "sm": sm, "block": block, "warp": warp,
        "role": pd.Categorical.from_codes(role, categories=roles),
        "kind": pd.Categorical.from_codes(kind, categories=list(EVENT_KINDS)),
        "phase": pd.Categorical.from_codes(phase, categories=names),
        "begin_ns": np.asarray(begin, np.int64), "end_ns": np.asarray(end, np.int64),
        "payload": np.asarray(payload, np.int64), "open": np.asarray(opn, bool),
    })


def _raw_min(cols, launch) -> int | None:
    vals = []
    if len(cols["begin_ns"]):
        vals.append(int(cols["begin_ns"].min()))
    if launch["gpu_begin_ns"] >= 0:
        vals.append(launch["gpu_begin_ns"])
    return min(vals) if vals else None


def decode_buffer(buf, info: LaunchInfo, registry, clock: ClockModel | None = None) -> DecodedLaunch:
    """Decode one launch's profile buffer.

    buf: bytes | memoryview | np.ndarray (any dtype, viewed as bytes); registry: Registry or its
    to_json() dict. With a ClockModel, times are on the run timeline (ns since run start, rank 0
    clock) and host spans become kind='host' rows; without one, times are this buffer's
    globaltimer minus its earliest timestamp. Raises DecodeError subclasses for unreadable
    buffers; recoverable problems come back in .warnings.
    """
    tables = _tables(registry)
    cols, names, roles, launch, warns = _decode_raw(buf, info, tables)
    shift = _raw_min(cols, launch) or 0
    host = _to_timeline(cols, launch, info, clock, shift)
    return DecodedLaunch(_frame(cols, names, roles, info, host), launch, warns)


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
    if not frames:
        return empty_events()
    if len(frames) == 1:
        return frames[0].reset_index(drop=True)
    out = {}
    for c, t in COLUMNS.items():
        if t == "category":
            if c == "kind":  # fixed categories: concatenate the codes
                out[c] = pd.Categorical.from_codes(np.concatenate([f[c].cat.codes.to_numpy() for f in frames]),
                                                   categories=list(EVENT_KINDS))
            else:
                out[c] = union_categoricals([f[c] for f in frames])
        else:
            out[c] = np.concatenate([f[c].to_numpy() for f in frames])
    return pd.DataFrame(out)


def launches_frame(rows: list[dict]) -> pd.DataFrame:
    df = pd.DataFrame(rows, columns=list(LAUNCH_COLUMNS))
    return df.astype(LAUNCH_COLUMNS)


def decode_launches(items, registries, clocks: ClockModel | None = None) -> Decoded:
    """Decode many launches (of any ranks and kernel families) into one table.

    items: iterable of (buf, LaunchInfo); registries: {family: Registry | to_json dict}. Without
    a clock model every rank's times are its own globaltimer minus the earliest raw timestamp of
    the whole decode (only meaningful across ranks on one GPU clock).
    """
    tabs = {fam: _tables(r) for fam, r in registries.items()}
    raw = []
    for buf, info in items:
        if info.family not in tabs:
            raise KeyError(f"no registry for kernel family {info.family!r} (have {sorted(tabs)})")
        raw.append((info, *_decode_raw(buf, info, tabs[info.family])))
    mins = [m for r in raw if (m := _raw_min(r[1], r[4])) is not None]
    shift = min(mins) if mins else 0
    frames, launches, warns = [], [], []
    for info, cols, names, roles, launch, w in raw:
        host = _to_timeline(cols, launch, info, clocks, shift)
        frames.append(_frame(cols, names, roles, info, host))
        launches.append(launch)
        warns += w
    return Decoded(concat_events(frames), launches_frame(launches), aggregate_warnings(warns))
