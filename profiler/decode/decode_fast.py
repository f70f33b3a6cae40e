"""A launch's records -> its rows of the event table, one compiled loop (optional: the `fast` extra).

profiler.decode.decode plans each launch with numpy (headers, region states, the time window, the clock
conversion of every region and its anchor segments) and then hands the whole launch either to
profiler.decode.decode_records (numpy, chunk by chunk) or to `decode_launch` here: one loop over each
region's candidate records that applies the decoder rules of docs/design.md record by record, the
way tests/profiler/reference_decoder.py does, writing the rows straight into the preallocated
columns. The differential tests hold every path equal to the reference decoder
(tests/profiler/differential.py).

Why compiled: the numpy path makes ~45 array passes over each chunk and tops out near 10-24 M
records/s a core (benchmarks/results/decode-cpu-2026-11-30.md); this loop reads each record once.

How it is compiled, and why not only numba's JIT: a fresh process pays ~0.15 s CPU to import
numba and ~0.4 s more for its first call of any function, even one loaded from numba's on-disk
cache (LLVM and numba's typing are set up on first use; dev VM, benchmarks/NOTES.md): more than
the whole budget of a cold 1 M-record decode at 50 M records/s (20 ms). So `_launch` is compiled
ahead of time with numba.pycc into a small extension module kept in a per-user cache directory
(`aot_dir()`), built on the first decode after installing or changing this file and loaded by
every later process in under a millisecond without importing numba. Where that build cannot run
(no C compiler, a numba without pycc) the same function runs under numba's JIT with its on-disk
cache (`cache=True`). The mechanism is profiler/aot.py's, shared with the graph build's loops.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .. import aot
from ..generated import layout as L

# Record as two u64 words: t, then id (bits 0-15) | kind (16-23) | reserved (24-31) | payload (32-63)
_RF = L.RECORD_DTYPE.fields
assert L.RECORD_SIZE == 16 and _RF["t"][1] == 0 and _RF["id"][1] == 8, "the loop reads records as two u64 words"
assert _RF["kind"][1] == 10 and _RF["payload"][1] == 12, "kind at bits 16-23 and payload at 32-63 of the second word"
# (u64 constants: numba types a u64 mixed with an i64 as float64)
_KIND_SHIFT, _PAYLOAD_SHIFT = np.uint64(8 * (_RF["kind"][1] - 8)), np.uint64(8 * (_RF["payload"][1] - 8))
_ID_MASK, _BYTE, _KEY_SHIFT = np.uint64(0xFFFF), np.uint64(0xFF), np.uint64(16)
# What the loop returns, by index of its result array
R_EVENTS, R_CORRUPT, R_BADTIME, R_UNMATCHED_END, R_UNMATCHED_BEGIN, R_REVERSED, R_UNKNOWN, R_TMIN, R_TMAX, \
    R_ANCHORS = range(10)
_RESULTS = 10
_IDS = 1 << 16
_I64_MAX = np.iinfo(np.int64).max


def _launch(slots, base, n, hires, v2, lo, hi, cs, rate, gs, ylo, yhi, seg_at, seg_len, pcs, pgs, prates,
            phase_lut, role_lut, kind_lut, blk, wrp, smv,
            o_begin, o_end, o_payload, o_phase, o_role, o_kind, o_open, o_block, o_warp, o_sm,
            o, unk_pos, unk_key, stamp, prev, gen0, tadd, tfrac, tdrift, tanchor, tmap, res):
    """Rows of every region of one launch from row `o` on; counts and time bounds into `res`.

    One pass over each region's records: a BEGIN's row is written open, ending where it begins;
    the END that closes it (the next END of its id) sets its end (and its payload when the BEGIN
    carried 0); BEGINs still open at the region's end end at its last kept record. stamp and prev
    (one entry per id) hold each id's open BEGIN: row prev of the region numbered stamp; regions
    are numbered gen0 + 1, gen0 + 2, ... so the arrays are zeroed once per decode, not per launch.
    ANCHORs of regions without anchor segments are counted (R_ANCHORS): the plan was made without
    looking for them (profiler.decode.decode _Plan.finish) and must be made again if there are any.
    With `tmap`, each region's rows, once complete (every rule above reads raw times), get their
    times moved to the table's time base while they are still in cache: t + tadd, plus
    rint(tfrac + tdrift * (t - tanchor)) where tdrift is not 0 (align.RankClock.to_ref's
    arithmetic, in its order; see time_map). The counts and res's time bounds stay raw.
    Nothing is allocated here, so the AOT build needs no numba runtime."""
    ulo, uhi = np.uint64(lo), np.uint64(hi)
    ev = o
    corrupt = badtime = unmatched_end = unmatched_begin = reversed_ = unknown = anchors = 0
    tmin, tmax = _I64_MAX, -_I64_MAX
    for r in range(n.shape[0]):
        m = n[r]
        if m == 0:
            continue
        b0 = base[r]
        gen = gen0 + r + 1
        sa, sl = seg_at[r], seg_len[r]
        last_t = np.int64(0)
        r_start = ev
        still_open = 0
        first_role = 0
        barriers = False
        blk_r, wrp_r, sm_r = blk[r], wrp[r], smv[r]
        for j in range(m):
            w0, w1 = slots[b0 + j, 0], slots[b0 + j, 1]
            kind = np.uint8((w1 >> _KIND_SHIFT) & _BYTE)
            if v2 and kind == 6:   # an ANCHOR: a conversion point (profiler.decode.decode plans it), not an event
                if sa < 0:
                    anchors += 1
                continue
            if kind < 1 or kind > 5:
                corrupt += 1
                continue
            if not hires:
                ok = w0 >= ulo and w0 <= uhi
                t = np.int64(w0)
            else:
                if sa >= 0:   # the segment of the last anchor point at or before this clock
                    off = np.int64(w0 - pcs[sa])
                    k = 0
                    for q in range(1, sl - 1):
                        if np.int64(pcs[sa + q] - pcs[sa]) <= off:
                            k += 1
                    c0, g0, rt = pcs[sa + k], pgs[sa + k], prates[sa + k]
                    yl, yh = np.float64(lo - g0), np.float64(hi - g0)
                else:
                    c0, g0, rt, yl, yh = cs[r], gs[r], rate[r], ylo[r], yhi[r]
                y = np.float64(np.int64(w0 - c0)) * rt
                ok = y >= yl and y <= yh
                t = g0 + np.int64(np.rint(y)) if ok else np.int64(0)
            if not ok:
                badtime += 1
                continue
            last_t = t
            pid = w1 & _ID_MASK
            if kind == 2:
                if stamp[pid] == gen:
                    q = prev[pid]
                    stamp[pid] = 0
                    e = t
                    if e < o_begin[q]:
                        e = o_begin[q]
                        reversed_ += 1
                    o_end[q] = e
                    o_open[q] = False
                    if o_payload[q] == 0:   # counts known only at the end ride on the END
                        o_payload[q] = np.int64(w1 >> _PAYLOAD_SHIFT)
                    still_open -= 1
                    tmax = max(tmax, e)
                else:
                    unmatched_end += 1
                continue
            key = pid | (np.uint64(kind & 7) << _KEY_SHIFT)
            o_begin[ev] = t
            o_end[ev] = t
            o_payload[ev] = np.int64(w1 >> _PAYLOAD_SHIFT)
            ph = phase_lut[key]
            o_phase[ev] = ph
            if ph < 0:
                unk_pos[unknown] = ev
                unk_key[unknown] = np.int64(key)
                unknown += 1
            ro = role_lut[key]
            o_role[ev] = ro
            if ro < 0:
                barriers = True
            elif ro > 0 and first_role == 0:
                first_role = ro
            o_kind[ev] = kind_lut[key]
            o_block[ev] = blk_r
            o_warp[ev] = wrp_r
            o_sm[ev] = sm_r
            if kind == 1:   # open until its END (a BEGIN it replaces in prev stays open)
                o_open[ev] = True
                still_open += 1
                stamp[pid] = gen
                prev[pid] = ev
            else:
                o_open[ev] = False
            tmin = min(tmin, t)
            tmax = max(tmax, t)
            ev += 1
        if still_open:   # BEGINs without END end at the warp's last kept record
            for q in range(r_start, ev):
                if o_open[q]:
                    unmatched_begin += 1
                    e = last_t
                    if e < o_begin[q]:
                        e = o_begin[q]
                        reversed_ += 1
                    o_end[q] = e
                    tmax = max(tmax, e)
        if barriers:   # a barrier event takes the role of its warp's first role-bearing event
            for q in range(r_start, ev):
                if o_role[q] < 0:
                    o_role[q] = first_role
        if tmap:   # raw times -> the table's time base (the region's rows are still in cache)
            if tdrift != 0.0:
                for q in range(r_start, ev):
                    tb, te = o_begin[q], o_end[q]
                    o_begin[q] = tb + tadd + np.int64(np.rint(tfrac + tdrift * np.float64(tb - tanchor)))
                    o_end[q] = te + tadd + np.int64(np.rint(tfrac + tdrift * np.float64(te - tanchor)))
            else:
                for q in range(r_start, ev):
                    o_begin[q] += tadd
                    o_end[q] += tadd
    res[R_EVENTS], res[R_CORRUPT], res[R_BADTIME] = ev - o, corrupt, badtime
    res[R_UNMATCHED_END], res[R_UNMATCHED_BEGIN], res[R_REVERSED], res[R_UNKNOWN] = \
        unmatched_end, unmatched_begin, reversed_, unknown
    res[R_TMIN], res[R_TMAX], res[R_ANCHORS] = tmin, tmax, anchors


# Format 3 (profiler.decode.decode_format3 states the rules; this is its loop, record by record): the
# meta word's fields, the kinds, and the constants of the clock chain, all u64 (numba types a u64
# mixed with an i64 as float64).
_U = np.uint64
_M32, _KS, _IS = _U(0xFFFF_FFFF), _U(L.META_KIND_SHIFT), _U(L.META_ID_SHIFT)
_IDM, _PLM, _HIGH = _U((1 << L.META_ID_BITS) - 1), _U((1 << L.META_PAYLOAD_BITS) - 1), _U((1 << L.META_KIND_SHIFT) - 1)
_M48, _M60 = _U((1 << 48) - 1), _U((1 << (L.META_KIND_SHIFT + 32)) - 1)
_K_FIRST, _K_LAST, _K_ANCHOR = _U(L.KIND_BEGIN), _U(L.KIND_BARRIER_DEPART), _U(L.KIND_ANCHOR)
_K_PAYLOAD, _K_ANCHOR_NS, _K_SHIFT2, _PL_SHIFT2 = _U(L.KIND_PAYLOAD), _U(L.KIND_ANCHOR_NS), _U(16), _U(32)
_PAST, _WRAP = _U(1 << 62), np.int64(1 << 32)


def _expand3(words, stride, first, n, cs, ce, gs, finished, out, out_base, out_n, res):
    """Format 3's candidate slots of every region -> format-2 records in `out`, region after region
    (region r's at out[out_base[r]:out_base[r] + out_n[r]]); res: [saturated payloads, ambiguous
    regions]. profiler.decode.decode_format3.expand does the same with numpy; the fuzz tests hold both to
    the reference decoder."""
    o = 0
    saturated = 0
    ambiguous = 0
    for r in range(n.shape[0]):
        out_base[r] = o
        m = n[r]
        row = r * stride + first
        c = cs[r]
        end_check = finished[r] and np.int64(ce[r] - cs[r]) > 0
        since = False
        amb = False
        j = 0
        while j < m:
            s = words[row + j]
            t, meta = s & _M32, s >> _PL_SHIFT2
            kind, pid = meta >> _KS, (meta >> _IS) & _IDM
            nxt = words[row + j + 1] >> _PL_SHIFT2 if j + 1 < m else _U(0)
            if kind >= _K_FIRST and kind <= _K_LAST:
                pl = meta & _PLM
                step = 1
                if j + 1 < m and (nxt >> _KS) == _K_PAYLOAD and ((nxt >> _IS) & _IDM) == pid:
                    pl = words[row + j + 1] & _M32
                    step = 2
                elif pl == _PLM:
                    saturated += 1
                c = c + ((t - c) & _M32)
                since = True
                clk = cs[r] + _PAST if end_check and np.int64(ce[r] - c) < 0 else c
                out[o, 0] = clk
                out[o, 1] = pid | (kind << _K_SHIFT2) | (pl << _PL_SHIFT2)
                j += step
            elif kind == _K_ANCHOR:
                ca = cs[r] + (((((meta & _HIGH) << _PL_SHIFT2) | t) & _M48) - cs[r] & _M48)
                g = _U(0)
                step = 1
                if j + 1 < m and (nxt >> _KS) == _K_ANCHOR_NS:
                    gbits = ((nxt & _HIGH) << _PL_SHIFT2) | (words[row + j + 1] & _M32)
                    g = gs[r] + ((gbits - gs[r]) & _M60)
                    ahead = np.int64(ca - c)
                    if since and ahead >= _WRAP:
                        amb = True
                    if ahead >= 0:
                        c = ca
                        since = False
                    step = 2
                c48 = ca & _M48
                out[o, 0] = g
                out[o, 1] = (c48 >> _PL_SHIFT2) | (_K_ANCHOR << _K_SHIFT2) | ((c48 & _M32) << _PL_SHIFT2)
                j += step
            else:   # an empty slot, an unknown kind, a PAYLOAD / ANCHOR_NS that follows nothing of its own
                out[o, 0] = _U(0)
                out[o, 1] = _U(0)
                j += 1
            o += 1
        if end_check and since and np.int64(ce[r] - c) >= _WRAP:
            amb = True
        if amb:
            ambiguous += 1
        out_n[r] = o - out_base[r]
    res[0] = saturated
    res[1] = ambiguous


_EXPAND_SIGNATURE = ("void(uint64[::1], int64, int64, int64[::1], uint64[::1], uint64[::1], uint64[::1], boolean[::1], "
                     "uint64[:, ::1], int64[::1], int64[::1], int64[::1])")


# Exported variants: the phase and role code widths decode._code_dtype picks (int8 up to 126
# names, int16 past); any other combination (over 32 k phase names or 126 roles) runs the JIT.
_CODES = {(np.dtype(np.int8), np.dtype(np.int8)): "i8_i8", (np.dtype(np.int16), np.dtype(np.int8)): "i16_i8"}
_AOT_MODULE = "_epscope_decode_aot"


def _signature(phase: str, role: str) -> str:
    a = "{}[::1]".format
    return "void(" + ", ".join([
        "uint64[:, ::1]", a("int64"), a("int64"), "boolean", "boolean", "int64", "int64",
        a("uint64"), a("float64"), a("int64"), a("float64"), a("float64"),
        a("int64"), a("int64"), a("uint64"), a("int64"), a("float64"),
        a(phase), a(role), a("int8"), a("int32"), a("int16"), a("int16"),
        a("int64"), a("int64"), a("int64"), a(phase), a(role), a("int8"), a("boolean"), a("int32"), a("int16"), a("int16"),
        "int64", a("int64"), a("int64"), a("int64"), a("int64"), "int64",
        "int64", "float64", "float64", "int64", "boolean", a("int64")]) + ")"


def _exports() -> dict:
    out = {name: (_launch, _signature(ph.name, ro.name)) for (ph, ro), name in _CODES.items()}
    out["expand3"] = (_expand3, _EXPAND_SIGNATURE)
    return out


def aot_dir() -> Path:
    """Where the ahead-of-time build of this file lives: keyed by this file's bytes and the Python,
    numpy and platform it was built for (under cachedir.cache_root(); profiler.aot.build_dir)."""
    return aot.build_dir(Path(__file__), "decode")


def _load_aot(where: Path):
    return aot.load(where, _AOT_MODULE)


def build_aot(where: Path | None = None) -> Path:
    """Compile `_launch` and `_expand3` ahead of time (numba.pycc) into `where` (default aot_dir());
    its path (profiler.aot.build: renamed into place, never half-written)."""
    return aot.build(where or aot_dir(), _AOT_MODULE, _exports())


class Kernels:
    """The compiled `_launch` for each (phase, role) code width: the AOT module's, else the JIT's
    (profiler.aot.Compiled: built on first use, the JIT where pycc cannot run)."""

    def __init__(self, jit_only: bool = False):
        self._c = aot.Compiled(_AOT_MODULE, Path(__file__), "decode", _exports(), "the record loop", jit_only,
                               builder=lambda where: build_aot(where))   # (looked up late: tests replace it)
        self.aot, self.how, self.build_error = self._c.aot, self._c.how, self._c.build_error

    def expand3(self):
        """The compiled format-3 expansion (_expand3): the AOT module's, else the JIT's."""
        return self._c.get("expand3")

    def get(self, phase: np.dtype, role: np.dtype):
        name = _CODES.get((np.dtype(phase), np.dtype(role)))
        return self._c.get(name or "", _launch)   # no AOT variant of these widths: the JIT


_KERNELS: dict[bool, Kernels] = {}


def kernels(jit_only: bool = False) -> Kernels:
    k = _KERNELS.get(jit_only)
    if k is None:
        k = _KERNELS[jit_only] = Kernels(jit_only)
    return k


def available() -> bool:
    """Can this process run the compiled loop (an AOT build on disk, or numba to make one)?"""
    return aot.available(aot_dir(), _AOT_MODULE)


def _segments(plan, nreg: int):
    """The anchor segments of plan.segments as flat arrays: (first point of each region or -1,
    points of each region, point clocks, point ns, rate of the segment from each point)."""
    seg_at, seg_len = np.full(nreg, -1, np.int64), np.zeros(nreg, np.int64)
    pcs, pgs, prates = [np.zeros(0, np.uint64)], [np.zeros(0, np.int64)], [np.zeros(0, np.float64)]
    at = 0
    for r, (pc, pg, rates) in plan.segments.items():
        seg_at[r], seg_len[r] = at, len(pc)
        pcs.append(pc)
        pgs.append(pg)
        prates.append(np.r_[rates, 0.0])   # one rate per segment; the last point starts none
        at += len(pc)
    return seg_at, seg_len, np.concatenate(pcs), np.concatenate(pgs), np.concatenate(prates)


class Scratch:
    """Work arrays of one decode, shared by its launches (see _launch)."""

    def __init__(self):
        self.stamp, self.prev = np.zeros(_IDS, np.int64), np.zeros(_IDS, np.int64)
        self.regions = 0   # regions numbered so far (stamp values in use)
        # reused by every launch: a fresh array per launch cost a page fault per 4 kB of it (the
        # sys time of a 30 M-record sparse decode was 2.3 s of 3.5)
        self._cand = np.empty((0, 2), np.uint64)
        self._unk = np.empty((2, 0), np.int64)

    def candidates(self, records: int) -> np.ndarray:
        """(records, 2) u64 for a launch's candidate records copied together."""
        if len(self._cand) < records:
            self._cand = np.empty((records, 2), np.uint64)
        return self._cand[:records]

    def unknown(self, records: int) -> tuple[np.ndarray, np.ndarray]:
        """Room for the row and LUT key of every unnamed event of a launch (pages touched only if used)."""
        if self._unk.shape[1] < records:
            self._unk = np.empty((2, records), np.int64)
        return self._unk[0, :records], self._unk[1, :records]


def time_map(add: int = 0, clock=None) -> tuple:
    """_launch's (tadd, tfrac, tdrift, tanchor, tmap) for raw time t -> t + add, or, with a rank's
    align.RankClock, -> clock.to_ref(t) + add: the same int64 and float64 operations in the same
    order (t + whole + rint(frac + drift_ppm * 1e-6 * (t - anchor))), so the table is the one
    ClockModel.to_run_timeline gives, bit for bit (tests/profiler/test_decode_fast.py)."""
    if clock is None:
        return np.int64(add), 0.0, 0.0, np.int64(0), add != 0
    whole = int(np.floor(clock.offset_ns))
    frac, drift = clock.offset_ns - whole, clock.drift_ppm * 1e-6
    if drift == 0.0:   # frac + 0.0 * x is frac for every finite x: a constant
        return np.int64(whole + add + int(np.rint(frac))), 0.0, 0.0, np.int64(0), True
    return np.int64(whole + add), float(frac), float(drift), np.int64(clock.anchor_ns), True


def decode_launch(plan, out: dict, o: int, codes, scratch: Scratch, jit_only: bool = False,
                  tmap: tuple | None = None):
    """Decode every record of `plan` into out[column][o:]; a decode_records.ChunkResult. A plan made
    without the anchor search is made again with it, and the launch decoded again, when the loop
    meets an ANCHOR record (optional in format 2: only kernels that call rec.anchor() write them).
    tmap: time_map()'s answer, the rows' times moved to the table's base as they are written
    (default: raw)."""
    from .decode_records import ChunkResult
    phase_lut, role_lut = codes.phase_lut(plan.family), codes.role_lut(plan.family)
    assert phase_lut.dtype == out["phase"].dtype and role_lut.dtype == out["role"].dtype, "LUT and column widths differ"
    launch = kernels(jit_only).get(phase_lut.dtype, role_lut.dtype)
    nreg = len(plan.n)
    n = plan.n.astype(np.int64)
    w = int(n.max()) if nreg else 0
    if plan.slots is not None and 2 * w <= plan.cap:
        # Sparse regions (the recorded EP runs: 16-64 records at capacity 512-4096): copy the
        # candidates together first. Each region's first record costs a TLB and cache miss; a
        # plain copy overlaps those misses, the branchy loop does not (1 M records in 30 launches of
        # 2112 regions x 16 at capacity 128: loop 49 ns a record in place, ~15 with the copy).
        slots = scratch.candidates(nreg * w)
        np.copyto(slots.reshape(nreg, w, 2), plan.slots[:, :w])
        base = np.arange(nreg, dtype=np.int64) * w
    else:
        slots = plan.all_slots   # in place (format 3's expanded records lie together already)
        base = np.ascontiguousarray(plan.base, np.int64)
    assert slots.dtype == np.uint64 and slots.flags.c_contiguous, "records are read as C-contiguous u64 pairs"
    blk, wrp, smv = (np.ascontiguousarray(a, dt) for a, dt in ((plan.block, np.int32), (plan.warp, np.int16),
                                                               (plan.sm, np.int16)))
    unk_pos, unk_key = scratch.unknown(plan.n_records)
    r = np.zeros(_RESULTS, np.int64)
    sc = scratch
    while True:
        if plan.hires:
            cs, rate, gs = (np.ascontiguousarray(a, dt) for a, dt in ((plan.cs, np.uint64), (plan.rate, np.float64),
                                                                      (plan.gs, np.int64)))
            ylo, yhi = np.ascontiguousarray(plan.ylo, np.float64), np.ascontiguousarray(plan.yhi, np.float64)
        else:   # unused: times are raw globaltimer ns checked against the window
            cs, gs = np.zeros(nreg, np.uint64), np.zeros(nreg, np.int64)
            rate, ylo, yhi = (np.zeros(nreg, np.float64) for _ in range(3))
        seg_at, seg_len, pcs, pgs, prates = _segments(plan, nreg)
        lo, hi = plan.window
        launch(slots, base, n, bool(plan.hires), plan.version >= 2, np.int64(lo), np.int64(hi),
               cs, rate, gs, ylo, yhi, seg_at, seg_len, pcs, pgs, prates,
               phase_lut, role_lut, codes.kind_lut, blk, wrp, smv,
               out["begin_ns"], out["end_ns"], out["payload"], out["phase"], out["role"], out["kind"], out["open"],
               out["block"], out["warp"], out["sm"], np.int64(o), unk_pos, unk_key, sc.stamp, sc.prev,
               np.int64(sc.regions), *(tmap or time_map()), r)
        sc.regions += nreg
        if not r[R_ANCHORS] or plan.anchors_searched:
            break
        plan.with_anchors()   # the rows written are written again
    res = ChunkResult()
    res.events = int(r[R_EVENTS])
    res.counts = {"CorruptRecords": int(r[R_CORRUPT]), "BadTimestamps": int(r[R_BADTIME]),
                  "UnmatchedEnd": int(r[R_UNMATCHED_END]), "UnmatchedBegin": int(r[R_UNMATCHED_BEGIN]),
                  "ReversedSpans": int(r[R_REVERSED])}
    if res.events:
        res.tmin, res.tmax = int(r[R_TMIN]), int(r[R_TMAX])
    k = int(r[R_UNKNOWN])
    if k:
        res.unknown = (unk_pos[:k].copy(), unk_key[:k].copy())   # the scratch is the next launch's
    return res


def expand(words: np.ndarray, first_slot: int, n: np.ndarray, rh: np.ndarray, finished: np.ndarray,
           out: np.ndarray | None = None, jit_only: bool = False):
    """profiler.decode.decode_format3.expand through the compiled loop: the same Expanded (into `out`,
    (at least n.sum(), 2) u64, when given)."""
    from .decode_format3 import Expanded
    nreg = len(n)
    n = np.ascontiguousarray(n, np.int64)
    flat = words.reshape(-1)
    if flat.ctypes.data % 8:   # the compiled loop reads aligned words
        flat = flat.copy()
    out = np.empty((int(n.sum()), 2), np.uint64) if out is None else out
    assert out.dtype == np.uint64 and out.flags.c_contiguous and len(out) >= int(n.sum()), "the records' array"
    base, n_out, res = np.empty(nreg, np.int64), np.empty(nreg, np.int64), np.zeros(2, np.int64)
    kernels(jit_only).expand3()(flat, np.int64(words.shape[1]), np.int64(first_slot), n,
                                *(np.ascontiguousarray(rh[f], np.uint64) for f in ("clk_start", "clk_end", "gt_start")),
                                np.ascontiguousarray(finished, np.bool_), out, base, n_out, res)
    return Expanded(out[:int(n_out.sum())], n_out, base, int(res[0]), int(res[1]))


class Loop:
    """The compiled record loop as profiler.decode.decode drives it: one Scratch per decode, then
    decode() per launch, its times moved to the table's base by the loop (time_map)."""

    def __init__(self, jit_only: bool = False):
        self.jit_only = jit_only

    def expand(self, words, first_slot: int, n, rh, finished, out=None):
        return expand(words, first_slot, n, rh, finished, out, self.jit_only)

    def scratch(self, plans: list) -> Scratch:
        return Scratch()

    def decode(self, plan, out: dict, o: int, codes, scratch: Scratch, tmap: tuple | None = None):
        return decode_launch(plan, out, o, codes, scratch, self.jit_only, tmap)
