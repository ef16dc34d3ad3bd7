"""Outputs whose size depends on the data (NonZero, NonMaxSuppression): the arena holds their upper bound, each
run gives the nodes downstream the actual size, graph outputs come back at it; a consumer whose shape could not
follow such a size is refused at load, naming the op, the node and its file and line."""

from __future__ import annotations

import numpy as np
import pytest

from engine.errors import UnsupportedOpError
from engine.ir import Graph
from engine.passes.pipeline import run_pipeline
from engine.runtime.model import Model


def nonzero_graph() -> Graph:
    """x (-1, 3) -> NonZero -> Transpose -> Cast float -> + 1 -> y; Gather rows of x at the row indices -> rows;
    the NonZero indices themselves -> idx."""
    g = Graph()
    x = g.value("x", (-1, 3), np.float32)
    g.inputs = [x]
    nz = g.add_node("NonZero", [x], name="nz", source="m:1").outputs[0]
    t = g.add_node("Transpose", [nz], name="tr", params={"perm": [1, 0]}, source="m:2").outputs[0]
    c = g.add_node("Cast", [t], name="cast", params={"to": "float32"}, source="m:3").outputs[0]
    y = g.add_node("Add", [c, g.const(np.float32(1))], name="add", source="m:4").outputs[0]
    row = g.add_node("Gather", [nz, g.const(np.int64(0))], name="row", params={"axis": 0}, source="m:5").outputs[0]
    rows = g.add_node("Gather", [x, row], name="rows", params={"axis": 0}, source="m:6").outputs[0]
    y.name, nz.name, rows.name = "y", "idx", "rows"
    g.outputs = [y, nz, rows]
    return run_pipeline(g)


def test_downstream_nodes_take_the_actual_extent_per_call():
    model = Model(nonzero_graph(), "m")
    assert {s.name: s.shape for s in model.outputs} == {"y": (-1, 2), "idx": (2, -1), "rows": (-1, 3)}
    assert sorted(model.data_dependent_outputs) == ["idx", "rows", "y"]
    inst = model.instance(max_shapes={"x": (4, 3)})
    arena, arena_bytes = inst.arena, inst.memory_plan.arena_bytes
    for x in (np.array([[0, 1, 0], [2, 0, 0]], np.float32), np.zeros((3, 3), np.float32),
              np.eye(4, 3, dtype=np.float32), np.ones((4, 3), np.float32), np.array([[0, 0, 5]], np.float32)):
        out = inst.run({"x": x})
        want = np.stack(np.nonzero(x))
        np.testing.assert_array_equal(out["idx"], want)
        np.testing.assert_array_equal(out["y"], want.T.astype(np.float32) + 1)
        np.testing.assert_array_equal(out["rows"], x[want[0]])
    assert inst.arena is arena and inst.memory_plan.arena_bytes == arena_bytes  # never reallocated


def test_a_second_data_dependent_op_downstream():
    """NonZero of the NonZero indices' row 1 (the column of each non-zero element) + NMS on the side."""
    g = Graph()
    x = g.value("x", (3, 4), np.float32)
    boxes, scores = g.value("boxes", (1, 5, 4), np.float32), g.value("scores", (1, 2, 5), np.float32)
    g.inputs = [x, boxes, scores]
    nz = g.add_node("NonZero", [x], name="nz").outputs[0]
    col = g.add_node("Gather", [nz, g.const(np.int64(1))], name="col", params={"axis": 0}).outputs[0]
    nz2 = g.add_node("NonZero", [col], name="nz2").outputs[0]
    kept = g.add_node("NonMaxSuppression", [boxes, scores], name="nms",
                      params={"max_output_boxes_per_class": 2, "iou_threshold": 0.5, "score_threshold": 0.1}).outputs[0]
    nz2.name, kept.name = "nz2", "kept"
    g.outputs = [nz2, kept]
    inst = Model(run_pipeline(g), "m").instance()
    rng = np.random.default_rng(5)
    for density in (0.0, 0.4, 1.0):
        xv = np.where(rng.random((3, 4)) < density, 1, 0).astype(np.float32)
        b = np.array([[[0, 0, 1, 1], [0, 0.1, 1, 1.1], [0, 5, 1, 6], [0, 9, 1, 10], [0, 5.1, 1, 6.1]]], np.float32)
        s = (rng.random((1, 2, 5)) * density).astype(np.float32)
        out = inst.run({"x": xv, "boxes": b, "scores": s})
        np.testing.assert_array_equal(out["nz2"], np.stack(np.nonzero(np.nonzero(xv)[1])))
        assert out["kept"].shape[1] == 3 and out["kept"].shape[0] <= 4
        for row in out["kept"]:  # every kept box scores above the threshold
            assert s[row[0], row[1], row[2]] > np.float32(0.1)


@pytest.mark.parametrize("op, params, why", [
    ("Shape", {"start": 0, "end": None}, "computes at load from the upper bound"),
    ("Softmax", {"axis": 0}, "cannot follow a size known only at run time"),
    ("Reshape", {"shape": [12]}, "cannot take every size it may have at run time"),
    ("Squeeze", {"axes": [1]}, "cannot take every size it may have at run time"),
    ("Expand", {"shape": [2, 6]}, "cannot follow a size known only at run time"),
])
def test_a_consumer_that_cannot_follow_is_refused_at_load(op, params, why):
    g = Graph()
    x = g.value("x", (2, 3), np.float32)
    g.inputs = [x]
    nz = g.add_node("NonZero", [x], name="nz", source="m.pnnx.param:3").outputs[0]
    c = g.add_node("Cast", [nz], name="cast", params={"to": "float32"}, source="m.pnnx.param:4").outputs[0]
    g.outputs = [g.add_node(op, [c], name="bad", params=params, source="m.pnnx.param:5").outputs[0]]
    with pytest.raises(UnsupportedOpError, match=why) as e:
        Model(run_pipeline(g), "m")
    assert f"m.pnnx.param:5: unsupported op '{op}" in str(e.value) and "node 'bad'" in str(e.value)


def _masked_rows(g: Graph, x, keep, tag: str):
    """x[keep] as the pnnx lowering of a bool-mask index emits it: NonZero of the mask, its row 0, Index."""
    nz = g.add_node("NonZero", [keep], name=tag + "nz", source=f"m:{tag}1").outputs[0]
    row = g.add_node("Gather", [nz, g.const(np.int64(0))], name=tag + "row", params={"axis": 0},
                     source=f"m:{tag}2").outputs[0]
    return g.add_node("Index", [x, row], name=tag + "ix", params={"dims": [0]}, source=f"m:{tag}3").outputs[0]


def test_one_mask_indexing_two_tensors_is_one_nonzero():
    """torch's boxes[keep] * scores[keep][:, None]: two NonZero nodes of the same mask become one, so the two
    operands of the product have one size by construction (they reported theirs separately before)."""
    g = Graph()
    boxes, scores = g.value("boxes", (8, 4), np.float32), g.value("scores", (8,), np.float32)
    g.inputs = [boxes, scores]
    keep = g.add_node("Greater", [scores, g.const(np.float32(0.5))], name="gt").outputs[0]
    b, s = _masked_rows(g, boxes, keep, "b"), _masked_rows(g, scores, keep, "s")
    s1 = g.add_node("Unsqueeze", [s], name="u", params={"axes": [1]}).outputs[0]
    y = g.add_node("Mul", [b, s1], name="mul").outputs[0]
    y.name = "y"
    g.outputs = [y]
    graph = run_pipeline(g)
    assert [n.op_type for n in graph.nodes].count("NonZero") == 1
    inst = Model(graph, "m").instance()
    rng = np.random.default_rng(1)
    for _ in range(6):
        bx, sc = rng.random((8, 4), dtype=np.float32), rng.random(8, dtype=np.float32)
        want = bx[sc > 0.5] * sc[sc > 0.5][:, None]
        np.testing.assert_array_equal(inst.run({"boxes": bx, "scores": sc})["y"], want)


def test_sizes_of_two_data_dependent_ops_meeting_are_refused_at_load():
    """Two masks: their counts can differ, which only a run would show; the Add is refused at load (it used to
    load, then fail nearly every request)."""
    g = Graph()
    x, m1, m2 = g.value("x", (6,), np.float32), g.value("m1", (6,), np.bool_), g.value("m2", (6,), np.bool_)
    g.inputs = [x, m1, m2]
    a, b = _masked_rows(g, x, m1, "a"), _masked_rows(g, x, m2, "b")
    y = g.add_node("Add", [a, b], name="add", source="m:9").outputs[0]
    y.name = "y"
    g.outputs = [y]
    with pytest.raises(UnsupportedOpError, match="combines values whose sizes come from different") as info:
        Model(run_pipeline(g), "m").instance()
    assert "NonZero 'anz'" in str(info.value) and "NonZero 'bnz'" in str(info.value)
    assert "m:9" in str(info.value)


def _two_masks() -> tuple[Graph, object, object]:
    g = Graph()
    x, m1, m2 = g.value("x", (6, 2), np.float32), g.value("m1", (6,), np.bool_), g.value("m2", (6,), np.bool_)
    g.inputs = [x, m1, m2]
    return g, _masked_rows(g, x, m1, "a"), _masked_rows(g, x, m2, "b")


def test_a_concat_along_the_kept_rows_of_two_masks_adds_their_sizes():
    g, a, b = _two_masks()
    y = g.add_node("Concat", [a, b], name="cat", params={"axis": 0}).outputs[0]
    total = g.add_node("ReduceSum", [y], name="sum", params={"axes": [0], "keepdims": False}).outputs[0]
    y.name, total.name = "y", "total"
    g.outputs = [y, total]
    model = Model(run_pipeline(g), "m")
    assert {s.name: s.shape for s in model.outputs} == {"y": (-1, 2), "total": (2,)}
    inst = model.instance()
    rng = np.random.default_rng(3)
    x = rng.standard_normal((6, 2)).astype(np.float32)
    for m1, m2 in ((rng.random(6) < 0.5, rng.random(6) < 0.5), (np.zeros(6, bool), np.zeros(6, bool)),
                   (np.ones(6, bool), np.zeros(6, bool)), (np.ones(6, bool), np.ones(6, bool))):
        out = inst.run({"x": x, "m1": m1, "m2": m2})
        want = np.concatenate([x[m1], x[m2]])
        np.testing.assert_array_equal(out["y"], want)
        np.testing.assert_allclose(out["total"], want.sum(0, dtype=np.float64), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("axis, meet", [(1, False), (0, True)])
def test_sizes_of_two_masks_that_must_agree_are_refused(axis, meet):
    """A Concat along the other axis needs equal counts; the sum a + b of a Concat along the rows cannot be
    compared with a alone: both only at run time."""
    g, a, b = _two_masks()
    y = g.add_node("Concat", [a, b], name="cat", params={"axis": axis}, source="m:7").outputs[0]
    if meet:
        y = g.add_node("Add", [y, a], name="add", source="m:8").outputs[0]
    y.name = "y"
    g.outputs = [y]
    with pytest.raises(UnsupportedOpError, match="combines values whose sizes come from different") as info:
        Model(run_pipeline(g), "m").instance()
    assert ("m:8" if meet else "m:7") in str(info.value)


def test_chunks_of_the_kept_rows_are_refused():
    """torch.chunk as a dynamic export lowers it (Split without sizes): torch gives fewer pieces when few rows are
    kept, a Split its fixed number; chunks along another axis follow."""
    for axis, refused in ((0, True), (1, False)):
        g, a, _ = _two_masks()
        first, second = g.add_node("Split", [a], outputs=2, name="chunk", params={"axis": axis},
                                   source="m:5").outputs
        first.name, second.name = "first", "second"
        g.outputs = [first, second]
        if refused:
            with pytest.raises(UnsupportedOpError, match="chunks along the axis whose size depends") as info:
                Model(run_pipeline(g), "m")
            assert "m:5" in str(info.value)
            continue
        inst = Model(run_pipeline(g), "m").instance()
        x = np.arange(12, dtype=np.float32).reshape(6, 2)
        for m1 in (np.array([1, 0, 1, 1, 0, 0], bool), np.zeros(6, bool)):
            out = inst.run({"x": x, "m1": m1, "m2": m1})
            np.testing.assert_array_equal(out["first"], x[m1][:, :1])
            np.testing.assert_array_equal(out["second"], x[m1][:, 1:])
