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
