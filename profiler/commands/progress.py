"""Progress of long commands on stderr (tqdm), silent when stderr is not a terminal.

`epscope report`, `export` and `view`'s first load of a run can take seconds on a large run; a
user at a terminal sees what is happening and for how long, while pipes, logs and tests get
nothing. Work that cannot count its own progress is shown as a label with the elapsed time,
redrawn by a timer thread; a `watch` callable adds a number that grows (bytes written, ...).
"""
from __future__ import annotations

import sys
import threading
from typing import Callable

REFRESH_S = 0.2


def enabled(stream=None) -> bool:
    stream = stream if stream is not None else sys.stderr
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


class Activity:
    """with Activity("epscope report") as a: a.step("loading events"); ...; a.step("phases")

    watch: optional callable returning a count shown beside the label as "(<count><unit> <what>)"
    (unit "B" scales to kB/MB)."""

    def __init__(self, prefix: str, *, watch: Callable[[], float] | None = None, unit: str = "", what: str = "",
                 stream=None):
        self.prefix = prefix
        self._watch = watch
        self._unit = unit
        self._what = what
        self._stream = stream if stream is not None else sys.stderr
        self._bar = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "Activity":
        if not enabled(self._stream):
            return self
        try:
            from tqdm import tqdm
        except ImportError:    # a bare install without tqdm: no progress, never an error
            return self
        fmt = f"{{desc}} ({{n_fmt}}{{unit}} {self._what}) [{{elapsed}}]" if self._watch else "{desc} [{elapsed}]"
        self._bar = tqdm(desc=self.prefix, total=None, file=self._stream, leave=False, bar_format=fmt,
                         unit=self._unit, unit_scale=self._unit == "B", mininterval=REFRESH_S)
        self._thread = threading.Thread(target=self._tick, name="epscope-progress", daemon=True)
        self._thread.start()
        return self

    def _tick(self) -> None:
        while not self._stop.wait(REFRESH_S):
            bar = self._bar
            if bar is None:
                return
            if self._watch is not None:
                try:
                    bar.n = self._watch()
                except Exception:   # noqa: BLE001 (a watch that fails shows nothing, never breaks the work)
                    pass
            bar.refresh()

    def step(self, label: str) -> None:
        if self._bar is not None:
            self._bar.set_description_str(f"{self.prefix}: {label}", refresh=True)

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._bar is not None:
            self._bar.close()
            self._bar = None
