"""A progress bar on stderr for calibration: redrawn in place on a terminal, a line per tenth otherwise."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

WIDTH = 30


def progress_bar(stream: TextIO | None = None) -> Callable[[str, int], Callable[[], None]]:
    """progress(label, total) -> step(): call step() after each item. `stream`: sys.stderr as it is when called
    (not when this module was imported: a redirected stderr is the one written to)."""
    stream = sys.stderr if stream is None else stream
    tty = stream.isatty()

    def start(label: str, total: int) -> Callable[[], None]:
        done, t0 = 0, time.monotonic()

        def step() -> None:
            nonlocal done
            done += 1
            if not tty and done != total and done * 10 // total == (done - 1) * 10 // total:
                return
            filled = WIDTH * done // max(total, 1)
            line = f"{label} [{'#' * filled}{'.' * (WIDTH - filled)}] {done}/{total} {time.monotonic() - t0:.1f}s"
            stream.write(("\r" + line + ("\n" if done == total else "")) if tty else line + "\n")
            stream.flush()
        return step
    return start
