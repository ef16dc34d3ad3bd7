"""The device interface the runtime compiles against.

A device owns:
- `ops`: the op definitions it runs, the shared registry (engine.ops) overlaid with its private ops (the CPU's
  blocked layout); the runtime and shape inference look ops up here;
- `kernels`: its kernel table keyed by op type (engine/devices/<device>/kernels.py);
- `prepare(graph)`: its own rewrite of a loaded graph before compiling (the CPU's layout; identity elsewhere);
- `options`: its settings, read once by the caller and passed in;
and where the arena lives, how a node's kernel and its workspace are built, how data crosses to and from it.
A device whose kernels read host memory (`host_inputs`) reads the graph inputs where the caller holds them; the
others get them copied into their arena (`copy_in`).
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from engine.ir import Graph, Node
from engine.memory.arena import Arena
from engine.ops.registry import OPS, OpDef, TensorInfo

# A built kernel: fn(inputs, outputs, workspace), writing into the preallocated outputs.
Kernel = Callable[[Sequence[np.ndarray], Sequence[np.ndarray], np.ndarray], None]


class Device(ABC):
    name: str = ""
    ops: Mapping[str, OpDef] = OPS
    kernels: Mapping[str, object] = {}
    options: object = None
    host_inputs: bool = True  # kernels read the caller's input arrays in place: no arena slot, no copy-in
    host_outputs: bool = True  # kernels may write a graph output straight into a fresh host array: no copy-out

    def prepare(self, graph: Graph) -> Graph:
        """The graph this device compiles: `graph` itself, or a rewritten copy (never changed in place)."""
        return graph

    @abstractmethod
    def allocate(self, nbytes: int) -> Arena:
        """The one activation arena (or workspace) of an instance, allocated once."""

    @abstractmethod
    def build_kernel(self, node: Node, op: OpDef, ins: list[TensorInfo]) -> Kernel:
        """A callable fn(inputs, outputs, workspace) for `node`, built once at the instance's max shapes."""

    @abstractmethod
    def workspace_bytes(self, node: Node, op: OpDef, ins: list[TensorInfo]) -> int:
        """Scratch bytes this device's kernel for `node` needs at the max shapes."""

    # Hooks with host-memory defaults; a device whose arena is not host memory (CUDA) overrides them.
    def activate(self) -> contextlib.AbstractContextManager:
        """Entered around every run (CUDA: makes the instance's device current on the calling thread)."""
        return contextlib.nullcontext()

    def copy_in(self, view, array: np.ndarray) -> None:
        """Copies a request's input into its arena view (devices without `host_inputs`)."""
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

    def fuse_calls(self, calls: list, nodes: list, varying: list[tuple[tuple[int, ...], tuple[int, ...]]],
                   workspace) -> list | None:
        """After a binding's first run: its call list with runs of calls merged into single calls the device
        runs without Python between them, and parallel to it the index of each entry's first original call
        ([calls, indices]); None to keep the list. `varying[i]`: what of call i changes from run to run
        (Bound.varying: the indices of its inputs and of its outputs that are arrays new each run)."""
        return None
