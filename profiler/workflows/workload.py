"""Inputs of an EP workload for one shape and routing, shared by `epscope trace`, the benchmark
and the acceptance tests.

Every rank's inputs are a pure function of (problem, routing, seed, rank, device), so any process
can rebuild every other rank's inputs and run the reference over all of them: that is how the
GPU tests compare ep_core's outputs on fresh random data with `ep_core.reference`.
The acceptance default is `seed = rank` (ep-api.md), i.e. base seed 0.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from ep_core.config import Problem
from ep_core.reference import get_dispatch_layout, per_token_cast_to_fp8
from ep_core.routing import make_routing

X_KINDS = ("randn", "rank")


def rank_seed(seed: int, rank: int) -> int:
    return int(seed) + int(rank)


@dataclass
class RankInputs:
    """One rank's inputs. `x` is bf16 [T, H]; `x_fp8` its per-128 FP8 cast (built on demand)."""

    rank: int
    x: torch.Tensor
    topk_idx: torch.Tensor
    topk_weights: torch.Tensor
    _fp8: Optional[tuple] = field(default=None, repr=False)

    @property
    def x_fp8(self) -> tuple:
        if self._fp8 is None:
            self._fp8 = per_token_cast_to_fp8(self.x)
        return self._fp8

    def x_for(self, dtype: str):
        """x in the form dispatch takes for `dtype` ('bf16' tensor or 'fp8' pair)."""
        return self.x if dtype == "bf16" else self.x_fp8


def make_rank_inputs(problem: Problem, routing: str, rank: int, *, seed: int = 0, device="cpu",
                     x_kind: str = "randn", drop: float = 0.0, routing_args: Optional[dict] = None) -> RankInputs:
    """Inputs of `rank`: x (`randn`, or the constant `rank` as in check 3) and its routing."""
    if not 0 <= rank < problem.ranks:
        raise ValueError(f"rank must be in 0..{problem.ranks - 1}, got {rank}")
    if x_kind not in X_KINDS:
        raise ValueError(f"x_kind must be one of {X_KINDS}, got {x_kind!r}")
    s = rank_seed(seed, rank)
    idx, w = make_routing(routing, problem.tokens, problem.experts, problem.topk, problem.ranks, s,
                          drop=drop, **(routing_args or {}))
    device = torch.device(device)
    shape = (problem.tokens, problem.hidden)
    if x_kind == "rank":
        x = torch.full(shape, float(rank), dtype=torch.bfloat16, device=device)
    else:
        gen = torch.Generator(device=device).manual_seed(s)
        x = torch.randn(shape, generator=gen, dtype=torch.float32, device=device).to(torch.bfloat16)
    return RankInputs(rank, x, idx.to(device), w.to(device))


def make_all_inputs(problem: Problem, routing: str, *, seed: int = 0, device="cpu", **kw) -> list[RankInputs]:
    """Every rank's inputs, in rank order (for the reference)."""
    return [make_rank_inputs(problem, routing, r, seed=seed, device=device, **kw) for r in range(problem.ranks)]


def routing_matrix(topk_idx_per_rank: list, num_experts: int) -> torch.Tensor:
    """counts[i][j]: tokens rank i sends to rank j (a token once per rank), int64 on the CPU."""
    num_ranks = len(topk_idx_per_rank)
    return torch.stack([get_dispatch_layout(t, num_experts, num_ranks)[0].cpu().to(torch.int64)
                        for t in topk_idx_per_rank])


@dataclass(frozen=True)
class Traffic:
    """Bytes one rank's dispatch receives: `logical` counts every received row (own included;
    the DeepEP convention for logical GB/s), `nvlink` only rows that crossed from other ranks."""

    rows: int
    remote_rows: int
    logical_bytes: int
    nvlink_bytes: int


def traffic(problem: Problem, counts: torch.Tensor, rank: int) -> Traffic:
    col = counts[:, rank]
    rows = int(col.sum())
    remote = rows - int(col[rank])
    return Traffic(rows, remote, rows * problem.row_bytes, remote * problem.row_bytes)


@dataclass(frozen=True)
class Layout:
    """What get_dispatch_layout returns and dispatch takes (named, not read by position)."""

    num_tokens_per_rank: torch.Tensor
    num_tokens_per_expert: torch.Tensor
    is_token_in_rank: torch.Tensor


@dataclass(frozen=True)
class Dispatched:
    """One dispatch's outputs that combine needs, and the rows this rank received."""

    recv_x: torch.Tensor          # bf16 rows as combine takes them (FP8 received rows cast back)
    recv_weights: torch.Tensor
    handle: object
    rows: int


class RankOp:
    """One rank's EP op as `epscope trace` and the catalogue run it: get_dispatch_layout, a
    non-cached dispatch, then a combine that sends the received rows straight back (the experts'
    work is out of scope). `profile` is passed to every call (None: not profiled, True: into the
    session of `with buffer.profile(session)`). The steps are separate methods so a caller can
    plant something between them (a host or device delay before the dispatch).

    `overlap` (optional) is other work issued on the compute stream while each call's rows move:
    with `hook` the call sends (return_recv_hook=True), overlap() runs, then the hook receives;
    without, the call runs with async_finish=True and the compute stream waits for its event
    after overlap()."""

    def __init__(self, buffer, problem: Problem, inputs: RankInputs, dispatch_config, combine_config, *,
                 hook: bool = False, overlap=None):
        import ep_core

        self.buffer, self.problem, self.inputs = buffer, problem, inputs
        self.dispatch_config, self.combine_config = dispatch_config, combine_config
        self.hook, self.overlap = bool(hook), overlap
        self.x = inputs.x_for(problem.dtype)
        self.topk_idx = inputs.topk_idx.to(ep_core.topk_idx_t)

    def _call(self, fn, *args, **kw):
        """fn(...) with the overlap around its data movement; DeepEP's tuple without the hook."""
        if self.hook:
            *out, hook = fn(*args, return_recv_hook=True, **kw)
            if self.overlap is not None:
                self.overlap()
            hook()
            return out
        if self.overlap is None:
            return fn(*args, **kw)
        out = fn(*args, async_finish=True, **kw)
        self.overlap()
        out[-1 if len(out) == 3 else 5].current_stream_wait()
        return out

    def layout(self, profile=None) -> Layout:
        per_rank, _, per_expert, in_rank, _ = self.buffer.get_dispatch_layout(
            self.topk_idx, self.problem.experts, profile=profile)
        return Layout(per_rank, per_expert, in_rank)

    def dispatch(self, layout: Layout, profile=None) -> Dispatched:
        from ep_core.reference import per_token_cast_back

        recv, _, recv_w, _, handle, _ = self._call(
            self.buffer.dispatch, self.x, num_tokens_per_rank=layout.num_tokens_per_rank,
            is_token_in_rank=layout.is_token_in_rank, num_tokens_per_expert=layout.num_tokens_per_expert,
            topk_idx=self.topk_idx, topk_weights=self.inputs.topk_weights, config=self.dispatch_config,
            profile=profile)
        y = per_token_cast_back(*recv) if isinstance(recv, tuple) else recv
        return Dispatched(y, recv_w, handle, int(y.size(0)))

    def combine(self, d: Dispatched, profile=None) -> None:
        self._call(self.buffer.combine, d.recv_x, d.handle, topk_weights=d.recv_weights, config=self.combine_config,
                   profile=profile)

    def iteration(self, profile=None) -> int:
        """One whole op; returns the rows this rank received."""
        d = self.dispatch(self.layout(profile), profile)
        self.combine(d, profile)
        return d.rows
