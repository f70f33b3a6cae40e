"""The pipelined bulk-copy path (Config.path="tma", ep_core/csrc/tma.cuh) against the same
acceptance checks and the PyTorch reference as the direct path, for every staging-buffer count.

Each N is its own kernel instantiation with its own wait depth (N=1: load, store, drain; N=2:
prefetch with every store drained before a refill; N=3: one store group left in flight), so each
is checked on its own: BF16 and FP8 (row- and column-major scales), with and without top-k,
synchronous and async+previous_event, dispatch bit-exact and combine against the reference.
Routing edge cases (a rank that receives nothing, -1 entries, a skewed load, 1 GPU) run at one N
each. Spawned through ep_core.launch.run_ranks like tests/gpu/test_ep_acceptance.py."""
import pytest

from ep_core.launch import run_ranks
from tests.gpu import ep_checks
from tests.gpu.ep_checks import Scenario

pytestmark = pytest.mark.gpu

TIMEOUT_S = 600
MODES = ((False, False), (True, True))  # synchronous, and async_finish with previous_event


def _expected_checks(sc: Scenario) -> int:
    variants = sum(3 if d == "fp8" else 2 for d in sc.dtypes) * 2  # x kinds x top-k on/off
    return 2 + variants * len(sc.modes)


@pytest.mark.multigpu
@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("num_sms", [24, 64])
def test_tma_acceptance_2gpu(n, num_sms):
    sc = Scenario(path="tma", num_tma_buffers=n, num_sms=num_sms, modes=MODES, seed=10 * n + num_sms)
    out = run_ranks(ep_checks.run_acceptance, 2, sc, timeout_s=TIMEOUT_S)
    assert [o["checks"] for o in out] == [_expected_checks(sc)] * 2
    assert all(o["recv_rows"] > 0 for o in out)


def test_tma_acceptance_1gpu_all_local():
    sc = Scenario(path="tma", num_tma_buffers=3, modes=MODES)
    out = run_ranks(ep_checks.run_acceptance, 1, sc, timeout_s=TIMEOUT_S)
    assert out[0]["checks"] == _expected_checks(sc)
    assert out[0]["recv_rows"] == 4096


@pytest.mark.multigpu
def test_tma_rank_that_receives_zero_tokens():
    sc = Scenario(routing="zero-rank", expect_zero_rank=1, seed=201, path="tma", num_tma_buffers=1, modes=MODES)
    out = run_ranks(ep_checks.run_acceptance, 2, sc, timeout_s=TIMEOUT_S)
    assert out[1]["recv_rows"] == 0 and out[0]["recv_rows"] > 0


@pytest.mark.multigpu
def test_tma_skewed_routing_with_minus_one_entries():
    sc = Scenario(routing="skewed", drop=0.1, seed=301, path="tma", num_tma_buffers=2, modes=MODES)
    out = run_ranks(ep_checks.run_acceptance, 2, sc, timeout_s=TIMEOUT_S)
    assert out[0]["recv_rows"] > out[1]["recv_rows"]


@pytest.mark.multigpu
def test_tma_expert_alignment_and_worst_tokens_match_reference():
    sc = Scenario(drop=0.1, seed=501, path="tma", num_tma_buffers=3)
    run_ranks(ep_checks.run_reference_options, 2, sc, timeout_s=TIMEOUT_S)
