"""A small, slow, obviously-correct decoder: the oracle of the differential fuzz tests.

Written from profiler/layout.toml (parsed here, offsets computed here: it does not use the
generated numpy dtypes) and from the decoder rules of docs/design.md, one record at a time in
plain Python. profiler.decode.decode must give the same table, launches, warning counts and errors for
every input; tests/profiler/test_decode_fuzz.py and benchmarks/fuzz_decode.py compare the two.
It takes its policy numbers (time window, plausible clock rates, limits) from profiler.decode.decode:
those are choices, not layout, and the comparison is about implementing them the same way.
"""
from __future__ import annotations

import struct
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from profiler.decode import decode as D
from profiler import errors as E

LAYOUT = tomllib.loads((Path(D.__file__).parents[1] / "layout.toml").read_text())   # profiler/layout.toml
_FMT = {"u8": "B", "u16": "H", "u32": "I", "u64": "Q", "i64": "q"}
_SIZE = {"u8": 1, "u16": 2, "u32": 4, "u64": 8, "i64": 8}
KIND = LAYOUT["kinds"]
STATE = LAYOUT["region_state"]
HIRES = LAYOUT["flags"]["HIRES"]
EVENT_KIND = {KIND["BEGIN"]: "span", KIND["INSTANT"]: "instant", KIND["BARRIER_ARRIVE"]: "arrive",
              KIND["BARRIER_DEPART"]: "depart"}
U64 = 1 << 64


@dataclass(frozen=True)
class Struct:
    name: str
    size: int
    offsets: dict
    formats: dict

    def read(self, buf: bytes, at: int) -> dict:
        return {n: struct.unpack_from("<" + f, buf, at + self.offsets[n])[0] for n, f in self.formats.items()}


def _struct(name: str) -> Struct:
    (s,) = [s for s in LAYOUT["struct"] if s["name"] == name]
    off, offsets, formats = 0, {}, {}
    for fname, ftype, _ in s["fields"]:
        size = _SIZE[ftype]
        off = -(-off // size) * size  # natural alignment
        offsets[fname], formats[fname] = off, _FMT[ftype]
        off += size
    assert off == s["size"], f"{name}: fields end at {off}, declared size {s['size']}"
    return Struct(name, s["size"], offsets, formats)


HDR, RH, REC, REC8 = _struct("BufferHeader"), _struct("RegionHeader"), _struct("Record"), _struct("Record8")
META = {name: (low, width) for name, (low, width) in LAYOUT["record8"].items()}


def _meta(meta: int, name: str) -> int:
    low, width = META[name]
    return (meta >> low) & ((1 << width) - 1)


def _format3(slots: list, r: dict, finished: bool, count) -> list:
    """Format 3: a region's candidate slots (t, meta) -> records as the format-2 rules read them
    (kind, id, payload, t = full clock64 or an ANCHOR's globaltimer, past_finish), one slot at a time."""
    out = []
    c, since, ambiguous = r["clk_start"], False, False
    end_check = finished and _signed64(r["clk_end"] - r["clk_start"]) > 0
    high = (1 << META["kind"][0]) - 1           # an anchor's high clock bits sit under the kind
    i = 0
    while i < len(slots):
        t, meta = slots[i]
        kind, pid = _meta(meta, "kind"), _meta(meta, "id")
        nxt = slots[i + 1] if i + 1 < len(slots) else None
        if 1 <= kind <= 5:
            payload = _meta(meta, "payload")
            step = 1
            if nxt is not None and _meta(nxt[1], "kind") == KIND["PAYLOAD"] and _meta(nxt[1], "id") == pid:
                payload, step = nxt[0], 2
            elif payload == (1 << META["payload"][1]) - 1:
                count("PayloadSaturated", 1)
            c = (c + (t - c) % (1 << 32)) % U64
            since = True
            out.append({"kind": kind, "id": pid, "payload": payload, "t": c,
                        "past_finish": end_check and _signed64(r["clk_end"] - c) < 0})
            i += step
        elif kind == KIND["ANCHOR"]:
            bits = (((meta & high) << 32) | t) % (1 << D.ANCHOR_CLOCK_BITS)
            ca = (r["clk_start"] + (bits - r["clk_start"]) % (1 << D.ANCHOR_CLOCK_BITS)) % U64
            g = 0   # without its ANCHOR_NS slot the anchor cannot anchor (BadAnchors below)
            if nxt is not None and _meta(nxt[1], "kind") == KIND["ANCHOR_NS"]:
                gbits = ((nxt[1] & high) << 32) | nxt[0]
                width = META["kind"][0] + 32
                g = (r["gt_start"] + (gbits - r["gt_start"]) % (1 << width)) % U64
                ahead = _signed64(ca - c)
                ambiguous |= since and ahead >= 1 << 32
                if ahead >= 0:
                    c, since = ca, False
                i += 1
            out.append({"kind": kind, "id": ca >> 32 & 0xFFFF, "payload": ca & 0xFFFF_FFFF, "t": g})
            i += 1
        else:   # an empty slot, a kind outside the layout, a PAYLOAD or ANCHOR_NS that follows nothing of its own
            out.append({"kind": KIND["EMPTY"], "id": 0, "payload": 0, "t": 0})
            i += 1
    ambiguous |= end_check and since and _signed64(r["clk_end"] - c) >= 1 << 32
    count("AmbiguousClock", int(ambiguous))
    return out


@dataclass
class RefLaunch:
    events: list = field(default_factory=list)   # dicts with the event-table columns (names as strings)
    launch: dict = field(default_factory=dict)
    warnings: dict = field(default_factory=dict)  # warning type name -> count


@dataclass
class RefError:
    type: str
    offset: int


def _signed64(v: int) -> int:
    v %= U64
    return v - U64 if v >= 1 << 63 else v


def _lower_median(values: list[int]) -> int:
    return sorted(values)[(len(values) - 1) // 2]


def _window(anchor: int | None) -> tuple[int, int]:
    if anchor is None:
        return 1, D.TIME_LIMIT_NS - 1
    return max(1, anchor - D.LAUNCH_WINDOW_NS), min(D.TIME_LIMIT_NS - 1, anchor + D.LAUNCH_WINDOW_NS)


def decode_one(buf: bytes, info: D.LaunchInfo, registry) -> RefLaunch | RefError:
    """One launch, times raw (the caller shifts them)."""
    buf = bytes(buf)
    if len(buf) < HDR.size:
        return RefError("TruncatedBuffer", len(buf))
    h = HDR.read(buf, 0)
    if h["magic"] != LAYOUT["magic"]:
        return RefError("BadMagic", HDR.offsets["magic"])
    if not 1 <= h["version"] <= LAYOUT["version"]:
        return RefError("UnsupportedVersion", HDR.offsets["version"])
    if h["registry_hash"] != registry.hash:
        return RefError("RegistryMismatch", HDR.offsets["registry_hash"])
    nreg, cap, wpb = h["num_regions"], h["region_capacity"], h["warps_per_block"]
    if nreg and not 1 <= wpb <= D.MAX_WARPS_PER_BLOCK:
        return RefError("DecodeError", HDR.offsets["warps_per_block"])
    rec = REC8 if h["version"] >= 3 else REC
    stride = RH.size + cap * rec.size
    if len(buf) < HDR.size + nreg * stride:
        return RefError("TruncatedBuffer", len(buf))
    at = [HDR.size + i * stride for i in range(nreg)]
    rhs = [RH.read(buf, a) for a in at]
    for i, r in enumerate(rhs):
        if r["state"] not in STATE.values():
            return RefError("DecodeError", at[i] + RH.offsets["state"])
    used = [r["state"] != STATE["UNUSED"] for r in rhs]
    for i, r in enumerate(rhs):
        if used[i] and r["sm"] > D.MAX_SM:
            return RefError("DecodeError", at[i] + RH.offsets["sm"])

    warn: dict[str, int] = {}

    def count(name: str, k: int) -> None:
        if k:
            warn[name] = warn.get(name, 0) + k

    version = h["version"]
    # candidate records of each region
    records = []
    dropped = 0
    for i, r in enumerate(rhs):
        recs = [rec.read(buf, at[i] + RH.size + j * rec.size) for j in range(cap)]
        if version >= 3:   # the kind of a format-3 slot is a bit field of its meta word
            for x in recs:
                x["kind"] = _meta(x["meta"], "kind")
        if r["state"] == STATE["FINISHED"]:
            if version >= 2:  # the overflow sink: past capacity, the last slot was overwritten
                n = max(cap - 1, 0) if r["attempted"] > cap else r["attempted"]
            else:
                n = min(r["attempted"], cap)
            dropped += r["attempted"] - n
        elif r["state"] == STATE["STARTED"]:
            n = next((j for j, x in enumerate(recs) if x["kind"] == KIND["EMPTY"]), cap)
        else:
            n = 0
        if version >= 3:
            records.append(_format3([(x["t"], x["meta"]) for x in recs[:n]], r, r["state"] == STATE["FINISHED"], count))
        else:
            records.append(recs[:n])
    count("DroppedRecords", dropped)
    count("UnfinishedRegion", sum(r["state"] == STATE["STARTED"] for r in rhs))

    # the launch's time window, anchored on the median warp start
    starts = [r["gt_start"] for r, u in zip(rhs, used) if u and 1 <= r["gt_start"] < D.TIME_LIMIT_NS]
    hires = bool(h["flags"] & HIRES) or version >= 2
    if starts:
        anchor = _lower_median(starts)
    elif not hires:
        raw = [x["t"] for recs in records for x in recs if 1 <= x["kind"] <= 5 and 1 <= x["t"] < D.TIME_LIMIT_NS]
        anchor = _lower_median(raw) if raw else None
    else:
        anchor = None
    lo, hi = _window(anchor)
    gs_ok = [u and lo <= r["gt_start"] <= hi for r, u in zip(rhs, used)]
    ge_ok = [r["state"] == STATE["FINISHED"] and lo <= r["gt_end"] <= hi for r in rhs]
    count("BadRegionClock", sum(u and (not gs_ok[i] or (rhs[i]["state"] == STATE["FINISHED"] and not ge_ok[i]))
                                for i, u in enumerate(used)))

    end_trusted = list(ge_ok)
    rates_overall = []   # (rate, globaltimer span) of each region converted from two or more points
    changed = {}         # region -> bound of its clock change

    def accept(c0, g0, c1, g1):
        dc = _signed64(c1 - c0)
        return lo <= g1 <= hi and dc > 0 and g1 > g0 and D.MIN_NS_PER_CYCLE <= float(g1 - g0) / float(dc) <= D.MAX_NS_PER_CYCLE

    def anchored(i: int):
        """Format 2: (clocks, ns) of region i's conversion points, or None without a usable anchor."""
        r = rhs[i]
        anchors = [x for x in records[i] if x["kind"] == KIND["ANCHOR"]]
        if not gs_ok[i]:
            count("BadAnchors", len(anchors))
            return None
        pc, pg = [r["clk_start"]], [r["gt_start"]]
        for x in anchors:
            c48 = (x["id"] << 32) | x["payload"]
            c = (pc[0] + ((c48 - pc[0]) % (1 << D.ANCHOR_CLOCK_BITS))) % U64
            g = x["t"]
            if accept(pc[-1], pg[-1], c, g):
                pc.append(c)
                pg.append(g)
            else:
                count("BadAnchors", 1)
        if len(pc) == 1:
            return None
        end_trusted[i] = ge_ok[i] and accept(pc[-1], pg[-1], r["clk_end"], r["gt_end"])
        if end_trusted[i]:
            pc.append(r["clk_end"])
            pg.append(r["gt_end"])
        return pc, pg

    def converter(i: int):
        """raw record time -> (ok, ns) for region i."""
        r = rhs[i]
        if not hires:
            return lambda t: (lo <= t <= hi, t)
        if not gs_ok[i]:
            end_trusted[i] = False
            if version >= 2:
                count("BadAnchors", sum(x["kind"] == KIND["ANCHOR"] for x in records[i]))
            return lambda t: (False, 0)
        points = anchored(i) if version >= 2 else None
        if points is not None:
            pc, pg = points
            rates = [float(pg[k + 1] - pg[k]) / float(_signed64(pc[k + 1] - pc[k])) for k in range(len(pc) - 1)]
            span_g = float(pg[-1] - pg[0])
            rates_overall.append((i, span_g / float(_signed64(pc[-1] - pc[0])), span_g))
            for k in range(len(rates) - 1):
                dg0, dg1 = float(pg[k + 1] - pg[k]), float(pg[k + 2] - pg[k + 1])
                dev = abs(rates[k + 1] / rates[k] - 1.0)
                if dev > 2 * D.ANCHOR_ERROR_NS * (1 / dg0 + 1 / dg1) + D.CLOCK_CHANGE_SLACK:
                    changed[i] = max(changed.get(i, 0.0), dev * min(dg0, dg1))

            def conv_seg(t):
                off = _signed64(t - pc[0])
                k = sum(1 for c in pc[1:-1] if _signed64(c - pc[0]) <= off)
                y = float(_signed64(t - pc[k])) * rates[k]
                if not float(lo - pg[k]) <= y <= float(hi - pg[k]):
                    return False, 0
                return True, pg[k] + round(y)
            return conv_seg
        gs, cs = r["gt_start"], r["clk_start"]
        span_c = _signed64(r["clk_end"] - r["clk_start"])
        rate = None
        if ge_ok[i] and r["clk_end"] > r["clk_start"] and r["gt_end"] > gs:
            rate = float(r["gt_end"] - gs) / float(span_c)
            if not D.MIN_NS_PER_CYCLE <= rate <= D.MAX_NS_PER_CYCLE:
                rate = None
            elif version >= 2:
                rates_overall.append((i, rate, float(r["gt_end"] - gs)))
        if rate is None:
            end_trusted[i] = False  # the finish clock of a rejected pair does not bound the launch either
            rate = 1.0 / D.NOMINAL_SM_GHZ
            if records[i]:
                count("ClockFallback", 1)
        ylo, yhi = float(lo - gs), float(hi - gs)

        def conv(t):
            y = float(_signed64(t - cs)) * rate
            if not ylo <= y <= yhi:  # also false for nan
                return False, 0
            return True, gs + round(y)
        return conv

    phase_names, barrier_names = registry.phase_names(), registry.barrier_names()
    phase_role = {p.id: p.role for p in registry.phases}
    events, times = [], []
    for i, recs in enumerate(records):
        conv = converter(i)
        kept = []
        for x in recs:
            if version >= 2 and x["kind"] == KIND["ANCHOR"]:
                continue  # a conversion point (see anchored), not an event
            if not 1 <= x["kind"] <= 5:
                count("CorruptRecords", 1)
                continue
            if x.get("past_finish"):   # format 3: completed past the region's finish clock
                count("BadTimestamps", 1)
                continue
            ok, t = conv(x["t"])
            if not ok:
                count("BadTimestamps", 1)
                continue
            kept.append((x["kind"], x["id"], x["payload"], t))
        if not kept:
            continue
        last_t = kept[-1][3]
        # spans: per phase id, a BEGIN immediately followed by an END of that id
        partner = {}
        prev = {}
        for j, (k, pid, _, _) in enumerate(kept):
            if k == KIND["BEGIN"]:
                prev[pid] = j
            elif k == KIND["END"]:
                b = prev.pop(pid, None)
                if b is None:
                    count("UnmatchedEnd", 1)
                else:
                    partner[b] = j
        # a BEGIN followed by another BEGIN of its id was replaced in `prev`: it is open
        region_events = []
        for j, (k, pid, pl, t) in enumerate(kept):
            if k == KIND["END"]:
                continue
            is_bar = k >= KIND["BARRIER_ARRIVE"]
            names = barrier_names if is_bar else phase_names
            name = names.get(pid)
            if name is None:
                name = f"{'barrier' if is_bar else 'phase'}_{pid}"
                count("UnknownPhase", 1)
            ev = {"rank": info.rank, "launch": info.launch, "kernel": info.kernel, "iteration": info.iteration,
                  "sm": rhs[i]["sm"], "block": i // wpb, "warp": i % wpb,
                  "role": "" if is_bar else (phase_role.get(pid, "") if pid in phase_names else ""),
                  "kind": EVENT_KIND[k], "phase": name, "begin_ns": t, "end_ns": t, "payload": pl, "open": False}
            if k == KIND["BEGIN"]:
                if j in partner:
                    e = kept[partner[j]]
                    ev["end_ns"] = e[3]
                    if pl == 0:
                        ev["payload"] = e[2]
                else:
                    ev["end_ns"], ev["open"] = last_t, True
                    count("UnmatchedBegin", 1)
                if ev["end_ns"] < ev["begin_ns"]:
                    ev["end_ns"] = ev["begin_ns"]
                    count("ReversedSpans", 1)
            region_events.append((is_bar, ev))
        role = next((ev["role"] for is_bar, ev in region_events if not is_bar and ev["role"]), "")
        for is_bar, ev in region_events:
            if is_bar:
                ev["role"] = role
            events.append(ev)
            times += [ev["begin_ns"], ev["end_ns"]]
    if len(rates_overall) >= 2:
        m = _lower_median([v[1] for v in rates_overall])
        for i, rate, span_g in rates_overall:
            dev = abs(rate / m - 1.0)
            if dev > 4 * D.ANCHOR_ERROR_NS / span_g + D.CLOCK_CHANGE_SLACK:
                changed[i] = max(changed.get(i, 0.0), dev * span_g)
    count("ClockChange", len(changed))
    times += [r["gt_start"] for r, ok in zip(rhs, gs_ok) if ok]
    times += [r["gt_end"] for r, ok in zip(rhs, end_trusted) if ok]
    launch = {"rank": info.rank, "launch": info.launch, "kernel": info.kernel, "iteration": info.iteration,
              "host_begin_ns": -1, "host_end_ns": -1,
              "gpu_begin_ns": min(times) if times else -1, "gpu_end_ns": max(times) if times else -1,
              "regions": sum(used), "dropped": dropped}
    return RefLaunch(events, launch, warn)


def decode_many(items, registries) -> tuple[list, list, dict] | RefError:
    """decode_launches without a clock model: (events, launches, warning counts) or the first error."""
    out = []
    for buf, info in items:
        r = decode_one(buf, info, registries[info.family])
        if isinstance(r, RefError):
            return r
        out.append(r)
    starts = [r.launch["gpu_begin_ns"] for r in out if r.launch["gpu_begin_ns"] >= 0]
    shift = min(starts) if starts else 0
    events, launches, warns = [], [], {}
    for r in out:
        for ev in r.events:
            ev["begin_ns"] -= shift
            ev["end_ns"] -= shift
            events.append(ev)
        la = dict(r.launch)
        if la["gpu_begin_ns"] >= 0:
            la["gpu_begin_ns"] -= shift
            la["gpu_end_ns"] -= shift
        launches.append(la)
        for k, v in r.warnings.items():
            warns[k] = warns.get(k, 0) + v
    return events, launches, warns

