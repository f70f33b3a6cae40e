"""Routing generators: shapes, dtypes, distinct experts, determinism, and each kind's property."""
import pytest
import torch
from hypothesis import given, settings, strategies as st

from ep_core.reference import get_dispatch_layout
from ep_core.routing import ROUTINGS, expert_weights, make_routing


@settings(max_examples=50, deadline=None)
@given(st.sampled_from(ROUTINGS), st.integers(2, 8).flatmap(lambda r: st.tuples(
    st.just(r), st.integers(2, 8).map(lambda k: k * r), st.integers(0, 64), st.integers(0, 10**6))),
    st.floats(0, 1))
def test_shape_range_distinct(kind, args, drop):
    ranks, experts, tokens, seed = args
    topk = min(4, experts - experts // ranks)
    idx, w = make_routing(kind, tokens, experts, topk, ranks, seed, drop=drop)
    assert idx.dtype == torch.int64 and w.dtype == torch.float32
    assert idx.shape == (tokens, topk) and w.shape == (tokens, topk)
    assert ((idx == -1) | ((idx >= 0) & (idx < experts))).all()
    for row in idx.tolist():
        picked = [e for e in row if e >= 0]
        assert len(picked) == len(set(picked))
    assert (w[idx == -1] == 0).all() and (w >= 0).all()


@pytest.mark.parametrize("kind", ROUTINGS)
def test_deterministic_in_seed(kind):
    a = make_routing(kind, 100, 64, 8, 4, 7, drop=0.1)
    b = make_routing(kind, 100, 64, 8, 4, 7, drop=0.1)
    c = make_routing(kind, 100, 64, 8, 4, 8, drop=0.1)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], c[0])


def test_zero_rank_receives_nothing():
    for zr in (None, 0, 2):
        idx, _ = make_routing("zero-rank", 500, 64, 8, 4, 1, zero_rank=zr)
        per_rank = get_dispatch_layout(idx, 64, 4)[0]
        target = 3 if zr is None else zr
        assert per_rank[target] == 0
        assert all(per_rank[r] > 0 for r in range(4) if r != target)


def test_zero_rank_limits():
    with pytest.raises(ValueError, match="2 ranks"):
        make_routing("zero-rank", 4, 8, 2, 1, 0)
    with pytest.raises(ValueError, match="topk"):
        make_routing("zero-rank", 4, 8, 5, 2, 0)


def test_skewed_loads_the_hot_rank():
    idx, _ = make_routing("skewed", 4096, 256, 8, 8, 0)
    per_expert = get_dispatch_layout(idx, 256, 8)[2].float()
    hot, cold = per_expert[:32].mean(), per_expert[32:].mean()
    assert hot > 4 * cold  # factor 10 in probability; sampling without replacement flattens it
    per_rank = get_dispatch_layout(idx, 256, 8)[0]
    assert per_rank[0] == per_rank.max() and per_rank[0] > 1.3 * per_rank[1:].float().mean()


def test_zipf_is_long_tailed():
    idx, _ = make_routing("zipf", 4096, 64, 2, 4, 0)
    per_expert = get_dispatch_layout(idx, 64, 4)[2].float()
    assert per_expert[0] > per_expert[8] > per_expert[63]
    w = expert_weights("zipf", 64, 2, 4, zipf_s=1.2)
    assert torch.all(w[:-1] > w[1:])


def test_uniform_is_balanced():
    idx, _ = make_routing("uniform", 8192, 256, 8, 2, 0)
    per_expert = get_dispatch_layout(idx, 256, 2)[2].float()
    expected = 8192 * 8 / 256
    assert (per_expert - expected).abs().max() < 0.25 * expected


def test_drop_probability():
    idx, w = make_routing("uniform", 4000, 32, 4, 2, 0, drop=0.25)
    frac = (idx == -1).float().mean().item()
    assert 0.22 < frac < 0.28
    assert make_routing("uniform", 10, 32, 4, 2, 0, drop=1.0)[0].eq(-1).all()


@pytest.mark.parametrize("bad, match", [
    (dict(kind="nope"), "unknown routing"), (dict(drop=1.5), "drop"), (dict(tokens=-1), "tokens"),
    (dict(experts=7), "multiple"), (dict(topk=0), "topk"),
])
def test_rejects(bad, match):
    args = dict(kind="uniform", tokens=4, experts=8, topk=2, ranks=2, seed=0)
    args.update(bad)
    with pytest.raises(ValueError, match=match):
        make_routing(args.pop("kind"), **args)
