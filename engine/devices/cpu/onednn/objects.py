"""oneDNN objects for the CPU kernels: memory descriptors, primitive descriptors, primitives and memory, each a
small class that frees its handle in __del__; one engine, a stream per thread, OpenMP thread count.

Kernels create primitives with `format_tag_any` and let oneDNN pick its blocked layouts (an order of magnitude
faster than forcing NCHW), reordering at the edges (`Step` + `Plan` below run a primitive's arguments by pointer).
`available()` loads libdnnl (binding.load) and is false when it is missing.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import threading
import weakref
from collections.abc import Sequence

import numpy as np

from engine.devices.cpu import native_program as N
from engine.devices.cpu.onednn import binding as L
from engine.devices.cpu.threads import get_threads, park, threads_for, work_of

log = logging.getLogger("engine.onednn")
_vp = ctypes.c_void_p
ALIGN = 64


def available() -> bool:
    return L.load() is not None


class _Engine:
    _handle: _vp | None = None
    _lock = threading.Lock()

    @classmethod
    def get(cls) -> _vp:
        with cls._lock:
            if cls._handle is None:
                h = _vp()
                L.call("dnnl_engine_create", ctypes.byref(h), L.ENGINE_CPU, 0)
                cls._handle = h  # lives as long as the process
        return cls._handle


_local = threading.local()
# A forked child's OpenMP thread count is its runtime's default again (Intel's resets it; libgomp keeps it): the
# count cached for the forking thread would skip the call that sets it.
os.register_at_fork(after_in_child=lambda: _local.__dict__.pop("threads", None))


def stream() -> _vp:
    """This thread's stream (oneDNN streams belong to one thread)."""
    s = getattr(_local, "stream", None)
    if s is None:
        s = _vp()
        L.call("dnnl_stream_create", ctypes.byref(s), engine(), L.STREAM_IN_ORDER)
        _local.stream = s
    return s


def engine() -> _vp:
    return _Engine.get()


def use_threads(n: int) -> None:
    """This thread's OpenMP team is `n` from now on, for a primitive that chose its own count (the int8 convs:
    created and run with it; a primitive must never run with more threads than it was created with); parks our
    pool's spinning workers, as sync_threads does."""
    park()
    _omp_threads(n)


def _omp_threads(n: int) -> None:
    if getattr(_local, "threads", None) != n:
        L.OMP.omp_set_num_threads(n)  # an OpenMP setting is per calling thread
        _local.threads = n


def note_threads(n: int) -> None:
    """OpenMP's count was set to `n` outside `_omp_threads` (a native program's records)."""
    _local.threads = n


def forget_threads() -> None:
    """OpenMP's count is not known (a native program stopped part-way): the next `_omp_threads` sets it."""
    _local.__dict__.pop("threads", None)


def sync_threads(work: int | None = None) -> None:
    """Gives this thread's OpenMP team the thread count for a primitive of `work` about to run
    (threads.threads_for: one for small work, else the engine's count; never more than it was created with, see
    `creating`), and parks our pool's spinning workers: the primitive uses OpenMP's threads."""
    park()
    _omp_threads(threads_for(work))


def restore_threads() -> None:
    """OpenMP's count back to the engine's after a primitive that ran on fewer."""
    _omp_threads(get_threads())


@contextlib.contextmanager
def creating(work: int | None = None):
    """Around a primitive's creation (descriptor and primitive): oneDNN sizes a primitive for OpenMP's count at
    that moment, and it must never run with more threads than that (its scratchpad and split are per thread). A
    primitive of small `work` (threads.threads_for: a fork-join would cost more than it saves) is created for one
    thread, and run after sync_threads(work) with the same `work`, so it never forks. The count is back to the
    engine's afterwards."""
    park()
    before = getattr(_local, "threads", None) or get_threads()
    _omp_threads(threads_for(work))
    try:
        yield
    finally:
        _omp_threads(before)  # nested (a reorder made inside a conv's creation): the outer count again


class _Handle:
    """Owns one oneDNN handle; `_destroy` names the C function that frees it."""
    _destroy = ""

    def __init__(self, handle: _vp):
        self.h = handle

    def __del__(self):
        if L is None:  # interpreter shutdown: the module is gone, and so is the process
            return
        h, lib = getattr(self, "h", None), L.LIB
        if h is not None and h.value and lib is not None:
            getattr(lib, self._destroy)(h)
            self.h = None


class MemoryDesc(_Handle):
    _destroy = "dnnl_memory_desc_destroy"

    @classmethod
    def any(cls, shape: Sequence[int], dt: int = L.F32) -> MemoryDesc:
        """Data type `dt` (float32 unless given) of `shape`, layout left to the primitive."""
        h = _vp()
        L.call("dnnl_memory_desc_create_with_tag", ctypes.byref(h), len(shape), L.dims(shape), dt, L.FORMAT_ANY)
        return cls(h)

    @classmethod
    def plain(cls, shape: Sequence[int], dt: int = L.F32) -> MemoryDesc:
        """Data type `dt` of `shape`, C-contiguous (NCHW, OIHW, ...)."""
        strides = [1] * len(shape)
        for i in range(len(shape) - 2, -1, -1):
            strides[i] = strides[i + 1] * int(shape[i + 1])
        return cls.strided(shape, strides, dt)

    @classmethod
    def strided(cls, shape: Sequence[int], strides: Sequence[int], dt: int = L.F32) -> MemoryDesc:
        """Data type `dt` of `shape` with element `strides`."""
        h = _vp()
        L.call("dnnl_memory_desc_create_with_strides", ctypes.byref(h), len(shape), L.dims(shape), dt,
               L.dims(strides))
        return cls(h)

    @classmethod
    def tagged(cls, shape: Sequence[int], tag: str, dt: int = L.F32) -> MemoryDesc:
        """Data type `dt` of logical `shape` in the layout of oneDNN's string tag (NHWC is "acdb")."""
        h = _vp()
        L.call("dnnl_memory_desc_create_with_string_tag", ctypes.byref(h), len(shape), L.dims(shape), dt,
               tag.encode())
        return cls(h)

    @classmethod
    def submemory(cls, parent: MemoryDesc, shape: Sequence[int], offsets: Sequence[int]) -> MemoryDesc:
        """The part of `parent` of logical `shape` starting at `offsets` (its layout and strides)."""
        h = _vp()
        L.call("dnnl_memory_desc_create_submemory", ctypes.byref(h), parent.h, L.dims(shape), L.dims(offsets))
        return cls(h)

    @classmethod
    def clone(cls, borrowed: int) -> MemoryDesc:
        h = _vp()
        L.call("dnnl_memory_desc_clone", ctypes.byref(h), _vp(borrowed))
        return cls(h)

    @property
    def nbytes(self) -> int:
        return int(L.LIB.dnnl_memory_desc_get_size(self.h))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MemoryDesc) and bool(L.LIB.dnnl_memory_desc_equal(self.h, other.h))

    __hash__ = None  # type: ignore[assignment]


class Attr(_Handle):
    """Primitive attributes: user scratchpad (so a run never allocates) and post-ops: ("sum",), an eltwise
    (name, alpha, beta), ("binary_add", MemoryDesc of the second operand), or ("binary", name, operand MemoryDesc)
    whose operand is passed as L.post_op_arg(index); `scales` maps an argument (L.ARG_WEIGHTS) to the mask of the
    dimensions its scales vary along, the scales themselves passed as L.ARG_ATTR_SCALES | argument; `zero_points`
    likewise for int32 zero points (L.ARG_ATTR_ZERO_POINTS | argument)."""
    _destroy = "dnnl_primitive_attr_destroy"

    def __init__(self, post_ops: Sequence[tuple] = (), scales: dict[int, int] | None = None,
                 zero_points: dict[int, int] | None = None):
        h = _vp()
        L.call("dnnl_primitive_attr_create", ctypes.byref(h))
        super().__init__(h)
        L.call("dnnl_primitive_attr_set_scratchpad_mode", h, L.SCRATCHPAD_USER)
        for arg, mask in (scales or {}).items():
            L.call("dnnl_primitive_attr_set_scales_mask", h, arg, mask)
        for arg, mask in (zero_points or {}).items():
            L.call("dnnl_primitive_attr_set_zero_points_mask", h, arg, mask)
        if post_ops:
            po = _vp()
            L.call("dnnl_post_ops_create", ctypes.byref(po))
            try:
                for op in post_ops:
                    if op[0] == "sum":
                        L.call("dnnl_post_ops_append_sum", po, 1.0, 0, 0)  # data type undef: dst's
                    elif op[0] == "binary_add":
                        L.call("dnnl_post_ops_append_binary", po, L.BINARY_ADD, op[1].h)
                    elif op[0] == "binary":
                        L.call("dnnl_post_ops_append_binary", po, L.BINARY[op[1]], op[2].h)
                    else:
                        L.call("dnnl_post_ops_append_eltwise", po, L.ELTWISE[op[0]], op[1], op[2])
                L.call("dnnl_primitive_attr_set_post_ops", h, po)
            finally:
                L.LIB.dnnl_post_ops_destroy(po)


class PrimitiveDesc(_Handle):
    _destroy = "dnnl_primitive_desc_destroy"

    def md(self, what: int) -> MemoryDesc:
        """The descriptor the primitive chose for one argument (L.QUERY_*_MD), a copy owned by the caller."""
        return MemoryDesc.clone(L.LIB.dnnl_primitive_desc_query_md(self.h, what, 0))

    @property
    def impl(self) -> str:
        s = ctypes.c_char_p()
        L.call("dnnl_primitive_desc_query", self.h, L.QUERY_IMPL_INFO_STR, 0, ctypes.byref(s))
        return (s.value or b"?").decode()

    @classmethod
    def create(cls, fn: str, *args) -> PrimitiveDesc:
        h = _vp()
        L.call(fn, ctypes.byref(h), *args)
        return cls(h)


def reorder_pd(src: MemoryDesc, dst: MemoryDesc) -> PrimitiveDesc:
    return PrimitiveDesc.create("dnnl_reorder_primitive_desc_create", src.h, engine(), dst.h, engine(), None)


class Primitive(_Handle):
    _destroy = "dnnl_primitive_destroy"

    def __init__(self, pd: PrimitiveDesc):
        h = _vp()
        L.call("dnnl_primitive_create", ctypes.byref(h), pd.h)
        super().__init__(h)
        self.pd = pd


class Stream(_Handle):
    """A stream owned by its holder, for one slot of a native region (each OpenMP thread executes on its slot's own
    stream; `stream()` is the calling Python thread's)."""
    _destroy = "dnnl_stream_destroy"

    def __init__(self):
        h = _vp()
        L.call("dnnl_stream_create", ctypes.byref(h), engine(), L.STREAM_IN_ORDER)
        super().__init__(h)


class Memory(_Handle):
    """A memory object over caller-owned data; the pointer is swapped per run (`set`), every run even when unchanged:
    dnnl_memory_set_data_handle also writes zeros into a blocked memory's padding, which oneDNN's primitives may
    assume, and the arena lets other values use those bytes between runs."""
    _destroy = "dnnl_memory_destroy"

    def __init__(self, md: MemoryDesc):
        h = _vp()
        L.check(L.LIB.dnnl_memory_create(ctypes.byref(h), md.h, engine(), None), "dnnl_memory_create")
        super().__init__(h)
        self.md = md

    def set(self, ptr: int) -> None:
        L.check(L.LIB.dnnl_memory_set_data_handle(self.h, ptr), "dnnl_memory_set_data_handle")


class Step:
    """One primitive with its argument memories; `run({arg: pointer})` points them and executes."""

    def __init__(self, prim: Primitive, args: dict[int, MemoryDesc], work: int | None = None):
        """`created`: the count a primitive of `work` is made for (made inside `creating(work)`, as reorders and
        poolings are, it is the count the primitive was made for)."""
        self.prim, self.work = prim, work
        self.created = threads_for(work)
        self.mems = {a: Memory(md) for a, md in args.items()}
        self.args = (L.ExecArg * len(args))(*(L.ExecArg(a, m.h) for a, m in self.mems.items()))

    def run(self, ptrs: dict[int, int]) -> None:
        if self.work is not None:
            # never more than created with: another instance may have raised the process's count since
            _omp_threads(min(self.created, threads_for(self.work)))
        for a, p in ptrs.items():
            self.mems[a].set(p)
        try:
            L.check(L.LIB.dnnl_primitive_execute(self.prim.h, stream(), len(self.args), self.args),
                    "dnnl_primitive_execute")
        finally:
            if self.work is not None:
                restore_threads()


    def threads(self, default: int) -> int:
        """The OpenMP count `run` executes with, `default` being the one in effect before it."""
        return default if self.work is None else min(self.created, threads_for(self.work))

    def records(self, ptrs: dict[int, int], default: int) -> list[tuple[int, ...]]:
        """What `run(ptrs)` calls, as native_program records, `default` being OpenMP's count before it: its
        count, its memories pointed, the execution (on this thread's stream: fused_calls.Segment), the engine's
        count again after a step of known work (restore_threads)."""
        out = [threads_record(self.threads(default))]
        out += [(N.OP_SET, fn_address("dnnl_memory_set_data_handle"), self.mems[a].h.value, p) for a, p in ptrs.items()]
        out.append(execute_record(self.prim, self.args))
        if self.work is not None:
            out.append(threads_record(get_threads()))
        return out


def fn_address(name: str, lib: ctypes.CDLL | None = None) -> int:
    """The address of a C function of oneDNN (or of `lib`), for native_program records."""
    return N.address_of(getattr(lib or L.LIB, name))


def execute_record(prim: Primitive, args) -> tuple[int, ...]:
    """dnnl_primitive_execute(prim, this thread's stream, args) as a native_program record."""
    return (N.OP_EXEC, fn_address("dnnl_primitive_execute"), prim.h.value, stream().value, len(args),
            ctypes.addressof(args))


def threads_record(n: int) -> tuple[int, ...]:
    """omp_set_num_threads(n) as a native_program record."""
    return (N.OP_THREADS, fn_address("omp_set_num_threads", L.OMP), n)


def wait_record() -> tuple[int, ...]:
    return (N.OP_WAIT, fn_address("dnnl_stream_wait"), stream().value)


def reorder_step(src: MemoryDesc, dst: MemoryDesc) -> Step:
    """A reorder, created and run on as many threads as its size is worth: a copy streams what it reads and
    writes, so it weighs those bytes (threads.work_of), not its element count."""
    work = work_of(0, src.nbytes + dst.nbytes)
    with creating(work):
        return Step(Primitive(reorder_pd(src, dst)), {L.ARG_SRC: src, L.ARG_DST: dst}, work=work)


def wait() -> None:
    L.check(L.LIB.dnnl_stream_wait(stream()), "dnnl_stream_wait")


def aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


def aligned_buffer(nbytes: int) -> np.ndarray:
    """A uint8 array of `nbytes` starting on an ALIGN boundary."""
    raw = np.empty(nbytes + ALIGN, np.uint8)
    off = -raw.ctypes.data % ALIGN
    return raw[off:off + nbytes]


def reorder_into(src: np.ndarray, src_md: MemoryDesc, dst_md: MemoryDesc) -> np.ndarray:
    """A new aligned buffer holding C-contiguous float32 `src` in layout `dst_md` (for weights, at build time)."""
    out = aligned_buffer(dst_md.nbytes)
    src = np.ascontiguousarray(src, np.float32)
    sync_threads()
    reorder_step(src_md, dst_md).run({L.ARG_SRC: src.ctypes.data, L.ARG_DST: out.ctypes.data})
    wait()
    return out


_ADDRESSES: dict[int, tuple[weakref.ref, int]] = {}
_MAX_ADDRESSES = 4096


def address(a: np.ndarray) -> int:
    """a.ctypes.data, remembered per array object: the arena views a kernel sees are the same objects run after
    run, and `ctypes.data` costs ~1.4 us each time (4-6 us of a small conv's ~10 us of Python). Entries hold weak
    references, so a remembered view never keeps an unloaded model's arena alive."""
    hit = _ADDRESSES.get(id(a))
    if hit is not None and hit[0]() is a:
        return hit[1]
    ptr = a.ctypes.data
    if len(_ADDRESSES) >= _MAX_ADDRESSES:
        _ADDRESSES.clear()
    _ADDRESSES[id(a)] = (weakref.ref(a), ptr)
    return ptr


def workspace_base(workspace: np.ndarray | None) -> tuple[int, int]:
    """(ALIGN-aligned address, usable bytes) of the instance workspace."""
    if workspace is None or workspace.nbytes == 0:
        return 0, 0
    ptr = address(workspace)
    off = -ptr % ALIGN
    return ptr + off, max(0, workspace.nbytes - off)


def scratch_address(plan, workspace: np.ndarray | None) -> int:
    """Where a plan's scratchpad (`plan.pad_bytes`) goes: the instance workspace where it fits, else the plan's
    own buffer (`plan.private`, made once: a shape whose scratchpad outgrows the max shape's, rare)."""
    ptr, size = workspace_base(workspace)
    if size >= plan.pad_bytes:
        return ptr
    if plan.private is None:
        plan.private = aligned_buffer(max(plan.pad_bytes, ALIGN))
    return plan.private.ctypes.data


def run_src_dst(step: Step, x: np.ndarray, out: np.ndarray, scratch: np.ndarray | None) -> None:
    """Runs a primitive of one source and one destination (a pooling) on `x` into `out`, with its scratchpad, and
    waits for it."""
    ptrs = {L.ARG_SRC: address(x), L.ARG_DST: address(out)}
    if scratch is not None:
        ptrs[L.ARG_SCRATCHPAD] = address(scratch)
    step.run(ptrs)
    wait()
