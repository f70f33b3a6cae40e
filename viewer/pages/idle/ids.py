from enum import StrEnum


class Ids(StrEnum):
    RUN = "idle-run"
    VERDICT = "idle-verdict"
    KERNEL = "idle-kernel"
    HEATMAP = "idle-heatmap"
    EVIDENCE = "idle-evidence"
