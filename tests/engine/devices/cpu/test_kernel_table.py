"""The CPU kernel table: which ops have a kernel (every one but the documented reference fallbacks), the CPU's
private blocked-layout, NHWC int8, packed-attention and matmul-affine ops, and the registration a plugin uses
(engine.ops.register + register_kernel)."""

from __future__ import annotations

import numpy as np
import pytest

from engine.devices.cpu import KERNELS, CpuDevice, register_kernel
from engine.devices.cpu.device import PRIVATE_OPS
from engine.ir import Graph
from engine.ops import OPS, OpDef, TensorInfo, register
from engine.runtime.model import Model

# Ops that run their numpy reference on the CPU (kernels.py says why): rare, aliases that are views, or cheap ops
# whose vectorised numpy reference is their kernel for now.
REFERENCE_ONLY = {"Expression", "Reshape", "Flatten", "Squeeze", "Unsqueeze",
                  "GatherElements", "RepeatInterleave", "Trilu", "TopK", "Sort", "CumSum", "ReduceVar", "Range",
                  "DetectionOutput"}
BLOCKED_LAYOUT = {"ToBlocked", "ToPlain", "ConvBlocked", "GlobalPoolBlocked", "MaxPoolBlocked", "BroadcastBlocked",
                  "RegroupBlocked"}
INT8_NHWC = {"Int8ConvNhwc", "Int8QuantizeNhwc", "Int8DequantizeNhwc", "Int8DequantizeToNhwc", "Int8DequantizeMeanNhwc",
             "Int8DequantizeConcatNhwc", "Int8AddNhwc", "Int8PoolNhwc", "Int8ConcatNhwc", "Int8ToNhwc", "Int8ToNchw",
             "Int8UpsampleNhwc"}
FUSED = {"PackedAttention", "MatMulAffine"}


def test_every_shared_op_has_a_kernel_or_is_a_documented_fallback():
    assert set(OPS) - set(KERNELS) == REFERENCE_ONLY


def test_the_blocked_layout_and_int8_layout_ops_are_the_cpus_own():
    private = BLOCKED_LAYOUT | INT8_NHWC | FUSED
    assert set(PRIVATE_OPS) == private and not private & set(OPS)
    assert private <= set(KERNELS)
    device = CpuDevice()
    assert all(device.ops[op] is PRIVATE_OPS[op] for op in private)
    assert device.ops["Conv"] is OPS["Conv"]


def test_registering_twice_is_an_error_unless_replacing():
    with pytest.raises(RuntimeError, match="registered twice"):
        register(OPS["Relu"])
    with pytest.raises(RuntimeError, match="registered twice"):
        register_kernel("Relu", KERNELS["Relu"].build)


@pytest.fixture
def plugin_op():
    """A plugin's op: its meaning in the shared registry and its CPU kernel in the table."""
    def infer(node, ins):
        return [TensorInfo(ins[0].shape, ins[0].dtype)]

    def build(backends, node, ins):
        def run(inputs, outputs, workspace):
            np.add(inputs[0], 1, out=outputs[0])
        return run

    register(OpDef("P_AddOne", infer, lambda node, arrays: [arrays[0] + 1]))
    register_kernel("P_AddOne", build)
    yield
    OPS.pop("P_AddOne")
    KERNELS.pop("P_AddOne")


def test_a_plugin_op_runs_its_registered_kernel(plugin_op):
    g = Graph()
    x = g.value("x", (2, 3), np.float32)
    g.inputs = [x]
    g.outputs = [g.add_node("P_AddOne", [x], name="add_one").outputs[0]]
    inst = Model(g, "plugin").instance()
    out = inst.run({"x": np.zeros((2, 3), np.float32)})
    np.testing.assert_array_equal(next(iter(out.values())), np.ones((2, 3), np.float32))
    assert inst.fallback_nodes == []  # the registered kernel, not the reference
