"""Issue 35's default-config gap, the part that needs no GPU: DeepEP's test_intranode.py tunes with
cached calls (`dispatch(x, handle=handle, config=Config(24, chunk, 256))`, then the default
`get_dispatch_config(num_ranks)` after `set_num_sms(24)`; combine likewise), and in ep_core a
cached call takes its chunking from the handle. So every row of that loop, the default's too,
hands the extension the same plan: the same kernel, grid and arguments. The gap the script
printed on one rank (benchmarks/NOTES.md, issue 35) cannot come from the config. What the config
does change in a cached call, the SM count, does change the plan (the check can fail)."""
from __future__ import annotations

import dataclasses

from ep_core import config as C
from ep_core.config import Config, Problem
from tests.ep_core.fake_ext import fresh_dispatch, one_rank_dispatch

SMS = 24  # the script's num_sms (its `for i in (24, )`)


def _plans(launcher, kind):
    return [c[1] for c in launcher.calls if c[0] == kind]


def _fields(plan) -> dict:
    """What the extension receives; the handle's tensors by address (the same memory in every call)."""
    out = {f.name: getattr(plan, f.name) for f in dataclasses.fields(plan) if f.name != "handle"}
    h = plan.handle
    out["handle"] = {f.name: (v.data_ptr() if hasattr(v, "data_ptr") else v)
                     for f in dataclasses.fields(h) for v in [getattr(h, f.name)]}
    return out


def _sweep(buf, handle, x, recv, kind):
    """The script's loop: its chunks, then the default after set_num_sms(SMS); the plans launched."""
    launcher = buf._build(False).launcher
    n0 = len(_plans(launcher, kind))
    chunks = range(4, 33, 2) if kind == "dispatch" else range(1, 17)
    configs = [Config(SMS, c, 256) for c in chunks]
    configs.append((C.dispatch_config if kind == "dispatch" else C.combine_config)(1, SMS))
    for cfg in configs:
        if kind == "dispatch":
            buf.dispatch(x, handle=handle, config=cfg)
        else:
            buf.combine(recv, handle, config=cfg)
    plans = _plans(launcher, kind)[n0:]
    assert len(plans) == len(configs)
    return plans


def test_every_row_of_the_scripts_tuning_loop_launches_the_same_plan(monkeypatch):
    buf, _, ins, idx, layout = one_rank_dispatch(Problem(96, 256, 4, 16, 1), 3, monkeypatch)
    recv, _, _, _, handle, _ = fresh_dispatch(buf, ins, idx, layout, config=Config(SMS, 8, 256))
    for kind in ("dispatch", "combine"):
        plans = _sweep(buf, handle, ins.x, recv, kind)
        assert all(_fields(p) == _fields(plans[0]) for p in plans), kind
    # the SM count is what a cached call's config changes: another grid, another plan
    buf.dispatch(ins.x, handle=handle, config=Config(48, 8, 256))
    more = _plans(buf._build(False).launcher, "dispatch")[-1]
    assert _fields(more) != _fields(plans[0]) and more.num_blocks == 48


def test_a_fresh_dispatch_raises_small_chunks_to_the_same_size(monkeypatch):
    """At the script's 4096 tokens and 24 sender blocks (one rank: every block sends), every chunk
    up to ceil(4096 / (8 x 24)) = 22 becomes 22; the default's 24 and larger ones stay."""
    buf, *_ = one_rank_dispatch(Problem(96, 256, 4, 16, 1), 3, monkeypatch)
    n, senders = buf._dispatch_blocks(Config(SMS, 8, 256))
    assert (n, senders) == (SMS, SMS)
    sizes = {c: buf._chunking(4096, senders, Config(SMS, c, 256))[0] for c in range(4, 33, 2)}
    assert {sizes[c] for c in range(4, 23, 2)} == {22} and sizes[24] == 24 and sizes[32] == 32
    assert buf._chunking(4096, senders, C.dispatch_config(1, SMS)) == (24, 171)
