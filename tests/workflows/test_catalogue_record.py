"""The catalogue's recording side on the CPU, where it can run without a GPU: each planned run's
op (profiler.workflows.catalogue_record._op) gets the run's knobs (SMs, copy path, staging buffers, hook
mode, the overlapped matmul), and profiler.workflows.workload.RankOp runs hook mode and the overlap as the
GPU recording will (over the one-rank fake extension)."""
from __future__ import annotations

import pytest
import torch

from ep_core import buffer as B
from profiler.workflows import catalogue as C
from profiler.workflows import catalogue_record as CR
from ep_core.config import Problem
from profiler.workflows.workload import RankOp, make_rank_inputs
from tests.ep_core.fake_ext import POISON, fake_buffer


class _Overlap:
    def __init__(self, n=0, device=None):
        self.n, self.calls, self.events = n, [], []

    def __call__(self):
        self.calls.append(1)


@pytest.mark.parametrize("group", ["ab-tma-buffers", "ab-hook", "ab-sms"])
def test_each_side_records_with_its_knobs(group, monkeypatch):
    buf, _ = fake_buffer(monkeypatch=monkeypatch)
    monkeypatch.setattr(CR, "Matmul", _Overlap)
    monkeypatch.setattr(CR, "_problem", lambda tokens: Problem(32, 256, 4, 16, 1, "bf16"))
    for run in C.plan([group])[:2]:
        op = CR._op(buf, run, 0, "cpu")
        st, s = run.settings, run.scenario
        for cfg in (op.dispatch_config, op.combine_config):
            assert (cfg.num_sms, cfg.path, cfg.num_tma_buffers) == (st["num_sms"], s.path, st["num_tma_buffers"])
        assert op.hook == st["return_recv_hook"]
        assert (op.overlap is not None) == bool(s.gemm_n) and (op.overlap is None or op.overlap.n == 8192)


@pytest.mark.parametrize("hook", [False, True])
def test_rank_op_overlaps_work_with_the_data_movement(hook, monkeypatch):
    buf, exts = fake_buffer(monkeypatch=monkeypatch)
    waits = []

    class Event:  # async_finish's event on the CPU: recorded, then waited on by the compute stream
        def record(self, stream=None):
            pass

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(B.EventOverlap, "current_stream_wait", lambda self: waits.append(launcher.calls[-1][0]))
    p = Problem(48, 256, 4, 16, 1)
    ins = make_rank_inputs(p, "uniform", 0, seed=2)
    seen = []
    launcher = buf._build(False).launcher

    def overlap():  # runs after the send; in hook mode the outputs are not complete yet
        seen.append([c[0] for c in launcher.calls][-1])

    op = RankOp(buf, p, ins, buf.get_dispatch_config(1), buf.get_combine_config(1), hook=hook, overlap=overlap)
    d = op.dispatch(op.layout())
    assert not bool((d.recv_x.float() == POISON).any()), "the hook ran before dispatch returned"
    op.combine(d)
    names = [c[0] for c in launcher.calls]
    if hook:
        assert names == ["layout", "notify", "dispatch", "dispatch_receive", "combine", "combine_receive"]
        assert seen == ["dispatch", "combine"]
    else:  # async_finish: the call does not join; the compute stream waits for its event after the overlap
        assert names == ["layout", "notify", "dispatch", "combine"] and seen == ["dispatch", "combine"]
        assert launcher.calls[2][2][2] and launcher.calls[3][2][2], "async_finish"
        assert waits == ["dispatch", "combine"], "the compute stream waits for each op's event"
    assert d.rows == int(ins.topk_idx.ge(0).any(1).sum()) and buf._pending_hook is None
