from enum import StrEnum


class Ids(StrEnum):
    A = "cmp-a"
    B = "cmp-b"
    RUN = "cmp-run"
    GO = "cmp-go"
    RESULT = "cmp-result"
    VERDICT = "cmp-verdict"
    TICK = "cmp-tick"          # polls while the runs' samples are computed in the background
