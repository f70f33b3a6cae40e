"""The bulk of a Kineto trace's `traceEvents` array, read in blocks of 512 KB and decoded by msgspec.

Each block is cut after its last event: the last `}` followed by `,` and `{` (how Kineto and
json.dumps separate events). A cut is trusted only when the text from the run's first event to the
cut decodes as a JSON array: a cut inside a string leaves the string open and a cut after a nested
object leaves an object open, and a strict parser refuses both, so a run that decodes ends exactly
after a complete event. msgspec decodes the run into typed structs holding only the kept fields
(the rest is skipped in C), which is what makes the reader fast; where msgspec refuses a run (a
field of another type, a lone surrogate, non-ASCII text that yajl and msgspec judge differently),
ijson (the reference parser) decodes that run instead. After a few refused cuts, or at the
array's end, what is left goes back to the caller (read by ijson as before): this module only ever
speeds up a prefix of the array it has proved complete.

msgspec is optional: without it (the GPU machines' environment) `available()` is False and the
whole array is read by ijson.
"""
from __future__ import annotations

import gzip
import io
import re
from dataclasses import dataclass

try:
    import msgspec
except ImportError:            # the GPU machines: read by ijson alone
    msgspec = None

# bytes read at a time: ~2.3 k events of the benchmark trace, whose structs (~0.7 MB) stay in cache
# between msgspec's decode and the column passes; 4 MB runs (~18 k events, ~5 MB of structs) read
# 1 M events in 1.3-1.46 s CPU, 0.5-1 MB in 1.08-1.23 s, 128 KB in 1.39 (per-run overheads):
# benchmarks/NOTES.md, issue 30 (branch i30s). The carry is < 1 event.
BLOCK = 512 << 10
_CUTS = re.compile(rb"\}\s*,\s*\{")
_TRIES = 4                    # cuts tried per block before giving the rest to ijson (adversarial strings)
_WINDOW = 1 << 14             # the last cut is searched for in the block's last 16 KB first (~70 events here)


def available() -> bool:
    return msgspec is not None


if msgspec is not None:
    class Args(msgspec.Struct, frozen=True, gc=False):
        """The kept members of an event's `args` (names as Kineto writes them)."""
        correlation: int = -1
        external_id: int = msgspec.field(default=-1, name="External id")
        stream: int = -1
        stack: str = msgspec.field(default="", name="Call stack")

    NO_ARGS = Args()

    class Event(msgspec.Struct, gc=False):
        """The kept members of one trace event; `ts` UNSET where the event has none (skipped then).
        pid / tid may be strings (Kineto's "Spans" rows); any other type makes msgspec refuse the
        run, and ijson reads it."""
        ph: str = ""
        cat: str = ""
        name: str = ""
        pid: int | str = -1
        tid: int | str = -1
        ts: float | msgspec.UnsetType = msgspec.UNSET
        dur: float = 0.0
        args: Args | None = NO_ARGS     # None for `"args": null` (Kineto never writes it)

    UNSET = msgspec.UNSET
    _DECODER = msgspec.json.Decoder(list[Event])


@dataclass(frozen=True)
class Run:
    """Complete events of the array, in order: `events` (msgspec structs) or, where msgspec refused
    them, `items` (ijson's dicts, what the reference reader sees). The run's JSON is `src[1:end]`
    (`src` a block's buffer, never written again once the run is made): `text` copies it out, only
    for a run whose structs the caller refuses."""
    src: bytearray
    end: int
    events: list | None
    items: list | None

    @property
    def text(self) -> bytes:
        return bytes(memoryview(self.src)[1:self.end])


def _decode(buf: bytearray, cut: int, ascii: bool) -> Run | None:
    """The run `buf[1:cut]` (`buf[0]` is `[`) as typed structs, else as ijson dicts; None when it is
    not a complete array of events (a cut inside a string or a nested object, or broken JSON).
    msgspec reads the buffer in place: the separator byte at `cut` is lent to the array's `]` while
    it decodes (no copy of the run; `ascii`: the whole buffer is ASCII)."""
    import ijson

    saved, buf[cut] = buf[cut], 0x5D
    doc = memoryview(buf)[:cut + 1]
    try:
        if ascii or bytes(doc).isascii():        # yajl and msgspec disagree only about some non-ASCII bytes
            try:
                return Run(buf, cut, _DECODER.decode(doc), None)
            except (msgspec.DecodeError, RecursionError):
                pass
        try:
            return Run(buf, cut, None, list(ijson.items(io.BytesIO(doc), "item", use_float=True)))
        except (ijson.JSONError, RecursionError):
            return None
    finally:
        doc.release()
        buf[cut] = saved


def _cuts(buf: bytes):
    """Candidate cuts (the index just after an event's `}`), last first: the block's last 16 KB,
    then the whole block."""
    start = max(len(buf) - _WINDOW, 0)
    found = [m.start() + 1 for m in _CUTS.finditer(buf, start)]
    if not found and start:
        found = [m.start() + 1 for m in _CUTS.finditer(buf)]
    return found[::-1]


class EventRuns:
    """Iterate the array's runs of complete events from the stream `f`, which is positioned just
    after the array's `[`. When iteration ends, `rest` holds the unread text (from an event's `{`,
    or the array's end) to be read on from `f` by ijson."""

    def __init__(self, f, block: int = BLOCK):
        self.f, self.block, self.rest = f, block, b""

    def _fill(self, carry) -> tuple[bytearray, int]:
        """A new buffer: `[`, the `carry` (from an event's `{`), then up to a block read into it in
        place (no bytes object a block); the number of bytes read. A gzip stream is read with read():
        its readinto decompresses into a bytes and copies it in Python (_compression.DecompressReader),
        0.04-0.05 s a million events slower here, where readinto saves ~0.02 s on a plain file."""
        if isinstance(self.f, gzip.GzipFile):
            data = self.f.read(self.block)
            buf = bytearray(b"[")
            buf += carry
            buf += data
            return buf, len(data)
        buf = bytearray(1 + len(carry) + self.block)
        buf[0] = 0x5B
        buf[1:1 + len(carry)] = carry
        with memoryview(buf) as mv:
            got = self.f.readinto(mv[1 + len(carry):]) or 0
        del buf[1 + len(carry) + got:]
        return buf, got

    def __iter__(self):
        buf = bytearray(b"[")          # `[` + the unread text: the array msgspec decodes in place
        while True:
            buf, got = self._fill(memoryview(buf)[1:])
            if not got:
                break
            run, gave_up, ascii = None, False, buf.isascii()
            for i, cut in enumerate(_cuts(buf)):
                if i == _TRIES:
                    gave_up = True
                    break
                run = _decode(buf, cut, ascii)
                if run is not None:
                    buf = bytearray(b"[") + buf[_CUTS.match(buf, cut - 1).end() - 1:]   # from the next event's `{`
                    break
            if run is not None:
                yield run
            elif gave_up:
                break
        self.rest = bytes(buf[1:])
