"""DeepEP's own test scripts pass against ep_core (issue 35): `tests/test_intranode.py` and
`tests/test_low_latency.py` of a DeepEP V1 checkout the developer supplies (env
EPSCOPE_DEEPEP_DIR; nothing is fetched), run unchanged with `import deep_ep` resolving to ep_core
(benchmarks/gpu/deepep_tests.py), at every rank count the machine's GPUs allow. Without the env
variable every case skips and says so. Then a DeepEP caller's process state on one GPU:
`torch.set_default_device('cuda')` with a bf16 default dtype, as DeepEP's tests/utils.py sets it,
through a normal and a low-latency Buffer, and DeepEP's other methods on the real buffers."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from benchmarks.gpu import deepep_tests as D

pytestmark = pytest.mark.gpu

CASES = [pytest.param(script, n, id=f"{Path(script).stem}-n{n}",
                      marks=[pytest.mark.multigpu] if n > 1 else [])
         for script in D.SCRIPTS for n in (1, 2, 4, 8)]


@pytest.mark.parametrize("script,ranks", CASES)
def test_deepep_script_passes(script, ranks, tmp_path):
    if not os.environ.get(D.ENV_DIR):
        pytest.skip(f"no DeepEP checkout: set {D.ENV_DIR} to one (its tests/ directory is what runs)")
    if ranks > torch.cuda.device_count():
        pytest.skip(f"needs {ranks} GPUs, {torch.cuda.device_count()} visible")
    if D.SCRIPTS[script] % ranks:
        pytest.skip(f"{script} routes {D.SCRIPTS[script]} experts: not a multiple of {ranks}")
    out = Path(os.environ.get("EPSCOPE_DEEPEP_LOGS", tmp_path))
    (run,) = D.run_all(os.environ[D.ENV_DIR], out, [ranks], [script], timeout_s=540)
    assert run.passed, f"{script} --num-processes {ranks} exited {run.returncode}:\n" + run.log.read_text()[-4000:]


@pytest.fixture
def deepep_process_state():
    """DeepEP's tests/utils.py init_dist: default device cuda, default dtype bf16."""
    dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    torch.set_default_device("cuda")
    try:
        yield
    finally:
        torch.set_default_device(None)
        torch.set_default_dtype(dtype)


def test_normal_path_under_deepeps_default_device_and_dtype(deepep_process_state):
    import ep_core
    from ep_core import reference as ref

    T, H, E, K = 256, 1024, 16, 4
    buf = ep_core.Buffer(None, ep_core.Buffer.get_buffer_size_hint(T, H, 1), explicitly_destroy=True)
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn((T, H), generator=g, dtype=torch.float32, device="cuda").to(torch.bfloat16)
    idx = torch.topk(torch.rand((T, E), generator=g, dtype=torch.float32, device="cuda"), K, dim=1).indices
    w = torch.rand((T, K), generator=g, dtype=torch.float32, device="cuda")
    layout = buf.get_dispatch_layout(idx, E)
    recv, recv_idx, recv_w, counts, handle, _ = buf.dispatch(
        x, num_tokens_per_rank=layout[0], is_token_in_rank=layout[3], num_tokens_per_expert=layout[2],
        topk_idx=idx, topk_weights=w)
    want = ref.dispatch([x], topk_idx=[idx], topk_weights=[w], num_experts=E)[0]
    assert torch.equal(recv, want.recv_x) and counts == want.num_recv_tokens_per_expert_list
    combined, _, _ = buf.combine(recv, handle, topk_weights=recv_w)
    assert torch.equal(combined, x)  # one rank: each token comes back once
    assert buf._info_host.device.type == "cpu" and buf._info_host.is_pinned()
    # DeepEP's other methods on the real buffer: the local tensor aliases the mapped memory
    t = buf.get_local_buffer_tensor(torch.int32, torch.Size((8,)), offset=buf.num_nvl_bytes - 64)
    assert t.data_ptr() == buf.peers.local + buf.num_nvl_bytes - 64 and t.device == buf.device
    t.fill_(5)
    assert buf.get_local_buffer_tensor(torch.int32)[-16:-8].eq(5).all()
    assert buf.get_comm_stream() == buf.comm_stream
    buf.destroy()


def test_low_latency_with_enable_shrink_under_deepeps_state(deepep_process_state):
    import ep_core

    T, H, E = 16, 2048, 8
    buf = ep_core.Buffer(None, num_rdma_bytes=ep_core.Buffer.get_low_latency_rdma_size_hint(T, H, 1, E),
                         low_latency_mode=True, num_qps_per_rank=E, explicitly_destroy=True, enable_shrink=True)
    x = torch.ones((T, H), dtype=torch.bfloat16, device="cuda")
    idx = torch.arange(T * 2, dtype=torch.int64, device="cuda").view(T, 2) % E
    w = torch.full((T, 2), 0.5, dtype=torch.float32, device="cuda")
    recv, count, handle, _, _ = buf.low_latency_dispatch(x, idx, T, E, use_fp8=False)
    out, _, _ = buf.low_latency_combine(recv, idx, w, handle)
    assert torch.allclose(out.float(), x.float())
    status = torch.ones((1,), dtype=torch.int32, device="cuda")
    buf.low_latency_query_mask_buffer(status)
    assert status.tolist() == [0]
    assert buf.get_local_buffer_tensor(torch.uint8, use_rdma_buffer=True).numel() == buf._ll.num_bytes
    buf.destroy()
