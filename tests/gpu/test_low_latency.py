"""ep_core's low-latency dispatch/combine on 2 GPUs against ep_core.low_latency_reference on fresh
random inputs (tests/gpu/ll_checks.py): the issue's shape (128 tokens per rank, hidden 7168,
top-8 of 256), -1 entries, a rank with zero tokens, every token to one expert, FP8 / round_scale /
UE8M0 / BF16, recv hooks with two ops in flight, async_finish, zero_copy, a CUDA graph replayed on
new inputs, every knob of LowLatencyConfig giving the same bits, a bounded wait that names the
silent rank, and a profiled step that decodes."""
import pytest

from ep_core.launch import run_ranks
from tests.gpu import ll_checks
from tests.gpu.ll_checks import LLScenario

pytestmark = [pytest.mark.gpu, pytest.mark.multigpu]

# JIT load from the cache, NCCL init and the references take seconds; a hang is killed after this
TIMEOUT_S = 300


def test_issue_shape_all_dtypes_and_modes():
    out = run_ranks(ll_checks.run_ll_checks, 2, LLScenario(), timeout_s=TIMEOUT_S)
    assert [o["checks"] for o in out] == [len(ll_checks.DTYPES) * 4] * 2
    assert all(o["rows"] > 0 for o in out)


def test_minus_one_entries_and_fewer_tokens_than_the_maximum():
    sc = LLScenario(tokens=100, max_tokens=128, drop=0.2, seed=100, dtypes=ll_checks.DTYPES[:2])
    run_ranks(ll_checks.run_ll_checks, 2, sc, timeout_s=TIMEOUT_S)


def test_a_rank_with_zero_tokens():
    sc = LLScenario(zero_rank=1, seed=200, dtypes=ll_checks.DTYPES[::3])
    out = run_ranks(ll_checks.run_ll_checks, 2, sc, timeout_s=TIMEOUT_S)
    assert all(o["rows"] > 0 for o in out)  # rank 1 still receives rank 0's tokens


def test_all_tokens_to_one_expert():
    sc = LLScenario(hot_expert=3, seed=300, dtypes=ll_checks.DTYPES[:1])
    run_ranks(ll_checks.run_ll_checks, 2, sc, timeout_s=TIMEOUT_S)


@pytest.mark.parametrize("tokens", [1, 4, 256])
def test_decode_sizes(tokens):
    run_ranks(ll_checks.run_ll_checks, 2, LLScenario(tokens=tokens, seed=400 + tokens, dtypes=ll_checks.DTYPES[::3]),
              timeout_s=TIMEOUT_S)


def test_small_shapes_and_top16():
    sc = LLScenario(tokens=37, hidden=512, topk=16, experts=64, drop=0.1, seed=500)
    run_ranks(ll_checks.run_ll_checks, 2, sc, timeout_s=TIMEOUT_S)


@pytest.mark.parametrize("tokens", [4, 128])
def test_every_knob_gives_the_same_bits(tokens):
    out = run_ranks(ll_checks.run_knob_equivalence, 2, LLScenario(tokens=tokens, seed=600), timeout_s=TIMEOUT_S)
    assert out[0]["configs"] == len(ll_checks.ll.LowLatencyConfig.KNOBS) + 3


def test_small_grid_geometry():
    sc = LLScenario(tokens=64, seed=700, dtypes=ll_checks.DTYPES[:1], config=dict(num_blocks=8, warps_per_block=4))
    run_ranks(ll_checks.run_ll_checks, 2, sc, timeout_s=TIMEOUT_S)


def test_two_ops_in_flight_with_hooks():
    run_ranks(ll_checks.run_in_flight, 2, LLScenario(tokens=64, seed=800), timeout_s=TIMEOUT_S)


def test_cuda_graph_replays_on_new_inputs():
    out = run_ranks(ll_checks.run_graph, 2, LLScenario(seed=900), timeout_s=TIMEOUT_S)
    assert [o["replays"] for o in out] == [3, 3]


def test_cumulative_stats_and_shape_errors():
    out = run_ranks(ll_checks.run_stats_and_errors, 2, LLScenario(tokens=32, seed=1000), timeout_s=TIMEOUT_S)
    assert all(len(o["errors"]) == 2 for o in out)


def test_a_silent_rank_gives_a_bounded_named_timeout():
    timeout = 2.0
    out = run_ranks(ll_checks.run_timeout, 2, LLScenario(tokens=16), timeout, timeout_s=TIMEOUT_S)
    err = out[0]["error"]
    assert err is not None, "rank 0 waited for a rank that never called and got no error"
    assert "timed out on rank 0" in err and "rank 1" in err and "wait_data" in err, err
    assert out[0]["seconds"] < timeout + 30, out[0]


@pytest.mark.parametrize("barrier", ["working", "all"])
def test_profiled_step_decodes(tmp_path, barrier):
    out = run_ranks(ll_checks.run_profiled, 2, LLScenario(tokens=16, seed=1100), str(tmp_path), barrier,
                    timeout_s=TIMEOUT_S)
    from profiler.runstore import load_run

    run = load_run(out[0]["path"])
    assert run.manifest["status"] == "ok"
    assert int(run.launches["dropped"].sum()) == 0
    phases = set(run.events["phase"].astype(str))
    assert {"route", "send_token", "fanout", "expert_meta", "weights", "partial", "reduce", "send_done",
            "recv_done", "publish", "post_credit"} <= phases, phases
    assert set(run.launches["kernel"].astype(str)) == {"ll_dispatch", "ll_combine"}
    arrivals = run.events[run.events["kind"].astype(str) == "arrive"]
    per_launch = arrivals.groupby(["rank", "launch"]).size()
    if barrier == "all":  # every warp of the grid arrives at both barriers
        assert (per_launch == 2 * 64 * 16).all(), per_launch
    else:  # only the warps with work: fewer than the grid at 16 tokens
        assert (per_launch < 2 * 64 * 16).all(), per_launch
