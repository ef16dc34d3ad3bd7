"""The device interface the runtime compiles against: where the arena lives and how a node's kernel is built."""

from __future__ import annotations

from abc import ABC, abstractmethod

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
