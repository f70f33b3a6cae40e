"""Plain-PyTorch reference of the intranode EP API: the oracle of every ep_core test.

It simulates R ranks in one process: each function takes a list with one entry per rank (that
rank's inputs) and returns a list with one entry per rank (what the API returns on that rank).
Runs on any device (CPU in CI, the GPU in the acceptance tests); vectorised, no loop per token.

Semantics are those of ../shared/reference/ep-api.md (DeepEP V1 intranode):
- expert e lives on rank e // (E // R); -1 means "no expert"; a token counts once per rank.
- dispatch: rank j receives, in the order of source rank then source token order, every token
  of every rank i with is_token_in_rank_i[t, j]; rank_prefix_matrix[i][j] = rows j gets from
  ranks 0..i; recv_topk_idx is local (global - j*E/R) or -1; recv_topk_weights 0 where -1;
  per-local-expert counts rounded up to expert_alignment; num_worst_tokens pads to a fixed row
  count (padding: x zeros, topk_idx -1, weights 0) and returns an empty list.
- combine: each original token gets the fp32 sum of the rows dispatched from it (over every rank
  it went to) plus the optional bias (one tensor or a pair), cast to the dtype of x; the top-k
  weights are summed the same way.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Union

import torch

TensorOrPair = Union[torch.Tensor, tuple]


def expert_rank(topk_idx: torch.Tensor, num_experts: int, num_ranks: int) -> torch.Tensor:
    """Rank of each top-k entry (-1 where the entry is -1)."""
    _check_experts(num_experts, num_ranks)
    per_rank = num_experts // num_ranks
    ranks = torch.div(topk_idx, per_rank, rounding_mode="floor")
    return torch.where(topk_idx < 0, torch.full_like(ranks, -1), ranks)


def _check_experts(num_experts: int, num_ranks: int) -> None:
    if num_ranks <= 0 or num_experts <= 0 or num_experts % num_ranks:
        raise ValueError(f"num_experts ({num_experts}) must be a positive multiple of num_ranks ({num_ranks})")


def _check_topk(topk_idx: torch.Tensor, num_experts: int) -> None:
    if topk_idx.dim() != 2:
        raise ValueError(f"topk_idx must be [tokens, topk], got shape {tuple(topk_idx.shape)}")
    if topk_idx.dtype != torch.int64:
        raise TypeError(f"topk_idx must be int64 (topk_idx_t), got {topk_idx.dtype}")
    if topk_idx.numel() and (int(topk_idx.min()) < -1 or int(topk_idx.max()) >= num_experts):
        raise ValueError(f"topk_idx entries must be -1 or in [0, {num_experts})")


def get_dispatch_layout(topk_idx: torch.Tensor, num_experts: int, num_ranks: int):
    """One rank's layout: `(num_tokens_per_rank [R] int32, None, num_tokens_per_expert [E] int32,
    is_token_in_rank [T, R] bool)`, as `Buffer.get_dispatch_layout` returns it (without the event)."""
    _check_experts(num_experts, num_ranks)
    _check_topk(topk_idx, num_experts)
    t = topk_idx.size(0)
    dev = topk_idx.device
    valid = topk_idx >= 0
    per_expert = torch.bincount(topk_idx[valid], minlength=num_experts).to(torch.int32)
    ranks = expert_rank(topk_idx, num_experts, num_ranks)
    is_token_in_rank = torch.zeros((t, num_ranks), dtype=torch.bool, device=dev)
    if topk_idx.numel():
        rows = torch.arange(t, dtype=torch.int64, device=dev).unsqueeze(1).expand_as(ranks)
        is_token_in_rank[rows[valid], ranks[valid]] = True
    per_rank = is_token_in_rank.sum(0).to(torch.int32)
    return per_rank, None, per_expert, is_token_in_rank


@dataclass
class RefHandle:
    """What the reference needs to combine on one rank (the API's handle, reduced to its meaning).

    `rank_prefix_matrix` is the API's handle[0]; `recv_src_idx[k]` the source-token index of
    received row k; `recv_src_rank[k]` its source rank; `is_token_in_rank` this rank's own
    [T, R] routing (what its tokens sent where)."""

    rank_prefix_matrix: torch.Tensor
    recv_src_idx: torch.Tensor
    recv_src_rank: torch.Tensor
    is_token_in_rank: torch.Tensor
    num_recv_tokens: int


@dataclass
class RefDispatch:
    recv_x: TensorOrPair
    recv_topk_idx: Optional[torch.Tensor]
    recv_topk_weights: Optional[torch.Tensor]
    num_recv_tokens_per_expert_list: list
    handle: RefHandle


def _rows(x: TensorOrPair, idx: torch.Tensor) -> TensorOrPair:
    if isinstance(x, tuple):
        return tuple(p.index_select(0, idx) for p in x)
    return x.index_select(0, idx)


def _cat(parts: list, like: TensorOrPair) -> TensorOrPair:
    if isinstance(like, tuple):
        return tuple(torch.cat([p[i] for p in parts], 0) for i in range(len(like)))
    return torch.cat(parts, 0)


def _pad(x: TensorOrPair, rows: int) -> TensorOrPair:
    if isinstance(x, tuple):
        return tuple(_pad(p, rows) for p in x)
    extra = rows - x.size(0)
    return torch.cat([x, torch.zeros((extra,) + tuple(x.shape[1:]), dtype=x.dtype, device=x.device)], 0)


def _num_tokens(x: TensorOrPair) -> int:
    return (x[0] if isinstance(x, tuple) else x).size(0)


def dispatch(xs: Sequence[TensorOrPair],
             is_token_in_rank: Optional[Sequence[torch.Tensor]] = None,
             topk_idx: Optional[Sequence[torch.Tensor]] = None,
             topk_weights: Optional[Sequence[torch.Tensor]] = None,
             num_experts: Optional[int] = None,
             expert_alignment: int = 1,
             num_worst_tokens: int = 0,
             num_tokens_per_expert: Optional[Sequence[torch.Tensor]] = None) -> list[RefDispatch]:
    """Dispatch of R ranks at once. `xs[r]` is rank r's x (bf16 [T, H] or (fp8 [T, H], scales
    [T, H/128]), scales in either memory order). Routing comes from `is_token_in_rank` (per rank,
    [T, R] bool) or, when that is None, from `topk_idx` and `num_experts`. Top-k outputs exist
    when `topk_idx` is given. The per-expert list comes from the top-k indices or, without them,
    from every rank's `num_tokens_per_expert` (as the API's notify step sums them). Returns one
    `RefDispatch` per rank."""
    num_ranks = len(xs)
    if num_ranks == 0:
        raise ValueError("dispatch needs at least one rank")
    if expert_alignment < 1:
        raise ValueError(f"expert_alignment must be >= 1, got {expert_alignment}")
    with_topk = topk_idx is not None
    if with_topk and num_experts is None:
        raise ValueError("num_experts is required with topk_idx")
    if is_token_in_rank is None:
        if not with_topk:
            raise ValueError("give is_token_in_rank or topk_idx")
        is_token_in_rank = [get_dispatch_layout(topk_idx[r], num_experts, num_ranks)[3] for r in range(num_ranks)]
    for r in range(num_ranks):
        if tuple(is_token_in_rank[r].shape) != (_num_tokens(xs[r]), num_ranks):
            raise ValueError(f"rank {r}: is_token_in_rank must be [{_num_tokens(xs[r])}, {num_ranks}], "
                             f"got {tuple(is_token_in_rank[r].shape)}")
    if with_topk and topk_weights is None:
        raise ValueError("topk_weights are required with topk_idx")

    # src_tokens[i][j]: indices of rank i's tokens that go to rank j, in token order
    src_tokens = [[torch.nonzero(is_token_in_rank[i][:, j], as_tuple=False).flatten()
                   for j in range(num_ranks)] for i in range(num_ranks)]
    counts = torch.tensor([[src_tokens[i][j].numel() for j in range(num_ranks)] for i in range(num_ranks)],
                          dtype=torch.int32, device="cpu")
    rank_prefix_matrix = counts.cumsum(0).to(torch.int32)
    per_rank = num_experts // num_ranks if with_topk else 0

    out = []
    for j in range(num_ranks):
        dev = is_token_in_rank[j].device
        idx_j = [src_tokens[i][j] for i in range(num_ranks)]
        recv_x = _cat([_rows(xs[i], idx_j[i]) for i in range(num_ranks)], xs[j])
        recv_src_idx = torch.cat(idx_j).to(torch.int32)
        recv_src_rank = torch.cat([torch.full((idx_j[i].numel(),), i, dtype=torch.int32, device=idx_j[i].device)
                                   for i in range(num_ranks)])
        n = recv_src_idx.numel()
        recv_topk_idx = recv_topk_weights = None
        expert_list: list = []
        if not with_topk and num_tokens_per_expert is not None:
            per = num_tokens_per_expert[0].numel() // num_ranks
            counts_e = sum(t.view(num_ranks, per)[j].to(torch.int64).cpu() for t in num_tokens_per_expert)
            expert_list = [int(-(-c // expert_alignment) * expert_alignment) for c in counts_e.tolist()]
        if with_topk:
            g = torch.cat([topk_idx[i].index_select(0, idx_j[i]) for i in range(num_ranks)])
            w = torch.cat([topk_weights[i].index_select(0, idx_j[i]) for i in range(num_ranks)])
            local = g - j * per_rank
            mine = (g >= 0) & (local >= 0) & (local < per_rank)
            recv_topk_idx = torch.where(mine, local, torch.full_like(local, -1))
            recv_topk_weights = torch.where(mine, w, torch.zeros_like(w))
            counts_e = torch.bincount(recv_topk_idx[mine], minlength=per_rank)
            expert_list = [int(-(-c // expert_alignment) * expert_alignment) for c in counts_e.tolist()]
        if num_worst_tokens:
            if num_worst_tokens < n:
                raise ValueError(f"rank {j} receives {n} rows > num_worst_tokens {num_worst_tokens}")
            recv_x = _pad(recv_x, num_worst_tokens)
            if with_topk:
                pad = num_worst_tokens - n
                recv_topk_idx = torch.cat([recv_topk_idx, torch.full((pad, recv_topk_idx.size(1)), -1,
                                                                     dtype=recv_topk_idx.dtype, device=dev)])
                recv_topk_weights = _pad(recv_topk_weights, num_worst_tokens)
            expert_list = []
        handle = RefHandle(rank_prefix_matrix.to(dev), recv_src_idx, recv_src_rank,
                           is_token_in_rank[j], n)
        out.append(RefDispatch(recv_x, recv_topk_idx, recv_topk_weights, expert_list, handle))
    return out


def combine(ys: Sequence[torch.Tensor], handles: Sequence[RefHandle],
            topk_weights: Optional[Sequence[torch.Tensor]] = None,
            bias: Optional[Sequence[TensorOrPair]] = None) -> list[tuple]:
    """Combine of R ranks at once. `ys[j]` are rank j's rows in its recv order ([N_j, H]; rows
    past N_j, e.g. num_worst_tokens padding, are ignored); `handles[j]` is its dispatch handle.
    Returns per source rank `(combined_x [T, H] in ys' dtype, combined_topk_weights or None)`."""
    num_ranks = len(ys)
    if len(handles) != num_ranks:
        raise ValueError(f"{len(handles)} handles for {num_ranks} ranks")
    hidden = ys[0].size(1)
    outs_x, outs_w = [], []
    for s in range(num_ranks):
        t = handles[s].is_token_in_rank.size(0)
        dev = ys[s].device
        outs_x.append(torch.zeros((t, hidden), dtype=torch.float32, device=dev))
        outs_w.append(None if topk_weights is None else
                      torch.zeros((t, topk_weights[0].size(1)), dtype=torch.float32, device=dev))
    for j in range(num_ranks):
        h = handles[j]
        m = h.rank_prefix_matrix
        for s in range(num_ranks):
            lo = 0 if s == 0 else int(m[s - 1][j])
            hi = int(m[s][j])
            if hi == lo:
                continue
            src = h.recv_src_idx[lo:hi].long().to(outs_x[s].device)
            outs_x[s].index_add_(0, src, ys[j][lo:hi].float().to(outs_x[s].device))
            if topk_weights is not None:
                outs_w[s].index_add_(0, src, topk_weights[j][lo:hi].float().to(outs_x[s].device))
    result = []
    for s in range(num_ranks):
        acc = outs_x[s]
        if bias is not None and bias[s] is not None:
            for b in (bias[s] if isinstance(bias[s], tuple) else (bias[s],)):
                if b is not None:
                    acc = acc + b.float()
        result.append((acc.to(ys[s].dtype), outs_w[s]))
    return result


# ---- FP8 per-128-column cast (DeepEP's per_token_cast_to_fp8 convention) ----------------------

# 448 = largest finite float8_e4m3fn value; the amax floor keeps all-zero blocks finite.
FP8_MAX = 448.0
_AMAX_FLOOR = 1e-4


def per_token_cast_to_fp8(x: torch.Tensor) -> tuple:
    """bf16/fp32 [T, H] -> (float8_e4m3fn [T, H], float32 scales [T, H/128]), x ≈ fp8 * scale."""
    t, h = x.shape
    if h % 128:
        raise ValueError(f"hidden must be a multiple of 128 for FP8, got {h}")
    blocks = x.float().view(t, h // 128, 128)
    amax = blocks.abs().amax(dim=2).clamp(min=_AMAX_FLOOR)
    scales = amax / FP8_MAX
    q = (blocks / scales.unsqueeze(2)).to(torch.float8_e4m3fn).view(t, h)
    return q, scales.contiguous()


def per_token_cast_back(x_fp8: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """(fp8 [T, H], scales [T, H/128]) -> bf16 [T, H]."""
    t, h = x_fp8.shape
    return (x_fp8.float().view(t, h // 128, 128) * scales.float().unsqueeze(2)).view(t, h).to(torch.bfloat16)


def calc_diff(x: torch.Tensor, y: torch.Tensor) -> float:
    """1 - cosine-like similarity of (x+1, y+1) in float64: the acceptance metric of ep-api.md
    check 7 (DeepEP's tests/utils.py calc_diff); 0 when equal."""
    if x.numel() == 0 and y.numel() == 0:
        return 0.0
    a = x.double() + 1
    b = y.double() + 1
    denom = (a * a + b * b).sum()
    return float(1 - 2 * (a * b).sum() / denom)
