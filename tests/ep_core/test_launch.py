"""The multi-process helper on the CPU (gloo): results, the child's traceback, timeouts."""
import time

import pytest
import torch
import torch.distributed as dist

from ep_core.launch import RankFailed, RankTimeout, free_port, run_ranks


def _allreduce(ctx, base):
    t = torch.tensor([base + ctx.rank], dtype=torch.int64)
    dist.all_reduce(t, group=ctx.group)
    return ctx.rank, ctx.world_size, int(t), ctx.backend


def _fail_on_rank1(ctx):
    if ctx.rank == 1:
        raise ValueError("boom from the child")
    dist.barrier(group=ctx.group)  # rank 0 waits for a peer that is gone: the helper must stop it
    return "unreachable"


def _sleep(ctx, seconds):
    time.sleep(seconds)


def _env(ctx):
    import os
    return (os.environ.get("EPSCOPE_TEST_VALUE"), os.environ.get("NCCL_NVLS_ENABLE"),
            os.environ.get("RANK"), os.environ.get("WORLD_SIZE"), os.environ.get("MASTER_ADDR"))


def test_results_in_rank_order():
    out = run_ranks(_allreduce, 2, 10, backend="gloo", timeout_s=120)
    assert out == [(0, 2, 21, "gloo"), (1, 2, 21, "gloo")]


def test_child_traceback_propagates():
    with pytest.raises(RankFailed) as e:
        run_ranks(_fail_on_rank1, 2, backend="gloo", timeout_s=120, grace_s=1.0)
    assert e.value.rank == 1
    assert "ValueError: boom from the child" in str(e.value)
    assert "_fail_on_rank1" in e.value.child_traceback  # the child's own frame, not the parent's


def test_timeout_kills_and_names_ranks():
    t0 = time.monotonic()
    with pytest.raises(RankTimeout, match=r"ranks \[0\] still running"):
        run_ranks(_sleep, 1, 600, backend="gloo", timeout_s=4)
    assert time.monotonic() - t0 < 60


def test_env_reaches_children_and_multicast_stays_off():
    out = run_ranks(_env, 1, backend="gloo", timeout_s=120, env={"EPSCOPE_TEST_VALUE": "7"})
    assert out == [("7", "0", "0", "1", "127.0.0.1")]


def test_nccl_needs_gpus():
    if torch.cuda.is_available() and torch.cuda.device_count() >= 64:
        pytest.skip("machine has 64 GPUs")
    with pytest.raises(RuntimeError, match="64 ranks need 64 CUDA GPUs"):
        run_ranks(_env, 64, backend="nccl")


def test_free_port_is_bindable():
    import socket
    p = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", p))
