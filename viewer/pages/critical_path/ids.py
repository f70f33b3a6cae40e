from enum import StrEnum


class Ids(StrEnum):
    RUN = "cp-run"
    SUMMARY = "cp-summary"
    PHASE = "cp-whatif-phase"
    RANK = "cp-whatif-rank"
    PERCENT = "cp-whatif-percent"
    APPLY = "cp-whatif-apply"
    RESULT = "cp-whatif-result"
    SEGMENTS = "cp-segments"
    WHATIF_BOX = "cp-whatif-box"        # a what-if still computing: its progress, replaced by the result
    WHATIF_ASKED = "cp-whatif-asked"
    WHATIF_TICK = "cp-whatif-tick"
