"""epscope's profiler, one subpackage per stage of the pipeline a record follows:

    record/       what the GPU writes: the device recorder's build, the recording session, clocks
    decode/       how the buffer's bytes become the event table, every clock aligned to rank 0's
    store/        how a run lies on disk (events, launches, manifest) and is verified on reading
    analysis/     what the table means: pure analyses, table in, tables out
    torchtrace/   PyTorch profiler traces joined to a run (the op inside the step)
    export/       the run as a Perfetto trace
    commands/     what a user runs: `epscope` (cli.py), the report, A/B verdicts
    workflows/    the commands that drive GPUs: trace, ab, tune, the ground-truth catalogue

Beside them: registry/ (what phases mean, generated into device and host code: layout.toml,
phases/, generated/ and csrc/generated/ stay here, where codegen writes every package's files),
groundtruth/ (what was planted in a run, and the simulator that plants it), errors.py (the errors
every stage raises). viewer/ draws what the analyses return (docs/design.md has the map).
"""
