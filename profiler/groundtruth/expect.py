"""Ground truth of a recording: the `expect` block a planting command writes into a manifest.

A run recorded with a planted cause (a hot rank, a host delay, a rank that never sends, a knob
changed between two sides of a comparison) carries what was planted, as structured fields, so
that a test can check that every analysis names it, and that a run with nothing planted raises
no alarm. The analyses answer in the same vocabulary (`Cause`), so the check compares fields,
never sentences.

    manifest["expect"] = {
        "schema": 1,
        "cause": "rank_imbalance",          # what the single-run pages should name ("none": no alarm)
        "rank": 0, "peer": null,            # the rank the cause is about, and the peer it involves
        "kernel": "dispatch", "phase": "recv_copy",
        "late_entry": null,                 # "host" | "gpu": the cause is `rank` entering ops late, from that side
        "op_before_entry": null,            # {"scope", "rank", "kernel", "side", "op"}: the op the PyTorch-trace
                                            #   blame names before that entry (issue 30; absent when null)
        "effect": {"metric": "rows_received_ratio", "value": 2.3, "unit": "x"},
        "comparison": {                     # only on runs that are one side of an A/A or A/B pair
            "group": "ab-num-sms", "side": "B", "replicate": 1,
            "outcome": "knob_change", "knob": "num_sms", "value": 64,
            "kernel": "dispatch", "phase": null, "direction": "faster"
        },
        "planted_by": "python -m profiler.workflows.catalogue ...", "note": "free text for people"
    }

This module is the data model only (stdlib, no pandas): parse, validate, serialise.
"""
from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

from ..errors import EpscopeError

SCHEMA = 1


class Cause(str, enum.Enum):
    """What made a run slow (or nothing). Analyses' verdicts name one of these."""

    NONE = "none"                            # nothing planted: no page may raise an alarm
    RANK_IMBALANCE = "rank_imbalance"        # one rank carries more work; `rank` = the straggler, the others wait on it
    TIMEOUT = "timeout"                      # `peer` never sent: `rank` waited in `phase` until the bound expired
    STARVED_WARPS = "starved_warps"          # warps/blocks with nothing to do (too few tokens, a per-block split)
    HOST_BOUND = "host_bound"                # host time on the critical path; `rank` = the late host (None: all ranks)
    BARRIER_STRAGGLER = "barrier_straggler"  # `rank` arrives last at barrier `phase`; the others wait for it
    USELESS_ARRIVALS = "useless_arrivals"    # warps with no work arrive at (and wait in) barriers
    SAME_CODE = "same_code"                  # comparison outcome: A and B are the same code and config
    KNOB_CHANGE = "knob_change"              # comparison outcome: a knob changed; `phase` moved in `direction`


COMPARISON_OUTCOMES = (Cause.SAME_CODE, Cause.KNOB_CHANGE)


# Why a rank entered an op late (profiler.analysis.timemodel's late_cause): its host had not launched
# the kernel yet, or its GPU was busy with earlier work. The single-run pages name the side
# (Verdict.late_entry); a late entry is host_bound on the host side and rank_imbalance on the GPU
# side (profiler.analysis.late_entry.SIDE_CAUSE), so a planted late entry is one of these pairs,
# or cause none when it was measured under the alarm share (then a page may name it, nothing else).
LATE_ENTRY_SIDES = ("host", "gpu")
LATE_ENTRY_CAUSES = {"host": Cause.HOST_BOUND, "gpu": Cause.RANK_IMBALANCE}


class Direction(str, enum.Enum):
    """B relative to A."""

    SLOWER = "slower"
    FASTER = "faster"


class ExpectError(EpscopeError, ValueError):
    """An expect block that does not follow this schema; the message names the field."""


@dataclass(frozen=True)
class Effect:
    """The size of what was planted, in the unit it was planted in (e.g. 20 ms of host delay)."""

    metric: str
    value: float
    unit: str

    def __post_init__(self):
        _need_str("effect.metric", self.metric)
        _need_str("effect.unit", self.unit)
        if isinstance(self.value, bool) or not isinstance(self.value, (int, float)):
            raise ExpectError(f"effect.value must be a number, got {self.value!r}")


@dataclass(frozen=True)
class ComparisonExpect:
    """One run's place in an A/A or A/B comparison (the run is the unit of replication)."""

    group: str                          # runs of one comparison share it
    side: str                           # "A" or "B"
    replicate: int                      # 0, 1, ...: runs of the two sides were recorded interleaved
    outcome: Cause                      # SAME_CODE or KNOB_CHANGE
    knob: str | None = None             # the changed setting (None for A/A)
    value: Any = None                   # this side's value of the knob
    kernel: str | None = None           # what should move, B against A
    phase: str | None = None
    direction: Direction | None = None

    def __post_init__(self):
        _need_str("comparison.group", self.group)
        if self.side not in ("A", "B"):
            raise ExpectError(f"comparison.side must be 'A' or 'B', got {self.side!r}")
        _need_int("comparison.replicate", self.replicate, minimum=0)
        if self.outcome not in COMPARISON_OUTCOMES:
            raise ExpectError(f"comparison.outcome must be one of {[c.value for c in COMPARISON_OUTCOMES]}, "
                              f"got {self.outcome!r}")
        if self.outcome is Cause.KNOB_CHANGE:
            _need_str("comparison.knob", self.knob)
            if self.direction is None:
                raise ExpectError("comparison.direction is required when the outcome is knob_change")
        elif self.direction is not None:
            raise ExpectError("comparison.direction must be null when the outcome is same_code")


@dataclass(frozen=True)
class OpBeforeEntry:
    """The op a recording planted before an op's entry (issue 30, profiler/torchtrace/blame.py):
    in `scope` ('lead_in': the time before `kernel` started on `rank`; 'late_entry': the time
    `rank` entered `kernel` late), the blame names `op` (an aten op or record_function range) on
    `side` ('gpu': a kernel it launched ran then; 'host': the launching thread was inside it)."""

    scope: str
    rank: int
    kernel: str
    side: str
    op: str

    def __post_init__(self):
        if self.scope not in ("lead_in", "late_entry"):
            raise ExpectError(f"op_before_entry.scope must be 'lead_in' or 'late_entry', got {self.scope!r}")
        if self.side not in LATE_ENTRY_SIDES:
            raise ExpectError(f"op_before_entry.side must be one of {LATE_ENTRY_SIDES}, got {self.side!r}")
        _need_int("op_before_entry.rank", self.rank, minimum=0)
        _need_str("op_before_entry.kernel", self.kernel)
        _need_str("op_before_entry.op", self.op)


@dataclass(frozen=True)
class Expect:
    cause: Cause
    rank: int | None = None
    peer: int | None = None
    kernel: str | None = None
    phase: str | None = None
    effect: Effect | None = None
    comparison: ComparisonExpect | None = None
    planted_by: str = ""
    note: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)  # planting details a person may want (seeds, knobs)
    late_entry: str | None = None       # LATE_ENTRY_SIDES: `rank` was planted to enter ops late, from this side
    op_before_entry: OpBeforeEntry | None = None   # the op the PyTorch-trace blame must name (issue 30)

    def __post_init__(self):
        if self.cause in COMPARISON_OUTCOMES:
            raise ExpectError(f"cause {self.cause.value!r} is a comparison outcome: put it in comparison.outcome")
        for name in ("rank", "peer"):
            v = getattr(self, name)
            if v is not None:
                _need_int(name, v, minimum=0)
        for name in ("kernel", "phase"):
            v = getattr(self, name)
            if v is not None:
                _need_str(name, v)
        needs_rank = (Cause.RANK_IMBALANCE, Cause.TIMEOUT, Cause.BARRIER_STRAGGLER)
        if self.cause in needs_rank and self.rank is None:
            raise ExpectError(f"cause {self.cause.value!r} needs a rank")
        if self.cause is Cause.TIMEOUT and self.peer is None:
            raise ExpectError("cause 'timeout' needs the peer that never sent")
        if self.late_entry is not None:
            if self.late_entry not in LATE_ENTRY_SIDES:
                raise ExpectError(f"late_entry must be one of {LATE_ENTRY_SIDES} or null, got {self.late_entry!r}")
            if self.rank is None:
                raise ExpectError("late_entry needs the rank that entered late")
            if self.cause not in (Cause.NONE, LATE_ENTRY_CAUSES[self.late_entry]):
                raise ExpectError(f"late_entry {self.late_entry!r} goes with cause "
                                  f"{LATE_ENTRY_CAUSES[self.late_entry].value!r} (or 'none' when it is "
                                  f"under the alarm share), got {self.cause.value!r}")

    @property
    def alarm(self) -> bool:
        """Whether the single-run pages should raise an alarm for this run."""
        return self.cause is not Cause.NONE

    def to_json(self) -> dict:
        d = asdict(self)
        d["cause"] = self.cause.value
        if self.comparison is not None:
            c = d["comparison"]
            c["outcome"] = self.comparison.outcome.value
            c["direction"] = self.comparison.direction.value if self.comparison.direction else None
        d["extra"] = dict(self.extra)
        if d["late_entry"] is None:
            del d["late_entry"]       # blocks without one stay readable by versions that predate the field
        if d["op_before_entry"] is None:
            del d["op_before_entry"]  # likewise
        return {"schema": SCHEMA, **d}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Expect":
        if not isinstance(d, Mapping):
            raise ExpectError(f"expect must be an object, got {type(d).__name__}")
        if d.get("schema") != SCHEMA:
            raise ExpectError(f"expect.schema must be {SCHEMA}, got {d.get('schema')!r}")
        known = {"schema", "cause", "rank", "peer", "kernel", "phase", "effect", "comparison",
                 "planted_by", "note", "extra", "late_entry", "op_before_entry"}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ExpectError(f"expect has unknown fields {unknown}")
        eff = d.get("effect")
        cmp_ = d.get("comparison")
        return cls(
            cause=_enum(Cause, "cause", d.get("cause")),
            rank=d.get("rank"), peer=d.get("peer"), kernel=d.get("kernel"), phase=d.get("phase"),
            effect=None if eff is None else Effect(**_fields(eff, "effect", ("metric", "value", "unit"))),
            comparison=None if cmp_ is None else _comparison(cmp_),
            planted_by=_str_or_empty("planted_by", d.get("planted_by", "")),
            note=_str_or_empty("note", d.get("note", "")),
            extra=dict(d.get("extra") or {}),
            late_entry=d.get("late_entry"),
            op_before_entry=None if d.get("op_before_entry") is None else OpBeforeEntry(
                **_fields(d["op_before_entry"], "op_before_entry", ("scope", "rank", "kernel", "side", "op"))),
        )


def from_manifest(manifest: Mapping[str, Any]) -> Expect | None:
    """The run's expect block, or None for a run recorded without one."""
    block = manifest.get("expect") if isinstance(manifest, Mapping) else None
    return None if block is None else Expect.from_json(block)


# -- helpers ------------------------------------------------------------------------------------
def _comparison(d) -> ComparisonExpect:
    f = _fields(d, "comparison", ("group", "side", "replicate", "outcome", "knob", "value", "kernel",
                                   "phase", "direction"))
    f["outcome"] = _enum(Cause, "comparison.outcome", f.get("outcome"))
    dirn = f.get("direction")
    f["direction"] = None if dirn is None else _enum(Direction, "comparison.direction", dirn)
    return ComparisonExpect(**f)


def _fields(d, where: str, allowed: tuple[str, ...]) -> dict:
    if not isinstance(d, Mapping):
        raise ExpectError(f"{where} must be an object, got {type(d).__name__}")
    unknown = sorted(set(d) - set(allowed))
    if unknown:
        raise ExpectError(f"{where} has unknown fields {unknown}")
    return dict(d)


def _enum(kind, where: str, value):
    try:
        return kind(value)
    except ValueError:
        raise ExpectError(f"{where} must be one of {[m.value for m in kind]}, got {value!r}") from None


def _need_str(where: str, v) -> None:
    if not isinstance(v, str) or not v:
        raise ExpectError(f"{where} must be a non-empty string, got {v!r}")


def _need_int(where: str, v, *, minimum: int) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise ExpectError(f"{where} must be an integer >= {minimum}, got {v!r}")


def _str_or_empty(where: str, v) -> str:
    if not isinstance(v, str):
        raise ExpectError(f"{where} must be a string, got {v!r}")
    return v
