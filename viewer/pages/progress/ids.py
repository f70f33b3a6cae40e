from enum import StrEnum


class Ids(StrEnum):
    ROOT = "progress-root"      # holds the progress state; the finished page replaces its children
    TARGET = "progress-target"  # {"path": page, "run": run id}: what the poll builds when ready
    BOX = "progress-box"
    TICK = "progress-tick"
