"""Triton's response cache: a server-wide, size-limited cache of model outputs, keyed by a hash of the request (model
name, version, and every input's name, datatype, shape and bytes), used by the models whose config says
`response_cache { enable: true }`. A hit answers without running the model.

Triton's key is a 64-bit hash of the names and bytes; here it is a 256-bit BLAKE2b digest that also covers datatypes
and shapes, so two requests that differ only in shape never share an entry. Entries are the model's outputs (all of
them: the requested subset is picked per request), read-only arrays; the least recently used go first when the
cache is full, and an entry larger than the whole cache is not stored.
"""

from __future__ import annotations

import hashlib
import struct
import threading
from collections import OrderedDict
from collections.abc import Mapping

import numpy as np


def request_key(model: str, version: str, inputs: Mapping[str, np.ndarray]) -> bytes:
    """The cache key of a request's inputs (in the model's shapes), in name order."""
    h = hashlib.blake2b(digest_size=32)
    for part in (model, version):
        _add(h, part.encode())
    for name in sorted(inputs):
        arr = inputs[name]
        _add(h, name.encode())
        _add(h, str(arr.dtype).encode())
        _add(h, struct.pack(f"<{arr.ndim}q", *arr.shape))
        if arr.dtype == np.object_:  # BYTES: each element with its length, so boundaries count
            for item in arr.reshape(-1):
                _add(h, item if isinstance(item, bytes) else str(item).encode())
        else:
            h.update(memoryview(np.ascontiguousarray(arr)).cast("B"))
    return h.digest()


def _add(h: hashlib.blake2b, data: bytes) -> None:
    h.update(struct.pack("<Q", len(data)))
    h.update(data)


def outputs_bytes(outputs: Mapping[str, np.ndarray]) -> int:
    total = 0
    for arr in outputs.values():
        if arr.dtype == np.object_:
            total += sum(len(v) if isinstance(v, bytes) else len(str(v)) for v in arr.reshape(-1)) + 8 * arr.size
        else:
            total += arr.nbytes
    return total


class ResponseCache:
    """LRU over at most `max_bytes` of output data. Thread-safe (lookups happen on the event loop, but nothing
    relies on that)."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.used_bytes = 0
        self.evictions = 0
        self._entries: OrderedDict[bytes, tuple[dict[str, np.ndarray], int]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: bytes) -> dict[str, np.ndarray] | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            self._entries.move_to_end(key)
            return dict(entry[0])

    def put(self, key: bytes, outputs: Mapping[str, np.ndarray]) -> bool:
        """Store read-only copies of `outputs`; False when they are larger than the whole cache."""
        size = outputs_bytes(outputs)
        if size > self.max_bytes:
            return False
        frozen = {}
        for name, arr in outputs.items():
            copy = np.array(arr, copy=True)
            copy.flags.writeable = False
            frozen[name] = copy
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self.used_bytes -= old[1]
            while self._entries and self.used_bytes + size > self.max_bytes:
                _, (_, freed) = self._entries.popitem(last=False)
                self.used_bytes -= freed
                self.evictions += 1
            self._entries[key] = (frozen, size)
            self.used_bytes += size
        return True
