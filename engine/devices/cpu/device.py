"""The CPU device: a numpy arena; the ops the shared registry has plus its own blocked-layout ops; the kernel table
of kernels.py, else an op's numpy reference; and `prepare`, which puts a graph in the blocked layout where that
pays."""

from __future__ import annotations

from collections import ChainMap

from engine.devices.base import Device, Kernel
from engine.devices.cpu.epilogue import prepare as prepare_passes
from engine.devices.cpu.fused_calls import Varying, fuse
from engine.devices.cpu.int8 import ops as int8_ops
from engine.devices.cpu.int8.rewrite import decide as int8_layout
from engine.devices.cpu.kernel import Backends, reference_kernel
from engine.devices.cpu.kernels import KERNELS
from engine.devices.cpu.layout import blocked_ops, conv_blocked, regroup
from engine.devices.cpu.layout.merge_reorders import merge_reorders
from engine.devices.cpu.layout.rewrite import decide
from engine.devices.cpu.matmul_affine import OPS as MATMUL_AFFINE_OPS
from engine.devices.cpu.matmul_affine import fuse_matmul_affine
from engine.devices.cpu.onednn.blocked import native_block
from engine.devices.cpu.options import CpuOptions
from engine.devices.cpu.packed_attention import OPS as PACKED_ATTENTION_OPS
from engine.devices.cpu.packed_attention import pack_attention
from engine.devices.cpu.threads import running
from engine.ir import Graph, Node
from engine.memory.arena import Arena
from engine.ops import OPS
from engine.ops.registry import OpDef, TensorInfo

# The ops only this device runs, inserted by `prepare`: the blocked layout's (engine/devices/cpu/layout/), the
# NHWC int8 ops (engine/devices/cpu/int8/), the attention on a packed projection (packed_attention.py) and the
# matmul with its scale and offset (matmul_affine.py).
PRIVATE_OPS: dict[str, OpDef] = {**blocked_ops.OPS, **conv_blocked.OPS, **regroup.OPS, **int8_ops.OPS,
                                  **PACKED_ATTENTION_OPS, **MATMUL_AFFINE_OPS}


class CpuDevice(Device):
    name = "cpu"

    def __init__(self, options: CpuOptions | None = None):
        self.options = options if options is not None else CpuOptions()
        self.backends = Backends.from_options(self.options)
        if self.backends.onednn:  # our passes may split as a native region on OpenMP's team: ready before a request
            prepare_passes()
        self.ops = ChainMap(PRIVATE_OPS, OPS)
        self.kernels = KERNELS

    def prepare(self, graph: Graph) -> Graph:
        """A copy whose attentions on a packed qkv projection read it in place (packed_attention.py) and whose
        matmuls take the scale and offset after them (matmul_affine.py); with oneDNN, also int8 activations in
        NHWC between TNN's int8 ops (int8/rewrite.py) and float ones blocked between convolutions
        (layout/rewrite.py) unless NNSERVE_LAYOUT=nchw or it would not pay, a reorder next to a transpose merged
        into it (layout/merge_reorders.py); else the graph itself."""
        graph = fuse_matmul_affine(pack_attention(graph))
        if not self.backends.onednn:
            return graph
        graph = int8_layout(graph)
        if self.options.layout == "nchw":
            return graph
        block = native_block()
        if not block:
            return graph
        laid = decide(graph, block)
        return merge_reorders(laid) if laid is not graph else graph  # the reorders are the copy's own

    def activate(self):
        """Around every run: the `run` wait policy's workers spin while one is in progress (threads.running)."""
        return running()

    def allocate(self, nbytes: int) -> Arena:
        return Arena(nbytes)

    def fuse_calls(self, calls: list, nodes: list, varying: list[Varying], workspace) -> list | None:
        """Runs of oneDNN calls as one native program each (fused_calls.py), unless NNSERVE_NATIVE_CALLS=0."""
        if not (self.backends.onednn and self.options.native_calls):
            return None
        return fuse(calls, nodes, varying, workspace)

    def build_kernel(self, node: Node, op: OpDef, ins: list[TensorInfo]) -> Kernel:
        entry = self.kernels.get(node.op_type)
        if entry is None:
            return reference_kernel(node, op)
        return entry.build(self.backends, node, ins)

    def workspace_bytes(self, node: Node, op: OpDef, ins: list[TensorInfo]) -> int:
        entry = self.kernels.get(node.op_type)
        if entry is None or entry.workspace is None:
            return 0
        return int(entry.workspace(self.backends, node, ins))
