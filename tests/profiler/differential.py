"""Differential decoding: profiler.decode.decode against the record-by-record reference decoder.

`check(items)` decodes the same launches with the reference and with each of profiler.decode.decode's
record loops (ENGINES: numpy, and when numba is importable the compiled one, ahead of time and
under the JIT) and asserts the
same table, launches, warning counts, or the same error (type and byte offset), plus what must hold for any input: schema
dtypes, no numpy warning, end >= begin, every time inside its launch's bounds, launches no
longer than twice the time window. `random_case(rng)` draws inputs from a numpy Generator: valid
buffers with byte flips and cuts, and buffers built field by field with plausible and extreme
values (states, attempted counts, kinds, ids, times, clock pairs, header fields). Used by
tests/profiler/test_decode_fuzz.py (fixed seeds, bounded) and benchmarks/fuzz_decode.py (long).
"""
from __future__ import annotations

import warnings

import numpy as np

from profiler.decode import decode as D
from profiler import errors as E
from profiler.generated import layout as L
from profiler.registry.registry import load_all
from profiler.store.schema import CATEGORICAL, COLUMNS

from . import reference_decoder as R
from .bufbuild import meta3, random_buffer, slots3

REG = load_all()["selftest"]
REGISTRIES = {"selftest": REG}
T0 = 1_764_000_000_000_000_000
_VERSION_AT = L.BUFFERHEADER_DTYPE.fields["version"][1]
try:
    import numba  # noqa: F401  (the `fast` extra; CI installs it with `dev`)
    ENGINES = ("numpy", "numba", "numba-jit")
except ImportError:
    ENGINES = ("numpy",)
PHASE_IDS = [p.id for p in REG.phases] + [77]          # 77: not in the registry
BARRIER_IDS = [b.id for b in REG.barriers] + [9]


def fast(items, engine: str = "numpy", registries=None):
    """profiler.decode.decode's answer in the reference's shape; numpy warnings are errors."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            d = D.decode_launches(items, registries or REGISTRIES, engine=engine)
    except E.DecodeError as e:
        return R.RefError(type(e).__name__, e.offset)
    ev = d.events
    assert list(ev.columns) == list(COLUMNS)
    assert [str(t) for t in ev.dtypes] == list(COLUMNS.values()), ev.dtypes
    assert all(isinstance(w, E.DecodeWarning) for w in d.warnings)
    cols = {c: (ev[c].astype(object).tolist() if c in CATEGORICAL else ev[c].tolist()) for c in COLUMNS}
    assert not any(x is None or x != x for c in CATEGORICAL for x in cols[c]), "a category code without a name"
    rows = [dict(zip(COLUMNS, r)) for r in zip(*cols.values())]
    launches = [{k: (str(v) if k == "kernel" else int(v)) for k, v in la.items()} for la in d.launches.to_dict("records")]
    return rows, launches, {type(w).__name__: w.count for w in d.warnings}


def reference(items, registries=None):
    return R.decode_many(items, registries or REGISTRIES)


def check(items, registries=None) -> None:
    """Every record loop of profiler.decode.decode gives the reference's answer (default: the selftest registry)."""
    want = reference(items, registries)
    for engine in ENGINES:
        got = fast(items, engine, registries)
        if got != want:
            raise AssertionError(f"decoders differ ({engine} record loop) on {describe(items)}:\n{_diff(got, want)}")
    if isinstance(got, R.RefError):
        assert got.offset >= 0
        return
    rows, launches, _ = got
    bounds = {(la["rank"], la["launch"]): (la["gpu_begin_ns"], la["gpu_end_ns"]) for la in launches}
    for la in launches:
        assert la["gpu_end_ns"] >= la["gpu_begin_ns"]
        assert la["gpu_end_ns"] - la["gpu_begin_ns"] <= 2 * D.LAUNCH_WINDOW_NS
        assert (la["gpu_begin_ns"] >= 0) == (la["gpu_end_ns"] >= 0)
    for r in rows:
        lo, hi = bounds[(r["rank"], r["launch"])]
        assert 0 <= lo <= r["begin_ns"] <= r["end_ns"] <= hi, (r, lo, hi)


def describe(items) -> str:
    return "; ".join(f"{len(b)}-byte buffer {bytes(b)[:96].hex()}..." for b, _ in items)


def _diff(got, want) -> str:
    if isinstance(got, R.RefError) or isinstance(want, R.RefError):
        return f"  fast: {got}\n  reference: {want}"
    lines = []
    if got[2] != want[2]:
        lines.append(f"  warnings fast {got[2]} reference {want[2]}")
    if got[1] != want[1]:
        lines.append(f"  launches fast {got[1]} reference {want[1]}")
    if len(got[0]) != len(want[0]):
        lines.append(f"  {len(got[0])} rows (fast) vs {len(want[0])} (reference)")
    for i, (a, b) in enumerate(zip(got[0], want[0])):
        if a != b:
            lines.append(f"  row {i}: fast {a}\n         reference {b}")
            break
    return "\n".join(lines)


# -- inputs ------------------------------------------------------------------------------------
def _extreme_time(rng: np.random.Generator, base: int) -> int:
    """A time around `base`, sometimes far off or out of range (a flipped byte)."""
    r = rng.random()
    if r < 0.85:
        return base
    if r < 0.90:
        far = [0, 1, 2**62, 2**63 + base % 2**62, 2**64 - 1]
        return far[int(rng.integers(len(far)))]
    return (base ^ (1 << int(rng.integers(20, 64)))) % 2**64


def structured_buffer(rng: np.random.Generator) -> bytes:
    """A buffer built field by field: mostly well-formed regions, with every field now and then
    extreme (state, attempted, kinds, ids, times, clock pairs, sm, header fields)."""
    nreg, cap = int(rng.integers(0, 7)), int(rng.integers(0, 12))
    version = 2 if rng.random() < 0.4 else 1           # every format the decoder reads
    hires = version >= 2 or rng.random() < 0.3         # format 2 records cycles whatever the flag says
    hdr = np.zeros(1, L.BUFFERHEADER_DTYPE)
    hdr["magic"], hdr["version"], hdr["registry_hash"] = L.MAGIC, version, REG.hash
    hdr["flags"] = L.FLAGS_HIRES if hires and rng.random() < 0.9 else 0
    hdr["num_regions"], hdr["region_capacity"] = nreg, cap
    odd_wpb = [0, 2**15, 2**15 + 1, 2**31, 2**32 - 1]
    hdr["warps_per_block"] = odd_wpb[int(rng.integers(len(odd_wpb)))] if rng.random() < 0.05 else int(rng.integers(1, 5))
    regions = np.zeros(nreg, [("h", L.REGIONHEADER_DTYPE), ("r", L.RECORD_DTYPE, (cap,))])
    start = T0 + int(rng.integers(0, 10**6))
    for i in range(nreg):
        h, r = regions["h"][i:i + 1], regions["r"][i]
        h["state"] = int(rng.choice([L.REGION_STATE_FINISHED] * 6 + [L.REGION_STATE_STARTED] * 2
                                    + [L.REGION_STATE_UNUSED] + ([3] if rng.random() < 0.05 else [])))
        h["sm"] = int(rng.integers(0, 132)) if rng.random() > 0.03 else 2**15
        n = int(rng.integers(0, cap + 1)) if cap else 0
        kinds = _kinds(rng, n)
        ids = [int(rng.choice(BARRIER_IDS if k in (L.KIND_BARRIER_ARRIVE, L.KIND_BARRIER_DEPART) else PHASE_IDS))
               for k in kinds]
        gt0 = _extreme_time(rng, start + int(rng.integers(0, 1000)))
        dur = int(rng.integers(1, 10**5))
        if hires:
            clk0 = int(rng.integers(0, 2**40))
            ghz = float(rng.choice([1.98, 1.98, 1.0, 0.05, 50.0]))
            clk1 = clk0 + max(1, int(dur * ghz)) if rng.random() > 0.05 else int(rng.integers(0, 2**64, dtype=np.uint64))
            hi = min(clk1, clk0 + 2**50)
            ts = sorted(int(x) for x in rng.integers(clk0, hi + 1, n)) if hi > clk0 else [clk0] * n
            h["clk_start"], h["clk_end"] = np.uint64(clk0), np.uint64(clk1)
        else:
            ts = sorted(int(x) for x in rng.integers(gt0 % 2**62, gt0 % 2**62 + dur + 1, n))
        ts = [_extreme_time(rng, t) if rng.random() < 0.1 else t for t in ts]
        h["gt_start"], h["gt_end"] = np.uint64(gt0), np.uint64(_extreme_time(rng, (gt0 + dur) % 2**64))
        for j, (k, pid, t) in enumerate(zip(kinds, ids, ts)):
            r[j] = (np.uint64(t), pid, k, 0, int(rng.choice([0, 0, 1, 7, 2**32 - 1])))
            if version >= 2 and hires and rng.random() < 0.15:  # an ANCHOR at this record's clock
                c = int(t) % 2**64
                ratio = float(rng.choice([ghz, ghz, ghz, ghz * 0.8, ghz * 1.5]))  # sometimes a clock change
                g = _extreme_time(rng, (gt0 + int((c - clk0) / ratio)) % 2**64)
                r[j] = (np.uint64(g), (c >> 32) & 0xFFFF, L.KIND_ANCHOR, 0, c & 0xFFFF_FFFF)
        over = int(rng.integers(0, 3)) if rng.random() < 0.2 else 0
        h["attempted"] = n + over if rng.random() > 0.03 else int(rng.integers(0, 2**32))
        if h["state"][0] == L.REGION_STATE_STARTED and n < cap:
            r[n]["kind"] = L.KIND_EMPTY
    return hdr.tobytes() + regions.tobytes()


def _clock_pair(rng: np.random.Generator, dur: int, span_cycles: int) -> tuple[int, int, float]:
    """(clk_start, clk_end, GHz) of a format-3 region: mostly plausible, sometimes not."""
    clk0 = int(rng.integers(0, 2**40))
    ghz = float(rng.choice([1.98, 1.98, 1.0, 0.05, 50.0]))
    r = rng.random()
    if r < 0.85:
        return clk0, clk0 + max(span_cycles, int(dur * ghz)) + int(rng.integers(0, 50)), ghz
    if r < 0.92:   # a finish clock before some record: those are past it
        return clk0, clk0 + int(rng.integers(0, max(span_cycles, 1))), ghz
    return clk0, int(rng.integers(0, 2**64, dtype=np.uint64)), ghz


def _slots3(rng: np.random.Generator, n: int, clk0: int, gt0: int, ghz: float) -> list:
    """About n format-3 slots: records whose clocks rise by gaps now and then past 2^31 or 2^32,
    32-bit payloads (a PAYLOAD slot), anchors (two slots), and sometimes raw junk slots."""
    kinds = _kinds(rng, n)
    recs, c = [], clk0
    for k in kinds:
        c += int(rng.choice([0, 1, 37, 1000, 2**20, 2**31 + 5, 2**32 + 7])) if rng.random() < 0.3 else int(rng.integers(0, 500))
        r = rng.random()
        if r < 0.1:    # an anchor at this clock (its globaltimer sometimes off, or a clock change)
            ratio = float(rng.choice([ghz, ghz, ghz * 0.8]))
            g = _extreme_time(rng, gt0 + int((c - clk0) / ratio))
            recs.append((g % 2**64, L.KIND_ANCHOR, (c >> 32) & 0xFFFF, c & 0xFFFF_FFFF))
        elif r < 0.14:  # a raw slot: any kind (PAYLOAD, ANCHOR_NS, unknown, EMPTY) with any meta bits
            recs.append((int(rng.integers(0, 2**32)), meta3(int(rng.integers(0, 16)), int(rng.integers(0, 4096)),
                                                             int(rng.integers(0, 2**16)))))
        else:
            ids = BARRIER_IDS if k in (L.KIND_BARRIER_ARRIVE, L.KIND_BARRIER_DEPART) else PHASE_IDS
            pl = int(rng.choice([0, 0, 1, 7, 0xFFFF, 0x10000, 2**32 - 1]))
            recs.append((c, k if k else L.KIND_INSTANT, int(rng.choice(ids)), pl))
    return slots3(recs)


def structured_buffer3(rng: np.random.Generator) -> bytes:
    """A format-3 buffer built slot by slot (decode_format3's cases: wraps, side slots, anchors, clocks)."""
    nreg, cap = int(rng.integers(0, 6)), int(rng.integers(0, 14))
    hdr = np.zeros(1, L.BUFFERHEADER_DTYPE)
    hdr["magic"], hdr["version"], hdr["registry_hash"], hdr["flags"] = L.MAGIC, 3, REG.hash, L.FLAGS_HIRES
    hdr["num_regions"], hdr["region_capacity"], hdr["warps_per_block"] = nreg, cap, int(rng.integers(1, 4))
    regions = np.zeros(nreg, [("h", L.REGIONHEADER_DTYPE), ("r", L.RECORD8_DTYPE, (cap,))])
    start = T0 + int(rng.integers(0, 10**6))
    for i in range(nreg):
        h, r = regions["h"][i:i + 1], regions["r"][i]
        h["state"] = int(rng.choice([L.REGION_STATE_FINISHED] * 6 + [L.REGION_STATE_STARTED] * 2 + [L.REGION_STATE_UNUSED]))
        h["sm"] = int(rng.integers(0, 132))
        gt0 = _extreme_time(rng, start + int(rng.integers(0, 1000)))
        clk0, clk1, ghz = _clock_pair(rng, int(rng.integers(1, 10**5)), 0)
        slots = _slots3(rng, int(rng.integers(0, cap + 1)) if cap else 0, clk0, gt0, ghz)[:cap]
        c = clk0
        for t, meta in slots:   # about the last record's clock (anchors aside): most finish pairs lie after it
            c = c + ((t - c) % 2**32) if 1 <= meta >> L.META_KIND_SHIFT <= 5 else c
        if clk1 >= clk0 and rng.random() < 0.8:
            clk1 = max(clk1, c + int(rng.integers(0, 100)))
        for j, (t, meta) in enumerate(slots):
            r[j] = (t, meta)
        h["clk_start"], h["clk_end"] = np.uint64(clk0), np.uint64(clk1 % 2**64)
        h["gt_start"] = np.uint64(gt0)
        h["gt_end"] = np.uint64(_extreme_time(rng, (gt0 + int(max(clk1 - clk0, 1) / ghz)) % 2**64))
        over = int(rng.integers(0, 3)) if rng.random() < 0.2 else 0
        h["attempted"] = len(slots) + over if rng.random() > 0.03 else int(rng.integers(0, 2**32))
    return hdr.tobytes() + regions.tobytes()


def _kinds(rng: np.random.Generator, n: int) -> list[int]:
    """Mostly nested BEGIN/END with instants and barrier events; sometimes anything in 0..7."""
    if rng.random() < 0.15:
        return [int(x) for x in rng.integers(0, 8, n)]
    out, depth = [], 0
    while len(out) < n:
        r = rng.random()
        if r < 0.35 or depth == 0 and r < 0.6:
            out.append(L.KIND_BEGIN)
            depth += 1
        elif r < 0.75 and depth:
            out.append(L.KIND_END)
            depth -= 1
        else:
            out.append(int(rng.choice([L.KIND_INSTANT, L.KIND_BARRIER_ARRIVE, L.KIND_BARRIER_DEPART])))
    return out


def mutated_buffer(rng: np.random.Generator) -> bytes:
    """A valid buffer with a few random bytes changed and sometimes cut short."""
    buf = bytearray(random_buffer(rng, REG, n_regions=int(rng.integers(0, 6)), capacity=int(rng.integers(4, 20)),
                                  warps_per_block=int(rng.integers(1, 4)), version=3 if rng.random() < 0.3 else 1))
    if rng.random() < 0.3 and len(buf) >= L.BUFFERHEADER_SIZE:  # the same bytes read as another format
        v = int.from_bytes(buf[_VERSION_AT:_VERSION_AT + 2], "little")
        buf[_VERSION_AT:_VERSION_AT + 2] = (2 if v == 1 else 1).to_bytes(2, "little")
    for _ in range(int(rng.integers(0, 6))):
        buf[int(rng.integers(0, len(buf)))] = int(rng.integers(0, 256))
    if rng.random() < 0.1:
        buf = buf[: int(rng.integers(0, len(buf) + 1))]
    return bytes(buf)


def random_case(rng: np.random.Generator) -> list:
    """One decode_launches input: 1-3 launches from the generators above."""
    items = []
    for i in range(int(rng.choice([1, 1, 1, 2, 3]))):
        r = rng.random()
        buf = (structured_buffer3(rng) if r < 0.3 else structured_buffer(rng)) if r < 0.6 else mutated_buffer(rng)
        if r > 0.97:
            buf = bytes(rng.integers(0, 256, int(rng.integers(0, 400)), dtype=np.uint8))
        items.append((buf, D.LaunchInfo(int(rng.integers(0, 2)), i, f"k{i % 2}", i, "selftest")))
    return items
