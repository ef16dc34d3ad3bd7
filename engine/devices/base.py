"""The device interface the runtime compiles against: where the arena lives and how a node's kernel is built."""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod

import numpy as np

from engine.ir import Node
from engine.memory.arena import Arena
from engine.ops.registry import Kernel, OpDef, TensorInfo


class Device(ABC):
    name: str = ""

    @abstractmethod
    def allocate(self, nbytes: int) -> Arena:
        """The one activation arena (or workspace) of an instance, allocated once."""

    @abstractmethod
    def build_kernel(self, node: Node, op: OpDef, ins: list[TensorInfo]) -> Kernel:
        """A callable fn(inputs, outputs, workspace) for `node`, built once at the instance's max shapes."""

    # Hooks with host-memory defaults; a device whose arena is not host memory (CUDA) overrides them.
    def workspace_bytes(self, node: Node, op: OpDef, ins: list[TensorInfo]) -> int:
        """Scratch bytes this device's kernel for `node` needs at the max shapes."""
        return int(op.workspace(node, ins)) if op.workspace is not None else 0

    def activate(self) -> contextlib.AbstractContextManager:
        """Entered around every run (CUDA: makes the instance's device current on the calling thread)."""
        return contextlib.nullcontext()

    def copy_in(self, view, array: np.ndarray) -> None:
        """Copies a request's input into its arena view."""
        np.copyto(view, array)

    def copy_out(self, view) -> np.ndarray:
        """A caller-owned host copy of an output (an arena view or a host value); waits for the device."""
        return np.array(view, copy=True)

    @property
    def memory_used_bytes(self) -> int | None:
        """Bytes this device object allocated on a device with its own memory (arena, workspace, weights); None
        for host memory."""
        return None

    def device_memory(self) -> tuple[int, int] | None:
        """(used, total) bytes of the whole device from its driver; None where there are no such figures."""
        return None
