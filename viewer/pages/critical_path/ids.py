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
