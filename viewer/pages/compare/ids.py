from enum import StrEnum


class Ids(StrEnum):
    A = "cmp-a"
    B = "cmp-b"
    RUN = "cmp-run"
    GO = "cmp-go"
    RESULT = "cmp-result"
    VERDICT = "cmp-verdict"
    TICK = "cmp-tick"          # polls while the runs' samples are computed in the background
    BEFORE_ENTRY = "cmp-before-entry"   # per side, the op the late rank ran before entry (PyTorch traces)
    BEFORE_DIFFER = "cmp-before-differ"
