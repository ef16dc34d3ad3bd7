"""CudaDevice: one CUDA device ("cuda:N") behind the engine's Device interface: the shared op registry (no private
ops), its kernel table (kernels.py; an op without a CUDA kernel is refused, never run on the CPU), no graph
rewrite of its own (`prepare` is the identity) and no settings.

Per instance (the runtime creates one device object per instance): a stream, one device allocation for the
planned arena at max shapes, one for the workspace, weights uploaded once at kernel build, and pinned host
staging buffers for the graph's inputs and outputs, grown only when a larger shape first arrives.
"""

from __future__ import annotations

import contextlib

import numpy as np
from numba import cuda

from engine.devices.base import Device, Kernel
from engine.devices.cuda import kernels
from engine.devices.cuda._launch import SIM
from engine.errors import ArenaOverflowError, EngineError, UnsupportedOpError
from engine.ir import Node
from engine.memory.planner import ALIGNMENT
from engine.ops.registry import OpDef, TensorInfo


def device_count() -> int:
    try:
        return len(cuda.gpus) if cuda.is_available() else 0
    except Exception:  # a driver that fails to initialize counts as no device
        return 0


def parse_index(name: str) -> int:
    """"cuda" / "gpu" -> 0, "cuda:1" -> 1."""
    _, _, index = str(name).partition(":")
    if not index:
        return 0
    if not index.isdigit():
        raise EngineError(f"bad CUDA device name {name!r}; use cuda, gpu or cuda:N")
    return int(index)


class CudaArena:
    """One device allocation; views are device arrays over byte ranges of it (the CPU Arena's interface)."""

    def __init__(self, nbytes: int, alignment: int = ALIGNMENT):
        self.raw = cuda.device_array(max(nbytes, 1) + alignment, dtype=np.uint8)
        start = (-_address(self.raw)) % alignment
        self.buffer = self.raw[start:start + nbytes]
        self.nbytes = nbytes

    def view(self, offset: int, shape: tuple[int, ...], dtype: np.dtype, name: str = ""):
        dtype = np.dtype(dtype)
        n = dtype.itemsize * int(np.prod(shape, dtype=np.int64))
        if offset < 0 or offset + n > self.nbytes:
            raise ArenaOverflowError(f"{name or 'buffer'} needs bytes {offset}..{offset + n} but the device "
                                     f"arena holds {self.nbytes}; create the instance with larger max_shapes")
        if n == 0:
            return cuda.device_array(shape, dtype=dtype)
        return self.buffer[offset:offset + n].view(dtype).reshape(shape)


def _address(a) -> int:
    if hasattr(a, "device_ctypes_pointer"):
        return int(a.device_ctypes_pointer.value or 0)
    return int(np.asarray(a).__array_interface__["data"][0])  # the simulator's arrays wrap numpy


class CudaDevice(Device):
    host_inputs = False  # kernels read device memory: the inputs are copied into the arena
    host_outputs = False  # and write it: the outputs are copied out

    def __init__(self, name: str = "cuda"):
        self.index = parse_index(name)
        count = device_count()
        if self.index >= count:
            found = ("CUDA device support is not installed/available here (numba.cuda found no device)"
                     if count == 0 else f"this machine has only {count} CUDA device(s), cuda:0..cuda:{count - 1}")
            raise EngineError(f"no CUDA device {self.index} for {name!r}: {found}; use device='cpu' "
                              "or an instance_group of KIND_CPU")
        self.name = f"cuda:{self.index}"
        self.kernels = kernels.KERNELS
        self.arena_bytes = 0  # activation arena + workspace on this device, for metrics
        self.weights_bytes = 0
        self._uploaded: dict[int, object] = {}  # id(host array) -> device copy, so shared weights upload once
        self._pinned: dict[int, np.ndarray] = {}
        with self.activate():
            self.stream = cuda.stream()
            self.dummy = cuda.to_device(np.zeros(1, np.float32))

    # -- Device interface -------------------------------------------------------------------------------
    def allocate(self, nbytes: int) -> CudaArena:
        with self.activate():
            arena = CudaArena(nbytes)
        self.arena_bytes += nbytes
        return arena

    def build_kernel(self, node: Node, op: OpDef, ins: list[TensorInfo]) -> Kernel:
        builder = self.kernels.get(node.op_type)
        if builder is None:
            self.refuse(node, f"{node.op_type} has no CUDA kernel")
        with self.activate():
            return kernels.wrap(self, node, builder(self, node, ins))

    def workspace_bytes(self, node: Node, op: OpDef, ins: list[TensorInfo]) -> int:
        fn = kernels.WORKSPACE.get(node.op_type)
        return int(fn(node, ins)) if fn else 0

    def activate(self) -> contextlib.AbstractContextManager:
        return cuda.gpus[self.index]

    def copy_in(self, view, array: np.ndarray) -> None:
        if view.size == 0:
            return
        stage = self._stage(view, array.dtype)
        np.copyto(stage, array.reshape(stage.shape))
        view.copy_to_device(stage, stream=self.stream)

    def copy_out(self, view) -> np.ndarray:
        if isinstance(view, np.ndarray):
            return np.array(view, copy=True)
        if view.size == 0:
            return np.empty(view.shape, view.dtype)
        stage = self._stage(view, view.dtype)
        view.copy_to_host(stage, stream=self.stream)
        self.stream.synchronize()
        return stage.copy()

    def synchronize(self) -> None:
        self.stream.synchronize()

    # -- helpers for kernels --------------------------------------------------------------------------
    def upload(self, array: np.ndarray):
        """A device copy of a host array (weights, tables), made once per array."""
        got = self._uploaded.get(id(array))
        if got is None:
            with self.activate():
                got = cuda.to_device(np.ascontiguousarray(array), stream=self.stream)
            self._uploaded[id(array)] = (got, array)  # keep the host array alive so its id stays unique
            self.weights_bytes += int(array.nbytes)
            return got
        return got[0]

    def refuse(self, node: Node, why: str) -> None:
        err = UnsupportedOpError(node.op_type, node.name, node.where())
        err.args = (f"{node.where()}: node {node.name!r}: {why}; the model cannot run on {self.name} "
                    "(no silent CPU fallback: use device='cpu')",)
        raise err

    @property
    def memory_used_bytes(self) -> int:
        """Device bytes this instance allocated: arena, workspace and uploaded weights/tables."""
        return self.arena_bytes + self.weights_bytes

    def device_memory(self) -> tuple[int, int] | None:
        """(used, total) bytes of the whole device from the driver; None under the simulator."""
        if SIM:
            return None
        with self.activate():
            free, total = cuda.current_context().get_memory_info()
        return int(total - free), int(total)

    def _stage(self, view, dtype) -> np.ndarray:
        """The pinned host buffer for one arena slot (keyed by its device address), grown on demand."""
        key, n = _address(view), int(view.size)
        buf = self._pinned.get(key)
        if buf is None or buf.size < n or buf.dtype != dtype:
            with self.activate():
                buf = cuda.pinned_array(n, dtype=dtype)
            self._pinned[key] = buf
        return buf[:n].reshape(view.shape)

