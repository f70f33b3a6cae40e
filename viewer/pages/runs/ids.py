from enum import StrEnum


class Ids(StrEnum):
    TABLE = "runs-table"
    COUNT = "runs-count"
