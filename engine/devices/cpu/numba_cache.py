"""numba's on-disk cache of our kernels, keyed on every CPU kernel source, not only the function's own file.

numba stamps a cached function with a hash of the file that defines it. Our loops inline helpers from other files
(`inline="always"`: the fused activations of loops/fused_epilogue.py inside the conv loops, ...), so a checkout
that changed only a helper would go on running machine code compiled from the old one: a silently wrong kernel
after a `git pull`. `stamp_with_kernel_sources` puts a locator before numba's own for the functions under this
package; it finds the cache where numba's own locators would (NUMBA_CACHE_DIR, the source tree, the user's
cache) and adds to their stamp a hash of every .py file here, so a change to any of them recompiles them all.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

from numba.core import caching

_ROOT = Path(__file__).resolve().parent
# numba 0.68 renamed _CacheImpl (which holds the locator classes, first to accept a function wins) to CacheImpl;
# neither there is an AttributeError at import, not a cache left unkeyed
_IMPL = caching.CacheImpl if hasattr(caching, "CacheImpl") else caching._CacheImpl


@functools.cache
def kernel_sources_hash() -> str:
    """sha256 over the paths and contents of every .py file under engine/devices/cpu (read once a process)."""
    h = hashlib.sha256()
    for path in sorted(_ROOT.rglob("*.py")):
        h.update(str(path.relative_to(_ROOT)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


class KernelSourcesLocator(caching._CacheLocator):
    """numba's own locator for the function, its stamp extended with kernel_sources_hash()."""

    def __init__(self, inner: caching._CacheLocator):
        self._inner = inner

    def ensure_cache_path(self):
        self._inner.ensure_cache_path()

    def get_cache_path(self):
        return self._inner.get_cache_path()

    def get_source_stamp(self):
        return self._inner.get_source_stamp(), kernel_sources_hash()

    def get_disambiguator(self):
        return self._inner.get_disambiguator()

    @classmethod
    def from_function(cls, py_func, py_file):
        if not Path(py_file).resolve().is_relative_to(_ROOT):
            return None
        for other in _IMPL._locator_classes:
            if other is not cls:
                inner = other.from_function(py_func, py_file)
                if inner is not None:
                    return cls(inner)
        return None


def stamp_with_kernel_sources() -> None:
    """Puts KernelSourcesLocator first in numba's locators (once; before our kernel modules are imported)."""
    classes = _IMPL._locator_classes
    if KernelSourcesLocator not in classes:
        classes.insert(0, KernelSourcesLocator)
