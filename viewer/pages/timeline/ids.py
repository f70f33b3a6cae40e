from enum import StrEnum


class Ids(StrEnum):
    RUN = "tl-run"
    LEVEL = "tl-level"
    RANKS = "tl-ranks"
    BLOCK_LO = "tl-block-lo"
    BLOCK_HI = "tl-block-hi"
    CRITICAL = "tl-critical"
    GRAPH = "tl-graph"
    INFO = "tl-info"
    RESET = "tl-reset"
    CP_READY = "tl-cp-ready"    # whether the critical path is computed (it is drawn when it is)
    CP_TICK = "tl-cp-tick"
    CP_STATE = "tl-cp-state"    # what the critical path's job is doing, while it runs
    WINDOW = "tl-window"        # the drawn time window [t0, t1] in µs (kept when the rows change)
    TORCH_GRAPH = "tl-torch-graph"   # the step's PyTorch ops in the window (runs with merged traces)
    TORCH_NOTES = "tl-torch-notes"   # the sentences naming the op before each late entry
