"""Hand-made Kineto traces of a run's launches, with known offsets, drifts and planted ops.

`fake_events(launches, rank, run)` writes what torch.profiler records around ep_core's profiled
launches: per launch a launch label (user_annotation) on the main thread around a cudaLaunchKernel
runtime event, and the kernel on stream 7, CUPTI's start PRE ns before the first warp and its end
POST ns after the last; times are the run's plus `offset_ns` (+ drift). Planted ops add an aten op
with its Python frames and its kernel (`upstream`) or a named range on the host (`host_range`).
"""
from __future__ import annotations

from profiler.torchtrace.labels import launch_label

PID, TID, STREAM, DEVICE = 4242, 4242, 7, 0
PRE, POST = 300, 500          # CUPTI's kernel start before the first warp, end after the last (ns)
CALL_NS = 2_000                # a cudaLaunchKernel call
BASE = 1_700_000_000_000_000_000


class Trace:
    def __init__(self, offset_ns: int = 0, drift_ppm: float = 0.0, ref_ns: int = 0):
        self.events, self.corr = [], 1000
        self.offset, self.drift, self.ref = offset_ns, drift_ppm * 1e-6, ref_ns

    def k(self, t_run: int) -> int:
        """Kineto time of run time t_run."""
        return int(round(t_run + self.offset + self.drift * (t_run - self.ref))) + BASE

    def x(self, cat, name, pid, tid, b, e, **args):
        ev = {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": self.k(b), "dur": self.k(e) - self.k(b)}
        if args:
            ev["args"] = args
        self.events.append(ev)

    def launch(self, b: int, kb: int, ke: int, name: str, ext: int = -1):
        """A launch call at run time b and its kernel on [kb, ke] (run times)."""
        self.corr += 1
        self.x("cuda_runtime", "cudaLaunchKernel", PID, TID, b, b + CALL_NS, correlation=self.corr,
               **({"External id": ext} if ext >= 0 else {}))
        self.x("kernel", name, DEVICE, STREAM, kb, ke, correlation=self.corr, stream=STREAM, device=DEVICE,
               **({"External id": ext} if ext >= 0 else {}))
        self.events.append({"ph": "s", "id": self.corr, "pid": PID, "tid": TID, "ts": self.k(b), "cat": "ac2g",
                            "name": "ac2g"})


def fake_events(launches, rank: int, run: str, *, offset_ns: int = 5_000_000, drift_ppm: float = 0.0,
                skip=(), label_rank: int | None = None, label_run: str | None = None,
                operator_kernels: bool = False) -> Trace:
    """operator_kernels: inside each label, before the launcher's own launch, an aten::zeros and an
    aten::copy_ that launch a fill and a copy kernel (what the session's first slab of a geometry
    does inside the first profiled call: the first H100 recording's trace)."""
    la = launches[(launches["rank"] == rank) & (launches["gpu_begin_ns"] >= 0)].sort_values("gpu_begin_ns")
    tr = Trace(offset_ns, drift_ppm, int(la["gpu_begin_ns"].median()) if len(la) else 0)
    for r in la.itertuples(index=False):
        if int(r.launch) in skip:
            continue
        b0, e0 = int(r.gpu_begin_ns), int(r.gpu_end_ns)
        call = (int(r.host_begin_ns) if r.host_begin_ns >= 0 and r.host_begin_ns < b0 else b0 - 20_000)
        first = call - (1_500 if operator_kernels else 200)
        tr.x("user_annotation", launch_label(label_run or run, rank if label_rank is None else label_rank, int(r.launch)),
             PID, TID, first, call + CALL_NS + 200)
        if operator_kernels:
            for i, (op, kname) in enumerate([("aten::zeros", "void at::native::vectorized_elementwise_kernel<4>"),
                                            ("aten::copy_", "void at::native::elementwise_kernel<128, 4>")]):
                ob = first + 100 + i * 600
                tr.x("cpu_op", op, PID, TID, ob, ob + 500)
                tr.corr += 1
                tr.x("cuda_runtime", "cudaLaunchKernel", PID, TID, ob + 100, ob + 400, correlation=tr.corr)
                tr.x("kernel", kname, DEVICE, STREAM, b0 - 60_000 + i * 10_000, b0 - 55_000 + i * 10_000,
                     correlation=tr.corr, stream=STREAM, device=DEVICE)
        tr.launch(call, b0 - PRE, e0 + POST, f"void ep_core::{r.kernel}_kernel<2>(Args)")
    return tr


def plant_gemm(tr: Trace, call: int, kb: int, ke: int, *, ext: int = 77):
    """aten::mm launched at run time `call` from moe.py:112 (under module plumbing), its kernel on [kb, ke]."""
    tr.x("python_function", "examples/moe.py(112): forward", PID, TID, call - 30_000, call + 20_000)
    tr.x("python_function", "torch/nn/modules/module.py(1736): _call_impl", PID, TID, call - 25_000, call + 15_000)
    tr.x("cpu_op", "aten::mm", PID, TID, call - 10_000, call + 10_000, **{"External id": ext})
    tr.launch(call, kb, ke, "nvjet_tst_128x256_64x4_2x1_v_bz_coopA_NNT", ext)


def plant_host_range(tr: Trace, b: int, e: int, name: str = "planted_host_delay"):
    tr.x("user_annotation", name, PID, TID, b, e)
    tr.x("python_function", "examples/moe.py(40): step", PID, TID, b - 1_000, e + 1_000)
