"""ctypes layer over oneDNN's v3 C API (libdnnl.so.3 from the `onednn-cpu-gomp` wheel): loading, constants,
status checks. The object wrappers the kernels use are in objects.py.

The library is looked up in `<sys.prefix>/lib` (where the wheel installs it), then on the loader path, when a
CPU device whose options allow oneDNN first asks for it (`load`); with NNSERVE_ONEDNN=0 it is never loaded and
the numpy/numba kernels run instead.

Which OpenMP runs oneDNN's threads (and ours under the `run` policy, openmp_pool.py): libdnnl is built against
GNU OpenMP (libgomp), whose idle threads spin a count fixed when it loads (GOMP_SPINCOUNT) and cannot be told to
spin through a request and sleep after it. Intel's OpenMP runtime (libiomp5, the `intel-openmp` wheel nnserve
depends on) implements libgomp's entry points (GOMP_parallel, omp_*; LLVM's OpenMP does the same) and waits by
time (KMP_BLOCKTIME). Loaded with RTLD_GLOBAL before libdnnl, it is where the loader binds libdnnl's GOMP_*
and omp_* calls (libgomp is still mapped, as libdnnl's dependency, and never called); `load` checks that binding
(the process-wide lookup of GOMP_parallel_start, one of libdnnl's imports, must be Intel's) and otherwise stays on
the runtime it found, saying why. OMP is the handle the omp_* / GOMP_* calls go through: the runtime libdnnl is
bound to (Intel's, or libdnnl's own libgomp).
NNSERVE_OPENMP (options.py) chooses: `auto` (Intel's when installed), `intel` (an error without it), `gnu`.

Each runtime reads its wait policy from the environment when it loads, once: `load` first sets GOMP_SPINCOUNT to
the wait policy's spin bound (NNSERVE_RUN_SPIN_US under the default `run` policy, NNSERVE_SPIN_US under `short`:
threads.py), or OMP_WAIT_POLICY=PASSIVE for 0, and KMP_BLOCKTIME to the policy's Intel blocktime
(WaitPolicy.intel_blocktime_us), unless the user set them (OMP_WAIT_POLICY: both; GOMP_SPINCOUNT;
KMP_BLOCKTIME).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import sys
import threading
from pathlib import Path

from engine.devices.cpu.options import WaitPolicy
from engine.devices.cpu.threads import gomp_spincount
from engine.errors import KernelError

log = logging.getLogger("engine.devices.cpu")

SONAME = "libdnnl.so.3"
INTEL_OPENMP = "libiomp5.so"
OPENMP_CHOICES = ("auto", "intel", "gnu")

# Enum values of the v3 C API (dnnl_types.h, dnnl_common_types.h); each one used is checked by a numeric test.
S32, F32, S8, U8 = 4, 3, 5, 6  # dnnl_data_type_t
FORMAT_ANY = 1
FORWARD_INFERENCE = 96
CONVOLUTION_DIRECT = 1
ENGINE_CPU = 1
STREAM_IN_ORDER = 1
SCRATCHPAD_USER = 1
QUERY_IMPL_INFO_STR = 8
QUERY_SRC_MD, QUERY_WEIGHTS_MD, QUERY_DST_MD, QUERY_SCRATCHPAD_MD = 129, 131, 133, 136
ARG_SRC, ARG_DST, ARG_WEIGHTS, ARG_BIAS, ARG_SCRATCHPAD = 1, 17, 33, 41, 80
ARG_SRC_1 = 2
ARG_ATTR_SCALES = 4096  # | ARG_WEIGHTS: the scales set by dnnl_primitive_attr_set_scales_mask, at execution
ARG_ATTR_ZERO_POINTS = 8192  # | ARG_SRC: the zero points set by dnnl_primitive_attr_set_zero_points_mask
ARG_ATTR_MULTIPLE_POST_OP_BASE = 32768  # oneDNN v3 (v2: 16384)
BINARY_ADD = 0x1FFF0


def ARG_POST_OP_SRC1(index: int) -> int:  # noqa: N802 (DNNL_ARG_ATTR_MULTIPLE_POST_OP(index) | DNNL_ARG_SRC_1)
    return ARG_ATTR_MULTIPLE_POST_OP_BASE * (index + 1) | ARG_SRC_1


ELTWISE = {"relu": 0x20, "tanh": 0x21, "elu": 0x22, "hardsigmoid": 0x28, "logistic": 0x29, "gelu_tanh": 0x2B,
           "swish": 0x2C, "clip": 0x2E, "gelu_erf": 0x31, "hardswish": 0x34}
POOL_MAX, POOL_AVG_INCLUDE, POOL_AVG_EXCLUDE = 0x1FF, 0x2FF, 0x3FF
BINARY = {"add": 0x1FFF0, "mul": 0x1FFF1, "max": 0x1FFF2, "min": 0x1FFF3}  # dnnl_binary_*
ARG_SRC_1 = 2
ARG_ATTR_MULTIPLE_POST_OP_BASE = 32768


def post_op_arg(index: int, arg: int = ARG_SRC_1) -> int:
    """DNNL_ARG_ATTR_MULTIPLE_POST_OP(index) | arg: the execution argument of post-op `index`'s operand."""
    return ARG_ATTR_MULTIPLE_POST_OP_BASE * (index + 1) | arg


vp = ctypes.c_void_p
Dims = ctypes.c_int64 * 12


class ExecArg(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_int), ("memory", vp)]


# restype / argtypes of the calls whose pointers or floats ctypes would otherwise mangle.
_SIGNATURES = {
    "dnnl_primitive_desc_query_md": (vp, [vp, ctypes.c_int, ctypes.c_int]),
    "dnnl_memory_desc_get_size": (ctypes.c_size_t, [vp]),
    "dnnl_memory_desc_equal": (ctypes.c_int, [vp, vp]),
    "dnnl_post_ops_append_eltwise": (ctypes.c_int, [vp, ctypes.c_int, ctypes.c_float, ctypes.c_float]),
    "dnnl_post_ops_append_sum": (ctypes.c_int, [vp, ctypes.c_float, ctypes.c_int32, ctypes.c_int]),
    "dnnl_post_ops_append_binary": (ctypes.c_int, [vp, ctypes.c_int, vp]),
    "dnnl_memory_set_data_handle": (ctypes.c_int, [vp, vp]),
    "dnnl_primitive_execute": (ctypes.c_int, [vp, vp, ctypes.c_int, ctypes.POINTER(ExecArg)]),
    "dnnl_stream_wait": (ctypes.c_int, [vp]),
    "dnnl_memory_create": (ctypes.c_int, [ctypes.POINTER(vp), vp, vp, vp]),
}
# The OpenMP calls, through OMP (the runtime libdnnl's calls bind to).
_OPENMP_SIGNATURES = {
    "omp_set_num_threads": (None, [ctypes.c_int]),
    "omp_get_max_threads": (ctypes.c_int, []),
    "omp_in_parallel": (ctypes.c_int, []),
}
# Since GCC 9's libgomp (OpenMP 5.0); threads.release_thread goes without it when an older one is loaded.
_OPTIONAL = {"omp_pause_resource_all": (ctypes.c_int, [ctypes.c_int])}


def _candidates() -> list[str]:
    found = [str(Path(sys.prefix) / "lib" / SONAME), str(Path(sys.base_prefix) / "lib" / SONAME)]
    name = ctypes.util.find_library("dnnl")
    return found + ([name] if name else []) + [SONAME]


def openmp_wait_policy(spin_us: int, environ, blocktime_us: int | None = None) -> dict[str, str]:
    """The variables to set so that libgomp's idle threads spin `spin_us` then sleep, as the pool's do
    (GOMP_SPINCOUNT; OMP_WAIT_POLICY=PASSIVE for 0, which Intel's runtime also reads as sleeping at once), and
    Intel's OpenMP's `blocktime_us` (KMP_BLOCKTIME, when given); each runtime's left as it is when the user chose it
    (OMP_WAIT_POLICY: both; GOMP_SPINCOUNT: libgomp's; KMP_BLOCKTIME: Intel's)."""
    if "OMP_WAIT_POLICY" in environ:
        return {}
    out = {}
    if "GOMP_SPINCOUNT" not in environ:
        out = {"OMP_WAIT_POLICY": "PASSIVE"} if spin_us <= 0 else {"GOMP_SPINCOUNT": str(gomp_spincount(spin_us))}
    if blocktime_us is not None and "KMP_BLOCKTIME" not in environ and "OMP_WAIT_POLICY" not in out:
        out["KMP_BLOCKTIME"] = f"{blocktime_us}us"  # this runtime takes microseconds ("us"; plain numbers are ms)
    return out


# Where the engine lists the OpenMP variables it set ("NAME=value;..."): a child process inherits them with the
# rest of the environment, and must not take them for its user's own choice.
SET_BY_ENGINE = "NNSERVE_OPENMP_SET"


def users_environ(environ) -> dict[str, str]:
    """`environ` without the OpenMP variables an engine set (SET_BY_ENGINE) and that still hold its value."""
    ours = dict(item.split("=", 1) for item in environ.get(SET_BY_ENGINE, "").split(";") if "=" in item)
    return {k: v for k, v in environ.items() if k != SET_BY_ENGINE and ours.get(k) != v}


def _users_intel_policy(environ) -> bool:
    """Whether the user chose Intel's OpenMP's wait policy (the engine then sets none)."""
    return "OMP_WAIT_POLICY" in environ or "KMP_BLOCKTIME" in environ


def _intel_candidates() -> list[str]:
    return [str(Path(sys.prefix) / "lib" / INTEL_OPENMP), str(Path(sys.base_prefix) / "lib" / INTEL_OPENMP)]


def _open_intel(choice: str) -> ctypes.CDLL | None:
    """Intel's OpenMP, loaded RTLD_GLOBAL so that libdnnl (loaded next) binds to it; None for `gnu`, or when it is
    not installed or came too late (`auto`: said in the log; `intel`: an error)."""
    if choice == "gnu":
        return None
    why = f"{INTEL_OPENMP} (the intel-openmp wheel) was not found in {sys.prefix}/lib"
    for path in _intel_candidates():
        if not Path(path).exists():
            continue
        if hasattr(ctypes.CDLL(None), "GOMP_parallel_start"):
            # an OpenMP runtime in the global scope already (another library loaded it so): the loader binds
            # libdnnl to whichever came first there, and two runtimes would be two sets of threads on the cores
            why = "an OpenMP runtime (libgomp or another) was already loaded globally in this process, by another " \
                  "library, before oneDNN"
            break
        try:
            return ctypes.CDLL(path, mode=os.RTLD_GLOBAL | os.RTLD_NOW)
        except OSError as e:
            why = f"{path} did not load: {e}"
            break
    if choice == "intel":
        raise KernelError(f"NNSERVE_OPENMP=intel asks for Intel's OpenMP, but {why}")
    log.info("oneDNN runs on GNU OpenMP (libgomp): %s", why)
    return None


def _bound_runtime(lib: ctypes.CDLL) -> ctypes.CDLL:
    """The handle that resolves the OpenMP runtime libdnnl's calls were bound to: the loader binds an import to the
    first definition in the process's global scope, else to libdnnl's own dependency (libgomp, loaded local). So a
    GOMP_parallel_start (one of libdnnl's imports) found process-wide is the one libdnnl calls, and the omp_* calls
    the engine makes must be looked up the same way, whichever runtime that is."""
    scope = ctypes.CDLL(None)
    return scope if hasattr(scope, "GOMP_parallel_start") else lib


def _same(a: ctypes.CDLL, b: ctypes.CDLL, name: str = "GOMP_parallel_start") -> bool:
    return ctypes.cast(getattr(a, name), vp).value == ctypes.cast(getattr(b, name), vp).value


def _open(spin_us: int, blocktime_us: int, choice: str) -> tuple[ctypes.CDLL, ctypes.CDLL, bool] | None:
    """(libdnnl, the OpenMP handle its calls bind to, whether that is Intel's), or None when libdnnl is not
    found."""
    # each runtime reads its wait policy once, when it is loaded (below); the process environment is what it
    # reads, so that is where the setting goes
    ours = openmp_wait_policy(spin_us, users_environ(os.environ), blocktime_us)
    os.environ.update(ours)
    os.environ[SET_BY_ENGINE] = ";".join(f"{k}={v}" for k, v in ours.items())
    intel = None
    for path in _candidates():
        if path.startswith("/") and not Path(path).exists():
            continue
        intel = intel or _open_intel(choice)
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        omp = _bound_runtime(lib)
        on_intel = intel is not None and omp is not lib and _same(omp, intel)
        if intel is not None and not on_intel:
            if choice == "intel":
                raise KernelError("NNSERVE_OPENMP=intel: libdnnl's OpenMP calls did not bind to Intel's runtime "
                                  "(another OpenMP runtime came first in the process's global scope)")
            log.warning("oneDNN's OpenMP calls did not bind to Intel's runtime (another OpenMP runtime came first "
                        "in the process): running on that one")
        for name, (restype, argtypes) in _SIGNATURES.items():
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = restype, argtypes
        for name, (restype, argtypes) in _OPENMP_SIGNATURES.items():
            fn = getattr(omp, name)
            fn.restype, fn.argtypes = restype, argtypes
        for name, (restype, argtypes) in _OPTIONAL.items():
            fn = getattr(omp, name, None)
            if fn is not None:
                fn.restype, fn.argtypes = restype, argtypes
        if on_intel:
            omp.kmp_set_blocktime.restype, omp.kmp_set_blocktime.argtypes = None, [ctypes.c_int]
            omp.kmp_get_blocktime.restype, omp.kmp_get_blocktime.argtypes = ctypes.c_int, []
        # oneDNN's primitive cache hands back a primitive made for another OpenMP thread count: a primitive is
        # created for the threads its work is worth (objects.creating), and with the cache on, a conv built after
        # the engine's thread count changed gave wrong outputs (tests/engine/devices/cpu/conv/test_onednn_conv.py,
        # test_threads_setting_reaches_openmp). Each kernel keeps its own primitives per shape, so the cache only
        # saved creation time at load.
        check(lib.dnnl_set_primitive_cache_capacity(0), "dnnl_set_primitive_cache_capacity")
        log.info("oneDNN loaded from %s, on %s", path, "Intel's OpenMP" if on_intel else "GNU OpenMP")
        return lib, omp, on_intel
    return None


LIB: ctypes.CDLL | None = None  # the library once `load` found it: a shared library loads once per process
OMP: ctypes.CDLL | None = None  # the OpenMP runtime libdnnl's calls bind to (omp_*, GOMP_*), once loaded
INTEL = False  # whether that is Intel's
# The blocktime the engine gave Intel's OpenMP, in whole ms (None: libgomp, or the user's policy): whether it is
# above 0 is what decides the splits and the busy-host guard (threads.use_openmp); the guard reads the runtime's own
# value (kmp_get_blocktime) to hand back.
INTEL_BLOCKTIME_MS: int | None = None
_loaded = False
_loaded_spin: int | None = None  # the spin the first load gave OpenMP (libgomp reads it that once)
_spin_warned = False
_lock = threading.Lock()


def load(spin_us: int | None = None, blocktime_us: int | None = None, openmp: str = "auto") -> ctypes.CDLL | None:
    """libdnnl, loaded on the first call (with OpenMP's idle threads spinning `spin_us`, the wait policy's
    openmp_spin_us, or `blocktime_us` on Intel's OpenMP, its intel_blocktime_us; `openmp`, NNSERVE_OPENMP, the
    runtime); None when it is not installed. No `spin_us`: a caller with no policy of its own (a probe of
    what oneDNN offers), which takes the loaded one (the default policy's when it loads first: a probe at import or
    test collection must not fix OpenMP's spin before the first device applies its policy) and is never warned
    about: under the `run` policy every instance's layout probe warned that 2 us could not apply."""
    global LIB, OMP, INTEL, INTEL_BLOCKTIME_MS, _loaded, _loaded_spin, _spin_warned
    with _lock:
        if not _loaded:
            spin_us = WaitPolicy().openmp_spin_us if spin_us is None else spin_us
            blocktime_us = WaitPolicy().intel_blocktime_us if blocktime_us is None else blocktime_us
            users = _users_intel_policy(users_environ(os.environ))
            opened = _open(spin_us, blocktime_us, openmp)
            LIB, OMP, INTEL = opened if opened is not None else (None, None, False)
            _loaded, _loaded_spin = True, spin_us
            INTEL_BLOCKTIME_MS = blocktime_us // 1000 if INTEL and not users and spin_us > 0 else None
            if LIB is None:  # said once: every convolution, matmul and pool then takes the slower numba paths
                log.warning("oneDNN (%s) was not found: the CPU kernels run without it, slower (install the onednn "
                            "wheel nnserve depends on, or set NNSERVE_ONEDNN=0 to choose this)", SONAME)
        elif LIB is not None and spin_us is not None and not _spin_warned and (
                spin_us != _loaded_spin or openmp == "gnu" and INTEL or openmp == "intel" and not INTEL):
            # said once: a later instance's wait policy or runtime cannot change what the first load chose
            _spin_warned = True
            log.warning("oneDNN runs on %s, whose idle threads spin what the first oneDNN load gave them (%s us); "
                        "%d us and NNSERVE_OPENMP=%s asked later cannot apply in this process",
                        "Intel's OpenMP" if INTEL else "GNU OpenMP", _loaded_spin, spin_us, openmp)
    return LIB


def check(status: int, fn: str) -> None:
    if status != 0:
        raise KernelError(f"oneDNN {fn} failed with status {status}")


def call(fn: str, *args) -> None:
    """Calls LIB.fn(*args) and raises KernelError naming it unless it returns dnnl_success."""
    if LIB is None:
        raise KernelError(f"oneDNN is not loaded (calling {fn})")
    check(getattr(LIB, fn)(*args), fn)


def dims(values) -> ctypes.Array:
    return Dims(*(int(v) for v in values))
