"""Reading the model repository's files: regular files only, and every read bounded.

A FIFO, socket or device where a config.pbtxt, model or warm-up file should be would block a read forever (a FIFO
nobody writes to) or never end it (/dev/zero), and a huge file would be read whole into memory. The repository
therefore checks that a file is regular before it hands its path to the engine, and reads its own files through
read_regular: opened without blocking, checked again on the open descriptor, read up to a stated size.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from server.errors import ModelLoadError

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))
_CHUNK = 2**20


def _kind(mode: int) -> str:
    return next((what for test, what in _KINDS if test(mode)), "not a regular file")


def check_regular(path: Path, label: str) -> os.stat_result:
    """The file's status (a symlink followed); a ModelLoadError naming `label` unless it is a regular file."""
    try:
        st = path.stat()
    except OSError as exc:
        raise ModelLoadError(f"{label}: cannot read: {exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        raise ModelLoadError(f"{label} is {_kind(st.st_mode)}, not a regular file: it is not read")
    return st


def read_regular(path: Path, limit: int, label: str) -> bytes:
    """The bytes of the regular file `path`, at most `limit` of them (a bigger file is a ModelLoadError)."""
    check_regular(path, label)
    try:  # O_NONBLOCK: a FIFO put in its place after the check must not block the open
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise ModelLoadError(f"{label}: cannot read: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ModelLoadError(f"{label} is {_kind(st.st_mode)}, not a regular file: it is not read")
        if st.st_size > limit:
            raise ModelLoadError(f"{label} has {st.st_size} bytes, more than the {limit} such a file may have")
        data = bytearray()
        while len(data) <= limit:
            chunk = os.read(fd, min(_CHUNK, limit + 1 - len(data)))
            if not chunk:
                break
            data += chunk
        if len(data) > limit:  # it grew while being read
            raise ModelLoadError(f"{label} has more than the {limit} bytes such a file may have")
        return bytes(data)
    except OSError as exc:
        raise ModelLoadError(f"{label}: cannot read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
