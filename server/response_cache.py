"""Triton's response cache: a server-wide, size-limited cache of model outputs, keyed by a hash of the request (model
name, version, and every input's name, datatype, shape and bytes; for a model that sees them, as a Python model does,
also the requested outputs' names and the request's parameters but those the front end consumes), used by the
models whose config says `response_cache { enable: true }`. A hit answers without running the model.

Triton's key is a 64-bit hash of the names and bytes; here it is a 256-bit BLAKE2b digest that also covers datatypes
and shapes, so two requests that differ only in shape never share an entry, and the loaded copies of the models that
answer (a reloaded model's, or an ensemble's whose step model was reloaded or got a new version, are new entries:
Triton would answer from the old ones). Entries are the model's outputs (all of
them: the requested subset is picked per request), read-only arrays; the least recently used go first when the
cache is full, and an entry larger than the whole cache is not stored.
"""

from __future__ import annotations

import hashlib
import struct
import sys
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

# The bytes a BYTES element weighs for hashing_cost.
OBJECT_COST = 64


def request_key(model: str, version: str, inputs: Mapping[str, np.ndarray], outputs: Iterable[str] = (),
                parameters: Mapping[str, bool | int | str] | None = None, copies: Sequence[int] = ()) -> bytes:
    """The cache key of a request's inputs (in the model's shapes), in name order; with what else the model sees of
    the request, where it sees more (a Python model: the requested outputs and the parameters), as its answer may
    depend on them; and the loaded copies that answer it (`copies`: the model's own, and an ensemble's steps'), as
    a reload or a step's new version answers otherwise."""
    h = hashlib.blake2b(digest_size=32)
    for part in (model, version):
        _add(h, part.encode())
    _add(h, struct.pack(f"<{len(copies)}q", *copies))
    wanted = sorted(outputs)
    _add(h, struct.pack("<q", len(wanted)))
    for name in wanted:
        _add(h, name.encode())
    params = parameters or {}
    _add(h, struct.pack("<q", len(params)))
    for name in sorted(params):
        _add(h, name.encode())
        _add(h, repr((type(params[name]).__name__, params[name])).encode())  # True and 1 differ
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
    """What an entry costs in memory: a BYTES element is a Python object of its own (sys.getsizeof: ~33 bytes of
    header beside its data) plus the array's pointer to it, so that --cache-config size bounds the memory held."""
    total = 0
    for arr in outputs.values():
        total += arr.nbytes  # for BYTES, the pointers
        if arr.dtype == np.object_:
            total += sum(sys.getsizeof(v) for v in arr.reshape(-1))
    return total


def hashing_cost(arrays: Mapping[str, np.ndarray]) -> int:
    """About how many bytes hashing (or copying) `arrays` walks: a BYTES element counts as an object's worth
    (OBJECT_COST), as visiting it in Python costs that much more than its bytes."""
    return sum(arr.size * OBJECT_COST if arr.dtype == np.object_ else arr.nbytes for arr in arrays.values())


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
