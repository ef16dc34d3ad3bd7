"""The requests waiting for an instance: arrival-ordered entries, the queue-size limit, and response ordering."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from server.backend import RequestContext
from server.errors import InvalidArgumentError, QueueFullError
from server.scheduling.policy import Pending


@dataclass
class Entry:
    """One submitted request: what the policy sees, the tensors, and the future its caller awaits."""

    pending: Pending
    inputs: dict[str, np.ndarray]
    future: asyncio.Future[Any]
    context: RequestContext | None = None  # for instances that take requests one by one (server/backend.py)

    @property
    def req_id(self) -> int:
        return self.pending.req_id


class RequestQueue:
    """Queued entries in arrival order (a dict keeps insertion order and removes by id in O(1))."""

    def __init__(self, max_size: int = 0):
        self.max_size = max_size  # 0 = unbounded
        self._entries: dict[int, Entry] = {}
        self.rows = 0  # sum of the queued requests' rows (the adaptive wait samples it at every decision)

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, entry: Entry) -> None:
        """Queue `entry`, or raise QueueFullError at once when max_size requests are already waiting."""
        if self.max_size and len(self._entries) >= self.max_size:
            raise QueueFullError()
        self._entries[entry.req_id] = entry
        self.rows += entry.pending.rows

    def remove(self, req_id: int) -> Entry | None:
        """Take one entry out (cancelled or expired); None when it already left the queue."""
        entry = self._entries.pop(req_id, None)
        if entry is not None:
            self.rows -= entry.pending.rows
        return entry

    def take(self, req_ids: Iterable[int]) -> list[Entry]:
        entries = [self._entries.pop(i) for i in req_ids]
        self.rows -= sum(e.pending.rows for e in entries)
        return entries

    def take_all(self) -> list[Entry]:
        entries = list(self._entries.values())
        self._entries.clear()
        self.rows = 0
        return entries

    def drop_cancelled(self) -> list[Entry]:
        """Remove entries whose caller went away; their futures are cancelled before the caller's own cleanup runs,
        so the loop purges them first to never dispatch one."""
        gone = [e for e in self._entries.values() if e.future.done()]
        for e in gone:
            del self._entries[e.req_id]
            self.rows -= e.pending.rows
        return gone

    def pending(self) -> list[Pending]:
        return [e.pending for e in self._entries.values()]


def rows_of(inputs: dict[str, np.ndarray], batched: bool) -> int:
    """A request's rows: the common dim 0 of its inputs, or 1 for a model that does not batch."""
    if not inputs:
        raise InvalidArgumentError("request has no inputs")
    if not batched:
        return 1
    dims = {name: (int(arr.shape[0]) if arr.ndim else None) for name, arr in inputs.items()}
    first = next(iter(dims.values()))
    if first is None or any(d != first for d in dims.values()):
        raise InvalidArgumentError(f"inputs must share the batch dimension (dim 0), got {dims}")
    return first


def shape_key(inputs: dict[str, np.ndarray], batched: bool) -> Hashable:
    """What must be equal for two requests to merge: names, dtypes and shapes without the batch dim."""
    skip = 1 if batched else 0
    return tuple(sorted((name, arr.dtype.str, arr.shape[skip:]) for name, arr in inputs.items()))


class ResponseOrder:
    """Delivers responses in arrival order when preserve_ordering is on, at once otherwise.

    A request that finishes early waits for every earlier one to be delivered or dropped (cancelled/expired)."""

    def __init__(self, preserve: bool):
        self.preserve = preserve
        self._slots: OrderedDict[int, Callable[[], None] | None] = OrderedDict()

    def register(self, req_id: int) -> None:
        if self.preserve:
            self._slots[req_id] = None

    def deliver(self, req_id: int, send: Callable[[], None]) -> None:
        if not self.preserve:
            send()
            return
        if req_id in self._slots:
            self._slots[req_id] = send
        while self._slots:
            head, ready = next(iter(self._slots.items()))
            if ready is None:
                return
            del self._slots[head]
            ready()

    def drop(self, req_id: int) -> None:
        """Forget a request that will get no response; later ones may now be released."""
        self.deliver(req_id, lambda: None)
