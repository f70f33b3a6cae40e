"""ep_core.tuned's low-latency entries: buckets of T_max that never govern a larger T_max, entries
holding a validated LowLatencyConfig, lookups that say which entry matched and why, and the
default a low-latency call takes from them (ep_core/low_latency.py over the CPU fakes): only when
neither the call nor the Buffer chose a config, once per shape, announced once."""
from __future__ import annotations

import json

import pytest
import torch

from ep_core import buffer as buffer_mod
from ep_core import low_latency as ll
from ep_core import tuned
from tests.ep_core.ll_fake import make_low_latency

T_MAX, H, E, K = 8, 256, 8, 2   # tests/ep_core/ll_fake.py's buffer


def _entry(kernel="ll_dispatch", lo=1, hi=16, gpu="NVIDIA H200", dtype="fp8", hidden=7168, **cfg):
    return tuned.Entry(kernel=kernel, gpu=gpu, ranks=2, dtype=dtype, hidden=hidden, tokens_min=lo, tokens_max=hi,
                       config=ll.LowLatencyConfig(**cfg).to_dict(), latency_us=25.0, spread_us=1.5, samples=160,
                       runs=4)


def _key(t_max, dtype="fp8"):
    return tuned.TunedKey("NVIDIA H200", 2, dtype, 7168, t_max)


def test_ll_buckets_start_above_the_previous_top():
    assert tuned.ll_buckets([16, 64, 128, 256]) == [(1, 16), (17, 64), (65, 128), (129, 256)]
    assert tuned.ll_buckets([1]) == [(1, 1)]


@pytest.mark.parametrize("tops, msg", [([], "at least one"), ([16, 16], "must increase"), ([64, 16], "must increase"),
                                       ([0], "1..1024"), ([2048], "1..1024"), ([True], "an int"), ([8.0], "an int")])
def test_ll_buckets_refuse_bad_tops(tops, msg):
    with pytest.raises(tuned.TunedTableError, match=msg):
        tuned.ll_buckets(tops)


def test_lookup_names_the_ll_entry_and_the_t_max_bucket():
    entries = [_entry(lo=1, hi=16, num_blocks=32), _entry(lo=17, hi=64, num_blocks=96),
               _entry("ll_combine", lo=17, hi=64, dtype="bf16", warps_per_block=8)]
    m = tuned.lookup(entries, "ll_dispatch", _key(40), "t.json")
    assert m.entry is entries[1] and m.reason == ("matched ll_dispatch NVIDIA H200, 2 ranks, fp8, hidden 7168, "
                                                  "T_max 17..64 (tuned at 64): T_max 40 in 17..64")
    assert tuned.lookup(entries, "ll_dispatch", _key(16)).entry is entries[0]
    assert tuned.lookup(entries, "ll_dispatch", _key(17)).entry is entries[1]
    assert tuned.lookup(entries, "ll_combine", _key(64, "bf16")).entry is entries[2]


def test_a_rule_for_one_t_max_bucket_never_governs_a_larger_one():
    m = tuned.lookup([_entry(lo=1, hi=16), _entry(lo=17, hi=64)], "ll_dispatch", _key(65))
    assert m.entry is None
    assert m.reason == ("T_max 65 is above every tuned ll_dispatch bucket (1..16, 17..64): a rule measured at "
                        "T_max 64 does not govern more")


@pytest.mark.parametrize("kernel, key", [
    ("dispatch", _key(8)),                  # a normal kernel never takes a low-latency entry, nor the reverse
    ("ll_combine", _key(8)),                # the other low-latency kernel
    ("ll_dispatch", _key(8, "bf16")),       # a BF16 dispatch is another shape than the FP8 one
    ("ll_dispatch", tuned.TunedKey("NVIDIA H100", 2, "fp8", 7168, 8)),
    ("ll_dispatch", tuned.TunedKey("NVIDIA H200", 4, "fp8", 7168, 8)),
    ("ll_dispatch", tuned.TunedKey("NVIDIA H200", 2, "fp8", 4096, 8)),
])
def test_another_kernel_or_shape_does_not_match(kernel, key):
    m = tuned.lookup([_entry()], kernel, key)
    assert m.entry is None and m.reason.startswith(f"no tuned {kernel} entry")


def test_ll_entries_round_trip_beside_normal_ones(tmp_path):
    from ep_core.config import dispatch_config

    normal = tuned.Entry("dispatch", "NVIDIA H200", 2, "bf16", 7168, 2049, 4096, dispatch_config(2, 48).to_dict(),
                         450.0, 50.0, 80, 4)
    p = tuned.save_entries(tmp_path / "t.json", [normal, _entry(num_blocks=32)])
    tuned.save_entries(p, [_entry(num_blocks=96), _entry(lo=17, hi=64)])   # same bucket replaced, another added
    got = tuned.load_table(p)
    assert sorted((e.kernel, e.tokens_max) for e in got) == [("dispatch", 4096), ("ll_dispatch", 16),
                                                              ("ll_dispatch", 64)]
    assert next(e for e in got if e.tokens_max == 16).config["num_blocks"] == 96


@pytest.mark.parametrize("mutate, msg", [
    (lambda c: c.update(num_blocks=0), r"entries\[0\].config: LowLatencyConfig.num_blocks must be in 1..256"),
    (lambda c: c.update(split="diagonal"), r"entries\[0\].config: LowLatencyConfig.split must be one of"),
    (lambda c: c.update(num_sms=24), r"entries\[0\].config: .*num_sms"),    # a normal Config's field
])
def test_a_broken_ll_config_names_the_field(tmp_path, mutate, msg):
    p = tuned.save_entries(tmp_path / "t.json", [_entry()])
    d = json.loads(p.read_text())
    mutate(d["entries"][0]["config"])
    p.write_text(json.dumps(d))
    with pytest.raises(tuned.TunedTableError, match=msg):
        tuned.load_table(p)


def test_a_normal_config_in_an_ll_entry_is_refused(tmp_path):
    from ep_core.config import dispatch_config

    p = tuned.save_entries(tmp_path / "t.json", [_entry()])
    d = json.loads(p.read_text())
    d["entries"][0]["config"] = dispatch_config(2, 24).to_dict()
    p.write_text(json.dumps(d))
    with pytest.raises(tuned.TunedTableError, match=r"entries\[0\].config"):
        tuned.load_table(p)


# -- the default of a low-latency call (LowLatency over the CPU fakes: the GPU's name is "cpu") -----
@pytest.fixture
def table(tmp_path, monkeypatch):
    monkeypatch.setattr(buffer_mod, "current_raw_stream", lambda device_index: 77)
    for name in ("_cache", "_ll_cache", "_device_names"):
        monkeypatch.setattr(tuned, name, {})
    monkeypatch.setattr(tuned, "_announced", set())
    entries = [_entry(gpu="cpu", hidden=H, lo=1, hi=8, num_blocks=32, warps_per_block=8),
               _entry("ll_combine", gpu="cpu", hidden=H, dtype="bf16", lo=1, hi=8, num_blocks=16, warps_per_block=4)]
    p = tuned.save_entries(tmp_path / "t.json", entries)
    monkeypatch.setenv(tuned.ENV, str(p))
    return p


def _inputs(T=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn((T, H), generator=g).to(torch.bfloat16)
    idx = torch.topk(torch.rand((T, E), generator=g), K, dim=1).indices.to(torch.int64)
    return x, idx, torch.rand((T, K), generator=g)


def _geometry(obj, i=-1):
    return vars(obj.buffer.ext.launches[i].plan.geometry)


def _pair(obj, t_max=T_MAX, **kw):
    x, idx, w = _inputs()
    h = obj.dispatch(x, idx, t_max, E, **kw)[2]
    y = torch.zeros((E // 2, 2 * t_max, H), dtype=torch.bfloat16)
    obj.combine(y, idx, w, h, **kw)
    return _geometry(obj, -2), _geometry(obj, -1)


def test_a_call_without_config_takes_each_kernels_entry_and_says_so_once(table, capsys):
    obj = make_low_latency()
    d, c = _pair(obj)
    assert d == dict(num_blocks=32, warps_per_block=8) and c == dict(num_blocks=16, warps_per_block=4)
    err = capsys.readouterr().err
    assert "ep_core: ll_dispatch uses the tuned config" in err and "T_max 8 in 1..8" in err
    assert "ep_core: ll_combine uses the tuned config" in err
    _pair(obj)
    assert capsys.readouterr().err == ""
    # one config object per shape (the host path is a dict lookup; cached plans key on the config)
    _pair(obj)
    plans = [l.plan for l in obj.buffer.ext.launches if l.kind == "dispatch"]
    assert plans[0] is plans[2]      # (the output sets, and their plans, alternate)
    assert obj._call_config(None, "ll_dispatch", T_MAX, H, "fp8") is obj._call_config(None, "ll_dispatch", T_MAX, H,
                                                                                       "fp8")


def test_a_chosen_config_wins_over_the_table(table):
    mine = ll.LowLatencyConfig(num_blocks=48, warps_per_block=4)
    obj = make_low_latency()
    assert _pair(obj, config=mine) == (dict(num_blocks=48, warps_per_block=4),) * 2
    with obj.using(ll.LowLatencyConfig()):   # `using` the defaults is a choice too (the A/B recordings do)
        assert _pair(obj) == (dict(num_blocks=64, warps_per_block=16),) * 2
    obj.config = mine                        # set on the Buffer (tests/gpu/ll_checks.py does)
    assert _pair(obj) == (dict(num_blocks=48, warps_per_block=4),) * 2
    built = make_low_latency(config=ll.LowLatencyConfig(num_blocks=8, warps_per_block=2))
    assert _pair(built) == (dict(num_blocks=8, warps_per_block=2),) * 2


def test_off_or_no_matching_bucket_gives_the_defaults(table, monkeypatch):
    defaults = (dict(num_blocks=64, warps_per_block=16),) * 2
    big = make_low_latency(num_bytes=ll.size_hint(16, H, 2, E))
    assert _pair(big, t_max=16) == defaults     # T_max 16 is above the 1..8 bucket
    monkeypatch.setenv(tuned.ENV, "off")
    assert _pair(make_low_latency()) == defaults


def test_an_entry_whose_grid_does_not_fit_the_gpu_is_refused(tmp_path, monkeypatch, table):
    p = tuned.save_entries(tmp_path / "big.json", [_entry(gpu="cpu", hidden=H, lo=1, hi=8, num_blocks=200)])
    monkeypatch.setenv(tuned.ENV, str(p))
    x, idx, _ = _inputs()
    with pytest.raises(tuned.TunedTableError, match="does not fit this GPU: .*must be <= the GPU's 132 SMs"):
        make_low_latency().dispatch(x, idx, T_MAX, E)


def test_bad_arguments_still_get_the_calls_own_message(table):
    obj = make_low_latency()
    with pytest.raises(ValueError, match="x must be a bf16"):
        obj.dispatch("not a tensor", _inputs()[1], T_MAX, E)
    with pytest.raises(ValueError, match="needs the handle"):
        obj.combine(torch.zeros(1), _inputs()[1], _inputs()[2], handle="nope")
