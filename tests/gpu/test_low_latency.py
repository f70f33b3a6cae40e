"""ep_core's low-latency dispatch/combine on 2 GPUs against ep_core.low_latency_reference on fresh
random inputs (tests/gpu/ll_checks.py): the issue's shape (128 tokens per rank, hidden 7168,
top-8 of 256), -1 entries, a rank with zero tokens, every token to one expert, FP8 / round_scale /
UE8M0 / BF16, recv hooks with two ops in flight, async_finish, zero_copy, a CUDA graph replayed on
new inputs, every knob of LowLatencyConfig giving the same bits, a bounded wait that names the
silent rank, and a profiled step that decodes.

The checks run in a few spawns of the two ranks (ll_checks.run_jobs: process start and NCCL init
cost seconds each; the wrong-argument calls in a spawn of their own), shared by the test
functions through module fixtures; each test asserts on
its own job's result, so a failure names the job. Every job runs whatever the others found
(ll_checks.run_jobs) and reports every difference it saw (ep_core.low_latency_diff); with
LL_REPORT=<file> the module also writes one compact block per job there (benchmarks/gpu/ll_gpu.sh
prints it): the whole diagnosis of a run in one place."""
import os

import pytest

from ep_core.launch import run_ranks
from tests.gpu import ll_checks
from tests.gpu.ll_checks import DTYPES, LLScenario

pytestmark = [pytest.mark.gpu, pytest.mark.multigpu]

# JIT load from the cache, NCCL init and the references take seconds; every device wait is bounded
# (ll_checks.CHECK_TIMEOUT_S), so a spawn that runs past this is stuck on the host: killed
TIMEOUT_S = 150

# in the order of what they tell: the first GPU run's failure first, the graph (a capture can
# leave a sticky error that ends the spawn) last
CORRECTNESS = {
    "skewed ranks": ("run_skewed", (LLScenario(tokens=128, seed=650),)),
    "issue shape": ("run_ll_checks", (LLScenario(),)),
    "1 token": ("run_ll_checks", (LLScenario(tokens=1, seed=401, dtypes=DTYPES[::3]),)),
    "4 tokens": ("run_ll_checks", (LLScenario(tokens=4, seed=404, dtypes=DTYPES[::3]),)),
    "256 tokens": ("run_ll_checks", (LLScenario(tokens=256, seed=456, dtypes=DTYPES[::3]),)),
    "-1 entries": ("run_ll_checks", (LLScenario(tokens=100, max_tokens=128, drop=0.2, seed=100, dtypes=DTYPES[:2]),)),
    "zero-token rank": ("run_ll_checks", (LLScenario(zero_rank=1, seed=200, dtypes=DTYPES[::3]),)),
    "one expert": ("run_ll_checks", (LLScenario(hot_expert=3, seed=300, dtypes=DTYPES[:1]),)),
    "top-16 small": ("run_ll_checks", (LLScenario(tokens=37, hidden=512, topk=16, experts=64, drop=0.1, seed=500),)),
    "small grid": ("run_ll_checks", (LLScenario(tokens=64, seed=700, dtypes=DTYPES[:1],
                                                config=dict(num_blocks=8, warps_per_block=4)),)),
    "knobs 4": ("run_knob_equivalence", (LLScenario(tokens=4, seed=600),)),
    "knobs 128": ("run_knob_equivalence", (LLScenario(tokens=128, seed=601),)),
    "T_max changes": ("run_t_max_changes", (LLScenario(tokens=128, seed=660),)),
    "in flight": ("run_in_flight", (LLScenario(tokens=64, seed=800),)),
    "graph": ("run_graph", (LLScenario(seed=900),)),
}
# The first GPU run's host crash (SIGSEGV in "stats and errors", 418ddf3) took every job's result
# with it: these run in a spawn of their own, after the correctness jobs, the wrong-argument calls
# last, so a crash there costs only their own tests.
APART = {
    "stats": ("run_cumulative_stats", (LLScenario(tokens=32, seed=1000),)),
    "errors": ("run_argument_errors", (LLScenario(tokens=32, seed=1001),)),
}


def write_report(path: str, results: dict) -> None:
    """One block per job: ok with its counts, or each rank's status and its findings."""
    lines = []
    for name, per_rank in results.items():
        if all(st == "ok" for st, _ in per_rank):
            v = per_rank[0][1]
            keys = ("checks", "rows", "configs", "ops", "replays", "seconds")
            extra = ", ".join(f"{k} {v[k]}" for k in keys if k in v)
            lines.append(f"ok    {name} ({extra})")
            continue
        lines.append(f"FAIL  {name}")
        for rank, (st, v) in enumerate(per_rank):
            text = str(v).split("\nTraceback")[0] if st != "ok" else "ok"
            lines += [f"      rank {rank} {st}: {ln}" for ln in text.splitlines()[:30]]
    with open(path, "a") as f:
        f.write("\n".join(lines) + "\n")


def _spawn(jobs: dict) -> dict:
    out = run_ranks(ll_checks.run_jobs, 2, list(jobs.values()), timeout_s=TIMEOUT_S)
    res = {name: [r[i] for r in out] for i, name in enumerate(jobs)}
    if os.environ.get("LL_REPORT"):
        write_report(os.environ["LL_REPORT"], res)
    return res


@pytest.fixture(scope="module")
def results():
    return _spawn(CORRECTNESS)


@pytest.fixture(scope="module")
def apart():
    return _spawn(APART)


def _ok(results, name):
    per_rank = results[name]
    for rank, (status, value) in enumerate(per_rank):
        assert status == "ok", f"{name} on rank {rank}: {status}: {value}"
    return [v for _, v in per_rank]


def test_issue_shape_all_dtypes_and_modes(results):
    out = _ok(results, "issue shape")
    assert [o["checks"] for o in out] == [len(DTYPES) * len(ll_checks.MODES) * 2] * 2  # dispatch and combine
    assert all(o["rows"] > 0 for o in out)


def test_minus_one_entries_and_fewer_tokens_than_the_maximum(results):
    _ok(results, "-1 entries")


def test_a_rank_with_zero_tokens(results):
    out = _ok(results, "zero-token rank")
    assert all(o["rows"] > 0 for o in out)  # rank 1 still receives rank 0's tokens


def test_all_tokens_to_one_expert(results):
    _ok(results, "one expert")


@pytest.mark.parametrize("name", ["1 token", "4 tokens", "256 tokens"])
def test_decode_sizes(results, name):
    _ok(results, name)


def test_small_shapes_and_top16(results):
    _ok(results, "top-16 small")


def test_small_grid_geometry(results):
    _ok(results, "small grid")


@pytest.mark.parametrize("name", ["knobs 4", "knobs 128"])
def test_every_knob_gives_the_same_bits(results, name):
    out = _ok(results, name)
    assert out[0]["configs"] == len(ll_checks.ll.LowLatencyConfig.KNOBS) + 3


def test_skewed_ranks_on_new_inputs_every_op(results):
    out = _ok(results, "skewed ranks")
    assert [o["ops"] for o in out] == [6, 6]


def test_t_max_may_change_between_ops(results):
    _ok(results, "T_max changes")


def test_two_ops_in_flight_with_hooks(results):
    _ok(results, "in flight")


def test_cuda_graph_replays_on_new_inputs(results):
    out = _ok(results, "graph")
    assert [o["replays"] for o in out] == [3, 3]


def test_cumulative_stats_accumulate(apart):
    out = _ok(apart, "stats")
    assert [o["ops"] for o in out] == [2, 2]


def test_wrong_arguments_are_refused_by_name_and_the_buffer_stays_usable(apart):
    out = _ok(apart, "errors")
    assert all(len(o["errors"]) == len(ll_checks.BAD_CALLS) for o in out)


def test_a_silent_rank_gives_a_bounded_named_timeout():
    timeout = 2.0
    out = run_ranks(ll_checks.run_timeout, 2, LLScenario(tokens=16), timeout, timeout_s=TIMEOUT_S)
    err = out[0]["error"]
    assert err is not None, "rank 0 waited for a rank that never called and got no error"
    assert "timed out on rank 0" in err and "rank 1" in err and "wait_data" in err, err
    assert out[0]["seconds"] < timeout + 30, out[0]


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    d = tmp_path_factory.mktemp("ll-profiled")
    jobs = [("run_profiled", (LLScenario(tokens=16, seed=1100), str(d), b)) for b in ("working", "all")]
    out = run_ranks(ll_checks.run_jobs, 2, jobs, timeout_s=TIMEOUT_S)
    res = {f"profiled {b}": [r[i] for r in out] for i, b in enumerate(("working", "all"))}
    if os.environ.get("LL_REPORT"):
        write_report(os.environ["LL_REPORT"], res)
    return {b: out[0][i] for i, b in enumerate(("working", "all"))}


@pytest.mark.parametrize("barrier", ["working", "all"])
def test_profiled_step_decodes(profiled, barrier):
    status, value = profiled[barrier]
    assert status == "ok", value
    from profiler.store.runstore import load_run

    run = load_run(value["path"])
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
