"""Which runs may go on the event loop thread: the direct policy's cheap runs, measured per instance."""

from __future__ import annotations

# A run measured under this goes on the event loop thread next time: handing it to the pool and back (a thread
# wake-up, two GIL hand-offs, the loop's self-pipe) costs more than that. Real models never get near it.
INLINE_MAX_NS = 200_000


class InlinePolicy:
    """Which runs of one instance may go on the event loop thread: inputs no bigger than one already seen running
    under the limit. A bigger request goes to the pool first, where its time is measured. Two runs in a row over the
    limit send their size (and every bigger one) back to the pool until a run of that size is measured cheap again;
    one alone is taken for the machine's noise (a descheduled thread), not the model's cost."""

    STRIKES = 2

    def __init__(self, limit_ns: int = INLINE_MAX_NS):
        self.limit_ns = limit_ns
        self.cheap_bytes = -1  # the largest input size measured cheap; -1: nothing runs inline yet
        self._strikes = 0

    def allows(self, nbytes: int) -> bool:
        return nbytes <= self.cheap_bytes

    def observe(self, nbytes: int, ns: int) -> None:
        if ns <= self.limit_ns:
            self._strikes = 0
            if nbytes > self.cheap_bytes:
                self.cheap_bytes = nbytes
        elif nbytes <= self.cheap_bytes:
            self._strikes += 1
            if self._strikes >= self.STRIKES:
                self.cheap_bytes, self._strikes = nbytes - 1, 0
