"""Model files sent with a load request (Triton's `file:<version>/<name>` parameters, base64 over HTTP, bytes over
gRPC): written to a private temporary directory that then serves as the model's directory for that load.

The directory is made by mkdtemp (mode 0700, a fresh random name) and removed once the load is over: the engine
reads every model file while it loads. A file's path is relative to the model directory and confined to it: each
component is a plain file name (no '..', no absolute path, no empty or overlong component), every directory and
file is created new inside the private directory (O_EXCL, O_NOFOLLOW), so nothing is written anywhere else, and
nothing that exists is overwritten. The files of one request are limited in total (--model-load-max-file-size),
checked before anything is written.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

from server.errors import RepositoryPollError
from server.request_limits import quoted

FILE_PREFIX = "file:"
MAX_COMPONENT_BYTES = 255  # NAME_MAX
MAX_DEPTH = 16


def file_parameters(params: Mapping[str, object]) -> list[str]:
    return [key for key in params if key.startswith(FILE_PREFIX)]


def poll_failure(name: str, why: str) -> RepositoryPollError:
    """Triton's answer to a load whose model directory cannot be made (clients match its start)."""
    return RepositoryPollError(f"failed to load '{quoted(name)}', failed to poll from model repository: {why}")


def check_files(name: str, files: Mapping[str, bytes], max_bytes: int) -> None:
    """Every path confined to the model directory, and the total within the limit; before anything is written."""
    if max_bytes <= 0:
        raise poll_failure(name, "loading model files through the API is disabled (--model-load-max-file-size 0)")
    total = sum(len(data) for data in files.values())
    if total > max_bytes:
        raise poll_failure(name, f"the model files of the request hold {total} bytes, more than the {max_bytes} "
                                 "allowed (--model-load-max-file-size)")
    for key in files:
        relative_parts(name, key)


def relative_parts(name: str, key: str) -> list[str]:
    """The path components of a `file:` parameter; refuses anything but a relative path of plain names."""
    path = key[len(FILE_PREFIX):]
    parts = path.split("/")
    bad = (not path or path.startswith("/") or "\\" in path or "\0" in path or len(parts) > MAX_DEPTH
           or any(p in ("", ".", "..") or len(p.encode("utf-8", "surrogatepass")) > MAX_COMPONENT_BYTES
                  for p in parts))
    if bad:
        raise poll_failure(name, f"invalid file parameter '{quoted(key)}': a file path must stay within the model "
                                 f"directory (relative, no '..', at most {MAX_DEPTH} plain names of at most "
                                 f"{MAX_COMPONENT_BYTES} bytes)")
    return parts


def write_model_directory(name: str, files: Mapping[str, bytes], max_bytes: int) -> Path:
    """A new private directory holding `<name>/` with `files` (keys "file:<path>"); the caller removes it with
    remove_directory once the load is over."""
    check_files(name, files, max_bytes)
    root = Path(tempfile.mkdtemp(prefix="nnserve-load-"))
    try:
        model_dir = root / name
        model_dir.mkdir(mode=0o700)
        for key, data in files.items():
            _write(name, model_dir, relative_parts(name, key), key, data)
    except BaseException:
        remove_directory(root)
        raise
    return root


def remove_directory(root: Path) -> None:
    shutil.rmtree(root, ignore_errors=True)


def _write(name: str, model_dir: Path, parts: list[str], key: str, data: bytes) -> None:
    directory = model_dir
    try:
        for part in parts[:-1]:
            directory = directory / part
            if not directory.is_dir() or directory.is_symlink():
                directory.mkdir(mode=0o700)
        fd = os.open(directory / parts[-1], os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600)
    except FileExistsError:
        raise poll_failure(name, f"invalid file parameter '{quoted(key)}': its path is already taken by another "
                                 "file parameter") from None
    except OSError as exc:
        raise poll_failure(name, f"cannot write file parameter '{quoted(key)}': {exc.strerror or exc}") from None
    with os.fdopen(fd, "wb") as f:
        f.write(data)
