"""Progress of the long indexing stages: a tqdm bar on a terminal, plain lines elsewhere.

``show=True`` draws a tqdm bar on stderr; ``show=None`` (the retriever's default) draws one
when stderr is a terminal and otherwise writes a line every ``interval`` seconds with the
same figures — done, total, rate, ETA — so a job log shows that indexing is alive; work
expected to take :data:`LONG_WORK_S` or more is announced after its first batch with the
time it will take at that rate. The lines go to stderr, or to the ``langchain_rse.progress``
logger (level INFO) when the application has set up logging that shows it (a handler, INFO
enabled), so they need no configuration. ``show=False`` reports nothing.
"""

from __future__ import annotations

import logging
import sys
import time
from types import TracebackType

from tqdm.auto import tqdm

__all__ = ["Progress", "progress_mode"]

logger = logging.getLogger("langchain_rse.progress")  # the documented name, kept

LOG_INTERVAL_S = 10.0
"""Seconds between two progress lines when stderr is not a terminal."""
LONG_WORK_S = 30.0
"""Work expected to take this long or longer is announced with its expected time."""


def progress_mode(show: bool | None) -> str:
    """``"bar"``, ``"log"`` or ``"off"`` for a ``show_progress`` setting."""
    if show is None:
        return "bar" if sys.stderr.isatty() else "log"
    return "bar" if show else "off"


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


def _about(seconds: float) -> str:
    """A rough duration for people: ``about 40 s``, ``about 12 min``, ``about 2 h 5 min``."""
    if seconds < 90:
        return f"about {int(round(seconds))} s"
    minutes = int(round(seconds / 60))
    if minutes < 90:
        return f"about {minutes} min"
    return f"about {minutes // 60} h {minutes % 60} min"


def _emit(text: str) -> None:
    """One progress line: on the logger when logging shows it, else on stderr."""
    if logger.isEnabledFor(logging.INFO) and logger.hasHandlers():
        logger.info("%s", text)
    else:
        print(text, file=sys.stderr, flush=True)


class Progress:
    """One stage's progress, counted in ``unit`` (e.g. chunks) out of ``total``."""

    def __init__(
        self,
        desc: str,
        total: int,
        unit: str = "chunk",
        show: bool | None = None,
        interval: float | None = None,
    ) -> None:
        self.desc, self.total, self.unit = desc, total, unit
        self.interval = LOG_INTERVAL_S if interval is None else interval
        self.mode = progress_mode(show) if total > 0 else "off"
        self.done = 0
        self._started = self._last_log = time.monotonic()
        self._bar = (
            tqdm(total=total, desc=desc, unit=unit, dynamic_ncols=True)
            if self.mode == "bar"
            else None
        )

    def line(self) -> str:
        """The figures as one line: ``embedding: 120/480 chunks, 6.1 chunks/s, ETA 0:59``."""
        elapsed = max(time.monotonic() - self._started, 1e-9)
        rate = self.done / elapsed
        eta = f"ETA {_duration((self.total - self.done) / rate)}" if rate > 0 else "ETA ?"
        return (
            f"{self.desc}: {self.done}/{self.total} {self.unit}s ({self.done / self.total:.0%}),"
            f" {rate:.1f} {self.unit}s/s, elapsed {_duration(elapsed)}, {eta}"
        )

    def update(self, n: int) -> None:
        """Count ``n`` more units done."""
        self.done += n
        if self._bar is not None:
            self._bar.update(n)
        elif self.mode == "log":
            now = time.monotonic()
            if self.done == n and n < self.total:  # the first batch gives the rate
                expected = self.total * (now - self._started) / n
                if expected >= LONG_WORK_S:
                    rate = f"{n / (now - self._started):.1f} {self.unit}s/s"
                    _emit(f"{self.desc}: {self.total:,} {self.unit}s, {_about(expected)} at the "
                          f"measured rate of {rate}")  # fmt: skip
            if now - self._last_log >= self.interval:
                self._last_log = now
                _emit(self.line())

    def close(self, finished: bool = True) -> None:
        """End the stage: close the bar, or log the final figures (``(done)`` only when
        the stage ``finished``; a stage cut short by an error or Ctrl-C logs nothing more)."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        elif self.mode == "log" and self.done and finished:
            _emit(f"{self.line()} (done)")
        self.mode = "off"

    def __enter__(self) -> Progress:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close(finished=exc_type is None)
