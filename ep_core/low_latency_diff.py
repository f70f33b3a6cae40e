"""What differs between a low-latency dispatch / combine result and ep_core.low_latency_reference:
the diagnosis the GPU checks (tests/gpu/ll_checks.py), the benchmark's validation
(benchmarks/gpu/ll_bench.py) and the CPU model of the kernels (tests/ep_core/ll_model.py) print
when a result is wrong, so that one run localises a bug instead of only detecting it.

    findings = dispatch_diff(DispatchResult.of(recv, count, handle), want, tokens)
    findings += combine_diff(combined, want_combined, exact)
    if findings: print(format_findings("rank 0, fp8 plain", findings))

Each Finding names the output (counts, layout ranges, rows, scales, src_info, the handle's slots,
combine), how many entries differ, and the first few of them with what they hold and what they
should: for a wrong row, its expert, row, source rank and token, which 128-column groups differ
and whether its bytes are another expected row (misplaced) or none (stale or torn); for combine,
which tokens and groups, the largest difference and the largest distance in BF16 units in the
last place (1 ulp everywhere points at the order of the additions, not at the data).
Pure torch, any device; the comparisons are exact (bit for bit), as the kernels promise."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from .low_latency_reference import GROUP, LLRefDispatch
from .reference import calc_diff

SHOW = 4  # entries named per finding
# DeepEP's tests/test_low_latency.py bound on calc_diff(combined, exact) for BF16 combine
COMBINE_DIFF = 1e-5


@dataclass(frozen=True)
class Finding:
    """One output that differs from the reference."""

    output: str   # recv_count, recv_layout_range, recv_tokens, recv_x, recv_scales, recv_src_info, slot,
                  # sent_mask, combine
    count: int    # differing entries (experts, rows, scales, slots, elements)
    detail: str   # the first entries and a summary of where the differences are

    def __str__(self) -> str:
        return f"{self.output}: {self.count} differ; {self.detail}"


@dataclass(frozen=True)
class DispatchResult:
    """One rank's low_latency_dispatch outputs, by name (from a call: DispatchResult.of)."""

    recv_x: torch.Tensor                  # [E/R, R*T_max, H] float8_e4m3fn or bf16
    recv_scales: Optional[torch.Tensor]   # [E/R, R*T_max, groups] float32, or int32 UE8M0 (any strides)
    recv_count: torch.Tensor              # [E/R] int32
    recv_src_info: torch.Tensor           # [E/R, R*T_max] int32
    recv_layout_range: torch.Tensor       # [E/R, R] int64
    slot: torch.Tensor                    # [R, T_max, K] int32
    recv_tokens: torch.Tensor             # [R] int32
    sent_mask: torch.Tensor               # [T_max] int32

    @classmethod
    def of(cls, recv, count, handle) -> "DispatchResult":
        x, sc = recv if isinstance(recv, tuple) else (recv, None)
        return cls(x, sc, count, handle.recv_src_info, handle.recv_layout_range, handle.slot, handle.recv_tokens,
                   handle.sent_mask)


def _first(idx: torch.Tensor, n: int = SHOW) -> list[tuple[int, ...]]:
    return [tuple(int(v) for v in row) for row in idx[:n].tolist()] if idx.dim() == 2 else \
        [(int(v),) for v in idx[:n].tolist()]


def _ranges(values: Sequence[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> '0-2, 5, 7-8'."""
    vs = sorted(set(int(v) for v in values))
    out, i = [], 0
    while i < len(vs):
        j = i
        while j + 1 < len(vs) and vs[j + 1] == vs[j] + 1:
            j += 1
        out.append(f"{vs[i]}" if i == j else f"{vs[i]}-{vs[j]}")
        i = j + 1
    return ", ".join(out)


def _row_keys(rows: torch.Tensor) -> torch.Tensor:
    """[N, B] uint8 -> [N] int64 checksums (position-weighted; equal rows, equal keys)."""
    g = torch.Generator(device="cpu").manual_seed(12345)
    w = torch.randint(1, 1 << 30, (rows.size(1),), generator=g, dtype=torch.int64, device="cpu").to(rows.device)
    return (rows.long() * w).sum(1)


def _source_of(layout_range: torch.Tensor, e: int, i: int) -> int:
    """The source rank whose range of expert e's rows holds row i (-1 if none)."""
    for s, v in enumerate(layout_range[e].tolist()):
        begin, cnt = v >> 32, v & 0xFFFFFFFF
        if begin <= i < begin + cnt:
            return s
    return -1


def _counts(got: DispatchResult, want: LLRefDispatch) -> list[Finding]:
    out = []
    g, w = got.recv_count.cpu().long(), want.recv_count.cpu().long()
    if not torch.equal(g, w):
        bad = (g != w).nonzero().flatten()
        ex = ", ".join(f"expert {e}: {int(g[e])} (want {int(w[e])})" for e in bad[:SHOW].tolist())
        out.append(Finding("recv_count", bad.numel(), f"{ex}; total {int(g.sum())} rows (want {int(w.sum())})"))
    g, w = got.recv_layout_range.cpu(), want.recv_layout_range.cpu()
    if not torch.equal(g, w):
        bad = (g != w).nonzero()
        ex = ", ".join(f"expert {e} from rank {s}: (begin {int(g[e, s]) >> 32}, count {int(g[e, s]) & 0xFFFFFFFF}) "
                       f"want ({int(w[e, s]) >> 32}, {int(w[e, s]) & 0xFFFFFFFF})" for e, s in _first(bad))
        out.append(Finding("recv_layout_range", bad.size(0), ex))
    g, w = got.recv_tokens.cpu(), want.recv_tokens.cpu()
    if not torch.equal(g, w):
        out.append(Finding("recv_tokens", int((g != w).sum()), f"{g.tolist()} (want {w.tolist()})"))
    return out


def _rows(got: DispatchResult, want: LLRefDispatch, valid: torch.Tensor) -> list[Finding]:
    El, RT, H = want.recv_x.shape
    gb = got.recv_x.reshape(El, RT, H).view(torch.uint8).reshape(El, RT, -1)
    wb = want.recv_x.to(gb.device).view(torch.uint8).reshape(El, RT, -1)
    per_group = gb.size(2) // (H // GROUP)
    diff = (gb != wb).view(El, RT, H // GROUP, per_group).any(-1) & valid.to(gb.device).unsqueeze(2)  # [El, RT, G]
    bad_rows = diff.any(-1).nonzero()
    if bad_rows.numel() == 0:
        return []
    # misplaced or stale: is a wrong row's content some other expected row?
    vmask = valid.to(gb.device)
    want_keys: dict[int, list] = {}  # a token's data sits in one row of each of its experts
    for key, (e, i) in zip(_row_keys(wb[vmask]).tolist(), vmask.nonzero().tolist()):
        want_keys.setdefault(key, []).append((e, i))
    shown = bad_rows[:SHOW]
    keys = _row_keys(gb[shown[:, 0], shown[:, 1]]).tolist()
    lr = want.recv_layout_range.cpu()
    src_info = want.recv_src_info.cpu()
    ex = []
    for (e, i), key in zip(shown.tolist(), keys):
        groups = diff[e, i].nonzero().flatten().tolist()
        where = sorted(want_keys.get(key, []), key=lambda ei: (ei[0] != e, ei))  # its own expert first
        holds = (f"holds the data of expert {where[0][0]} row {where[0][1]} (misplaced)" if where
                 else "matches no expected row (stale, torn or miscast)")
        ex.append(f"expert {e} row {i} (rank {_source_of(lr, e, i)} token {int(src_info[e, i])}): groups "
                  f"{_ranges(groups)} of {H // GROUP} differ; {holds}")
    all_groups = diff[bad_rows[:, 0], bad_rows[:, 1]].sum(0)
    srcs = torch.bincount(torch.tensor([_source_of(lr, e, i) + 1 for e, i in bad_rows[:256].tolist()],
                                   dtype=torch.int64, device="cpu"),
                          minlength=lr.size(1) + 1)
    by_source = {s - 1: int(c) for s, c in enumerate(srcs.tolist()) if c}
    summary = (f"groups with a difference: {_ranges(all_groups.nonzero().flatten().tolist())}; "
               f"bad rows by source rank (first 256): {by_source}; "
               f"bad experts: {_ranges(bad_rows[:, 0].tolist())}")
    if got.recv_x.dtype == torch.bfloat16:
        d = (got.recv_x.float() - want.recv_x.to(got.recv_x.device).float()).abs()[valid.to(got.recv_x.device)]
        summary += f"; max |diff| {float(d.max()):.4g}"
    return [Finding("recv_x", bad_rows.size(0), "; ".join(ex) + "; " + summary)]


def _scales(got: DispatchResult, want: LLRefDispatch, valid: torch.Tensor) -> list[Finding]:
    if want.recv_scales is None:
        return [] if got.recv_scales is None else [Finding("recv_scales", 1, "scales returned for BF16")]
    if got.recv_scales is None:
        return [Finding("recv_scales", 1, "no scales returned for FP8")]
    g = got.recv_scales.cpu()
    w = want.recv_scales.cpu()
    if g.shape != w.shape or g.dtype != w.dtype:
        return [Finding("recv_scales", 1, f"{g.dtype} {tuple(g.shape)} (want {w.dtype} {tuple(w.shape)})")]
    bad = ((g != w) & valid.cpu().unsqueeze(2)).nonzero()
    if bad.numel() == 0:
        return []
    fmt = (lambda v: f"0x{int(v) & 0xFFFFFFFF:08x}") if g.dtype == torch.int32 else (lambda v: f"{float(v):.6g}")
    ex = ", ".join(f"expert {e} row {i} group {c}: {fmt(g[e, i, c])} (want {fmt(w[e, i, c])})"
                   for e, i, c in _first(bad))
    return [Finding("recv_scales", bad.size(0), f"{ex}; groups {_ranges(bad[:, 2].tolist())}, "
                                                 f"rows in {len(set(map(tuple, bad[:, :2].tolist())))} (expert, row)")]


def _handle(got: DispatchResult, want: LLRefDispatch, valid: torch.Tensor, tokens: Sequence[int],
            rank: int) -> list[Finding]:
    out = []
    g, w = got.recv_src_info.cpu(), want.recv_src_info.cpu()
    bad = ((g != w) & valid.cpu()).nonzero()
    if bad.numel():
        ex = ", ".join(f"expert {e} row {i}: {int(g[e, i])} (want {int(w[e, i])})" for e, i in _first(bad))
        out.append(Finding("recv_src_info", bad.size(0), ex))
    bad_slots = []
    for s, n in enumerate(tokens):
        g, w = got.slot[s, :n].cpu(), want.slot[s, :n].cpu()
        for t, k in (g != w).nonzero().tolist():
            bad_slots.append((s, t, k, int(g[t, k]), int(w[t, k])))
    if bad_slots:
        RT = want.recv_x.size(1)
        def name(v):
            return "-1" if v < 0 else f"{v} (expert {v // RT} row {v % RT})"
        ex = ", ".join(f"source {s} token {t} k {k}: {name(gv)} (want {name(wv)})"
                       for s, t, k, gv, wv in bad_slots[:SHOW])
        out.append(Finding("slot", len(bad_slots), f"{ex}; sources {sorted(set(b[0] for b in bad_slots))}"))
    n = tokens[rank]
    g, w = got.sent_mask[:n].cpu(), want.sent_mask.cpu()
    if not torch.equal(g, w):
        bad = (g != w).nonzero().flatten()
        ex = ", ".join(f"token {t}: {int(g[t]):#x} (want {int(w[t]):#x})" for t in bad[:SHOW].tolist())
        out.append(Finding("sent_mask", bad.numel(), ex))
    return out


def dispatch_diff(got: DispatchResult, want: LLRefDispatch, tokens: Sequence[int], rank: int) -> list[Finding]:
    """Every difference of one rank's dispatch outputs from the reference (empty: identical).
    tokens: every rank's token count; rank: this rank (its tokens' sent_mask). Rows past the
    reference's count of an expert are not compared (the kernels leave them as they were)."""
    El, RT, _ = want.recv_x.shape
    if tuple(got.recv_x.shape) != tuple(want.recv_x.shape) or got.recv_x.dtype != want.recv_x.dtype:
        return [Finding("recv_x", 1, f"{got.recv_x.dtype} {tuple(got.recv_x.shape)} (want {want.recv_x.dtype} "
                                     f"{tuple(want.recv_x.shape)})")]
    valid = torch.arange(RT, dtype=torch.int64, device="cpu").unsqueeze(0) < want.recv_count.cpu().long().unsqueeze(1)
    return (_counts(got, want) + _rows(got, want, valid) + _scales(got, want, valid)
            + _handle(got, want, valid, tokens, rank))


def combine_diff(got: torch.Tensor, want: torch.Tensor, exact: Optional[torch.Tensor] = None) -> list[Finding]:
    """Where one rank's combined output differs from the reference (bit for bit), and, with
    `exact` (the float64 sum), whether DeepEP's calc_diff bound holds."""
    if got.dtype != want.dtype or got.shape != want.shape:
        return [Finding("combine", 1, f"{got.dtype} {tuple(got.shape)} (want {want.dtype} {tuple(want.shape)})")]
    out = []
    g, w = got.cpu(), want.cpu()
    bits_g, bits_w = g.view(torch.int16).int(), w.view(torch.int16).int()
    bad = bits_g != bits_w
    if bad.any():
        T, H = g.shape
        tokens = bad.any(1).nonzero().flatten()
        groups = bad.view(T, H // GROUP, GROUP).any(2).any(0).nonzero().flatten()
        diff = (g.float() - w.float()).abs()
        same_sign = (bits_g < 0) == (bits_w < 0)
        ulp = torch.where(same_sign & bad, (bits_g - bits_w).abs(), torch.zeros_like(bits_g))
        first = bad.nonzero()[:SHOW].tolist()
        ex = ", ".join(f"token {t} column {c}: {float(g[t, c]):.6g} (want {float(w[t, c]):.6g})" for t, c in first)
        nonfinite = int((~torch.isfinite(g.float()) & bad).sum())
        out.append(Finding("combine", int(bad.sum()),
                           f"{ex}; tokens {_ranges(tokens[:64].tolist())}{' ...' if tokens.numel() > 64 else ''} "
                           f"({tokens.numel()} of {T}); groups {_ranges(groups.tolist())}; max |diff| "
                           f"{float(diff[bad].max()):.4g}; max ulp {int(ulp.max())}"
                           f"{' (signs differ too)' if bool((~same_sign & bad).any()) else ''}"
                           f"{f'; {nonfinite} not finite' if nonfinite else ''}"))
    if exact is not None and g.numel():
        d = calc_diff(g.double(), exact.cpu())
        if not d < COMBINE_DIFF:
            out.append(Finding("combine", 1, f"calc_diff(combined, exact) = {d:.3g} >= DeepEP's bound {COMBINE_DIFF}"))
    return out


def format_findings(tag: str, findings: Sequence[Finding]) -> str:
    """One line per finding under the check's tag."""
    return "\n".join(f"{tag} {f}" for f in findings)
