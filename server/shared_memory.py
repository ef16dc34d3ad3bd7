"""Triton's system shared-memory extension: regions a client registers (a POSIX shared-memory object in /dev/shm, an
offset and a size), which requests then name for their input and output tensors instead of carrying the bytes.

The objects belong to the client, and a client can change them at any time, also shrink them: a region is
therefore never memory-mapped (reading a mapping past the object's new end kills the process with SIGBUS). It keeps
the object's descriptor, opened without following a symlink, and tensors are read and written with pread/pwrite,
which a shrunken object answers with a short count instead. Inputs are copied out once, into the request's own
array; an object the server may only read is registered read-only (outputs into it are refused).

A region unregistered while requests use it is closed when the last of them is done (Triton's rule): a request
holds a lease on each region it names, from the moment it is validated to its answer.

CUDA shared memory (CUDA IPC handles) is not implemented: its endpoints answer Triton's error for a server without
GPU support.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from server.errors import (
    AlreadyExistsError,
    InvalidArgumentError,
    NotFoundError,
    ServerError,
    UnsupportedError,
)
from server.inference import ShmRef
from server.request_limits import check_label, quoted

log = logging.getLogger("nnserve.shm")

SHM_DIR = Path("/dev/shm")
# Triton keeps keys with this prefix for its Python backend's own regions.
RESERVED_PREFIX = "triton_python_backend_shm_region_"
CLIENT_SHM_DISABLED = ("Client shared memory is disabled. Start the server with '--allow-client-shm=true' to "
                       "enable.")  # Triton's words
# Each region holds a file descriptor: a bound on what clients can make the server hold open.
MAX_REGIONS = 1024
MAX_KEY_BYTES = 255  # NAME_MAX: a key is one file name in /dev/shm


def check_key(name: str, key: str) -> str:
    """The object's file name in /dev/shm for `key` (Triton accepts leading slashes, as shm_open does); anything
    that is not one plain name there (a path, '..', a NUL) is refused, as is Triton's reserved prefix."""
    base = key.lstrip("/")
    invalid = f"cannot register shared memory region '{quoted(name)}' - invalid shm key '{quoted(key)}'"
    if not base:
        raise InvalidArgumentError(invalid)  # Triton's words
    if base.startswith(RESERVED_PREFIX):
        raise InvalidArgumentError(f"cannot register shared memory region '{quoted(name)}' with key '{quoted(key)}' "
                                   f"as the key contains the reserved prefix '{RESERVED_PREFIX}'")
    if "/" in base or base in (".", "..") or "\0" in base or len(base.encode("utf-8", "surrogatepass")) > \
            MAX_KEY_BYTES:
        raise InvalidArgumentError(f"{invalid}: a key names one shared-memory object (a file name in {SHM_DIR}, at "
                                   f"most {MAX_KEY_BYTES} bytes)")
    return base


@dataclass(eq=False)
class Region:
    """One registered region: the object's descriptor and the window [offset, offset + byte_size) of it."""

    name: str
    key: str
    offset: int
    byte_size: int
    fd: int
    writable: bool
    users: int = 0  # requests holding a lease
    retired: bool = False  # unregistered: closed when the last user is done
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def status(self) -> dict[str, Any]:
        return {"name": self.name, "key": self.key, "offset": self.offset, "byte_size": self.byte_size}

    def read(self, offset: int, size: int) -> np.ndarray:
        """`size` bytes at `offset` of the window, copied into a new uint8 array."""
        out = np.empty(size, dtype=np.uint8)
        got = os.preadv(self.fd, [out], self.offset + offset) if size else 0
        if got != size:
            raise InvalidArgumentError(f"shared memory region '{quoted(self.name)}': only {got} of {size} bytes at "
                                       f"offset {offset} could be read: its object '{quoted(self.key)}' is smaller "
                                       "than when it was registered")
        return out

    def write(self, offset: int, data: Any) -> None:
        view = memoryview(data).cast("B")
        if not self.writable:
            raise InvalidArgumentError(f"shared memory region '{quoted(self.name)}' is read-only for the server "
                                       f"(its object '{quoted(self.key)}' may not be written): it cannot take outputs")
        end = self.offset + offset + view.nbytes
        if os.fstat(self.fd).st_size < end:  # pwrite past the end would grow the client's object instead
            raise InvalidArgumentError(f"shared memory region '{quoted(self.name)}': its object '{quoted(self.key)}' "
                                       f"is smaller than when it was registered; the output does not fit")
        written = 0
        while written < view.nbytes:
            written += os.pwrite(self.fd, view[written:], self.offset + offset + written)

    def close(self) -> None:
        with self._lock:
            if self.fd >= 0:
                os.close(self.fd)
                self.fd = -1


@dataclass
class Lease:
    """A request's use of a region window: `region` stays open until release()."""

    region: Region
    offset: int
    byte_size: int

    def read(self) -> np.ndarray:
        return self.region.read(self.offset, self.byte_size)

    def write(self, data: Any, output: str) -> None:
        size = memoryview(data).nbytes
        if size > self.byte_size:  # Triton's words
            raise InvalidArgumentError(f"shared memory size specified with the request for output '{output}' "
                                       f"({self.byte_size} bytes) should be at least {size} bytes to hold the results")
        self.region.write(self.offset, data)


class SystemSharedMemory:
    """The registered system shared-memory regions of the server. Registration, status and leases run on the event
    loop; reads and writes of a leased region may run in worker threads."""

    def __init__(self, allowed: bool = False, max_regions: int = MAX_REGIONS, shm_dir: Path = SHM_DIR):
        self.allowed = allowed
        self.max_regions = max_regions
        self.shm_dir = shm_dir
        self._regions: dict[str, Region] = {}
        self._lock = threading.Lock()

    # ---- the extension's API --------------------------------------------------------------------------------
    def register(self, name: str, key: Any, offset: Any, byte_size: Any) -> None:
        """Register a region. `key`, `offset` and `byte_size` are as the request gave them (None: absent), checked
        here in Triton's order and words."""
        self.check_allowed()
        check_label(name, "shared memory region name")
        if not name:
            raise InvalidArgumentError("'region name' is necessary to register system shared memory region")
        if key is None:
            raise InvalidArgumentError("Shared memory register request has no 'key' field")
        if not isinstance(key, str):
            raise InvalidArgumentError("Unable to parse 'key': expected a string")
        offset = _uint(0 if offset is None else offset, "offset")
        if byte_size is None:
            raise InvalidArgumentError("Shared memory register request has no 'byte_size' field")
        byte_size = _uint(byte_size, "byte_size")
        base = check_key(name, key)
        with self._lock:
            if name in self._regions:
                raise AlreadyExistsError(f"shared memory region '{quoted(name)}' already in manager")
            if len(self._regions) >= self.max_regions:
                raise InvalidArgumentError(f"cannot register shared memory region '{quoted(name)}': {self.max_regions} "
                                           "regions are registered, the most the server holds; unregister some")
            fd, writable = self._open(key, base)
            try:
                size = os.fstat(fd).st_size
                if byte_size == 0 or offset + byte_size > size:  # Triton's words
                    raise InvalidArgumentError(f"failed to register shared memory region '{quoted(name)}': invalid "
                                               f"args (offset {offset} + byte_size {byte_size} must lie within the "
                                               f"{size} bytes of '{quoted(key)}')")
            except BaseException:
                os.close(fd)
                raise
            self._regions[name] = Region(name, key, offset, byte_size, fd, writable)
        log.debug("registered system shared memory region '%s' (key '%s', offset %d, %d bytes%s)", name, key,
                  offset, byte_size, "" if writable else ", read-only")

    def status(self, name: str = "") -> list[dict[str, Any]]:
        with self._lock:
            if not name:
                return [r.status() for r in self._regions.values()]
            region = self._regions.get(name)
        if region is None:
            raise NotFoundError(f"Unable to find system shared memory region: '{quoted(name)}'")
        return [region.status()]

    def unregister(self, name: str = "") -> None:
        """One region, or every region when `name` is empty; unknown names are not an error (Triton's rule)."""
        self.check_allowed()
        with self._lock:
            names = [name] if name else list(self._regions)
            gone = [self._regions.pop(n) for n in names if n in self._regions]
        for region in gone:
            self._retire(region)

    def close(self) -> None:
        """Shutdown: every region goes (those in use when their requests finish)."""
        with self._lock:
            gone = list(self._regions.values())
            self._regions.clear()
        for region in gone:
            self._retire(region)

    # ---- requests -------------------------------------------------------------------------------------------
    def lease(self, ref: ShmRef) -> Lease:
        """The window a tensor names, checked against its region (Triton's messages); release() it when done."""
        with self._lock:
            region = self._regions.get(ref.region)
            if region is None:
                raise NotFoundError(f"Unable to find shared memory region: '{quoted(ref.region)}'")
            if ref.offset >= region.byte_size:
                raise InvalidArgumentError(f"Invalid offset for shared memory region: '{quoted(ref.region)}'")
            if ref.offset + ref.byte_size > region.byte_size:
                raise InvalidArgumentError(f"Invalid offset + byte size for shared memory region: "
                                           f"'{quoted(ref.region)}'")
            region.users += 1
        return Lease(region, ref.offset, ref.byte_size)

    def release(self, lease: Lease) -> None:
        region = lease.region
        with self._lock:
            region.users -= 1
            last = region.retired and region.users == 0
        if last:
            region.close()

    def __contains__(self, name: str) -> bool:
        return name in self._regions

    def check_allowed(self) -> None:
        if not self.allowed:
            raise UnsupportedError(CLIENT_SHM_DISABLED)

    def _retire(self, region: Region) -> None:
        with self._lock:
            region.retired = True
            idle = region.users == 0
        if idle:
            region.close()
        else:
            log.debug("shared memory region '%s' will be unregistered after in-flight requests complete",
                      region.name)

    def _open(self, key: str, base: str) -> tuple[int, bool]:
        """(descriptor, writable) of the object: read-write where the server may write it, else read-only. Never
        through a symlink (O_NOFOLLOW), never blocking (a FIFO), and only a regular file (what shm_open makes)."""
        path = self.shm_dir / base
        flags = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            fd, writable = os.open(path, os.O_RDWR | flags), True
        except PermissionError:
            try:
                fd, writable = os.open(path, os.O_RDONLY | flags), False
            except OSError as exc:
                raise _open_error(key, exc) from None
        except OSError as exc:
            raise _open_error(key, exc) from None
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            os.close(fd)
            raise InvalidArgumentError(f"Unable to open shared memory region: '{quoted(key)}': not a shared-memory "
                                       "object (a regular file in /dev/shm)")
        return fd, writable


def _uint(value: Any, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**64:
        raise InvalidArgumentError(f"Unable to parse '{field}': expected an unsigned integer")
    return value


def _open_error(key: str, exc: OSError) -> ServerError:
    if exc.errno == errno.ELOOP:
        why = "it is a symbolic link"
    else:
        why = exc.strerror or str(exc)
    return InvalidArgumentError(f"Unable to open shared memory region: '{quoted(key)}' ({why})")


def cuda_unsupported(name: str) -> ServerError:
    """Triton's answer to a CUDA shared-memory registration on a server without GPU support."""
    return InvalidArgumentError(f"failed to register CUDA shared memory region: '{quoted(name)}', GPUs not supported")
