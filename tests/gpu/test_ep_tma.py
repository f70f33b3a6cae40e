"""The pipelined bulk-copy path (Config.path="tma", ep_core/csrc/tma.cuh) against the same
acceptance checks and the PyTorch reference as the direct path, for every staging-buffer count.

Each N is its own kernel instantiation with its own wait depth (N=1: load, store, drain; N=2:
prefetch with every store drained before a refill; N=3: one store group left in flight), so each
is checked on its own: BF16 and FP8 (row- and column-major scales), with and without top-k,
synchronous and async+previous_event, dispatch bit-exact and combine against the reference.
Routing edge cases (a rank that receives nothing, -1 entries, a skewed load, 1 GPU) run at one N
each. Spawned through ep_core.launch.run_ranks like tests/gpu/test_ep_acceptance.py.

The scenarios and the assertions on their results are functions of the shape, so
tests/ep_core/test_gpu_scripts_cpu.py runs exactly these on the CPU (a reference-backed Buffer
over gloo, a small shape) before they run here."""
import pytest

from ep_core.launch import run_ranks
from tests.gpu import ep_checks
from tests.gpu.ep_checks import Scenario

pytestmark = pytest.mark.gpu

TIMEOUT_S = 600
MODES = ((False, False), (True, True))  # synchronous, and async_finish with previous_event


def expected_checks(sc: Scenario) -> int:
    variants = sum(3 if d == "fp8" else 2 for d in sc.dtypes) * 2  # x kinds x top-k on/off
    return 2 + variants * len(sc.modes)


# -- scenarios (shape: Scenario's problem fields; {} = the 4096 x 7168, top-8 of 256) ------
def acceptance(n: int, num_sms: int, **shape) -> Scenario:
    return Scenario(path="tma", num_tma_buffers=n, num_sms=num_sms, modes=MODES, seed=10 * n + num_sms, **shape)


def one_gpu(**shape) -> Scenario:
    return Scenario(path="tma", num_tma_buffers=3, modes=MODES, **shape)


def zero_rank(**shape) -> Scenario:
    return Scenario(routing="zero-rank", expect_zero_rank=1, seed=201, path="tma", num_tma_buffers=1, modes=MODES,
                    **shape)


def skewed(**shape) -> Scenario:
    return Scenario(routing="skewed", drop=0.1, seed=301, path="tma", num_tma_buffers=2, modes=MODES, **shape)


def options(**shape) -> Scenario:
    return Scenario(drop=0.1, seed=501, path="tma", num_tma_buffers=3, **shape)


# -- what each scenario's results must show ----------------------------------------------------
def check_acceptance(out: list, sc: Scenario) -> None:
    assert [o["checks"] for o in out] == [expected_checks(sc)] * len(out)
    assert all(o["recv_rows"] > 0 for o in out)


def check_one_gpu(out: list, sc: Scenario) -> None:
    assert out[0]["checks"] == expected_checks(sc)
    assert out[0]["recv_rows"] == sc.tokens


def check_zero_rank(out: list, sc: Scenario) -> None:
    assert out[1]["recv_rows"] == 0 and out[0]["recv_rows"] > 0


def check_skewed(out: list, sc: Scenario) -> None:
    assert out[0]["recv_rows"] > out[1]["recv_rows"]


@pytest.mark.multigpu
@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("num_sms", [24, 64])
def test_tma_acceptance_2gpu(n, num_sms):
    sc = acceptance(n, num_sms)
    check_acceptance(run_ranks(ep_checks.run_acceptance, 2, sc, timeout_s=TIMEOUT_S), sc)


def test_tma_acceptance_1gpu_all_local():
    sc = one_gpu()
    check_one_gpu(run_ranks(ep_checks.run_acceptance, 1, sc, timeout_s=TIMEOUT_S), sc)


@pytest.mark.multigpu
def test_tma_rank_that_receives_zero_tokens():
    sc = zero_rank()
    check_zero_rank(run_ranks(ep_checks.run_acceptance, 2, sc, timeout_s=TIMEOUT_S), sc)


@pytest.mark.multigpu
def test_tma_skewed_routing_with_minus_one_entries():
    sc = skewed()
    check_skewed(run_ranks(ep_checks.run_acceptance, 2, sc, timeout_s=TIMEOUT_S), sc)


@pytest.mark.multigpu
def test_tma_expert_alignment_and_worst_tokens_match_reference():
    run_ranks(ep_checks.run_reference_options, 2, options(), timeout_s=TIMEOUT_S)
