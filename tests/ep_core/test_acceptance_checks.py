"""The GPU acceptance checks (tests/gpu/ep_checks.py) run on the CPU against a reference-backed
Buffer over gloo: they must pass on a correct implementation, at 1 and 2 ranks, with -1
entries, a zero rank and skewed routing, before they judge ep_core's kernels on the H200."""
import pytest

from ep_core.launch import run_ranks
from tests.gpu import ep_checks
from tests.gpu.ep_checks import Scenario

ENV = {"EPSCOPE_TEST_BUFFER": "tests.ep_core.reference_buffer:ReferenceBuffer"}
SMALL = dict(tokens=48, hidden=256, topk=4, experts=16)


@pytest.mark.parametrize("ranks, extra", [
    (2, {}),
    (1, {}),
    (2, dict(drop=0.2, routing="skewed")),
    (2, dict(routing="zero-rank", expect_zero_rank=1, modes=((True, True),))),
])
def test_checks_pass_on_the_reference(ranks, extra):
    sc = Scenario(**{**SMALL, **extra})
    out = run_ranks(ep_checks.run_acceptance, ranks, sc, backend="gloo", timeout_s=300, env=ENV)
    # 1 layout check + one per (dtype, x variant, top-k on/off, mode) + 1 worst-tokens check
    per_mode = 2 * (2 + 3)
    assert [o["checks"] for o in out] == [2 + per_mode * len(sc.modes)] * ranks


def test_reference_options_and_shapes_pass_on_the_reference():
    sc = Scenario(**SMALL, drop=0.1)
    run_ranks(ep_checks.run_reference_options, 2, sc, backend="gloo", timeout_s=300, env=ENV)
    shapes = [(0, 128, 1, 2, "uniform"), (5, 128, 2, 4, "zipf"), (9, 384, 3, 6, "uniform")]
    out = run_ranks(ep_checks.run_shapes, 2, shapes, backend="gloo", timeout_s=300, env=ENV)
    assert [o["shapes"] for o in out] == [3, 3]


@pytest.mark.parametrize("double, ranks, check", [
    ("SwappedBlocksBuffer", 2, "recv_x differs from the reference"),
    ("LossyCombineBuffer", 1, "check 7"),
])
def test_checks_catch_a_wrong_buffer(double, ranks, check):
    from ep_core.launch import RankFailed

    sc = Scenario(**SMALL, dtypes=("bf16",), modes=((False, False),))
    env = {"EPSCOPE_TEST_BUFFER": f"tests.ep_core.reference_buffer:{double}"}
    with pytest.raises(RankFailed, match=check):
        run_ranks(ep_checks.run_acceptance, ranks, sc, backend="gloo", timeout_s=300, env=env)
