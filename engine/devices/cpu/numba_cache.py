"""numba's on-disk cache of our kernels, keyed on every engine source, not only the function's own file.

numba stamps a cached function with a hash of the file that defines it. Our loops inline helpers from other files
(`inline="always"`: the fused activations of loops/fused_epilogue.py inside the conv loops, ...), so a checkout
that changed only a helper would go on running machine code compiled from the old one: a silently wrong kernel
after a `git pull`. `stamp_with_kernel_sources` puts a locator before numba's own for the functions of the engine
package; it finds the cache where numba's own locators would (NUMBA_CACHE_DIR, the source tree, the user's cache,
a zip) and adds to their stamp a hash of every .py file of the package, read through the import system (so a zipped
install is hashed too), so a change to any of them recompiles them all. A user who sets numba's
NUMBA_CACHE_LOCATOR_CLASSES chooses the locators themselves, and this one is not among them.
"""

from __future__ import annotations

import functools
import hashlib
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

from numba.core import caching

_PACKAGE = Path(__file__).resolve().parents[2]  # engine/
# numba 0.68 renamed _CacheImpl (which holds the locator classes, first to accept a function wins) to CacheImpl;
# neither there is an AttributeError at import, not a cache left unkeyed
_IMPL = caching.CacheImpl if hasattr(caching, "CacheImpl") else caching._CacheImpl


def _py_files(node: Traversable, prefix: str = "") -> list[tuple[str, Traversable]]:
    found = []
    for child in node.iterdir():
        name = f"{prefix}/{child.name}" if prefix else child.name
        if child.is_dir():
            found += _py_files(child, name)
        elif child.name.endswith(".py"):
            found.append((name, child))
    return found


@functools.cache
def kernel_sources_hash() -> str | None:
    """sha256 over the names and contents of every .py file of the engine package (read once a process); None
    where there are none (a frozen executable: numba stamps its caches with the executable, which changes with
    any source)."""
    files = sorted(_py_files(resources.files("engine")))
    if not files:
        return None
    h = hashlib.sha256()
    for name, f in files:
        h.update(name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()


class KernelSourcesLocator(caching._CacheLocator):
    """numba's own locator for the function, its stamp extended with kernel_sources_hash(); anything else numba
    asks of a locator (`_py_file` for its warnings, ...) is the inner one's."""

    def __init__(self, inner: caching._CacheLocator):
        self._inner = inner

    def __getattr__(self, name: str):  # only for names not found on self: never _inner itself (a copy or an
        if name == "_inner" or name.startswith("__"):  # unpickling asks before __init__ ran: no recursion)
            raise AttributeError(name)
        return getattr(self._inner, name)

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
        if not Path(py_file).resolve().is_relative_to(_PACKAGE) or kernel_sources_hash() is None:
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
