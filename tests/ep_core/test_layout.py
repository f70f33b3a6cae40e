"""Layout maths: the reference get_dispatch_layout (counts, -1 entries, a token once per rank),
against hand-computed cases and a naive loop. (Buffer sizes are the Buffer's own formula,
Buffer.get_buffer_size_hint; tests/gpu covers it with the extension loaded.)"""
import pytest
import torch
from hypothesis import given, settings, strategies as st

from ep_core.reference import expert_rank, get_dispatch_layout


def test_layout_hand_computed():
    # 4 experts over 2 ranks: experts 0,1 -> rank 0; 2,3 -> rank 1
    topk_idx = torch.tensor([[0, 1],     # both on rank 0: counted once
                             [2, -1],    # rank 1 only
                             [-1, -1],   # no expert at all
                             [1, 3],     # both ranks
                             [3, 2]])    # rank 1, once
    per_rank, rdma, per_expert, in_rank = get_dispatch_layout(topk_idx, 4, 2)
    assert rdma is None
    assert per_rank.dtype == torch.int32 and per_expert.dtype == torch.int32 and in_rank.dtype == torch.bool
    assert per_rank.tolist() == [2, 3]
    assert per_expert.tolist() == [1, 2, 2, 2]
    assert in_rank.tolist() == [[True, False], [False, True], [False, False], [True, True], [False, True]]


def test_expert_rank_keeps_minus_one():
    idx = torch.tensor([[0, 5, -1, 7]])
    assert expert_rank(idx, 8, 4).tolist() == [[0, 2, -1, 3]]


def test_layout_zero_tokens():
    per_rank, _, per_expert, in_rank = get_dispatch_layout(torch.empty((0, 8), dtype=torch.int64), 16, 2)
    assert per_rank.tolist() == [0, 0] and per_expert.sum() == 0 and in_rank.shape == (0, 2)


def test_layout_rejects_bad_input():
    with pytest.raises(TypeError, match="int64"):
        get_dispatch_layout(torch.zeros((2, 2), dtype=torch.int32), 4, 2)
    with pytest.raises(ValueError, match="entries"):
        get_dispatch_layout(torch.tensor([[4, 0]]), 4, 2)
    with pytest.raises(ValueError, match="multiple"):
        get_dispatch_layout(torch.tensor([[1, 0]]), 5, 2)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 8).flatmap(lambda r: st.tuples(
    st.just(r), st.integers(1, 4).map(lambda k: k * r), st.integers(0, 20), st.integers(1, 4),
    st.integers(0, 2**31 - 1))))
def test_layout_matches_naive_loop(args):
    ranks, experts, tokens, topk, seed = args
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(-1, experts, (tokens, topk), generator=g)
    per_rank, _, per_expert, in_rank = get_dispatch_layout(idx, experts, ranks)
    per = experts // ranks
    for t in range(tokens):
        dests = {int(e) // per for e in idx[t] if e >= 0}
        assert {r for r in range(ranks) if in_rank[t, r]} == dests
    for e in range(experts):
        assert per_expert[e] == int((idx == e).sum())
    assert per_rank.tolist() == in_rank.sum(0).tolist()
