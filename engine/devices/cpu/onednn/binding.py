"""ctypes layer over oneDNN's v3 C API (libdnnl.so.3 from the `onednn-cpu-gomp` wheel): loading, constants,
status checks. The object wrappers the kernels use are in objects.py.

The library is looked up in `<sys.prefix>/lib` (where the wheel installs it), then on the loader path, when a
CPU device whose options allow oneDNN first asks for it (`load`); with NNSERVE_ONEDNN=0 it is never loaded and
the numpy/numba kernels run instead. Loading it loads libgomp, which reads its wait policy from the environment
then, once: `load` first sets GOMP_SPINCOUNT to the wait policy's spin bound (NNSERVE_RUN_SPIN_US under the
default `run` policy, NNSERVE_SPIN_US under `short`: threads.py), or OMP_WAIT_POLICY=PASSIVE for 0, unless the user
set either.
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


def openmp_wait_policy(spin_us: int, environ) -> dict[str, str]:
    """The variables to set so that libgomp's idle threads spin `spin_us` then sleep, as the pool's do; none when
    the user chose OpenMP's policy (OMP_WAIT_POLICY or GOMP_SPINCOUNT in `environ`)."""
    if "OMP_WAIT_POLICY" in environ or "GOMP_SPINCOUNT" in environ:
        return {}
    if spin_us <= 0:
        return {"OMP_WAIT_POLICY": "PASSIVE"}
    return {"GOMP_SPINCOUNT": str(gomp_spincount(spin_us))}


def _open(spin_us: int) -> ctypes.CDLL | None:
    # libgomp reads its wait policy once, when it is loaded (with libdnnl, below); the process environment is
    # what it reads, so that is where the setting goes.
    os.environ.update(openmp_wait_policy(spin_us, os.environ))
    for path in _candidates():
        if path.startswith("/") and not Path(path).exists():
            continue
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for name, (restype, argtypes) in _SIGNATURES.items():
            fn = getattr(lib, name)  # omp_* resolve through libdnnl's own libgomp dependency
            fn.restype, fn.argtypes = restype, argtypes
        for name, (restype, argtypes) in _OPTIONAL.items():
            fn = getattr(lib, name, None)
            if fn is not None:
                fn.restype, fn.argtypes = restype, argtypes
        # oneDNN's primitive cache hands back a primitive made for another OpenMP thread count: a primitive is
        # created for the threads its work is worth (objects.creating), and with the cache on, a conv built after
        # the engine's thread count changed gave wrong outputs (tests/engine/devices/cpu/conv/test_onednn_conv.py,
        # test_threads_setting_reaches_openmp). Each kernel keeps its own primitives per shape, so the cache only
        # saved creation time at load.
        check(lib.dnnl_set_primitive_cache_capacity(0), "dnnl_set_primitive_cache_capacity")
        return lib
    return None


LIB: ctypes.CDLL | None = None  # the library once `load` found it: a shared library loads once per process
_loaded = False
_loaded_spin: int | None = None  # the spin the first load gave OpenMP (libgomp reads it that once)
_spin_warned = False
_lock = threading.Lock()


def load(spin_us: int | None = None) -> ctypes.CDLL | None:
    """libdnnl, loaded on the first call (with OpenMP's idle threads spinning `spin_us`, the wait policy's
    openmp_spin_us); None when it is not installed. No `spin_us`: a caller with no policy of its own (a probe of
    what oneDNN offers), which takes the loaded one (the default policy's when it loads first: a probe at import or
    test collection must not fix OpenMP's spin before the first device applies its policy) and is never warned
    about: under the `run` policy every instance's layout probe warned that 2 us could not apply."""
    global LIB, _loaded, _loaded_spin, _spin_warned
    with _lock:
        if not _loaded:
            spin_us = WaitPolicy().openmp_spin_us if spin_us is None else spin_us
            LIB, _loaded, _loaded_spin = _open(spin_us), True, spin_us
            if LIB is None:  # said once: every convolution, matmul and pool then takes the slower numba paths
                log.warning("oneDNN (%s) was not found: the CPU kernels run without it, slower (install the onednn "
                            "wheel nnserve depends on, or set NNSERVE_ONEDNN=0 to choose this)", SONAME)
        elif LIB is not None and spin_us is not None and spin_us != _loaded_spin and not _spin_warned:
            # said once: a later instance's wait policy cannot change what OpenMP's threads already spin
            _spin_warned = True
            log.warning("OpenMP's idle threads spin what the first oneDNN load gave them (%s us); %d us asked "
                        "later (another wait policy) cannot apply in this process", _loaded_spin, spin_us)
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
