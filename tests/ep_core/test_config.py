"""Config / Problem validation: every bad field is refused with a message naming it."""
import pytest

from ep_core.config import (MAX_EXPERTS, MAX_HIDDEN, MAX_RANKS, MAX_TOPK, Config, Problem,
                            combine_config, dispatch_config)


def test_defaults_are_deepep_defaults():
    c = Config()
    assert (c.num_sms, c.num_max_nvl_chunked_send_tokens, c.num_max_nvl_chunked_recv_tokens,
            c.num_max_rdma_chunked_send_tokens) == (20, 6, 256, 6)
    # DeepEP rounds the RDMA ring up to whole send chunks: 256 -> 258 with chunks of 6
    assert c.num_max_rdma_chunked_recv_tokens == 258


def test_positional_order_matches_deepep():
    c = Config(24, 8, 256)
    assert c.num_sms == 24 and c.num_max_nvl_chunked_send_tokens == 8
    assert c.num_max_nvl_chunked_recv_tokens == 256


@pytest.mark.parametrize("kwargs, field", [
    (dict(num_sms=0), "num_sms"),
    (dict(num_sms=3), "num_sms"),
    (dict(num_sms=-2), "num_sms"),
    (dict(num_max_nvl_chunked_send_tokens=0), "num_max_nvl_chunked_send_tokens"),
    (dict(num_max_nvl_chunked_recv_tokens=0), "num_max_nvl_chunked_recv_tokens"),
    (dict(num_max_nvl_chunked_send_tokens=256, num_max_nvl_chunked_recv_tokens=256),
     "num_max_nvl_chunked_send_tokens"),
    (dict(num_max_nvl_chunked_send_tokens=300), "num_max_nvl_chunked_send_tokens"),
    (dict(num_max_rdma_chunked_send_tokens=0), "num_max_rdma_chunked_send_tokens"),
    (dict(num_max_rdma_chunked_recv_tokens=-1), "num_max_rdma_chunked_recv_tokens"),
    (dict(num_max_rdma_chunked_send_tokens=200, num_max_rdma_chunked_recv_tokens=150),
     "num_max_rdma_chunked_send_tokens"),
])
def test_config_rejects_with_field_name(kwargs, field):
    with pytest.raises(ValueError, match=field):
        Config(**kwargs)


@pytest.mark.parametrize("bad", [2.0, "4", True, None])
def test_config_rejects_non_int(bad):
    with pytest.raises(TypeError, match="num_sms"):
        Config(num_sms=bad)


def test_config_is_immutable_value():
    c = Config()
    with pytest.raises(Exception):
        c.num_sms = 4
    assert Config(24) == Config(24) and hash(Config(24)) == hash(Config(24))
    assert c.with_num_sms(64).num_sms == 64 and c.with_send_chunk(12).num_max_nvl_chunked_send_tokens == 12


def test_nvl_hint_validates_before_loading_the_extension():
    with pytest.raises(ValueError, match="num_ranks"):
        Config().get_nvl_buffer_size_hint(7168 * 2, 9)
    with pytest.raises(ValueError, match="hidden_bytes"):
        Config().get_nvl_buffer_size_hint(2 * 8192 + 2, 2)
    with pytest.raises(TypeError, match="hidden_bytes"):
        Config().get_nvl_buffer_size_hint(7168.0, 2)


def test_rdma_hint_is_zero_intranode():
    assert Config().get_rdma_buffer_size_hint(7168 * 2, 8) == 0
    with pytest.raises(ValueError, match="num_ranks"):
        Config().get_rdma_buffer_size_hint(7168 * 2, 16)


@pytest.mark.parametrize("ranks", range(1, MAX_RANKS + 1))
def test_tables_cover_1_to_8_ranks(ranks):
    for fn in (dispatch_config, combine_config):
        c = fn(ranks)
        assert isinstance(c, Config) and c.num_sms == 20
        assert fn(ranks, num_sms=64).num_sms == 64


def test_tables_published_rows():
    # DeepEP deep_ep/buffer.py get_dispatch_config / get_combine_config rows for 2, 4, 8 ranks
    assert [dispatch_config(r).num_max_nvl_chunked_send_tokens for r in (2, 4, 8)] == [24, 6, 6]
    assert [combine_config(r).num_max_nvl_chunked_send_tokens for r in (2, 4, 8)] == [10, 9, 4]
    assert {dispatch_config(r).num_max_nvl_chunked_recv_tokens for r in (2, 4, 8)} == {256}


@pytest.mark.parametrize("ranks", [0, 9, 16])
def test_tables_refuse_other_rank_counts(ranks):
    with pytest.raises(ValueError, match="num_ranks"):
        dispatch_config(ranks)
    with pytest.raises(ValueError, match="num_ranks"):
        combine_config(ranks)


def good(**kw):
    base = dict(tokens=4096, hidden=7168, topk=8, experts=256, ranks=2, dtype="bf16")
    base.update(kw)
    return Problem(**base)


def test_problem_accepts_limits():
    good(tokens=0)
    good(hidden=128)
    good(hidden=MAX_HIDDEN)
    good(experts=MAX_EXPERTS, ranks=8)
    good(topk=1)
    good(topk=MAX_TOPK)
    good(ranks=1, experts=1, topk=1)
    good(dtype="fp8")


@pytest.mark.parametrize("kw, field", [
    (dict(tokens=-1), "tokens"),
    (dict(hidden=0), "hidden"),
    (dict(hidden=100), "hidden"),
    (dict(hidden=MAX_HIDDEN + 128), "hidden"),
    (dict(experts=255), "experts"),
    (dict(experts=MAX_EXPERTS + 2), "experts"),
    (dict(experts=0), "experts"),
    (dict(topk=0), "topk"),
    (dict(topk=MAX_TOPK + 1), "topk"),
    (dict(topk=9, experts=8), "topk"),
    (dict(ranks=0), "ranks"),
    (dict(ranks=9, experts=288), "ranks"),
    (dict(dtype="fp16"), "dtype"),
])
def test_problem_rejects_with_field_name(kw, field):
    with pytest.raises(ValueError, match=rf"Problem\.{field}"):
        good(**kw)


def test_problem_derived_sizes():
    p = good()
    assert p.experts_per_rank == 128 and p.num_scales == 56
    assert p.hidden_bytes == 7168 * 2 and p.row_bytes == 7168 * 2
    f = good(dtype="fp8")
    # FP8 row: 1 byte per element plus one float32 scale per 128 columns (DeepEP's fp8_factor)
    assert f.row_bytes == 7168 + 56 * 4
    assert f.row_bytes / p.row_bytes == pytest.approx((1 + 4 / 128) / 2)


def test_op_configs_are_the_tables_with_the_send_chunk_overridden():
    from ep_core.config import combine_config, dispatch_config, op_configs

    assert op_configs(2, 24) == (dispatch_config(2, 24), combine_config(2, 24))
    d, c = op_configs(2, 64, 48)
    assert (d.num_sms, d.num_max_nvl_chunked_send_tokens, c.num_max_nvl_chunked_send_tokens) == (64, 48, 48)
    with pytest.raises(ValueError, match="num_max_nvl_chunked_send_tokens"):
        op_configs(2, 24, 300)


# -- copy path and staging buffers (issue 11) ------------------------------------------------------
def test_default_path_is_the_direct_one():
    c = Config()
    assert c.path == "direct" and c.kernel_tma_buffers == 0
    assert Config(24, 6, 256).kernel_tma_buffers == 0  # DeepEP's positional form keeps the old path


@pytest.mark.parametrize("n", [1, 2, 3])
def test_tma_path_passes_its_buffer_count(n):
    c = Config(24, 6, 256).with_path("tma", n)
    assert (c.path, c.num_tma_buffers, c.kernel_tma_buffers) == ("tma", n, n)
    assert c.with_num_sms(64).kernel_tma_buffers == n and c.with_send_chunk(8).kernel_tma_buffers == n
    assert c.to_dict()["num_tma_buffers"] == n and c.to_dict()["path"] == "tma"


@pytest.mark.parametrize("kwargs, field", [
    (dict(path="registers"), "path"),
    (dict(num_tma_buffers=0), "num_tma_buffers"),
    (dict(num_tma_buffers=4), "num_tma_buffers"),
])
def test_copy_path_fields_are_validated(kwargs, field):
    with pytest.raises(ValueError, match=field):
        Config(**kwargs)
    with pytest.raises(TypeError, match="num_tma_buffers"):
        Config(num_tma_buffers=2.0)


def test_buffer_bounds_are_the_kernels():
    """config.TMA_BUFFERS mirrors tma.cuh's bounds, which its Depth<> static_assert enforces."""
    import re
    from pathlib import Path

    from ep_core.config import TMA_BUFFERS

    src = (Path(__file__).resolve().parents[2] / "ep_core" / "csrc" / "tma.cuh").read_text()
    lo = int(re.search(r"constexpr int kMinBuffers = (\d+);", src).group(1))
    hi = int(re.search(r"constexpr int kMaxBuffers = (\d+);", src).group(1))
    assert TMA_BUFFERS == tuple(range(lo, hi + 1))
