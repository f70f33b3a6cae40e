"""The low-latency buffer map (ep_core/low_latency_layout.py is its one source: the kernels take its
offsets by name), the size hint, the mirrors of the kernels' limits, and LowLatencyConfig's
validation. CPU only."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from ep_core import low_latency as ll
from ep_core.config import MAX_HIDDEN, MAX_RANKS, MAX_TOPK

CSRC = Path(ll.__file__).resolve().parent / "csrc"
HEADER = (CSRC / "low_latency.cuh").read_text()
SHAPES = [(128, 7168, 2, 256), (1, 128, 1, 1), (256, 4096, 8, 512), (1024, 8192, 2, 64), (37, 384, 3, 9)]


def _regions(off: dict, R: int) -> list[tuple[str, int, int]]:
    """(name, begin, end) of every region of both halves and of the control block."""
    out = [(w, off[w], off[w] + 4) for w in ll.CONTROL_WORDS]
    out += [(a, off[a], off[a] + 2 * MAX_RANKS * 4) for a in ll.FLAG_ARRAYS]
    for h in range(2):
        base = off["half0"] + h * off["half_stride"]
        for region, stride in (("hdr", "hdr_stride"), ("meta", "meta_stride"), ("rows", "rows_stride"),
                               ("cweights", "cw_stride"), ("cpartials", "cp_stride")):
            out.append((f"{region}[{h}]", base + off[region], base + off[region] + R * off[stride]))
    return out


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_regions_are_aligned_disjoint_and_inside(shape):
    T, H, R, E = shape
    lay = ll.LowLatencyLayout(T, H, R, E)
    off = lay.offsets()
    for name, v in off.items():
        assert v >= 0 and v % 16 == 0, f"{name}={v} is not 16-byte aligned (the kernels' int4 accesses)"
    assert off["half0"] >= ll.CONTROL_BYTES and off["half_stride"] % 4096 == 0
    regs = sorted(_regions(off, R), key=lambda r: r[1])
    for (n0, b0, e0), (n1, b1, e1) in zip(regs, regs[1:]):
        assert e0 <= b1, f"{n0} [{b0}, {e0}) overlaps {n1} [{b1}, {e1})"
    assert regs[-1][2] <= off["size"] == lay.size
    # what each region must hold per source (ep_core/csrc/low_latency.cuh layout_ok)
    assert off["hdr_stride"] >= ll.HEADER_BYTES + 4 * (E // R)
    assert off["meta_stride"] >= T * MAX_TOPK * 4
    assert off["row_bytes"] >= 2 * H and off["row_bytes"] >= H + 4 * (H // ll.GROUP)
    assert off["rows_stride"] >= T * off["row_bytes"]
    assert off["cw_stride"] >= T * MAX_TOPK * 4 and off["cp_stride"] >= T * 2 * H


def test_a_larger_half_stride_moves_half_one_only():
    lay = ll.LowLatencyLayout(16, 1024, 2, 32)
    own = lay.offsets()
    wide = lay.offsets(half_stride=own["half_stride"] + 8192)
    assert wide["half_stride"] == own["half_stride"] + 8192 and wide["size"] == own["size"] + 2 * 8192
    assert {k: v for k, v in wide.items() if k not in ("half_stride", "size")} == \
        {k: v for k, v in own.items() if k not in ("half_stride", "size")}
    for bad in (own["half_stride"] - 4096, own["half_stride"] + 100):
        with pytest.raises(ValueError, match="half_stride"):
            lay.offsets(half_stride=bad)


def test_size_hint_is_the_layout_size_and_grows_with_every_dimension():
    assert ll.size_hint(128, 7168, 2, 256) == ll.LowLatencyLayout(128, 7168, 2, 256).size
    base = ll.size_hint(64, 1024, 2, 16)
    assert ll.size_hint(128, 1024, 2, 16) > base
    assert ll.size_hint(64, 2048, 2, 16) > base
    assert ll.size_hint(64, 1024, 4, 16) > base
    # the decode shape: two halves of R sources x 128 tokens x (staged row + partial row)
    hint = ll.size_hint(128, 7168, 2, 256)
    assert 2 * 2 * 128 * (2 * 7168 * 2) < hint < 2 * 2 * 128 * (2 * 7168 * 2) + (1 << 20)


@pytest.mark.parametrize("args,match", [
    ((0, 128, 2, 4), "num_max_dispatch_tokens_per_rank"),
    ((ll.MAX_TOKENS + 1, 128, 2, 4), "num_max_dispatch_tokens_per_rank"),
    ((8, 100, 2, 4), "hidden"),
    ((8, MAX_HIDDEN + 128, 2, 4), "hidden"),
    ((8, 128, MAX_RANKS + 1, 16), "num_ranks"),
    ((8, 128, 2, 5), "num_experts"),
    ((8, 128, 1, ll.MAX_LOCAL_EXPERTS + 1), "num_experts"),
])
def test_layout_rejects_shapes_out_of_range(args, match):
    with pytest.raises(ValueError, match=match):
        ll.LowLatencyLayout(*args)
    with pytest.raises(TypeError, match="must be an int"):
        ll.LowLatencyLayout(8.0, 128, 2, 4)


def test_offsets_are_the_kernels_layout_fields():
    """Every name the Python layout gives is a field of the C++ Layout, and the reverse (the
    bindings fill the struct by name and refuse unknown or missing names)."""
    body = re.search(r"struct Layout \{(.*?)\};", HEADER, re.S).group(1)
    fields = set(re.findall(r"\b([a-z_0-9]+)\s*[,;]", re.sub(r"//[^\n]*", "", body.replace("int64_t", ""))))
    assert fields == set(ll.LowLatencyLayout(8, 128, 2, 4).offsets())
    bindings = (CSRC / "low_latency_bindings.cpp").read_text()
    assert set(re.findall(r'\{"([a-z_0-9]+)", &ll::Layout::\1\}', bindings)) == fields


def _constexpr(name: str) -> int:
    m = re.search(rf"constexpr int {name} = ([^;]+);", HEADER)
    assert m, f"{name} not in low_latency.cuh"
    return m.group(1).strip()


def test_python_mirrors_match_the_kernel_header():
    assert int(_constexpr("kGroup")) == ll.GROUP
    assert int(_constexpr("kMaxTokens")) == ll.MAX_TOKENS
    assert int(_constexpr("kMaxBlocks")) == ll.MAX_BLOCKS
    assert int(_constexpr("kThreads")) // 32 == ll.MAX_WARPS_PER_BLOCK
    assert _constexpr("kMaxLocalExperts") == "kMaxExperts"
    ids = dict(re.findall(r"(kKernel\w+) = (\d+),", HEADER))
    assert sorted(int(v) for v in ids.values()) == sorted(ll.KERNELS)
    assert int(re.search(r"kErrProtocol = (\d+)", HEADER).group(1)) == ll.ERROR_PROTOCOL
    assert (int(re.search(r"kSendPhase = (\d+)", HEADER).group(1)),
            int(re.search(r"kRecvPhase = (\d+)", HEADER).group(1))) == (ll.SEND_PHASE, ll.RECV_PHASE)
    assert ll.META_BYTES == MAX_TOPK * 4


def test_config_defaults_are_the_new_behaviours_and_old_flips_every_knob():
    new, old = ll.LowLatencyConfig(), ll.LowLatencyConfig.old()
    assert (new.split, new.barrier, new.min_slice_groups, new.loads, new.host) == ("flat", "working", 4, "first",
                                                                                  "cached")
    assert {k: getattr(old, k) for k in ll.LowLatencyConfig.KNOBS} == ll.LowLatencyConfig.OLD
    assert (old.num_blocks, old.warps_per_block) == (new.num_blocks, new.warps_per_block)
    for knob in ll.LowLatencyConfig.KNOBS:
        one = new.with_old(knob)
        changed = [k for k in ll.LowLatencyConfig.KNOBS if getattr(one, k) != getattr(new, k)]
        assert changed == [knob]
    assert ll.LowLatencyConfig.old(num_blocks=32).num_blocks == 32
    assert new.to_dict()["split"] == "flat"


@pytest.mark.parametrize("kwargs,match", [
    (dict(num_blocks=0), "num_blocks"), (dict(num_blocks=ll.MAX_BLOCKS + 1), "num_blocks"),
    (dict(warps_per_block=0), "warps_per_block"), (dict(warps_per_block=17), "warps_per_block"),
    (dict(split="diagonal"), "split"), (dict(barrier="some"), "barrier"), (dict(min_slice_groups=0), "min_slice"),
    (dict(loads="later"), "loads"), (dict(host="never"), "host"),
])
def test_config_names_the_bad_field(kwargs, match):
    with pytest.raises(ValueError, match=f"LowLatencyConfig.{match}"):
        ll.LowLatencyConfig(**kwargs)


def test_config_geometry_checks():
    with pytest.raises(ValueError, match="no knob"):
        ll.LowLatencyConfig().with_old("num_blocks")
    with pytest.raises(TypeError, match="must be an int"):
        ll.LowLatencyConfig(num_blocks=True)
    with pytest.raises(ValueError, match="rank count"):
        ll.LowLatencyConfig(num_blocks=4).check_geometry(num_ranks=8)
    with pytest.raises(ValueError, match="132 SMs"):
        ll.LowLatencyConfig(num_blocks=200).check_geometry(num_ranks=2, num_sms=132)
    ll.LowLatencyConfig(num_blocks=132).check_geometry(num_ranks=8, num_sms=132)
