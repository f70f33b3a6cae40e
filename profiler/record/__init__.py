"""The GPU-side recording path: JIT build helper, recording session, clock pairing, self-tests.

Only torch, numpy, pandas and pyarrow are needed here (no dash / plotly / perfetto): this package
runs on the GPU machine. torch is imported lazily, so `profiler.record.build` and the session's
host-side helpers also import on a CPU-only machine.
"""
from .build import load_extension, load_record_extension, nvcc_compile_check
from .session import Session, SessionError, write_from_raw

__all__ = ["Session", "SessionError", "load_extension", "load_record_extension", "nvcc_compile_check",
           "write_from_raw"]
