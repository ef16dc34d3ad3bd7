"""numba's cache of our kernels is keyed on every engine source (engine/devices/cpu/numba_cache.py): a change to
a helper that another file's kernel inlines recompiles that kernel, where numba alone would run the stale one."""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
import sys
from pathlib import Path

import engine
from engine.devices.cpu import numba_cache
from engine.devices.cpu.loops import fused_epilogue

# a cached kernel in its own file that inlines fused_epilogue.activate_cheap (ReLU is act 1), and one numba
# cannot cache (a ctypes function: numba warns, naming the locator's file, and compiles it each process)
CALLER = '''
import ctypes
import ctypes.util

from numba import njit
from engine.devices.cpu.loops.fused_epilogue import activate_cheap

_cos = ctypes.CDLL(ctypes.util.find_library("m")).cos
_cos.restype, _cos.argtypes = ctypes.c_double, [ctypes.c_double]


@njit(cache=True)
def relu_of(v):
    return activate_cheap(v, 1, 0.0, 0.0, 0.0)


@njit(cache=True)
def uncachable(v):
    return _cos(v)
'''
RUN = ("import warnings; warnings.simplefilter('ignore'); "
       "from engine.devices.cpu.loops.cache_probe import relu_of, uncachable; r = relu_of(-2.0); "
       "assert uncachable(0.0) == 1.0; print(r, sum(relu_of.stats.cache_hits.values()))")


def test_our_kernels_take_the_locator():
    loc = fused_epilogue.epilogue_cols._cache._impl._locator
    assert isinstance(loc, numba_cache.KernelSourcesLocator)
    assert loc.get_source_stamp() == (loc._inner.get_source_stamp(), numba_cache.kernel_sources_hash(), "key-named")
    assert isinstance(fused_epilogue.epilogue_cols._cache._cache_file, numba_cache.KeyNamedCacheFile)
    assert numba_cache.KernelSourcesLocator.from_function(len, __file__) is None  # other code keeps numba's own
    assert loc._py_file == loc._inner._py_file  # what numba reads of a locator beyond its interface
    clone = copy.copy(loc)  # attributes pass through without recursing where _inner is not set yet
    assert clone.get_cache_path() == loc.get_cache_path()
    bare = numba_cache.KernelSourcesLocator.__new__(numba_cache.KernelSourcesLocator)  # as unpickling makes it
    assert not hasattr(bare, "anything")  # an AttributeError, not a RecursionError


def test_a_changed_helper_recompiles_its_callers(tmp_path):
    root = tmp_path / "src"
    shutil.copytree(Path(engine.__file__).parent, root / "engine", ignore=shutil.ignore_patterns("__pycache__"))
    (root / "engine/devices/cpu/loops/cache_probe.py").write_text(CALLER)
    env = {**os.environ, "PYTHONPATH": str(root), "NUMBA_CACHE_DIR": str(tmp_path / "numba")}

    def run() -> tuple[float, int]:
        out = subprocess.run([sys.executable, "-c", RUN], env=env, cwd=root, capture_output=True, text=True,
                             timeout=300, check=True).stdout.split()
        return float(out[0]), int(out[1])

    assert run() == (0.0, 0)  # compiled and saved
    assert run() == (0.0, 1)  # loaded from the cache
    helper = root / "engine/devices/cpu/loops/fused_epilogue.py"
    text = helper.read_text()
    assert "return max(v, 0.0)" in text
    helper.write_text(text.replace("return max(v, 0.0)", "return v - 1.0", 1))  # a different "ReLU"
    assert run() == (-3.0, 0)  # cache_probe.py did not change, its kernel was recompiled with the new helper


def test_two_processes_saving_overloads_at_once_never_cross_them(tmp_path):
    """Two writers of one function's cache, each with its own signature: the second read the index before the
    first wrote its entry, and the first's data file landed last. numba's numbering gives both file 1, and the index
    left (the second's) names the first's machine code: an int64 kernel that runs int32's. Named by key, the second
    loads its own; the first's entry is lost from the index (a recompile), never crossed."""
    stamp = ("numba's stamp", "sources", "key-named")
    first, second = (numba_cache.KeyNamedCacheFile(str(tmp_path), "f-1.py311", stamp) for _ in range(2))
    landing = []
    first._save_data = lambda name, data: landing.append((name, data))  # its data lands after the second's
    second._load_index = lambda: {}  # read before the first's entry was written
    first.save(("int64",), "int64 code")
    second.save(("int32",), "int32 code")
    numba_cache.KeyNamedCacheFile._save_data(first, *landing[0])
    reader = numba_cache.KeyNamedCacheFile(str(tmp_path), "f-1.py311", stamp)
    assert reader.load(("int32",)) == "int32 code"
    assert reader.load(("int64",)) is None
    first.save(("int64",), "int64 code")  # the next process to compile it saves it again
    assert reader.load(("int64",)) == "int64 code" and reader.load(("int32",)) == "int32 code"
    # the same key under other sources is another file: an old checkout's writer never overwrites a new one's
    other = numba_cache.KeyNamedCacheFile(str(tmp_path), "f-1.py311", ("numba's stamp", "old sources", "key-named"))
    other.save(("int32",), "old int32 code")
    assert other.load(("int32",)) == "old int32 code"
    assert reader.load(("int32",)) is None  # the index is the old sources' now: a recompile, never their code
    second.save(("int32",), "int32 code")
    assert reader.load(("int32",)) == "int32 code" and other.load(("int32",)) is None
    # a stamp not ours (another library's function): numba's own numbering, as it was
    theirs = numba_cache.KeyNamedCacheFile(str(tmp_path), "g-1.py311", ("their stamp",))
    theirs.save(("int32",), "code")
    assert (tmp_path / "g-1.py311.1.nbc").exists() and theirs.load(("int32",)) == "code"


def test_numba_versions_never_share_a_file_and_old_files_go_with_a_new_index(tmp_path):
    """numba checks its version on the index only: two versions over one cache write two files. An index written
    anew (other sources, another numba) removes this function's files it does not name, so edits do not pile them
    up; other functions' files stay."""
    stamp = ("numba's stamp", "sources", "key-named")
    new, old = (numba_cache.KeyNamedCacheFile(str(tmp_path), "f-1.py311", stamp) for _ in range(2))
    old._version = "0.59.0"
    old.save(("int32",), "0.59's code")
    new.save(("int32",), "0.68's code")  # the index is 0.59's: stale to 0.68, written anew, 0.59's file removed
    assert new.load(("int32",)) == "0.68's code" and old.load(("int32",)) is None
    (tmp_path / "f-1.py311.3.nbc").write_bytes(b"numbered")  # the scheme before key-named files
    (tmp_path / "g-1.py311.abcdefabcdefabcdefabcdef.nbc").write_bytes(b"another function's")
    edited = numba_cache.KeyNamedCacheFile(str(tmp_path), "f-1.py311", ("numba's stamp", "edited", "key-named"))
    edited.save(("int32",), "edited code")
    assert sorted(p.name for p in tmp_path.glob("f-1.py311.*.nbc")) == [edited._data_name_pattern.replace(
        "{number:d}", numba_cache._key_digest(edited._version, edited._source_stamp, ("int32",)))]
    assert (tmp_path / "g-1.py311.abcdefabcdefabcdefabcdef.nbc").exists()
    assert edited.load(("int32",)) == "edited code"
