from __future__ import annotations

import pytest

from profiler.groundtruth.synthetic import make_events
from profiler.store.runstore import write_run
from profiler.torchtrace.kineto import write_kineto

from .fake import BASE, fake_events, plant_gemm

GEMM_NS = 480_000


@pytest.fixture(scope="module")
def upstream(tmp_path_factory):
    """A 2-rank synthetic run whose rank 1 runs 480 µs of unrecorded GPU work before every dispatch
    (profiler.groundtruth.synthetic 'upstream_gpu'), with both ranks' Kineto traces: rank 1's has that work as
    an aten::mm kernel launched from moe.py:112. Offsets 5 ms and -3 ms (ranks' host clocks differ)."""
    root = tmp_path_factory.mktemp("upstream")
    ev, la, man = make_events(ranks=2, events=20_000, scenario="upstream_gpu", late_rank=1, late_ns=GEMM_NS,
                              iterations=3)
    run = write_run(root / "run", ev, la, man, perfetto=False)
    name = man["name"]
    t0 = fake_events(la, 0, name, offset_ns=5_000_000)
    t1 = fake_events(la, 1, name, offset_ns=-3_000_000)
    d1 = la[(la["rank"] == 1) & (la["kernel"] == "dispatch")]
    for r in d1.itertuples(index=False):
        n1 = la[(la["rank"] == 1) & (la["iteration"] == r.iteration) & (la["kernel"] == "notify")].iloc[0]
        plant_gemm(t1, int(n1.host_begin_ns) - 40_000, int(r.gpu_begin_ns) - GEMM_NS - 100, int(r.gpu_begin_ns) - 200)
    paths = [write_kineto(root / "rank0.json", t0.events, base_ns=BASE, rank=0, world_size=2),
             write_kineto(root / "rank1.json.gz", t1.events, base_ns=BASE, rank=1, world_size=2)]
    return {"run": run, "events": ev, "launches": la, "manifest": man, "traces": paths, "root": root,
            "fakes": (t0, t1)}
