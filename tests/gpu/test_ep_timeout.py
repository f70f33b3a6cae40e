"""No hangs: one rank never sends (the Buffer's test hook EPSCOPE_TEST_SKIP_SEND_RANK), the
other raises an error naming rank, chunk/channel and phase within the timeout, and the partial
profile saved on the way out shows, as open spans, where each warp was waiting."""
import dataclasses
import time

import pytest
import torch

from ep_core.launch import run_ranks

pytestmark = [pytest.mark.gpu, pytest.mark.multigpu]

# Bound of every device spin-wait in this test (Buffer reads EPSCOPE_TIMEOUT_S); small so the
# test is quick, large against a normal dispatch of this shape (well under 1 ms on H200).
DEVICE_TIMEOUT_S = 2.0
SKIP_RANK = 1


def _timeout_worker(ctx, out_dir):
    import ep_core
    from ep_core.config import Problem
    from profiler.workflows.workload import make_rank_inputs
    from profiler.record.session import Session

    p = Problem(1024, 2048, 8, 64, ctx.world_size)
    ins = make_rank_inputs(p, "uniform", ctx.rank, device=ctx.device)
    buffer = ep_core.Buffer(ctx.group, num_nvl_bytes=ep_core.Buffer.get_buffer_size_hint(p.tokens, p.hidden,
                                                                                        p.ranks, p.topk))
    idx = ins.topk_idx.to(ep_core.topk_idx_t)
    layout = buffer.get_dispatch_layout(idx, p.experts)
    ep_core._ext.load(profile=True)  # a first JIT build of the instrumented variant is not part of the bound
    torch.cuda.synchronize()
    session = Session(out_dir, name="forced-timeout", description="rank 1 never sends; rank 0 times out",
                      rank=ctx.rank, world_size=ctx.world_size, group=ctx.group,
                      workload={"kind": "ep", **p.to_dict(), "skip_send_rank": SKIP_RANK}, config={})
    t0 = time.monotonic()
    error = None
    try:
        with session:
            with buffer.profile(session):
                out = buffer.dispatch(ins.x, num_tokens_per_rank=layout[0], is_token_in_rank=layout[3],
                                      num_tokens_per_expert=layout[2], topk_idx=idx,
                                      topk_weights=ins.topk_weights, profile=True)
                buffer.combine(out[0], out[4], profile=True)
                buffer.synchronize()
    except Exception as e:  # noqa: BLE001 (the test inspects type and message)
        error = (type(e).__name__, str(e))
    rep = buffer.error_report()
    return {"rank": ctx.rank, "error": error, "seconds": time.monotonic() - t0,
            "report": None if rep is None else dataclasses.asdict(rep)}


def test_one_rank_never_sends(tmp_path):
    env = {"EPSCOPE_TEST_SKIP_SEND_RANK": str(SKIP_RANK), "EPSCOPE_TIMEOUT_S": str(DEVICE_TIMEOUT_S)}
    out = run_ranks(_timeout_worker, 2, str(tmp_path), timeout_s=300, env=env)
    waiting = out[0]
    assert waiting["error"] is not None, f"rank 0 waited on a rank that never sends and got no error: {out}"
    name, msg = waiting["error"]
    assert name == "EPTimeoutError", msg
    assert "rank 0" in msg, msg                       # who timed out
    assert f"rank {SKIP_RANK}" in msg, msg            # whom it waited for
    assert "chunk" in msg or "channel" in msg, msg    # where in the op
    assert "phase" in msg or "barrier" in msg, msg    # which phase of the registry
    # the same, as named fields (what profiler.workflows.catalogue checks its timeout run with)
    rep = waiting["report"]
    assert rep is not None, out
    assert (rep["kind"], rep["rank"], rep["kernel"], rep["phase"], rep["is_barrier"], rep["peer"]) == \
        ("timeout", 0, "dispatch", "wait_data", False, SKIP_RANK), rep
    # bounded: the error arrives within the device timeout plus setup and saving, not a hang
    assert waiting["seconds"] < DEVICE_TIMEOUT_S + 60, waiting

    from profiler.store.runstore import load_run

    run = load_run(tmp_path / "forced-timeout")
    assert run.manifest["status"] == "timeout", run.manifest["status"]
    assert "timed out" in run.manifest["error"], run.manifest["error"]
    ev = run.events
    r0 = ev[ev["rank"] == 0]
    open_spans = r0[r0["open"]]
    assert len(open_spans) > 0, "the partial trace of rank 0 has no open span: where was it waiting?"
    # the warps that hung were waiting for data (or at a barrier) from the rank that never sent
    waits = open_spans[open_spans["phase"].astype(str).isin(["wait_data", "wait_space"])]
    assert len(waits) > 0 or (r0["kind"] == "arrive").any(), open_spans["phase"].astype(str).value_counts()
    if len(waits):
        # wait phases carry the peer they wait on (registry convention): someone waited on the silent rank
        assert (waits["payload"] == SKIP_RANK).any(), waits[["phase", "payload"]]
