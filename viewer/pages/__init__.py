"""One package per page; each has ids.py (a StrEnum), layout.py, callbacks.py and a Dash-free
logic.py (style.md rule 10)."""
