from enum import StrEnum


class Ids(StrEnum):
    TABLE = "runs-table"      # the grid (dash-ag-grid, infinite row model)
    COUNT = "runs-count"
    MESSAGE = "runs-message"  # a rows request the server refused, in words
