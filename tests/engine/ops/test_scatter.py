"""SliceAssign and IndexPut: references against plain numpy written out by hand, shape inference refusals, the CPU
kernels against the references (in place and not), and aliasing through the runtime: a write never changes a
value another node still reads."""

from __future__ import annotations

import numpy as np
import pytest
from op_harness import check_kernel, infer, make_node, reference

from engine.errors import ShapeError
from engine.ir import Graph
from engine.runtime.model import Model

X = np.arange(24, dtype=np.float32).reshape(4, 6)


def _assign(**params):
    return make_node("SliceAssign", 2, params={"drop_axes": [], **params})


def test_slice_assign_writes_the_region_only():
    node = _assign(starts=[1, 0], ends=[3, 2147483647], axes=[0, 1], steps=[1, 2])
    (out,) = reference(node, [X, np.float32(-1)])
    want = X.copy()
    want[1:3, ::2] = -1
    np.testing.assert_array_equal(out, want)
    assert np.array_equal(X, np.arange(24, dtype=np.float32).reshape(4, 6))  # input 0 is not changed


def test_slice_assign_select_drops_the_axis_and_counts_from_the_end():
    node = _assign(starts=[-1], ends=[2147483647], axes=[1], steps=[1], drop_axes=[1])
    src = np.array([10, 20, 30, 40], np.float32)  # x[:, -1] = src: src has the region's shape (4,)
    (out,) = reference(node, [X, src])
    want = X.copy()
    want[:, 5] = src
    np.testing.assert_array_equal(out, want)


def test_slice_assign_casts_the_source_to_the_target_dtype():
    ids = np.zeros((2, 3), np.int64)
    (out,) = reference(_assign(starts=[0], ends=[2], axes=[1], steps=[1]), [ids, np.array([[1.7, -2.9]], np.float32)])
    np.testing.assert_array_equal(out, [[1, -2, 0], [1, -2, 0]])  # truncated toward zero, as torch's copy_
    assert out.dtype == np.int64


def test_slice_assign_whole_tensor_is_copy():
    (out,) = reference(_assign(starts=[], ends=[], axes=[], steps=[]), [X, X[:1] * 2])
    np.testing.assert_array_equal(out, np.broadcast_to(X[:1] * 2, X.shape))


@pytest.mark.parametrize("src_shape", [(3, 6), (2, 4), (2, 2, 6)])
def test_slice_assign_refuses_a_source_of_another_shape(src_shape):
    node = _assign(starts=[0], ends=[2], axes=[0], steps=[1])
    with pytest.raises(ShapeError, match="does not fit the written region"):
        infer(node, [X, np.zeros(src_shape, np.float32)])


def test_slice_assign_refuses_a_select_out_of_range():
    with pytest.raises(ShapeError, match="out of range"):
        infer(_assign(starts=[6], ends=[7], axes=[1], steps=[1], drop_axes=[1]), [X, np.zeros(4, np.float32)])


def test_index_put_rows_mask_and_accumulate():
    idx = np.array([0, 2, 0], np.int64)
    node = make_node("IndexPut", 3, params={"accumulate": False})
    (out,) = reference(node, [X, np.float32(-1), np.array([1, 3], np.int64)])
    want = X.copy()
    want[[1, 3]] = -1
    np.testing.assert_array_equal(out, want)
    acc = make_node("IndexPut", 3, params={"accumulate": True})
    (out,) = reference(acc, [X, np.ones((3, 6), np.float32), idx])
    want = X.copy()
    want[0] += 2  # a repeated index adds twice
    want[2] += 1
    np.testing.assert_array_equal(out, want)
    mask = X > 20
    (out,) = reference(node, [X, np.float32(0.5), mask])
    np.testing.assert_array_equal(out, np.where(mask, 0.5, X))


def test_index_put_two_index_tensors_pick_elements():
    node = make_node("IndexPut", 4, params={"accumulate": False})
    (out,) = reference(node, [X, np.float32(7), np.array([0, 3], np.int64), np.array([5, 1], np.int64)])
    want = X.copy()
    want[0, 5] = want[3, 1] = 7
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("indices, values, match", [
    ([np.array([0.0, 1.0], np.float32)], np.float32(1), "integer tensors or one bool mask"),
    ([np.ones((4, 6), np.bool_), np.array([0], np.int64)], np.float32(1), "integer tensors or one bool mask"),
    ([np.ones((6,), np.bool_)], np.float32(1), "does not match the leading dims"),
    ([np.array([0, 1], np.int64)], np.zeros((3, 6), np.float32), "do not broadcast"),
    ([np.array([0, 1], np.uint8)], np.float32(1), "integer tensors or one bool mask"),
])
def test_index_put_refuses_what_torch_refuses(indices, values, match):
    node = make_node("IndexPut", 2 + len(indices), params={"accumulate": False})
    with pytest.raises(ShapeError, match=match):
        infer(node, [X, values, *indices])


def test_index_put_out_of_range_index_is_an_error_not_a_wrap():
    node = make_node("IndexPut", 3, params={"accumulate": False})
    with pytest.raises(ShapeError, match="out of range"):
        reference(node, [X, np.float32(1), np.array([4], np.int64)])


@pytest.mark.parametrize("inplace", [False, True])
def test_kernels_match_the_references(inplace):
    check_kernel(_assign(starts=[1, 0], ends=[3, 5], axes=[0, 1], steps=[1, 2], drop_axes=[]),
                 [X, np.full((2, 3), 9, np.float32)], inplace=inplace)
    check_kernel(_assign(starts=[2], ends=[3], axes=[0], steps=[1], drop_axes=[0]), [X, X[0]], inplace=inplace)
    check_kernel(make_node("IndexPut", 3, params={"accumulate": True}),
                 [X, np.ones((2, 6), np.float32), np.array([1, 1], np.int64)], inplace=inplace)
    check_kernel(make_node("Full", 1, params={"value": -2.5, "dtype": "float32"}), [np.array([3, 2], np.int64)])


def _write_graph() -> Graph:
    """x -> Relu -> a; b = Reshape(a) (a view of a's buffer); c = SliceAssign(b, 0 at row 0); outputs c and
    Neg(a), which runs after the write: it must see a unchanged although the write could have been in place."""
    g = Graph()
    x = g.value("x", (2, 6), np.float32)
    g.inputs = [x]
    a = g.add_node("Relu", [x], name="relu").outputs[0]
    b = g.add_node("Reshape", [a], name="view", params={"shape": [3, 4]}).outputs[0]
    zero = g.const(np.float32(0), "zero")
    c = g.add_node("SliceAssign", [b, zero], name="write", params={
        "starts": [0], "ends": [1], "axes": [0], "steps": [1], "drop_axes": []}).outputs[0]
    n = g.add_node("Neg", [a], name="neg").outputs[0]
    c.name, n.name = "c", "n"
    g.outputs = [c, n]
    return g


def test_a_write_never_changes_a_value_read_afterwards():
    x = np.arange(1, 13, dtype=np.float32).reshape(2, 6)
    out = Model(_write_graph(), "write").instance().run({"x": x})
    want = x.reshape(3, 4).copy()
    want[0] = 0
    np.testing.assert_array_equal(out["c"], want)
    np.testing.assert_array_equal(out["n"], -x)


def test_a_write_is_in_place_when_nothing_reads_its_target_afterwards():
    g = _write_graph()
    g.outputs = g.outputs[:1]
    g.remove_node(next(n for n in g.nodes if n.op_type == "Neg"))
    inst = Model(g, "write").instance()
    x = np.arange(1, 13, dtype=np.float32).reshape(2, 6)
    want = x.reshape(3, 4).copy()
    want[0] = 0
    np.testing.assert_array_equal(inst.run({"x": x})["c"], want)
    (target,) = [n.inputs[0] for n in g.nodes if n.op_type == "SliceAssign"]
    assert [(k.name, v) for k, v in inst.memory_plan.inplace.items()] == [("c", target)]


def _scatter_elements_loops(x, idx, upd, axis, add):
    """ONNX ScatterElements, element by element in index order."""
    out = x.copy()
    for pos in np.ndindex(*idx.shape):
        at = list(pos)
        at[axis] = int(idx[pos]) % x.shape[axis]
        if add:
            out[tuple(at)] += upd[pos]
        else:
            out[tuple(at)] = upd[pos]
    return out


@pytest.mark.parametrize("axis, reduction", [(0, "none"), (1, "none"), (-1, "add"), (0, "add")])
def test_scatter_elements_reference_and_kernel_follow_onnxs_loops(axis, reduction):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((4, 5, 3)).astype(np.float32)
    idx = rng.integers(-x.shape[axis], x.shape[axis], (3, 4, 2)).astype(np.int32)  # repeats included
    upd = rng.standard_normal(idx.shape).astype(np.float32)
    node = make_node("ScatterElements", 3, params={"axis": axis, "reduction": reduction})
    (out,) = reference(node, [x, idx, upd])
    want = _scatter_elements_loops(x, idx, upd, axis, reduction == "add")
    np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-6)  # repeated positions: the last write (TNN's loop)
    check_kernel(node, [x, idx, upd])


def test_scatter_elements_repeated_positions_keep_the_last_write():
    x = np.zeros((3,), np.float32)
    node = make_node("ScatterElements", 3, params={"axis": 0})
    (out,) = reference(node, [x, np.array([1, 1, 1], np.int32), np.array([1, 2, 3], np.float32)])
    np.testing.assert_array_equal(out, [0, 3, 0])


def test_scatter_elements_refusals_name_the_node():
    x = np.zeros((3, 4), np.float32)
    node = make_node("ScatterElements", 3, params={"axis": 1})
    with pytest.raises(ShapeError, match="one shape"):
        infer(node, [x, np.zeros((2, 2), np.int32), np.zeros((2, 3), np.float32)])
    with pytest.raises(ShapeError, match="larger than x"):
        infer(node, [x, np.zeros((4, 2), np.int32), np.zeros((4, 2), np.float32)])
    with pytest.raises(ShapeError, match="integers"):
        infer(node, [x, np.zeros((2, 2), np.float32), np.zeros((2, 2), np.float32)])
    with pytest.raises(ShapeError, match="out of range"):
        reference(node, [x, np.full((2, 2), 4, np.int32), np.zeros((2, 2), np.float32)])
    with pytest.raises(ShapeError, match="reduction"):
        infer(make_node("ScatterElements", 3, params={"reduction": "mul"}),
              [x, np.zeros((2, 2), np.int32), np.zeros((2, 2), np.float32)])
