"""Typed errors and warnings of the profiler core.

Errors are for what cannot be read (a corrupt header, a missing run); they name the byte offset
or the path. Warnings are for what can be read with losses (dropped records, an unmatched
BEGIN): the decoder returns them, each with a count, and never drops anything silently.
"""
from __future__ import annotations


class EpscopeError(Exception):
    """Base of every error epscope raises on purpose."""


# -- decoding ---------------------------------------------------------------------------------
class DecodeError(EpscopeError):
    """A profile buffer cannot be decoded; `offset` is the byte offset of the problem."""

    def __init__(self, message: str, offset: int = 0):
        super().__init__(f"{message} (byte offset {offset})")
        self.offset = int(offset)


class BadMagic(DecodeError):
    pass


class UnsupportedVersion(DecodeError):
    pass


class TruncatedBuffer(DecodeError):
    pass


class RegistryMismatch(DecodeError):
    """The buffer's registry_hash is not the hash of the registry given to the decoder."""


class CountedWarning(UserWarning):
    """A warning with a count (how many records, events, phases) and a detail; `to_json` is how
    runs and analyses store it."""

    def __init__(self, count: int, detail: str = ""):
        super().__init__(f"{type(self).__name__}: {count} ({detail})" if detail else f"{type(self).__name__}: {count}")
        self.count = int(count)
        self.detail = detail

    def to_json(self) -> dict:
        return {"type": type(self).__name__, "count": self.count, "detail": self.detail}

    def __reduce__(self):
        # pickled by its fields (a distributed analysis sends a chunk's warnings back from a
        # worker); the default pickles the message, which __init__ cannot take back
        return type(self), (self.count, self.detail)


class DecodeWarning(CountedWarning):
    """Something was decoded with losses; `count` says how many records/events/regions."""


class DroppedRecords(DecodeWarning):
    """Regions overflowed: `count` records were attempted past capacity and not stored."""


class UnmatchedBegin(DecodeWarning):
    """BEGINs without their END: kept as open spans ending at the warp's last timestamp."""


class UnmatchedEnd(DecodeWarning):
    """ENDs without a BEGIN: dropped, `count` of them."""


class UnfinishedRegion(DecodeWarning):
    """Regions in state STARTED (kernel aborted): decoded up to their first empty record."""


class UnknownPhase(DecodeWarning):
    """Phase or barrier ids the registry does not declare: named phase_<id> / barrier_<id>."""


class CorruptRecords(DecodeWarning):
    """Records inside the written range with an invalid kind (0 or > 5): skipped."""


class ClockFallback(DecodeWarning):
    """High-resolution regions without a usable clock pair (missing, reversed or implying an SM
    clock outside 0.1-10 GHz): converted at the nominal SM clock."""


class BadTimestamps(DecodeWarning):
    """Records whose time lies outside their launch's window (an hour around its median warp
    start, below 2^62 ns), or cannot be converted from clock64: skipped, `count` of them."""


class BadRegionClock(DecodeWarning):
    """Regions whose warp start or finish clock lies outside the launch's window: those clocks are
    ignored (launch bounds, high-resolution conversion); `count` regions."""


class ReversedSpans(DecodeWarning):
    """Spans whose END time precedes their BEGIN's (corrupt timestamps): end set to begin."""


class ClockChange(DecodeWarning):
    """Regions whose SM clock changed while they recorded (format 2): the cycles-per-ns rate
    between two of their anchors differs from the next pair's, or their rate from start to finish
    differs from the launch's median, by more than the anchors' quantisation allows. Their cycles
    are converted piecewise between anchors (never at one rate), but a time between two anchors
    can be off by up to the detail's bound; `count` regions."""


class BadAnchors(DecodeWarning):
    """ANCHOR records (format 2) that cannot anchor: outside the launch's window, not after the
    previous anchor in both clocks, or implying an SM clock outside 0.1-10 GHz (format 3 also: an
    ANCHOR without its ANCHOR_NS slot); ignored, `count`."""


class PayloadSaturated(DecodeWarning):
    """Format 3: records whose 16-bit payload is 0xFFFF without a PAYLOAD slot. The recorder saturates
    a payload wider than 16 bits there (the registry declares the phase's `payload_bits = 16`), so the
    value may have been larger; `count` records. Declare `payload_bits = 32` to keep all 32 bits."""


class AmbiguousClock(DecodeWarning):
    """Format 3: regions where a full clock (an anchor, or the finish) lies 2^32 cycles or more after
    the last record before it. A record keeps 32 clock bits and the decoder completes them from the
    record before it, so one of those gaps may have hidden whole wraps of 2^32 cycles (2.17 s at
    1.98 GHz): their times may be early by such multiples. `count` regions (a kernel that waits that
    long between records calls rec.anchor() after the wait)."""


# -- analyses ---------------------------------------------------------------------------------
class AnalysisWarning(CountedWarning):
    """An analysis ran with less than it needs; `count` says how many phases/rows, `detail` which.
    Analyses return these with their results (never only print them)."""


class UndeclaredPhases(AnalysisWarning):
    """Phases or barriers of the table that no registry given to the analysis declares: their
    spans count as work (never as waits or idle) and their barriers as per-launch (scope grid)."""


class InvalidRegistry(AnalysisWarning):
    """A registry embedded in the run does not validate: its phases have no semantics."""


class CalibrationError(EpscopeError):
    """A calibration file (profiler.decode.calibration) that cannot be used; the message names the field."""

    def __init__(self, message: str, field: str = ""):
        super().__init__(message)
        self.field = field


class TooWideToAnalyse(EpscopeError, ValueError):
    """A run the schema accepts but an analysis cannot index (its lane key or lanes x time range
    past 62 bits: a timestamp far from the others, ids far apart). A ValueError too, as analyses
    raised before it was typed (callers that catch ValueError still do)."""


class ExportError(EpscopeError):
    """A run cannot be exported as asked (e.g. ids outside the trace's track id scheme)."""


# -- run store --------------------------------------------------------------------------------
class RunError(EpscopeError):
    """A run directory cannot be used; the message names the path."""


class RunNotFound(RunError):
    pass


class CorruptRun(RunError):
    pass


class InvalidManifest(CorruptRun):
    """manifest.json parses but a field has the wrong type or value; `field` is its dotted path."""

    def __init__(self, message: str, field: str = ""):
        super().__init__(message)
        self.field = field


class InvalidEvents(CorruptRun):
    """A run's event or launch table breaks the schema (a column's type, a timestamp, a kind)."""


class InconsistentRun(InvalidEvents):
    """A run's tables are well-formed alone but disagree with each other or with the manifest (an
    event of a launch that does not exist, a launch key twice, a duplicated row, counts that
    differ); the message names the first offence."""


class NotRegularFile(CorruptRun):
    """A file a reader needs is not a regular file (a FIFO, a device, a directory, a socket), or is
    larger than such a file may be; it is not read (a FIFO would block the reader forever)."""


class SealMismatch(CorruptRun):
    """A sealed document (a manifest, stored analyses) differs from the digest it carries; `file`
    names it."""

    def __init__(self, message: str, file: str = ""):
        super().__init__(message)
        self.file = file


class DowngradedRun(CorruptRun):
    """The manifest says an older format than the run's data files were written in (a sealed run
    whose seal and checksums were removed): it is not read as an unverified old run."""


class OutsideRoots(RunError):
    """A run file resolves (through a symlink) to a path outside the roots the reader allows."""


class ChecksumMismatch(CorruptRun):
    """A data file's bytes differ from the checksum its manifest records; `file` names it."""

    def __init__(self, message: str, file: str = ""):
        super().__init__(message)
        self.file = file


class RunChanged(RunError):
    """The run directory was rewritten between two reads of one Run (its files carry another
    write's version id): open it again to see the new version."""


class RunExists(RunError):
    """A write would replace something it must not (an existing file without --force, a run
    without --overwrite, a file inside a run directory)."""


class UnsupportedRunVersion(RunError):
    pass


class EmptyRun(RunError):
    pass
