"""The run for other tools.

    perfetto.py   the event table as a native Perfetto trace, streamed batch by batch
                  (`epscope export`; write_run keeps one beside small runs)
"""
