"""What a user runs.

    cli.py        `epscope` (and `python -m profiler`): every subcommand, the GPU ones by module
                  name from profiler/workflows/ so that a CPU-only install starts without torch
    report.py     `epscope report`: a text summary of a run (phases, ranks, what was lost)
    ab.py         the A/B comparison record and its verdicts (`epscope ab` and `tune` fill it)
    progress.py   progress of long commands on stderr, silent when it is not a terminal
"""
