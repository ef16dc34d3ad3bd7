"""merge_transposes: Transpose -> reshape -> Transpose becomes one Transpose between views and moves every element
where the two copies did (numpy's transposes and reshapes as the reference); chains it cannot write so stay."""

from __future__ import annotations

import numpy as np
import pytest

from engine.ir import Graph
from engine.passes.infer_shapes import infer_shapes
from engine.passes.merge_transposes import compose, merge_transposes
from engine.runtime.model import Model

RNG = np.random.default_rng(5)


def chain(x_shape, p1, mid, p2, middle="Reshape", expose=False):
    g = Graph()
    x = g.value("x", x_shape, np.float32)
    g.inputs = [x]
    a = g.add_node("Transpose", [x], params={"perm": list(p1)}).outputs[0]
    params = {"shape": list(mid)} if middle == "Reshape" else {"axis": 1}
    b = g.add_node(middle, [a], params=params).outputs[0]
    y = g.add_node("Transpose", [b], params={"perm": list(p2)}).outputs[0]
    y.name = "y"
    g.outputs = [y, a] if expose else [y]
    return infer_shapes(g)


def run(g: Graph, x: np.ndarray) -> np.ndarray:
    return Model(g, "test").instance().run({"x": x})["y"]


@pytest.mark.parametrize("x_shape,p1,mid,p2", [
    ((1024, 2, 16, 2), (0, 2, 1, 3), (1, 64, 256, 4), (0, 3, 2, 1)),  # MobileViT's unfold
    ((1, 4, 256, 64), (0, 3, 2, 1), (1024, 16, 2, 2), (0, 2, 1, 3)),  # ... and fold
    ((2, 3, 4), (2, 0, 1), (4, 6), (1, 0)),  # the permutations cancel: reshapes only
    ((3, 4, 5), (1, 0, 2), (4, 3, 5), (2, 0, 1)),  # no reshape at all
    ((2, 1, 6), (2, 0, 1), (3, 2, 2, 1), (1, 3, 0, 2)),  # size-1 axes on both sides
])
def test_one_transpose_moves_what_two_did(x_shape, p1, mid, p2):
    g = chain(x_shape, p1, mid, p2)
    merge_transposes(g)
    g.validate()
    assert [n.op_type for n in g.nodes].count("Transpose") <= 1
    x = RNG.standard_normal(x_shape).astype(np.float32)
    want = x.transpose(p1).reshape(mid).transpose(p2)
    np.testing.assert_array_equal(run(infer_shapes(g), x), want)


def test_random_chains_compose_exactly():
    done = 0
    for _ in range(300):
        rank = int(RNG.integers(1, 5))
        x_shape = tuple(int(d) for d in RNG.choice([1, 2, 3, 4, 6], rank))
        p1 = [int(a) for a in RNG.permutation(rank)]
        factors = []
        for d in (x_shape[a] for a in p1):
            factors += [2, d // 2] if d in (4, 6) and RNG.random() < 0.5 else [d]
        mid, i = [], 0
        while i < len(factors):
            k = int(RNG.integers(1, 3))
            mid.append(int(np.prod(factors[i:i + k])))
            i += k
        p2 = [int(a) for a in RNG.permutation(len(mid))]
        plan = compose(x_shape, p1, tuple(mid), p2)
        if plan is None:
            continue
        x = RNG.standard_normal(x_shape)
        want = x.transpose(p1).reshape(mid).transpose(p2)
        np.testing.assert_array_equal(x.reshape(plan[0]).transpose(plan[1]).reshape(want.shape), want)
        done += 1
    assert done > 200


@pytest.mark.parametrize("case", ["boundaries", "exposed", "dynamic", "not_a_reshape"])
def test_chains_it_cannot_write_stay(case):
    if case == "boundaries":  # 6x4 seen as 4x6: an axis boundary inside another axis, not at a divisor
        g = chain((4, 6), (1, 0), (4, 6), (1, 0))
    elif case == "exposed":
        g = chain((2, 3, 4), (1, 0, 2), (3, 8), (1, 0), expose=True)
    elif case == "dynamic":
        g = chain((2, 3, 4), (1, 0, 2), (3, 8), (1, 0))
        g.nodes[0].inputs[0].shape = (-1, 3, 4)
    else:  # Softmax between the transposes is not a view
        g = chain((2, 3, 4), (1, 0, 2), (3, 2, 4), (2, 1, 0), middle="Softmax")
    before = [(n.op_type, dict(n.params)) for n in g.nodes]
    merge_transposes(g)
    assert [(n.op_type, dict(n.params)) for n in g.nodes] == before
