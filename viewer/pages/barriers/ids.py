from enum import StrEnum


class Ids(StrEnum):
    RUN = "bar-run"
    VERDICT = "bar-verdict"
    SUMMARY = "bar-summary"
    OCCURRENCES = "bar-occurrences"
