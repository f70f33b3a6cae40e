"""ep-api.md's eight acceptance checks on real GPUs (one process per GPU, NCCL), plus the
comparison with the PyTorch reference on fresh random inputs, -1 entries, a rank that receives
nothing, skewed routing, the API options and the size limits of issue 3.

Default shape (ep-api.md): T=4096 tokens per rank, H=7168, top-8 of 256 experts, seed = rank.
Every test spawns its ranks through ep_core.launch.run_ranks: a failing check comes back with
the rank's traceback; a hang is killed after the timeout. The check logic itself is tested on
the CPU (tests/ep_core/test_acceptance_checks.py)."""
import pytest

from ep_core.launch import run_ranks
from tests.gpu import ep_checks
from tests.gpu.ep_checks import Scenario

pytestmark = pytest.mark.gpu

# A whole scenario (JIT load from cache, NCCL init, 4 modes x 10 dispatch+combine variants) takes
# well under a minute on 2 H200s; 600 s is the bound after which a hang counts as a failure.
TIMEOUT_S = 600


def _expected_checks(sc: Scenario) -> int:
    variants = sum(3 if d == "fp8" else 2 for d in sc.dtypes) * 2  # x kinds x top-k on/off
    return 2 + variants * len(sc.modes)


@pytest.mark.multigpu
def test_acceptance_2gpu_bf16_fp8_all_modes():
    sc = Scenario()
    out = run_ranks(ep_checks.run_acceptance, 2, sc, timeout_s=TIMEOUT_S)
    assert [o["checks"] for o in out] == [_expected_checks(sc)] * 2
    assert all(o["recv_rows"] > 0 for o in out)


def test_acceptance_1gpu_all_local():
    sc = Scenario()
    out = run_ranks(ep_checks.run_acceptance, 1, sc, timeout_s=TIMEOUT_S)
    assert out[0]["checks"] == _expected_checks(sc)
    assert out[0]["recv_rows"] == 4096  # every token has an expert on the only rank


@pytest.mark.multigpu
def test_random_routing_with_minus_one_entries():
    sc = Scenario(drop=0.15, seed=100)
    out = run_ranks(ep_checks.run_acceptance, 2, sc, timeout_s=TIMEOUT_S)
    assert [o["checks"] for o in out] == [_expected_checks(sc)] * 2


@pytest.mark.multigpu
def test_a_rank_that_receives_zero_tokens():
    sc = Scenario(routing="zero-rank", expect_zero_rank=1, seed=200)
    out = run_ranks(ep_checks.run_acceptance, 2, sc, timeout_s=TIMEOUT_S)
    assert out[1]["recv_rows"] == 0 and out[0]["recv_rows"] > 0


@pytest.mark.multigpu
def test_skewed_routing():
    sc = Scenario(routing="skewed", seed=300)
    out = run_ranks(ep_checks.run_acceptance, 2, sc, timeout_s=TIMEOUT_S)
    assert out[0]["recv_rows"] > out[1]["recv_rows"]  # the hot experts live on rank 0


@pytest.mark.multigpu
def test_zipf_routing_with_minus_one():
    sc = Scenario(routing="zipf", drop=0.05, seed=400, modes=((False, False), (True, True)))
    run_ranks(ep_checks.run_acceptance, 2, sc, timeout_s=TIMEOUT_S)


@pytest.mark.multigpu
def test_expert_alignment_and_worst_tokens_match_reference():
    run_ranks(ep_checks.run_reference_options, 2, Scenario(drop=0.1, seed=500), timeout_s=TIMEOUT_S)


# Sizes at the limits of issue 3: zero tokens, hidden 128 and 8192, top-1 and top-16,
# 512 experts, experts == ranks.
LIMIT_SHAPES = [
    (0, 7168, 8, 256, "uniform"),
    (1, 128, 1, 2, "uniform"),
    (37, 8192, 16, 512, "zipf"),
    (513, 256, 16, 32, "skewed"),
    (4096, 4096, 4, 64, "uniform"),
]


@pytest.mark.multigpu
def test_problem_sizes_at_the_limits_2gpu():
    out = run_ranks(ep_checks.run_shapes, 2, LIMIT_SHAPES, timeout_s=TIMEOUT_S)
    assert [o["shapes"] for o in out] == [len(LIMIT_SHAPES)] * 2


def test_problem_sizes_at_the_limits_1gpu():
    shapes = [(0, 128, 1, 1, "uniform"), (77, 8192, 16, 512, "uniform")]
    out = run_ranks(ep_checks.run_shapes, 1, shapes, timeout_s=TIMEOUT_S)
    assert out[0]["shapes"] == 2


@pytest.mark.multigpu
def test_too_small_buffer_and_bad_sizes_raise_clear_errors():
    out = run_ranks(ep_checks.run_limit_errors, 2, timeout_s=TIMEOUT_S)
    for o in out:
        assert "num_nvl_bytes" in o["small_buffer"] or "bytes" in o["small_buffer"], o["small_buffer"]
        assert "hidden" in o["hidden"] and "topk" in o["topk"] and "experts" in o["experts"], o


def test_size_hints_are_the_buffers_formula():
    import ep_core
    from ep_core.config import HINT_TOKENS_PER_RANK, Config, Problem

    Buffer = ep_core.Buffer
    for R in (1, 2, 4, 8):
        hint = Config().get_nvl_buffer_size_hint(7168 * 2, R)
        assert hint == Buffer.get_buffer_size_hint(HINT_TOKENS_PER_RANK, 7168, R, 16)
        for topk, dtype in ((1, "bf16"), (8, "fp8"), (16, "bf16")):
            need = Problem(4096, 7168, topk, 256, R, dtype).nvl_bytes_needed()
            assert need == Buffer.get_buffer_size_hint(4096, 7168, R, topk)
            assert need <= hint  # 4096 <= HINT_TOKENS_PER_RANK tokens per rank fit the DeepEP-style hint


@pytest.mark.multigpu
def test_acceptance_on_every_visible_gpu():
    """EP4 / EP8 (issue 5): the same checks over all GPUs of the machine, with -1 entries and
    skewed routing in the same spawn."""
    import torch

    n = torch.cuda.device_count()
    if n <= 2:
        pytest.skip(f"{n} GPUs visible: the 1- and 2-GPU tests cover this machine")
    # experts must be a multiple of the rank count: one expert per rank at the smallest
    shapes = [(t, h, k, max(e, n) // n * n, r) for (t, h, k, e, r) in LIMIT_SHAPES]
    jobs = [("run_acceptance", Scenario()),
            ("run_acceptance", Scenario(drop=0.15, seed=100, modes=((False, False), (True, True)))),
            ("run_acceptance", Scenario(routing="skewed", seed=300, modes=((True, False),))),
            ("run_reference_options", Scenario(drop=0.1, seed=500, dtypes=("bf16",))),
            ("run_shapes", shapes)]
    out = run_ranks(ep_checks.run_many, n, jobs, timeout_s=TIMEOUT_S)
    assert [o[0]["checks"] for o in out] == [_expected_checks(Scenario())] * n
    assert all(o[4]["shapes"] == len(shapes) for o in out)


@pytest.mark.multigpu
def test_zero_token_rank_bf16_and_fp8_both_scale_layouts():
    """Issue 9: a rank whose own input has zero tokens (each rank in turn) receives exactly the
    reference's rows and FP8 scales (row-major and column-major scales), fresh and cached, and
    combines back; outputs are poisoned before every call."""
    out = run_ranks(ep_checks.run_zero_token_ranks, 2, {"tokens": 512}, timeout_s=TIMEOUT_S)
    assert [o["cases"] for o in out] == [2 * 3 * 2] * 2
