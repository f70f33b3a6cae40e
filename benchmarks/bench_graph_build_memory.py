"""The graph build of one chunk, step by step: tracemalloc's live and peak bytes around each step of
graph._build (table, lanes, intervals, points, owners, segments, the edges, binding).

    PYTHONPATH=. python3 benchmarks/bench_graph_build_memory.py RUN ITERATION

Reads the events of one iteration of RUN (a chunk of `epscope analyze`), closes its unfinished
waits as chunked.chunk_pass does, and builds its graph once under tracemalloc. Made for issue 31
(branch i31g: benchmarks/NOTES.md "Issue 31: the graph build").
"""
import sys, tracemalloc
from pathlib import Path
import numpy as np
from profiler.store.runreader import load_run, EventReader
from profiler.analysis import graph as G, unfinished
from profiler.analysis.semantics import semantics
import profiler.analysis.points as PT, profiler.analysis.edges as E
run = load_run(Path(sys.argv[1]))  # noqa: E402
with EventReader(run) as r:
    ev = r.read(iterations=np.array([int(sys.argv[2])]))
closed = unfinished.close(ev, run.launches)
sem = semantics(run.manifest.get("registry"))
tracemalloc.start()
base = tracemalloc.get_traced_memory()[0]
def wrap(mod, name, alias=None):
    f = getattr(mod, name)
    def w(*a, **k):
        tracemalloc.reset_peak(); b = tracemalloc.get_traced_memory()[0]
        r = f(*a, **k)
        cur, peak = tracemalloc.get_traced_memory()
        print(f"{name:16s} before {(b-base)/1e6:6.0f} peak {(peak-base)/1e6:6.0f} after {(cur-base)/1e6:6.0f} MB")
        return r
    setattr(mod, name, w)
    if alias: setattr(alias, name, w)
for n in ["_table", "_lanes", "intervals", "points", "owners", "segments"]:
    wrap(G, n)
for n in ["wait_edges", "barrier_edges", "gpu_launches", "launch_edges", "host_sync_edges", "binding"]:
    wrap(E, n)
g = G._build(closed, sem)
cur, peak = tracemalloc.get_traced_memory()
print(f"total kept {(cur-base)/1e6:.0f} MB")
