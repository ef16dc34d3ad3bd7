"""How many rows the recent load keeps in the server at once: the adaptive wait's estimate of who could still join.

A closed-loop client has one request in the server at a time (queued or executing), so the peak of rows in the
server over the last second is the number of rows that can arrive for the next batch: 1 for a lone client, 8 for
eight of them. Sampled each time the batcher decides (after arrivals) and when a batch finishes (before its rows
leave), so a batch that runs longer than the window still leaves a fresh sample for its clients' next requests.
Pure bookkeeping on the times it is given: tested with a fake clock.
"""

from __future__ import annotations

from collections import deque

WINDOW_NS = 1_000_000_000


class PeakWindow:
    """Sliding-window maximum of (time, rows in the server) samples."""

    def __init__(self, window_ns: int = WINDOW_NS):
        self.window_ns = window_ns
        self._samples: deque[tuple[int, int]] = deque()  # times increasing, rows decreasing: the max is first

    def observe(self, now_ns: int, rows: int) -> None:
        while self._samples and self._samples[-1][1] <= rows:
            self._samples.pop()  # an older, smaller sample can never be the max again
        self._samples.append((now_ns, rows))

    def expires_at(self) -> int | None:
        """When the current peak sample leaves the window (the peak may drop then); None when nothing is held."""
        return self._samples[0][0] + self.window_ns if self._samples else None

    def peak(self, now_ns: int) -> int:
        """The most rows seen within the window ending now; 0 when nothing was seen in it."""
        while self._samples and self._samples[0][0] <= now_ns - self.window_ns:
            self._samples.popleft()
        return self._samples[0][1] if self._samples else 0
