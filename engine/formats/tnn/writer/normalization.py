"""Writer rules for normalizations: BatchNorm -> BatchNormCxx, InstanceNorm -> InstBatchNormCxx, LayerNorm,
GroupNorm (gamma and beta as constant-map entries), LpNormalize -> Normalize."""

from __future__ import annotations

import numpy as np

from engine.formats.tnn.writer.core import Writer, io_names
from engine.formats.tnn.writer.registry import writes
from engine.ir import Node

F32 = np.float32


@writes("BatchNorm")
def batchnorm(w: Writer, node: Node) -> None:
    x, y = io_names(w, node)
    w.layer("BatchNormCxx", [x], [y], [], [w.raw(node.attrs["scale"]), w.raw(node.attrs["bias"])])


@writes("InstanceNorm")
def instance_norm(w: Writer, node: Node) -> None:
    c = w.shape(node.inputs[0])[1]
    scale = node.attrs.get("weight", np.ones(c, F32))
    bias = node.attrs.get("bias", np.zeros(c, F32))
    x, y = io_names(w, node)
    w.layer("InstBatchNormCxx", [x], [y], [c, float(node.params.get("eps", 1e-5))], [w.raw(scale), w.raw(bias)])


def _affine_inputs(w: Writer, node: Node, shape: tuple[int, ...]) -> list[str]:
    gamma = node.attrs.get("weight", np.ones(shape, F32))
    beta = node.attrs.get("bias", np.zeros(shape, F32))
    return [w.name(node.inputs[0]), w.new_const(np.asarray(gamma, F32), "weight"),
            w.new_const(np.asarray(beta, F32), "bias")]


@writes("LayerNorm")
def layer_norm(w: Writer, node: Node) -> None:
    k = int(node.params.get("normalized_ndim", 1))
    shape = w.shape(node.inputs[0])[-k:]
    w.layer("LayerNorm", _affine_inputs(w, node, shape), [w.name(node.outputs[0])],
            [k, float(node.params.get("eps", 1e-5))])


@writes("GroupNorm")
def group_norm(w: Writer, node: Node) -> None:
    c = w.shape(node.inputs[0])[1]
    w.layer("GroupNorm", _affine_inputs(w, node, (c,)), [w.name(node.outputs[0])],
            [int(node.params["num_groups"]), float(node.params.get("eps", 1e-5))])


@writes("LpNormalize")
def lp_normalize(w: Writer, node: Node) -> None:
    x, y = io_names(w, node)
    axis = int(node.params.get("axis", 1)) % len(w.shape(node.inputs[0]))
    w.layer("Normalize", [x], [y], [0, float(node.params.get("eps", 1e-12)), 0, axis, int(node.params.get("p", 2))])
