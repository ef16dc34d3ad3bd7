"""merge_reorders: ToPlain -> reshape -> Transpose and Transpose -> reshape -> ToBlocked on whole blocks become one
Transpose between views, moving every element where the reorder and the transpose did (numpy's reorders and
transposes as the reference); padded blocks and chains without a reorder stay."""

from __future__ import annotations

import numpy as np
import pytest

from engine.devices.cpu.device import PRIVATE_OPS
from engine.devices.cpu.layout.blocked_ops import to_blocked, to_plain
from engine.devices.cpu.layout.merge_reorders import merge_reorders
from engine.ir import Graph
from engine.ops import OPS
from engine.passes.infer_shapes import infer_shapes

RNG = np.random.default_rng(2)
ALL_OPS = {**OPS, **PRIVATE_OPS}


def evaluate(g: Graph, x: np.ndarray) -> np.ndarray:
    """Each node's numpy reference in order."""
    vals = {g.inputs[0].name: x}
    for n in g.nodes:
        outs = ALL_OPS[n.op_type].reference(n, [vals[v.name] for v in n.inputs])
        vals.update({v.name: np.asarray(o) for v, o in zip(n.outputs, outs, strict=True)})
    return vals[g.outputs[0].name]


def v_path(C=32, block=16, heads=4, expose=False):
    """EfficientFormer's v: blocked (1, C/B, 7, 7, B) -> ToPlain -> (1, heads, C/heads, 49) -> Transpose."""
    g = Graph()
    x = g.value("x", (1, -(-C // block), 7, 7, block), np.float32)
    g.inputs = [x]
    p = g.add_node("ToPlain", [x], params={"block": block, "channels": C}).outputs[0]
    r = g.add_node("Reshape", [p], params={"shape": [1, heads, C // heads, 49]}).outputs[0]
    y = g.add_node("Transpose", [r], params={"perm": [0, 1, 3, 2]}).outputs[0]
    y.name = "y"
    g.outputs = [y, p] if expose else [y]
    return with_shapes(g)


def out_path(C=32, block=16, heads=4):
    """... and its output: (1, heads, 49, C/heads) -> Transpose -> (1, C, 7, 7) -> ToBlocked."""
    g = Graph()
    x = g.value("x", (1, heads, 49, C // heads), np.float32)
    g.inputs = [x]
    t = g.add_node("Transpose", [x], params={"perm": [0, 1, 3, 2]}).outputs[0]
    r = g.add_node("Reshape", [t], params={"shape": [1, C, 7, 7]}).outputs[0]
    y = g.add_node("ToBlocked", [r], params={"block": block, "channels": C}).outputs[0]
    y.name = "y"
    g.outputs = [y]
    return with_shapes(g)


def with_shapes(g: Graph) -> Graph:
    return infer_shapes(g, ALL_OPS)


@pytest.mark.parametrize("make,shape", [(v_path, (1, 2, 7, 7, 16)), (out_path, (1, 4, 49, 8))])
def test_reorder_and_transpose_become_one_transpose(make, shape):
    x = RNG.standard_normal(shape).astype(np.float32)
    g = make()
    want = evaluate(g, x)
    merge_reorders(g)
    g.validate()
    kinds = [n.op_type for n in g.nodes]
    assert kinds.count("Transpose") == 1 and not {"ToPlain", "ToBlocked"} & set(kinds)
    np.testing.assert_array_equal(evaluate(g, x), want)


def test_the_references_agree_with_plain_numpy():
    x = RNG.standard_normal((1, 2, 7, 7, 16)).astype(np.float32)
    want = to_plain(x, 32).reshape(1, 4, 8, 49).transpose(0, 1, 3, 2)
    np.testing.assert_array_equal(evaluate(v_path(), x), want)
    y = RNG.standard_normal((1, 4, 49, 8)).astype(np.float32)
    np.testing.assert_array_equal(evaluate(out_path(), y), to_blocked(y.transpose(0, 1, 3, 2).reshape(1, 32, 7, 7), 16))


@pytest.mark.parametrize("make", [
    lambda: v_path(C=24, block=16, heads=4),  # padding lanes in the last block: ToPlain drops them
    lambda: v_path(expose=True),  # the plain value is also a graph output
])
def test_what_it_cannot_merge_stays(make):
    g = make()
    before = [(n.op_type, dict(n.params)) for n in g.nodes]
    merge_reorders(g)
    assert [(n.op_type, dict(n.params)) for n in g.nodes] == before
