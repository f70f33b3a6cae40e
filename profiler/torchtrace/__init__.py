"""PyTorch profiler (Kineto) traces joined to a run: the op inside the step.

labels.py   the record_function label ep_core puts around each instrumented launch
kineto.py   streaming reader of Kineto JSON / gzipped JSON traces -> a columnar event table
align.py    the join of labelled launches to the trace's kernels, and the clock offset with its
            stated uncertainty (bounds from each launch's warps lying inside its CUPTI kernel)
store.py    traces attached to a run directory (`epscope merge`, `Session(torch_profiler=True)`),
            checksummed in the manifest; the merged view on the run timeline
blame.py    what a late rank (or a queued launch) was doing before it entered: kernels on its GPU,
            CPU ops on its launching thread, the sentence that names the op

Pure (numpy, pandas, ijson); torch is never imported here.
"""
