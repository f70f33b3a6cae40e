"""The CPU model of the low-latency kernels (tests/ep_core/ll_model.py: their work split, lane
mapping, routing, row arithmetic and flag discipline, warp by warp over numpy copies of every
rank's buffer) against ep_core.low_latency_reference, bit for bit (ep_core.low_latency_diff says
what differs): 1 to 256 tokens per rank, every knob at its old behaviour, small and large grids,
2 to 4 ranks, FP8 / round_scale / UE8M0 / BF16, -1 entries, a rank without tokens, every token to
one expert, an expert named twice, top-16, two ops in flight with hooks, a different
num_max_dispatch_tokens_per_rank from one op to the next. Every op brings fresh inputs, so a read
of the previous op's data shows. The model's own checks run in all of them: no read before the
flag that publishes it (DataRace), barrier counts (BarrierMiscount), no deadlock, task and lane
coverage. The first GPU run's fan-out, which waited only for its own source before reading the
counts of the sources before it, is caught as a data race."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from ep_core import low_latency as ll
from ep_core import low_latency_reference as ref
from ep_core.low_latency_diff import combine_diff, dispatch_diff, format_findings
from tests.ep_core import ll_model as M


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    # the model's many small tensor ops: one thread is much faster than two on a busy 2-core machine
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@dataclasses.dataclass
class Case:
    R: int = 2
    T: int = 64
    H: int = 1024
    K: int = 8
    E: int = 32
    T_max: int | None = None
    dtype: tuple = ("fp8", False, False)   # (dtype, round_scale, use_ue8m0)
    cfg: ll.LowLatencyConfig = dataclasses.field(default_factory=ll.LowLatencyConfig)
    inputs: dict = dataclasses.field(default_factory=dict)  # ll_model.make_inputs options
    ops: int = 2                           # round trips, each on fresh inputs

    @property
    def t_max(self) -> int:
        return self.T_max or max(self.T, 1)


def _dispatch_calls(c: Case, inp: M.Inputs, T_max: int, outs) -> list:
    fp8, rs, ue = c.dtype[0] == "fp8", c.dtype[1], c.dtype[2]
    return [M.DispatchCall(M.bf16_bits(inp.xs[r]), inp.topks[r].numpy(), T_max, c.E, fp8, rs, ue, outs[r])
            for r in range(c.R)]


def _check_dispatch(c: Case, inp: M.Inputs, T_max: int, outs, tag: str) -> tuple[list, list]:
    fp8, rs, ue = c.dtype[0] == "fp8", c.dtype[1], c.dtype[2]
    want = ref.dispatch(inp.xs, inp.topks, c.E, T_max, fp8, rs, ue)
    tokens = [x.size(0) for x in inp.xs]
    lines = []
    for r in range(c.R):
        f = dispatch_diff(outs[r].as_result(c.E, c.H, fp8, ue), want[r], tokens, r)
        if f:
            lines.append(format_findings(f"[{tag} rank {r} dispatch]", f))
    return want, lines


def _combine_calls(c: Case, inp: M.Inputs, want, T_max: int, outs, seed: int):
    fp8 = c.dtype[0] == "fp8"
    ys = [ref.expert_outputs(d, c.H, fp8, seed=seed, rank=r) for r, d in enumerate(want)]
    out = [np.full((x.size(0), c.H), M.POISON, np.uint16) for x in inp.xs]
    calls = [M.CombineCall(M.bf16_bits(ys[r]).reshape(-1, c.H), inp.topks[r].numpy(), inp.ws[r].numpy(), T_max, c.E,
                           outs[r], out[r]) for r in range(c.R)]
    return ys, calls, out


def _check_combine(c: Case, inp: M.Inputs, want, ys, out, tag: str) -> list:
    combined = ref.combine(ys, want, inp.topks, inp.ws)
    lines = []
    for r in range(c.R):
        got = torch.from_numpy(out[r].view(np.int16)).view(torch.bfloat16)
        f = combine_diff(got, combined[r])
        if f:
            lines.append(format_findings(f"[{tag} rank {r} combine]", f))
    return lines


def run_case(c: Case, seed: int = 0, fanout_waits: str = "before", t_max_per_op=None) -> list[str]:
    """c.ops round trips (dispatch then combine, both halves in one launch) on one model machine;
    the output sets alternate as the Buffer's do. Returns the findings (empty: bit-exact)."""
    fp8, ue = c.dtype[0] == "fp8", c.dtype[2]
    t_maxes = t_max_per_op or [c.t_max] * c.ops
    num_bytes = max(ll.size_hint(t, c.H, c.R, c.E) for t in t_maxes)
    m = M.Machine(c.R, num_bytes, c.cfg, seed=seed, fanout_waits=fanout_waits)
    sets = {}
    lines = []
    for op, T_max in enumerate(t_maxes):
        key = (T_max, op & 1)
        if key not in sets:
            sets[key] = [M.DispatchOut.empty(c.R, T_max, c.H, c.E, c.K, fp8, ue) for _ in range(c.R)]
        outs = sets[key]
        inp = M.make_inputs(c.R, min(c.T, T_max), c.H, c.K, c.E, seed=seed * 100 + op, **c.inputs)
        for r, call in enumerate(_dispatch_calls(c, inp, T_max, outs)):
            m.dispatch(r, call)
        m.run()
        tag = f"op {op} T={c.T} T_max={T_max}"
        want, bad = _check_dispatch(c, inp, T_max, outs, tag)
        lines += bad
        ys, calls, out = _combine_calls(c, inp, want, T_max, outs, seed=op)
        for r, call in enumerate(calls):
            m.combine(r, call)
        m.run()
        lines += _check_combine(c, inp, want, ys, out, tag)
    return lines


def _assert_exact(lines: list[str]) -> None:
    assert not lines, "\n".join(lines)


TOKENS = [1, 2, 3, 4, 16, 31, 32, 33, 64, 100, 128, 256]


@pytest.mark.parametrize("T", TOKENS)
def test_token_counts_match_the_reference(T):
    _assert_exact(run_case(Case(T=T, H=512 if T > 64 else 1024), seed=T))


@pytest.mark.parametrize("T", [4, 64, 128])
def test_fine_slices_match_the_reference(T):
    # min_slice_groups=1: up to 8 slices of a 1024-wide row, so slice boundaries fall inside it
    _assert_exact(run_case(Case(T=T, cfg=dataclasses.replace(ll.LowLatencyConfig(), min_slice_groups=1)), seed=T))


@pytest.mark.parametrize("knob", ll.LowLatencyConfig.KNOBS + ("all",))
def test_every_knob_at_its_old_behaviour_matches(knob):
    cfg = ll.LowLatencyConfig.old() if knob == "all" else ll.LowLatencyConfig().with_old(knob)
    _assert_exact(run_case(Case(T=64, cfg=cfg), seed=3))


@pytest.mark.parametrize("dtype", [("fp8", True, False), ("fp8", True, True), ("bf16", False, False)],
                         ids=["round_scale", "ue8m0", "bf16"])
def test_dtypes_match_the_reference(dtype):
    _assert_exact(run_case(Case(T=48, dtype=dtype), seed=5))


@pytest.mark.parametrize("case", [
    Case(R=3, T=37, H=512, K=16, E=48, inputs=dict(drop=0.1, zero_rank=1)),
    Case(R=4, T=33, H=512, K=4, E=16, inputs=dict(ragged=True, repeat=True)),
    Case(R=2, T=64, H=512, E=32, inputs=dict(hot_expert=3)),
    Case(R=2, T=100, H=512, T_max=128, inputs=dict(drop=0.2)),
    Case(R=2, T=64, cfg=ll.LowLatencyConfig(num_blocks=8, warps_per_block=4)),
    Case(R=4, T=20, H=512, E=16, cfg=ll.LowLatencyConfig(num_blocks=4, warps_per_block=1),
         dtype=("bf16", False, False)),
], ids=["3 ranks top-16 zero rank", "4 ranks ragged repeat", "hot expert", "fewer than T_max",
        "small grid", "one warp per block"])
def test_shapes_and_routings_match_the_reference(case):
    _assert_exact(run_case(case, seed=7))


def test_the_issue_shape_dispatch_matches_the_reference():
    # hidden 7168, top-8 of 256 at 128 tokens per rank: dispatch only (the CPU reference of the
    # combine at this size takes tens of seconds; the combine indexing is the same as above)
    c = Case(T=128, H=7168, E=256)
    m = M.Machine(2, ll.size_hint(128, 7168, 2, 256), c.cfg, seed=11)
    inp = M.make_inputs(2, 128, 7168, 8, 256, seed=11)
    outs = [M.DispatchOut.empty(2, 128, 7168, 256, 8, True, False) for _ in range(2)]
    for r, call in enumerate(_dispatch_calls(c, inp, 128, outs)):
        m.dispatch(r, call)
    m.run()
    _assert_exact(_check_dispatch(c, inp, 128, outs, "issue shape")[1])


def test_t_max_may_change_between_ops():
    # the halves sit at fixed places (LowLatency.half_stride): every shape's regions stay inside
    # their half (the model asserts it on every access)
    _assert_exact(run_case(Case(T=64, H=512, ops=4), seed=13, t_max_per_op=[16, 64, 4, 64]))


def test_two_ops_in_flight_with_hooks():
    c = Case(T=40, H=512)
    m = M.Machine(2, ll.size_hint(40, 512, 2, 32), c.cfg, seed=17)
    inps = [M.make_inputs(2, 40, 512, 8, 32, seed=170 + i) for i in range(2)]
    outs = [[M.DispatchOut.empty(2, 40, 512, 32, 8, True, False) for _ in range(2)] for _ in range(2)]
    calls = [_dispatch_calls(c, inps[i], 40, outs[i]) for i in range(2)]
    for r in range(2):  # send A, send B, hook A, hook B
        for i, ph in ((0, M.SEND), (1, M.SEND), (0, M.RECV), (1, M.RECV)):
            m.dispatch(r, calls[i][r], ph)
    m.run()
    lines, wants, ys, cout = [], [], [], []
    for i in range(2):
        want, bad = _check_dispatch(c, inps[i], 40, outs[i], f"in flight {i}")
        lines += bad
        y, ccalls, out = _combine_calls(c, inps[i], want, 40, outs[i], seed=i)
        wants.append(want)
        ys.append(y)
        cout.append((ccalls, out))
    for r in range(2):
        for i, ph in ((0, M.SEND), (1, M.SEND), (0, M.RECV), (1, M.RECV)):
            m.combine(r, cout[i][0][r], ph)
    m.run()
    for i in range(2):
        lines += _check_combine(c, inps[i], wants[i], ys[i], cout[i][1], f"in flight {i}")
    _assert_exact(lines)


def test_a_third_op_before_the_first_hook_deadlocks():
    # the host refuses it (LowLatency._open); the device would time out: op 3 writes into half 1
    # only after the peers' credit for op 1, which the uncalled hook never posts
    c = Case(T=8, H=512)
    m = M.Machine(2, ll.size_hint(8, 512, 2, 32), c.cfg, seed=19)
    inp = M.make_inputs(2, 8, 512, 8, 32, seed=19)
    outs = [M.DispatchOut.empty(2, 8, 512, 32, 8, True, False) for _ in range(2)]
    for r, call in enumerate(_dispatch_calls(c, inp, 8, outs)):
        for _ in range(3):
            m.dispatch(r, call, M.SEND)
    with pytest.raises(M.Deadlock):
        m.run()


def test_the_first_gpu_runs_fanout_is_a_data_race():
    # 2xH200 at 6a0331a: a fan-out task of the peer's tokens read this rank's own header (the
    # counts of the rows before the peer's) after waiting only for the peer's flag; with the peer
    # ahead, it read op n - 2's counts (the same inputs in the first four checks: right by luck;
    # new inputs: rows in the wrong places)
    with pytest.raises(M.DataRace, match="expert counts"):
        run_case(Case(T=64, ops=1), seed=23, fanout_waits="source")


def test_split_accounting_matches_the_tasks():
    # block_workers / working_blocks (what the "working" barrier counts) against the warps that
    # actually get a task or a duty, over many shapes (the model checks it again at run time)
    for items in (0, 1, 5, 63, 64, 65, 200, 512):
        for groups in (1, 4, 7, 56):
            for duties in (0, 1, 2, 128):
                for B, wpb in ((64, 16), (8, 4), (3, 1), (7, 3)):
                    for flat in (True, False):
                        k = M.Knobs(flat, True, 4, True)
                        sp = M.Split(items, groups, duties, k, B, wpb)
                        M.check_cover(sp, "split")
                        for b in range(B):
                            # a duty: warps g < duties (routers, weights, expert bookkeeping; the
                            # first warp of block 0 counts even without one)
                            busy = [w for w in range(wpb) if sp.tasks_of(b, w) or w * B + b < max(duties, 1)]
                            n = sp.block_workers(b)
                            assert busy == list(range(len(busy))), (items, groups, duties, B, wpb, flat, b)
                            assert len(busy) == n, (items, groups, duties, B, wpb, flat, b, busy, n)
                        working = [b for b in range(B) if sp.block_workers(b) > 0]
                        assert working == list(range(sp.working_blocks()))


def test_lane_mappings_tile_every_slice():
    for g0 in range(0, 8):
        for g1 in range(g0 + 1, 64, 5):
            M.lanes_bf16_in(g0, g1)
            M.lanes_fanout(g0, g1, True)
            M.lanes_fanout(g0, g1, False)
