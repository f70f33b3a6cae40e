"""The reference (the oracle of every test) against hand-computed cases and properties."""
import pytest
import torch
from hypothesis import given, settings, strategies as st

from ep_core import reference as ref

# 2 ranks, 4 experts (0,1 on rank 0; 2,3 on rank 1), top-2, hidden 128.
IDX0 = torch.tensor([[0, 1], [2, -1], [-1, -1], [1, 3]])   # rank 0's 4 tokens
IDX1 = torch.tensor([[3, 2], [0, 2], [1, -1]])              # rank 1's 3 tokens
W0 = torch.tensor([[.1, .2], [.3, .4], [.5, .6], [.7, .8]])
W1 = torch.tensor([[1.1, 1.2], [1.3, 1.4], [1.5, 1.6]])


def rows(vals, h=128):
    """bf16 rows whose row i is the constant vals[i] (exact in bf16 for small integers)."""
    return torch.tensor(vals, dtype=torch.float32).unsqueeze(1).expand(-1, h).to(torch.bfloat16).contiguous()


X0 = rows([10, 11, 12, 13])
X1 = rows([20, 21, 22])


def run_small(**kw):
    return ref.dispatch([X0, X1], topk_idx=[IDX0, IDX1], topk_weights=[W0, W1], num_experts=4, **kw)


def test_dispatch_hand_computed_order_and_prefix():
    d0, d1 = run_small()
    # rank 0 receives: from rank 0 tokens 0, 3; from rank 1 tokens 1, 2  (source rank, then token order)
    assert d0.recv_x[:, 0].float().tolist() == [10, 13, 21, 22]
    # rank 1 receives: from rank 0 tokens 1, 3; from rank 1 tokens 0, 1
    assert d1.recv_x[:, 0].float().tolist() == [11, 13, 20, 21]
    # rank_prefix_matrix[i][j]: rows j receives from ranks 0..i
    assert d0.handle.rank_prefix_matrix.tolist() == [[2, 2], [4, 4]]
    assert d0.handle.rank_prefix_matrix.dtype == torch.int32
    assert d0.handle.recv_src_idx.tolist() == [0, 3, 1, 2]
    assert d1.handle.recv_src_rank.tolist() == [0, 0, 1, 1]


def test_dispatch_topk_local_ids_and_weights():
    d0, d1 = run_small()
    # rank 0 (experts 0,1 local as 0,1): rows tok0@r0 [0,1], tok3@r0 [1,3], tok1@r1 [0,2], tok2@r1 [1,-1]
    assert d0.recv_topk_idx.tolist() == [[0, 1], [1, -1], [0, -1], [1, -1]]
    assert torch.allclose(d0.recv_topk_weights, torch.tensor([[.1, .2], [.7, 0], [1.3, 0], [1.5, 0]]))
    # rank 1 (experts 2,3 local as 0,1): tok1@r0 [2,-1], tok3@r0 [1,3], tok0@r1 [3,2], tok1@r1 [0,2]
    assert d1.recv_topk_idx.tolist() == [[0, -1], [-1, 1], [1, 0], [-1, 0]]
    assert torch.allclose(d1.recv_topk_weights, torch.tensor([[.3, 0], [0, .8], [1.1, 1.2], [0, 1.4]]))
    assert d0.num_recv_tokens_per_expert_list == [2, 3]
    assert d1.num_recv_tokens_per_expert_list == [3, 2]


def test_expert_alignment_rounds_each_count_up():
    d0, d1 = run_small(expert_alignment=4)
    assert d0.num_recv_tokens_per_expert_list == [4, 4]
    assert d1.num_recv_tokens_per_expert_list == [4, 4]
    assert d0.recv_x.size(0) == 4  # alignment changes the counts, not the rows


def test_num_worst_tokens_pads():
    d0, _ = run_small(num_worst_tokens=7)
    base, _ = run_small()
    assert d0.recv_x.size(0) == 7 and d0.recv_topk_idx.size(0) == 7
    assert torch.equal(d0.recv_x[:4], base.recv_x)
    assert torch.equal(d0.recv_topk_idx[:4], base.recv_topk_idx)
    assert (d0.recv_topk_idx[4:] == -1).all() and (d0.recv_topk_weights[4:] == 0).all()
    assert d0.num_recv_tokens_per_expert_list == []
    with pytest.raises(ValueError, match="num_worst_tokens"):
        run_small(num_worst_tokens=3)


def test_dispatch_without_topk_uses_is_token_in_rank():
    in0 = ref.get_dispatch_layout(IDX0, 4, 2)[3]
    in1 = ref.get_dispatch_layout(IDX1, 4, 2)[3]
    d0, d1 = ref.dispatch([X0, X1], is_token_in_rank=[in0, in1])
    assert d0.recv_topk_idx is None and d0.num_recv_tokens_per_expert_list == []
    assert d0.recv_x[:, 0].float().tolist() == [10, 13, 21, 22]
    # without top-k the per-expert list still comes from every rank's counts (the notify step)
    per_expert = [ref.get_dispatch_layout(IDX0, 4, 2)[2], ref.get_dispatch_layout(IDX1, 4, 2)[2]]
    d0, d1 = ref.dispatch([X0, X1], is_token_in_rank=[in0, in1], num_tokens_per_expert=per_expert,
                          expert_alignment=2)
    assert d0.num_recv_tokens_per_expert_list == [2, 4] and d1.num_recv_tokens_per_expert_list == [4, 2]


def test_fp8_pairs_travel_together_and_column_major_scales():
    x = torch.randn(4, 256).to(torch.bfloat16)
    q, s = ref.per_token_cast_to_fp8(x)
    assert q.dtype == torch.float8_e4m3fn and s.shape == (4, 2) and s.dtype == torch.float32
    s_col = s.T.contiguous().T
    assert not s_col.is_contiguous()
    y = torch.randn(3, 256).to(torch.bfloat16)
    qy, sy = ref.per_token_cast_to_fp8(y)
    d0, _ = ref.dispatch([(q, s_col), (qy, sy)], topk_idx=[IDX0, IDX1], topk_weights=[W0, W1], num_experts=4)
    rq, rs = d0.recv_x
    assert torch.equal(rq.view(torch.uint8), torch.cat([q[[0, 3]], qy[[1, 2]]]).view(torch.uint8))
    assert torch.equal(rs, torch.cat([s[[0, 3]], sy[[1, 2]]]))


def test_fp8_cast_round_trip_error_is_small():
    x = torch.randn(8, 512) * 3
    back = ref.per_token_cast_back(*ref.per_token_cast_to_fp8(x.to(torch.bfloat16)))
    # e4m3 keeps 3 mantissa bits: relative error per element <= 2^-4, plus bf16 rounding
    assert ((back.float() - x).abs() <= x.abs() * 0.07 + 1e-2).all()
    const = torch.full((2, 128), 5.0).to(torch.bfloat16)
    assert torch.equal(ref.per_token_cast_back(*ref.per_token_cast_to_fp8(const)), const)


def test_combine_sums_per_source_with_weights_and_bias():
    d = run_small()
    ys = [di.recv_x for di in d]
    out = ref.combine(ys, [di.handle for di in d], topk_weights=[di.recv_topk_weights for di in d])
    (c0, w0), (c1, w1) = out
    # rank 0 token 3 went to both ranks: 13 + 13; token 2 went nowhere: 0
    assert c0[:, 0].float().tolist() == [10, 11, 0, 26]
    assert c1[:, 0].float().tolist() == [20, 42, 22]
    assert c0.dtype == torch.bfloat16
    # summed weights restore the original weights, 0 where the index was -1
    assert torch.allclose(w0, W0.masked_fill(IDX0 < 0, 0))
    assert torch.allclose(w1, W1.masked_fill(IDX1 < 0, 0))
    b0 = torch.full((4, 128), 0.5, dtype=torch.bfloat16)
    b1 = torch.full((3, 128), 1.0, dtype=torch.bfloat16)
    (c0b, _), (c1b, _) = ref.combine(ys, [di.handle for di in d], bias=[(b0, b0), b1])
    assert c0b[:, 0].float().tolist() == [11, 12, 1, 27]
    assert c1b[:, 0].float().tolist() == [21, 43, 23]


def test_combine_accumulates_in_fp32():
    # 256 + 1 + 1: bf16 has 8 bits of mantissa, so a bf16 running sum would lose the ones.
    x0 = rows([256, 256])
    idx0 = torch.tensor([[0], [0]])
    d = ref.dispatch([x0], topk_idx=[idx0], topk_weights=[torch.ones(2, 1)], num_experts=1)
    ys = [d[0].recv_x]
    one = torch.ones(2, 128, dtype=torch.bfloat16)
    (c, _), = ref.combine(ys, [d[0].handle], bias=[(one, one)])
    assert c[0, 0].item() == 258


def test_combine_ignores_worst_tokens_padding():
    d = run_small(num_worst_tokens=8)
    ys = [di.recv_x.clone() for di in d]
    for y, di in zip(ys, d):
        y[di.handle.num_recv_tokens:] = 99  # garbage in the padding must not leak
    (c0, _), _ = ref.combine(ys, [di.handle for di in d])
    assert c0[:, 0].float().tolist() == [10, 11, 0, 26]


def test_calc_diff():
    x = torch.randn(16, 8)
    assert ref.calc_diff(x, x) == pytest.approx(0, abs=1e-12)
    assert ref.calc_diff(x, x + 1) > 1e-3
    assert ref.calc_diff(torch.empty(0), torch.empty(0)) == 0.0


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 4).flatmap(lambda r: st.tuples(
    st.just(r), st.integers(1, 3).map(lambda k: 2 * k * r), st.integers(1, 3),
    st.lists(st.integers(0, 9), min_size=r, max_size=r), st.floats(0, 0.5),
    st.sampled_from(["uniform", "skewed", "zipf"]), st.integers(0, 1000))))
def test_property_combine_of_dispatch_is_count_times_x(args):
    ranks, experts, topk, tokens, drop, routing, seed = args
    topk = min(topk, experts)
    hidden = 128
    inputs = []
    for r in range(ranks):
        from ep_core.routing import make_routing
        idx, w = make_routing(routing, tokens[r], experts, topk, ranks, seed + r, drop=drop)
        x = torch.randint(-8, 8, (tokens[r], hidden)).to(torch.bfloat16)
        inputs.append((x, idx, w))
    d = ref.dispatch([i[0] for i in inputs], topk_idx=[i[1] for i in inputs],
                     topk_weights=[i[2] for i in inputs], num_experts=experts)
    # every received row is a row of its source, at recv_src_idx
    for j, dj in enumerate(d):
        for k in range(dj.handle.num_recv_tokens):
            s, t = int(dj.handle.recv_src_rank[k]), int(dj.handle.recv_src_idx[k])
            assert torch.equal(dj.recv_x[k], inputs[s][0][t])
        assert sum(dj.num_recv_tokens_per_expert_list) == int((dj.recv_topk_idx >= 0).sum())
    out = ref.combine([di.recv_x for di in d], [di.handle for di in d],
                      topk_weights=[di.recv_topk_weights for di in d])
    for s, (c, w) in enumerate(out):
        count = d[s].handle.is_token_in_rank.sum(1, keepdim=True)
        assert torch.equal(c.float(), inputs[s][0].float() * count)
        idx = inputs[s][1]
        assert torch.allclose(w, inputs[s][2].masked_fill(idx < 0, 0), atol=1e-6)
