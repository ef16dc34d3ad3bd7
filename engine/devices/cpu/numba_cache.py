"""numba's on-disk cache of our kernels, keyed on every engine source, not only the function's own file.

numba stamps a cached function with a hash of the file that defines it. Our loops inline helpers from other files
(`inline="always"`: the fused activations of loops/fused_epilogue.py inside the conv loops, ...), so a checkout
that changed only a helper would go on running machine code compiled from the old one: a silently wrong kernel
after a `git pull`. `stamp_with_kernel_sources` puts a locator before numba's own for the functions of the engine
package; it finds the cache where numba's own locators would (NUMBA_CACHE_DIR, the source tree, the user's cache,
a zip) and adds to their stamp a hash of every .py file of the package, read through the import system (so a zipped
install is hashed too), so a change to any of them recompiles them all. A user who sets numba's
NUMBA_CACHE_LOCATOR_CLASSES chooses the locators themselves, and this one is not among them.

numba names a cached overload's file by the first number its index does not use yet: two processes that compile
two signatures of one function at once (pytest's workers, two servers over one install) can both take number 1,
and the index one of them wrote then points at the other's machine code. Seen here: Gather's int64 kernel loaded
an int32 overload's and every model with an int64 Gather failed to load ("can't unbox array from PyObject"); a
mismatch numba's unboxing did not catch would run another signature's machine code. So our functions' overloads
are named by a hash of numba's version, the stamp and their key (`KeyNamedCacheFile`): whatever the order of two
writers, an index entry names the file written for that key by that numba and sources of that stamp, or one not
there yet (a recompile).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
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
        return self._inner.get_source_stamp(), kernel_sources_hash(), _SCHEME

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


class KeyNamedCacheFile(caching.IndexDataCacheFile):
    """numba's index and data files, an overload of our functions in a file named by a hash of the stamp and its
    key instead of the next free number (module doc); other functions' caches as numba keeps them."""

    def save(self, key, data):
        if not _ours(self._source_stamp):
            return super().save(key, data)
        name = self._data_name_pattern.replace("{number:d}", _key_digest(self._version, self._source_stamp, key))
        overloads = self._load_index()
        if not overloads:  # a new index (new sources, or numba's): the files of older ones are nobody's now
            self._remove_unlisted({name})
        if overloads.get(key) != name:
            overloads[key] = name
            self._save_index(overloads)
        self._save_data(name, data)

    def _remove_unlisted(self, keep: set[str]) -> None:
        """Deletes this function's data files but `keep`, key-named or numbered (each edit of the sources names
        every overload anew; without this they would pile up). Another process's file deleted meanwhile costs it a
        recompile: `load` takes a missing file for none."""
        prefix, suffix = self._data_name_pattern.split("{number:d}")
        try:
            names = os.listdir(self._cache_path)
        except OSError:
            return
        for n in names:
            digest = n[len(prefix):-len(suffix)] if n.startswith(prefix) and n.endswith(suffix) else ""
            ours = digest.isdigit() or len(digest) == DIGEST_CHARS and all(c in "0123456789abcdef" for c in digest)
            if ours and n not in keep:  # numbered: written before key-named files, by our code too
                with contextlib.suppress(OSError):
                    os.remove(os.path.join(self._cache_path, n))


# The stamp of our functions' caches: numba's own, the sources' hash and the scheme of their file names (so an index
# written before keyed names, which may point at another key's file, is stale and never read).
_SCHEME = "key-named"


def _ours(stamp) -> bool:
    return isinstance(stamp, tuple) and len(stamp) == 3 and stamp[2] == _SCHEME


DIGEST_CHARS = 24


def _key_digest(version: str, stamp, key) -> str:
    """A file-name-safe hash of numba's version, the stamp and an overload's key (its signature, the target and the
    bytecode's hashes: their repr, fixed for a given numba and source). numba checks its version on the index only:
    two numba versions over one cache (a test matrix run in parallel) must not write one data file."""
    return hashlib.sha256(repr((version, stamp, key)).encode()).hexdigest()[:DIGEST_CHARS]


def stamp_with_kernel_sources() -> None:
    """Puts KernelSourcesLocator first in numba's locators and KeyNamedCacheFile in place of numba's cache file
    (once; before our kernel modules are imported)."""
    classes = _IMPL._locator_classes
    if KernelSourcesLocator not in classes:
        classes.insert(0, KernelSourcesLocator)
    caching.IndexDataCacheFile = KeyNamedCacheFile  # Cache.__init__ looks the class up in its module
