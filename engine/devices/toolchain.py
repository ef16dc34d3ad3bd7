"""The JIT toolchain's own compatibility, checked before any kernel is compiled.

numba 0.68.0 registers an overload of `np.row_stack` when it first types a function, and numpy 2.5 removed that
name: every compilation then fails with "module 'numpy' has no attribute 'row_stack'" deep inside numba, on the
first inference of every model (seen on a machine whose image shipped numba 0.68.0 beside numpy 2.5.2: 313 of the
CUDA suite's tests failed so); numba 0.68.1 registers it only where numpy has it. The pair is refused when a device is
made (the model's load), naming the fix, instead of failing each request.
"""

from __future__ import annotations

import functools
import re
from importlib import metadata

import numpy as np

from engine.errors import EngineError

# (numba version, first numpy version it cannot compile with)
BROKEN_PAIRS = (((0, 68, 0), (2, 5)),)


def _version(text: str, parts: int) -> tuple[int, ...]:
    """The first `parts` numbers of a version string, each from its leading digits ("0rc1" is 0)."""
    return tuple(int(re.match(r"\d*", piece).group() or 0) for piece in text.split(".")[:parts])


def incompatibility(numba_version: str, numpy_version: str) -> str | None:
    """Why this numba cannot compile with this numpy (None when the pair is not known to be broken)."""
    nb, npv = _version(numba_version, 3), _version(numpy_version, 2)
    for bad, numpy_from in BROKEN_PAIRS:
        if nb == bad and npv >= numpy_from:
            return (f"numba {numba_version} cannot compile kernels with numpy {numpy_version} (it overloads "
                    f"np.row_stack, which numpy {numpy_from[0]}.{numpy_from[1]} removed): install numba>=0.68.1 "
                    f"or numpy<{numpy_from[0]}.{numpy_from[1]}")
    return None


@functools.cache
def check() -> None:
    """EngineError for a known-broken numba/numpy pair; nothing otherwise (numba itself checks the rest). Asked
    when a device is made (cached: once a process)."""
    try:
        installed = metadata.version("numba")
    except metadata.PackageNotFoundError:
        return  # the import of numba that follows names what is missing
    why = incompatibility(installed, np.__version__)
    if why:
        raise EngineError(why)
