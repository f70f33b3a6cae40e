"""ep_core.low_latency_diff names what differs: planted faults in reference outputs (a count, two
rows swapped, a torn slice, a scale, a slot, a sent mask, a combine off by one ulp, a wrong
combine row) are each reported with the output, the count and where; identical outputs give no
finding. And tests/gpu/ll_checks.py's round trip, driven on the CPU by a stand-in Buffer that
serves the reference's outputs with a planted fault, reports it, checks the combine on the
reference handle, and keeps going."""
from __future__ import annotations

import dataclasses
import types

import pytest
import torch

from ep_core import low_latency_reference as ref
from ep_core.low_latency_diff import DispatchResult, combine_diff, dispatch_diff, format_findings

R, T, H, K, E = 2, 24, 512, 4, 8


def _inputs(seed=0):
    xs, topks, ws = [], [], []
    for r in range(R):
        g = torch.Generator().manual_seed(seed * 10 + r)
        x = torch.randn((T, H), generator=g)
        x[:, :128] *= 50
        xs.append(x.to(torch.bfloat16))
        topks.append(torch.topk(torch.rand((T, E), generator=g), K, dim=1).indices)
        ws.append(torch.rand((T, K), generator=g))
    return xs, topks, ws


def _result(want: ref.LLRefDispatch) -> DispatchResult:
    sc = None if want.recv_scales is None else want.recv_scales.clone()
    return DispatchResult(want.recv_x.clone(), sc, want.recv_count.clone(), want.recv_src_info.clone(),
                          want.recv_layout_range.clone(), want.slot.clone(), want.recv_tokens.clone(),
                          torch.cat([want.sent_mask, torch.zeros(0, dtype=torch.int32)]).clone())


@pytest.fixture(scope="module")
def disp():
    xs, topks, _ = _inputs()
    return ref.dispatch(xs, topks, E, T, use_fp8=True)


def _one(findings, output):
    assert [f.output for f in findings] == [output], format_findings("", findings)
    return findings[0]


def test_identical_outputs_have_no_finding(disp):
    for r in range(R):
        assert dispatch_diff(_result(disp[r]), disp[r], [T] * R, r) == []


def test_a_wrong_count_names_the_expert(disp):
    got = _result(disp[0])
    got.recv_count[2] += 1
    f = _one(dispatch_diff(got, disp[0], [T] * R, 0), "recv_count")
    assert f.count == 1 and "expert 2:" in f.detail


def test_swapped_rows_are_reported_as_misplaced(disp):
    got = _result(disp[0])
    a, b = got.recv_x[1, 0].clone(), got.recv_x[1, 1].clone()
    got.recv_x[1, 0], got.recv_x[1, 1] = b, a
    sa, sb = got.recv_scales[1, 0].clone(), got.recv_scales[1, 1].clone()
    got.recv_scales[1, 0], got.recv_scales[1, 1] = sb, sa
    fs = dispatch_diff(got, disp[0], [T] * R, 0)
    assert [f.output for f in fs] == ["recv_x", "recv_scales"]
    assert fs[0].count == 2 and "expert 1 row 0" in fs[0].detail
    assert "holds the data of expert 1 row 1 (misplaced)" in fs[0].detail


def test_a_torn_slice_names_its_groups_and_source(disp):
    got = _result(disp[1])
    got.recv_x.view(torch.uint8)[0, 2, 256:384] = 0xA5  # group 2 of expert 0's row 2
    f = _one(dispatch_diff(got, disp[1], [T] * R, 1), "recv_x")
    assert f.count == 1 and "groups 2 of 4 differ" in f.detail and "matches no expected row" in f.detail
    src = int(disp[1].recv_src_info[0, 2])
    assert f"token {src}" in f.detail


def test_a_wrong_scale_slot_and_mask_are_named(disp):
    got = _result(disp[0])
    got.recv_scales[0, 0, 3] *= 2
    got.slot[1, 5, 0] = -1 if int(got.slot[1, 5, 0]) >= 0 else 0
    got.sent_mask[7] ^= 1
    fs = dispatch_diff(got, disp[0], [T] * R, 0)
    assert [f.output for f in fs] == ["recv_scales", "slot", "sent_mask"]
    assert "expert 0 row 0 group 3" in fs[0].detail
    assert "source 1 token 5 k 0" in fs[1].detail
    assert "token 7" in fs[2].detail


def test_rows_past_the_count_are_not_compared(disp):
    got = _result(disp[0])
    n = int(disp[0].recv_count[0])
    got.recv_x.view(torch.uint8)[0, n:] = 0x5A
    assert dispatch_diff(got, disp[0], [T] * R, 0) == []


def test_combine_differences_name_tokens_groups_and_ulps():
    g = torch.Generator().manual_seed(3)
    want = torch.randn((T, H), generator=g).to(torch.bfloat16)
    got = want.clone()
    got.view(torch.int16)[4, 300] += 1  # one unit in the last place
    f = _one(combine_diff(got, want), "combine")
    assert f.count == 1 and "token 4 column 300" in f.detail and "max ulp 1" in f.detail and "groups 2" in f.detail
    got[9] = 0
    f = _one(combine_diff(got, want), "combine")
    assert "tokens 4, 9" in f.detail
    assert combine_diff(want.clone(), want) == []
    exact = want.double() + 1.0  # far from it: DeepEP's bound fails too
    assert [x.output for x in combine_diff(want.clone(), want, exact)] == ["combine"]


# ---- tests/gpu/ll_checks.py's round trip on the CPU ------------------------------------------------
class ServedBuffer:
    """A stand-in for ep_core.Buffer in low-latency mode on one rank: it serves the reference's
    outputs for the Oracle's inputs, with `fault` applied to the dispatch outputs."""

    def __init__(self, oracle, rank, fault=None):
        self.o, self.rank, self.fault = oracle, rank, fault
        self.combine_handles = []

    def low_latency_dispatch(self, x, idx, t_max, experts, use_fp8=True, round_scale=False, use_ue8m0=False,
                             async_finish=False, return_recv_hook=False, config=None, **kw):
        from ep_core.low_latency import LowLatencyHandle

        want = self.o.disp[self.rank]
        got = _result(want)
        sent = torch.zeros((t_max,), dtype=torch.int32)
        sent[:x.size(0)] = want.sent_mask
        # the Buffer's scales are column-major in their last two dimensions (DeepEP's layout)
        sc = None if got.recv_scales is None else got.recv_scales.transpose(1, 2).contiguous().transpose(1, 2)
        got = dataclasses.replace(got, sent_mask=sent, recv_scales=sc)
        if self.fault:
            self.fault(got)
        handle = LowLatencyHandle(got.recv_src_info, got.recv_layout_range, t_max, x.size(1), experts, got.slot,
                                  got.recv_tokens, got.sent_mask, x.size(0), idx.size(1), None)
        recv = (got.recv_x, got.recv_scales) if use_fp8 else got.recv_x
        hook = (lambda: None) if return_recv_hook else None
        event = types.SimpleNamespace(current_stream_wait=lambda: None)
        return recv, got.recv_count, handle, event, hook

    def low_latency_combine(self, y, idx, w, handle, zero_copy=False, async_finish=False, return_recv_hook=False,
                            config=None):
        # combine from what the handle says (the reference's combine over this rank's handle)
        self.combine_handles.append(handle.slot.clone())
        disp = list(self.o.disp)
        disp[self.rank] = dataclasses.replace(disp[self.rank], slot=handle.slot.clone())
        out = ref.combine(self.o.ys, disp, self.o.idxs, self.o.ws)[self.rank]
        hook = (lambda: None) if return_recv_hook else None
        return out, types.SimpleNamespace(current_stream_wait=lambda: None), hook


@pytest.fixture
def checks(monkeypatch):
    from tests.gpu import ll_checks

    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    return ll_checks


def _oracle(checks):
    sc = checks.LLScenario(tokens=T, hidden=H, topk=K, experts=E, seed=5)
    return sc, checks.Oracle(sc, R, "cpu", "fp8", False, False)


def test_round_trip_reports_nothing_when_right(checks):
    sc, o = _oracle(checks)
    found = checks.Findings(0)
    rows = checks._round_trip(ServedBuffer(o, 0), sc, o, 0, "fp8", False, False, "[t]", found)
    assert rows == int(o.disp[0].recv_count.sum()) and found.checks == 2 and found.bad == []
    found.raise_if_any()


def test_round_trip_reports_a_wrong_dispatch_and_checks_combine_on_the_reference_handle(checks):
    sc, o = _oracle(checks)

    def fault(got):
        got.slot[1, 3, 0] = 5  # a wrong row for one (source, token, k): combine would read it
        got.recv_count[0] += 1

    found = checks.Findings(0)
    buf = ServedBuffer(o, 0, fault)
    checks._round_trip(buf, sc, o, 0, "fp8", False, False, "[t]", found)
    assert found.bad == ["[t] dispatch"], found.lines  # the combine, on the reference handle, is right
    assert torch.equal(buf.combine_handles[0], o.disp[0].slot)
    with pytest.raises(AssertionError) as e:
        found.raise_if_any()
    msg = str(e.value)
    assert "1 of 2 checks differ" in msg and "recv_count" in msg and "source 1 token 3 k 0" in msg


def test_the_gpu_report_has_one_block_per_job(tmp_path):
    from tests.gpu.test_low_latency import write_report

    path = tmp_path / "report.txt"
    write_report(str(path), {
        "issue shape": [("ok", {"checks": 32, "rows": 900, "seconds": 3.2})] * 2,
        "skewed ranks": [("error", "AssertionError: 1 of 12 checks differ from the reference on rank 0: [rank 0, "
                                   "skewed 1] dispatch\n[rank 0, skewed 1] dispatch recv_x: 3 differ; expert 4 row 9"
                                   "\nTraceback (most recent call last):\n  File ..."), ("ok", {"ops": 6})],
    })
    text = path.read_text().splitlines()
    assert text[0] == "ok    issue shape (checks 32, rows 900, seconds 3.2)"
    assert text[1] == "FAIL  skewed ranks"
    assert text[2].startswith("      rank 0 error: AssertionError: 1 of 12 checks differ")
    assert text[3] == "      rank 0 error: [rank 0, skewed 1] dispatch recv_x: 3 differ; expert 4 row 9"
    assert text[4] == "      rank 1 ok: ok" and len(text) == 5  # no traceback in the report
