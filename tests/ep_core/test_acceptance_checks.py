"""The GPU acceptance checks (tests/gpu/ep_checks.py) run on the CPU against a reference-backed
Buffer over gloo: they must pass on a correct implementation, at 1 and 2 ranks, with -1
entries, a zero rank and skewed routing, before they judge ep_core's kernels on the H200; and
they must fail on a wrong one."""
import pytest

from ep_core.launch import RankFailed, run_ranks
from tests.gpu import ep_checks
from tests.gpu.ep_checks import Scenario

ENV = {"EPSCOPE_TEST_BUFFER": "tests.ep_core.reference_buffer:ReferenceBuffer"}
SMALL = dict(tokens=48, hidden=256, topk=4, experts=16)


def expected_checks(sc: Scenario) -> int:
    # 1 layout check + one per (dtype, x variant, top-k on/off, mode) + 1 worst-tokens check
    variants = sum(3 if d == "fp8" else 2 for d in sc.dtypes) * 2
    return 2 + variants * len(sc.modes)


def test_checks_pass_on_the_reference_2_ranks():
    scenarios = [Scenario(**SMALL),
                 Scenario(**SMALL, drop=0.2, routing="skewed", seed=7),
                 Scenario(**SMALL, routing="zero-rank", expect_zero_rank=1, modes=((True, True),))]
    shapes = [(0, 128, 1, 2, "uniform"), (5, 128, 2, 4, "zipf"), (9, 384, 3, 6, "uniform")]
    jobs = [("run_acceptance", sc) for sc in scenarios]
    jobs += [("run_reference_options", Scenario(**SMALL, drop=0.1)), ("run_shapes", shapes)]
    out = run_ranks(ep_checks.run_many, 2, jobs, backend="gloo", timeout_s=300, env=ENV)
    for rank_out in out:
        assert [o["checks"] for o in rank_out[:3]] == [expected_checks(sc) for sc in scenarios]
        assert rank_out[4]["shapes"] == len(shapes)
    assert out[1][2]["recv_rows"] == 0 and out[0][2]["recv_rows"] > 0  # the zero rank got nothing


def test_checks_pass_on_the_reference_1_rank():
    sc = Scenario(**SMALL)
    out = run_ranks(ep_checks.run_acceptance, 1, sc, backend="gloo", timeout_s=300, env=ENV)
    assert out[0]["checks"] == expected_checks(sc) and out[0]["recv_rows"] == SMALL["tokens"]


@pytest.mark.parametrize("double, ranks, check", [
    ("SwappedBlocksBuffer", 2, "recv_x differs from the reference"),
    ("LossyCombineBuffer", 1, "check 7"),
])
def test_checks_catch_a_wrong_buffer(double, ranks, check):
    sc = Scenario(**SMALL, dtypes=("bf16",), modes=((False, False),))
    env = {"EPSCOPE_TEST_BUFFER": f"tests.ep_core.reference_buffer:{double}"}
    with pytest.raises(RankFailed, match=check):
        run_ranks(ep_checks.run_acceptance, ranks, sc, backend="gloo", timeout_s=300, env=env)


ZERO = dict(tokens=24, hidden=256, topk=4, experts=16)


def test_zero_token_rank_checks_pass_on_the_reference():
    out = run_ranks(ep_checks.run_zero_token_ranks, 2, ZERO, backend="gloo", timeout_s=300, env=ENV)
    # each rank in turn has no tokens: 3 dtypes/layouts x top-k on/off per zero rank
    assert [o["cases"] for o in out] == [2 * 3 * 2] * 2


def test_zero_token_rank_checks_catch_lost_scales():
    env = {"EPSCOPE_TEST_BUFFER": "tests.ep_core.reference_buffer:ZeroTokenScalesBuffer"}
    with pytest.raises(RankFailed, match=r"zero-token rank \d, fp8-(row|col).*scales differ"):
        run_ranks(ep_checks.run_zero_token_ranks, 2, ZERO, backend="gloo", timeout_s=300, env=env)
