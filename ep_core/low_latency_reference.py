"""Plain-PyTorch reference of ep_core's low-latency dispatch and combine (ep_core/low_latency.py):
the oracle of tests/gpu/test_low_latency.py and of the CPU tests.

It simulates R ranks in one process: each function takes one entry per rank and returns one
entry per rank; vectorised (no loop per token), any device. It computes what the kernels
compute, bit for bit:
- expert e lives on rank e // (E / R); a -1 top-k entry (or any id outside [0, E)) is ignored; a
  token takes one row per (token, expert) even if its top-k names an expert twice.
- the rows of local expert e on rank j: sources in rotation order j, j+1, ..., j-1 (mod R), then
  token order; recv_count[e] of the R * T_max rows are valid, the rest are left as they were.
  recv_src_info[e, i] is the token's index at its source; recv_layout_range[e, r] =
  (begin << 32) | count of the rows from rank r.
- FP8 per 128 columns (DeepEP's LL convention): amax = max(1e-4, max |x|); scale = 448 / amax and
  scale_inv = amax * float32(1 / 448), or with round_scale e = ceil(log2(amax * float32(1 / 448)))
  from the float's bits, scale = 2^-e, scale_inv = 2^e; q = float8_e4m3fn(x * scale); the
  received scales are scale_inv. use_ue8m0: the exponent byte of scale_inv, four per int32
  (group 4i + b in byte b).
- combine, on the token's rank s: for every rank d that holds an expert of the token (the
  dispatch's routing), partial_d = bf16(acc) with acc = 0 + w'_k * y_k + ... over the top-k slots k
  whose expert is on d, in k order, each product and sum rounded to fp32 (no fused multiply-add),
  w'_k = w_k where combine's topk_idx is >= 0, else 0; combined = bf16(0 + partial_0 + partial_1
  ...) in rank order, fp32.
`combine_exact` is the same weighted sum in float64 without the intermediate roundings (what
DeepEP's calc_diff bound is measured against).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch

GROUP = 128
FP8_MAX = 448.0
AMAX_FLOOR = 1e-4


def _f32(v: float, like: torch.Tensor) -> torch.Tensor:
    return torch.tensor(v, dtype=torch.float32, device=like.device)


def cast_fp8(x: torch.Tensor, round_scale: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """bf16 [T, H] -> (float8_e4m3fn [T, H], scale_inv float32 [T, H / 128]), as the kernel casts."""
    t, h = x.shape
    if h % GROUP:
        raise ValueError(f"hidden must be a multiple of {GROUP}, got {h}")
    f = x.float().view(t, h // GROUP, GROUP)
    amax = torch.maximum(f.abs().amax(dim=2), _f32(AMAX_FLOOR, f))
    inv448 = _f32(1.0 / FP8_MAX, f)
    if round_scale:
        bits = (amax * inv448).view(torch.int32)
        e = ((bits >> 23) & 0xFF) - 127 + ((bits & 0x7FFFFF) != 0).to(torch.int32)
        scale = ((127 - e) << 23).view(torch.float32)
        scale_inv = ((127 + e) << 23).view(torch.float32)
    else:
        scale_inv = amax * inv448
        scale = _f32(FP8_MAX, f) / amax
    q = (f * scale.unsqueeze(2)).to(torch.float8_e4m3fn).view(t, h)
    return q, scale_inv


def ue8m0_pack(scale_inv: torch.Tensor) -> torch.Tensor:
    """[..., G] power-of-two float32 scales -> [..., G / 4] int32 of their exponent bytes."""
    if scale_inv.size(-1) % 4:
        raise ValueError(f"UE8M0 packs 4 scales per int32: {scale_inv.size(-1)} groups")
    exp = (scale_inv.view(torch.int32) >> 23) & 0xFF
    exp = exp.view(*scale_inv.shape[:-1], -1, 4)
    packed = exp[..., 0] | (exp[..., 1] << 8) | (exp[..., 2] << 16) | (exp[..., 3] << 24)
    return packed.to(torch.int32)


def dequantize(q: torch.Tensor, scale_inv: torch.Tensor) -> torch.Tensor:
    """(fp8 [N, H], float32 [N, H / 128]) -> bf16 [N, H]."""
    n, h = q.shape
    return (q.float().view(n, h // GROUP, GROUP) * scale_inv.float().unsqueeze(2)).view(n, h).to(torch.bfloat16)


@dataclass
class LLRefDispatch:
    """One rank's low_latency_dispatch outputs (valid rows only are meaningful: rows
    [recv_count[e], R * T_max) of expert e are whatever the buffer held)."""

    recv_x: torch.Tensor               # [E/R, R*T_max, H] fp8 or bf16 (invalid rows zero)
    recv_scales: Optional[torch.Tensor]  # [E/R, R*T_max, H/128] float32, or [.., H/512] int32 (UE8M0)
    recv_count: torch.Tensor           # [E/R] int32
    recv_src_info: torch.Tensor        # [E/R, R*T_max] int32 (invalid entries -1)
    recv_layout_range: torch.Tensor    # [E/R, R] int64
    slot: torch.Tensor                 # [R, T_max, K] int32: e * R * T_max + row of (source, token, k), or -1
    recv_tokens: torch.Tensor          # [R] int32
    sent_mask: torch.Tensor            # [T] int32: destination ranks of this rank's tokens


def _local_hits(topk: torch.Tensor, rank: int, num_local: int) -> torch.Tensor:
    """[T, K] local expert of each top-k entry on `rank`, or -1."""
    lo = rank * num_local
    on = (topk >= lo) & (topk < lo + num_local)
    return torch.where(on, topk - lo, torch.full_like(topk, -1))


def dispatch(xs: Sequence[torch.Tensor], topks: Sequence[torch.Tensor], num_experts: int, max_tokens: int,
             use_fp8: bool = True, round_scale: bool = False, use_ue8m0: bool = False) -> list[LLRefDispatch]:
    """Every rank's low_latency_dispatch: xs[r] bf16 [T_r, H], topks[r] int64 [T_r, K]."""
    _check_dispatch_args(xs, topks, num_experts, max_tokens, use_fp8, round_scale, use_ue8m0)
    R, H, K = len(xs), xs[0].size(1), topks[0].size(1)
    El = num_experts // R
    RT = R * max_tokens
    dev = xs[0].device
    casts = [cast_fp8(x, round_scale) if use_fp8 else (x, None) for x in xs]
    out = []
    for j in range(R):
        # (expert, rotation index of the source, token) of every row this rank receives
        keys, payload = [], []
        slot = torch.full((R, max_tokens, K), -1, dtype=torch.int32, device=dev)
        for si in range(R):
            s = (j + si) % R
            loc = _local_hits(topks[s], j, El)                  # [T_s, K]
            T_s = loc.size(0)
            one = torch.zeros((T_s, El), dtype=torch.bool, device=dev)
            valid = loc >= 0
            rows = torch.arange(T_s, dtype=torch.int64, device=dev).unsqueeze(1).expand_as(loc)
            one[rows[valid], loc[valid]] = True                   # a repeated expert is one row
            t_idx, e_idx = torch.nonzero(one, as_tuple=True)
            keys.append((e_idx.to(torch.int64) * R + si) * max_tokens + t_idx)
            payload.append((e_idx, torch.full_like(t_idx, s), t_idx))
        key = torch.cat(keys)
        order = torch.argsort(key)
        e_all = torch.cat([p[0] for p in payload])[order]
        s_all = torch.cat([p[1] for p in payload])[order]
        t_all = torch.cat([p[2] for p in payload])[order]
        count = torch.bincount(e_all, minlength=El).to(torch.int32)
        start = torch.cumsum(count, 0) - count
        row = torch.arange(e_all.numel(), dtype=torch.int64, device=dev) - start[e_all]
        rowid = e_all * RT + row
        # outputs
        recv_x = torch.zeros((El * RT, H), dtype=casts[0][0].dtype, device=dev)
        scales = torch.zeros((El * RT, H // GROUP), dtype=torch.float32, device=dev) if use_fp8 else None
        src_info = torch.full((El * RT,), -1, dtype=torch.int32, device=dev)
        for s in range(R):
            m = s_all == s
            if m.any():
                recv_x[rowid[m]] = casts[s][0][t_all[m]]
                if use_fp8:
                    scales[rowid[m]] = casts[s][1][t_all[m]]
        src_info[rowid] = t_all.to(torch.int32)
        layout_range = torch.zeros((El, R), dtype=torch.int64, device=dev)
        per_src = torch.zeros((El, R), dtype=torch.int64, device=dev)
        per_src.index_put_((e_all, s_all), torch.ones_like(e_all), accumulate=True)
        rot = [(j + si) % R for si in range(R)]
        begin = torch.zeros((El,), dtype=torch.int64, device=dev)
        for s in rot:
            layout_range[:, s] = (begin << 32) | per_src[:, s]
            begin = begin + per_src[:, s]
        # each (source, token, k) -> its row id
        lookup = torch.full((El, R, max_tokens), -1, dtype=torch.int64, device=dev)
        lookup[e_all, s_all, t_all] = rowid
        for s in range(R):
            loc = _local_hits(topks[s], j, El)
            T_s = loc.size(0)
            t_grid = torch.arange(T_s, dtype=torch.int64, device=dev).unsqueeze(1).expand_as(loc)
            ids = lookup[loc.clamp(min=0), s, t_grid]
            slot[s, :T_s] = torch.where(loc >= 0, ids, torch.full_like(ids, -1)).to(torch.int32)
        recv_scales = None
        if use_fp8:
            recv_scales = scales.view(El, RT, -1)
            if use_ue8m0:
                recv_scales = ue8m0_pack(recv_scales)
        out.append(LLRefDispatch(recv_x.view(El, RT, H), recv_scales, count, src_info.view(El, RT), layout_range,
                                 slot, torch.tensor([x.size(0) for x in xs], dtype=torch.int32, device=dev),
                                 _sent_mask(topks[j], num_experts, El)))
    return out


def _check_dispatch_args(xs, topks, num_experts: int, max_tokens: int, use_fp8: bool, round_scale: bool,
                         use_ue8m0: bool) -> None:
    R = len(xs)
    if R == 0 or len(topks) != R:
        raise ValueError("one x and one topk_idx per rank")
    if num_experts % R:
        raise ValueError(f"num_experts ({num_experts}) must be a multiple of the rank count ({R})")
    if use_ue8m0 and not (use_fp8 and round_scale):
        raise ValueError("use_ue8m0 needs use_fp8 and round_scale")
    K = topks[0].size(1)
    for r in range(R):
        if xs[r].size(0) > max_tokens or topks[r].shape != (xs[r].size(0), K):
            raise ValueError(f"rank {r}: {xs[r].size(0)} tokens (max {max_tokens}) with top-k {tuple(topks[r].shape)}")


def _sent_mask(topk: torch.Tensor, num_experts: int, El: int) -> torch.Tensor:
    """This rank's tokens' destination ranks, a bitmask per token (int32)."""
    ok = (topk >= 0) & (topk < num_experts)
    dest = torch.where(ok, topk // El, torch.full_like(topk, -1))
    bits = torch.where(dest >= 0, torch.ones_like(dest) << dest.clamp(min=0), torch.zeros_like(dest))
    mask = torch.zeros((topk.size(0),), dtype=torch.int64, device=topk.device)
    for k in range(topk.size(1)):
        mask |= bits[:, k]
    return mask.to(torch.int32)


def _masked_weights(topk_idx: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
    return torch.where(topk_idx >= 0, topk_weights.float(), torch.zeros_like(topk_weights, dtype=torch.float32))


def combine(ys: Sequence[torch.Tensor], disp: Sequence[LLRefDispatch], topks: Sequence[torch.Tensor],
            weights: Sequence[torch.Tensor], combine_topks: Optional[Sequence[torch.Tensor]] = None) -> list[torch.Tensor]:
    """Every rank's low_latency_combine, with the kernels' roundings: ys[d] bf16 [E/R, R*T_max, H]
    (the experts' outputs on rank d, rows as dispatched), disp the dispatch reference, topks /
    weights each rank's dispatch routing and weights; combine_topks the indices given to combine
    (default the dispatch's; a -1 there zeroes the weight)."""
    R = len(ys)
    El, RT, H = ys[0].shape
    out = []
    for s in range(R):
        topk = topks[s]
        T, K = topk.shape
        w = _masked_weights(topk if combine_topks is None else combine_topks[s], weights[s])
        dest = torch.where((topk >= 0) & (topk < El * R), topk // El, torch.full_like(topk, -1))
        acc_out = torch.zeros((T, H), dtype=torch.float32, device=ys[0].device)
        for d in range(R):
            rowids = disp[d].slot[s, :T].to(torch.int64)          # [T, K] on expert rank d
            flat = ys[d].reshape(El * RT, H)
            acc = torch.zeros((T, H), dtype=torch.float32, device=ys[0].device)
            for k in range(K):
                on = (rowids[:, k] >= 0).unsqueeze(1)
                term = w[:, k:k + 1] * flat[rowids[:, k].clamp(min=0)].float()
                acc = torch.where(on, acc + term, acc)
            has = (dest == d).any(1, keepdim=True)
            partial = acc.to(torch.bfloat16).float()
            acc_out = torch.where(has, acc_out + partial, acc_out)
        out.append(acc_out.to(torch.bfloat16))
    return out


def combine_exact(ys: Sequence[torch.Tensor], disp: Sequence[LLRefDispatch], topks: Sequence[torch.Tensor],
                  weights: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The weighted sum in float64 without intermediate roundings (float64 [T, H] per rank)."""
    R = len(ys)
    El, RT, H = ys[0].shape
    out = []
    for s in range(R):
        topk = topks[s]
        T, K = topk.shape
        w = _masked_weights(topk, weights[s]).double()
        acc = torch.zeros((T, H), dtype=torch.float64, device=ys[0].device)
        for d in range(R):
            rowids = disp[d].slot[s, :T].to(torch.int64)
            flat = ys[d].reshape(El * RT, H)
            for k in range(K):
                on = (rowids[:, k] >= 0).unsqueeze(1)
                acc = acc + torch.where(on, w[:, k:k + 1] * flat[rowids[:, k].clamp(min=0)].double(),
                                        torch.zeros((), dtype=torch.float64, device=acc.device))
        out.append(acc)
    return out


def expert_outputs(recv: LLRefDispatch, hidden: int, use_fp8: bool, seed: int, rank: int) -> torch.Tensor:
    """A stand-in for the experts' GEMMs on one rank: the received rows dequantised to bf16, each
    expert's rows scaled by its own factor (so a mix-up of experts shows), invalid rows random
    (so reading one shows). Deterministic in (seed, rank)."""
    El, RT, H = recv.recv_x.shape
    dev = recv.recv_x.device
    if use_fp8:
        sc = recv.recv_scales
        if sc.dtype == torch.int32:  # UE8M0: unpack the exponent bytes
            b = torch.stack([(sc >> (8 * i)) & 0xFF for i in range(4)], dim=-1).reshape(El, RT, -1)
            sc = (b << 23).view(torch.float32)
        y = dequantize(recv.recv_x.reshape(El * RT, H), sc.reshape(El * RT, -1)).view(El, RT, H)
    else:
        y = recv.recv_x.clone()
    gen = torch.Generator(device="cpu").manual_seed(seed * 1000 + rank)
    factor = (torch.rand((El, 1, 1), generator=gen, dtype=torch.float32, device="cpu") + 0.5).to(dev)
    y = (y.float() * factor).to(torch.bfloat16)
    valid = torch.arange(RT, dtype=torch.int64, device=dev).unsqueeze(0) < recv.recv_count.unsqueeze(1).to(dev)
    dgen = torch.Generator(device=dev).manual_seed(seed * 1000 + rank)
    noise = torch.randn((El, RT, H), generator=dgen, device=dev, dtype=torch.float32).to(torch.bfloat16)
    return torch.where(valid.unsqueeze(2), y, noise)
