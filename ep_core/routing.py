"""Routing generators: which top-k experts each token of one rank picks.

Every generator returns `(topk_idx int64 [T, K], topk_weights float32 [T, K])` on the CPU,
deterministic in `seed` (a CPU torch.Generator, so the same seed gives the same routing on any
machine; callers move the tensors to their device). Experts of one token are distinct; `drop`
turns each entry into -1 ("no expert") with that probability, and its weight into 0.

Kinds (expert e lives on rank e // (E / R)):
- `uniform`: every expert equally likely (DeepEP's tests: top-k of |randn| + 1 scores).
- `skewed`: a hot set (the first `hot_fraction` of the experts, all on the low ranks) is
  `hot_factor` times as likely as the rest, so rank 0 receives far more rows than the others.
- `zipf`: expert i has weight 1 / (i + 1)^s (expert 0 hottest); a long-tailed load.
- `zero-rank`: uniform over every expert except those of `zero_rank` (default the last rank),
  which then receives no token from anyone.
Sampling without replacement in proportion to the weights uses the Gumbel-top-k trick.
"""
from __future__ import annotations

import math

import torch

ROUTINGS = ("uniform", "skewed", "zipf", "zero-rank")


def _check(tokens: int, experts: int, topk: int, ranks: int) -> None:
    if tokens < 0:
        raise ValueError(f"tokens must be >= 0, got {tokens}")
    if ranks < 1 or experts < 1 or experts % ranks:
        raise ValueError(f"experts ({experts}) must be a positive multiple of ranks ({ranks})")
    if not 1 <= topk <= experts:
        raise ValueError(f"topk must be in 1..experts ({experts}), got {topk}")


def expert_weights(kind: str, experts: int, topk: int, ranks: int, *, hot_fraction: float = 0.125,
                   hot_factor: float = 10.0, zipf_s: float = 1.2, zero_rank: int | None = None) -> torch.Tensor:
    """Relative probability of each expert under `kind` (float64 [E]; 0 = never chosen)."""
    if kind == "uniform":
        return torch.ones(experts, dtype=torch.float64, device="cpu")
    if kind == "skewed":
        if not 0 < hot_fraction <= 1 or hot_factor <= 0:
            raise ValueError("skewed routing needs 0 < hot_fraction <= 1 and hot_factor > 0")
        w = torch.ones(experts, dtype=torch.float64, device="cpu")
        w[: max(1, math.ceil(hot_fraction * experts))] = hot_factor
        return w
    if kind == "zipf":
        if zipf_s <= 0:
            raise ValueError(f"zipf_s must be > 0, got {zipf_s}")
        return 1.0 / torch.arange(1, experts + 1, dtype=torch.float64, device="cpu") ** zipf_s
    if kind == "zero-rank":
        if ranks < 2:
            raise ValueError("zero-rank routing needs at least 2 ranks (one of them gets nothing)")
        zr = ranks - 1 if zero_rank is None else zero_rank
        if not 0 <= zr < ranks:
            raise ValueError(f"zero_rank must be in 0..{ranks - 1}, got {zr}")
        per = experts // ranks
        if topk > experts - per:
            raise ValueError(f"zero-rank routing: topk ({topk}) > experts left off rank {zr} ({experts - per})")
        w = torch.ones(experts, dtype=torch.float64, device="cpu")
        w[zr * per:(zr + 1) * per] = 0
        return w
    raise ValueError(f"unknown routing {kind!r}; choose one of {ROUTINGS}")


def make_routing(kind: str, tokens: int, experts: int, topk: int, ranks: int, seed: int, *,
                 drop: float = 0.0, **kind_args) -> tuple[torch.Tensor, torch.Tensor]:
    """Routing of one rank's `tokens` tokens; see the module doc for the kinds and `kind_args`."""
    _check(tokens, experts, topk, ranks)
    if not 0.0 <= drop <= 1.0:
        raise ValueError(f"drop must be a probability in [0, 1], got {drop}")
    w = expert_weights(kind, experts, topk, ranks, **kind_args)
    gen = torch.Generator().manual_seed(int(seed))
    u = torch.rand((tokens, experts), generator=gen, dtype=torch.float64, device="cpu").clamp_(1e-12, 1 - 1e-12)
    # log w + Gumbel noise; top-k of it samples k distinct experts without replacement ∝ w.
    scores = torch.log(w).unsqueeze(0) - torch.log(-torch.log(u))
    topk_idx = torch.topk(scores, topk, dim=1).indices.to(torch.int64)
    weights = torch.rand((tokens, topk), generator=gen, dtype=torch.float32, device="cpu") + 0.1
    if drop > 0:
        dropped = torch.rand((tokens, topk), generator=gen, dtype=torch.float32, device="cpu") < drop
        topk_idx[dropped] = -1
        weights[dropped] = 0.0
    weights = weights / weights.sum(1, keepdim=True).clamp(min=1e-6)
    return topk_idx, weights.to(torch.float32)
