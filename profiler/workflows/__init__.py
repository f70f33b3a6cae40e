"""epscope's workflows: one module per command, importing the library (ep_core) and the profiler,
never imported by either (tests/test_import_graph.py holds that).

    trace.py       `epscope trace`: record a profiled EP workload (workload.py builds the inputs)
    catalogue.py   `python -m profiler.workflows.catalogue`: the ground-truth catalogue of planted
                   runs (catalogue_plan.py the scenarios, catalogue_record.py the recording,
                   catalogue_expect.py the measured expect blocks)
    ab.py          `epscope ab`: two git refs interleaved (rounds.py drives one ab_worker.py per rank
                   and side; the verdicts are profiler/commands/ab.py)
    tune.py        `epscope tune` (tune_ll.py: `--ll`; tune_sweep.py the screen / re-check both share)
"""
