"""Layout maths: the reference get_dispatch_layout (counts, -1, once per rank) and the NVLink
buffer arithmetic (NvlLayout, size hints, the "needs N bytes, has M" error)."""
import pytest
import torch
from hypothesis import given, settings, strategies as st

from ep_core.config import (BUFFER_ALIGNMENT, MAX_SCALES, MAX_TOPK, Config, NvlLayout, Problem)
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


def test_nvl_layout_arithmetic():
    c = Config(24, 6, 256)
    lay = NvlLayout(c, 2, 7168 * 2, 8, 0, 256)
    # notify: 2x2 rank counts + 2x128 expert counts, int32, rounded to 128 B
    assert lay.notify_bytes == 1152
    assert lay.ctrl_offset == lay.notify_bytes
    assert lay.ctrl_bytes == 384  # 12 channels x 2 source ranks x 4 int32 (start, end, head, tail)
    assert lay.slot_bytes == 7168 * 2 + 4 + 8 * 12
    rings = 12 * 2
    assert lay.total_bytes == lay.data_offset + rings * lay.ring_bytes
    assert lay.ring_bytes >= 256 * lay.slot_bytes
    for ch in range(12):
        for src in range(2):
            off = lay.ring_offset(ch, src)
            assert off % BUFFER_ALIGNMENT == 0
            assert off + lay.ring_bytes <= lay.total_bytes
    with pytest.raises(IndexError):
        lay.ring_offset(12, 0)
    with pytest.raises(IndexError):
        lay.ring_offset(0, 2)


def test_size_hint_covers_every_problem_of_that_hidden():
    c = Config(64, 24, 256)
    hint = c.get_nvl_buffer_size_hint(7168 * 2, 8)
    for topk in (1, 8, MAX_TOPK):
        for dtype in ("bf16", "fp8"):
            p = Problem(4096, 7168, topk, 512, 8, dtype)
            assert p.nvl_bytes_needed(c) <= hint
            p.check_fits(c, hint)
    assert NvlLayout(c, 8, 7168 * 2, MAX_TOPK, MAX_SCALES).total_bytes == hint


def test_check_fits_names_both_sizes():
    c = Config(24, 6, 256)
    p = Problem(4096, 7168, 8, 256, 2)
    need = p.nvl_bytes_needed(c)
    p.check_fits(c, need)
    with pytest.raises(ValueError, match=rf"needs {need} bytes.*has {need - 1}"):
        p.check_fits(c, need - 1)


def test_layout_grows_with_channels_ranks_and_ring():
    base = NvlLayout(Config(24, 6, 256), 2, 7168 * 2, 8, 0, 256).total_bytes
    assert NvlLayout(Config(64, 6, 256), 2, 7168 * 2, 8, 0, 256).total_bytes > base
    assert NvlLayout(Config(24, 6, 512), 2, 7168 * 2, 8, 0, 256).total_bytes > base
    assert NvlLayout(Config(24, 6, 256), 4, 7168 * 2, 8, 0, 256).total_bytes > base


@pytest.mark.parametrize("kw, field", [
    (dict(num_ranks=0), "num_ranks"), (dict(num_ranks=9), "num_ranks"),
    (dict(hidden_bytes=100), "hidden_bytes"), (dict(num_topk=MAX_TOPK + 1), "num_topk"),
    (dict(num_scales=MAX_SCALES + 1), "num_scales"),
])
def test_nvl_layout_validates(kw, field):
    args = dict(config=Config(), num_ranks=2, hidden_bytes=256, num_topk=8, num_scales=0)
    args.update(kw)
    with pytest.raises(ValueError, match=field):
        NvlLayout(**args)
