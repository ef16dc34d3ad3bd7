"""Graph inputs are read where the caller holds them: no arena slot, no copy unless the kernels need one, and never
written (an in-place or alias op on an input still leaves the caller's array as it was)."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest
from fixture_models import assert_close_to_torch, cases, fixture_names, max_shapes, model_path
from toy_ops import PROBED

import engine
from engine.errors import EngineError
from engine.ir import Graph
from engine.runtime.inputs import SMALL_READ_ONLY
from engine.runtime.model import Model

toys = pytest.mark.usefixtures("toys")


def probe_graph(shape=(2, 6)) -> Graph:
    """x -> T_Probe -> y: the probe records the array its kernel got for x."""
    g = Graph()
    x = g.value("x", shape, np.float32)
    g.inputs = [x]
    y = g.add_node("T_Probe", [x], name="probe").outputs[0]
    y.name = "y"
    g.outputs = [y]
    return g


def run_probe(x: np.ndarray) -> tuple[np.ndarray, int, np.ndarray]:
    """(output, address the kernel read, array the kernel read)."""
    inst = Model(probe_graph(x.shape), "toy").instance()
    assert inst.memory_plan.sizes.keys() == {inst.graph.outputs[0]}  # the input has no arena slot
    out = inst.run({"x": x})["y"]
    address, seen = PROBED[-1]
    return out, address, seen


def values(shape=(2, 6)) -> np.ndarray:
    return np.arange(np.prod(shape), dtype=np.float32).reshape(shape) - 5


@toys
def test_contiguous_input_is_read_in_place():
    x = values()
    out, address, seen = run_probe(x)
    assert address == x.ctypes.data  # no copy
    np.testing.assert_array_equal(out, x)
    assert not np.shares_memory(out, x)  # outputs are the caller's own


@toys
def test_non_contiguous_input_is_copied_dense():
    wide = values((2, 12))
    x = wide[:, ::2]
    out, address, seen = run_probe(x)
    assert seen.flags.c_contiguous and not np.shares_memory(seen, wide)
    np.testing.assert_array_equal(out, x)


@toys
def test_misaligned_input_is_copied_aligned():
    raw = bytearray(12 * 4 + 1)
    x = np.frombuffer(raw, np.float32, count=12, offset=1).reshape(2, 6)
    x[...] = values()
    assert not x.flags.aligned
    out, address, seen = run_probe(x)
    assert seen.flags.aligned and seen.flags.c_contiguous and address != x.ctypes.data
    np.testing.assert_array_equal(out, values())


@toys
def test_read_only_input_is_read_in_place_and_left_as_it_was():
    shape = (64, 128)  # 32 KiB: above SMALL_READ_ONLY
    data = values(shape).tobytes()
    x = np.frombuffer(data, np.float32).reshape(shape)  # a request's bytes: read-only
    assert not x.flags.writeable and x.nbytes >= SMALL_READ_ONLY
    out, address, seen = run_probe(x)
    assert address == x.ctypes.data  # no copy: seen through a writeable view of the same bytes
    assert seen.flags.writeable  # numba's variant for writeable arrays, compiled when the kernel was built
    np.testing.assert_array_equal(out, values(shape))
    assert data == values(shape).tobytes()


@toys
def test_small_read_only_input_is_copied():
    x = np.frombuffer(values().tobytes(), np.float32).reshape(2, 6)
    out, address, seen = run_probe(x)
    assert address != x.ctypes.data and seen.flags.writeable  # cheaper than the view at 48 bytes
    np.testing.assert_array_equal(out, values())


@toys
def test_other_byte_order_is_converted():
    x = values().astype(">f4")
    out, address, seen = run_probe(x)
    assert seen.dtype == np.float32 and seen.dtype.isnative
    np.testing.assert_array_equal(out, values())
    assert out.dtype == np.float32


@toys
def test_an_input_at_the_max_shape_is_checked_as_any_other():
    """The max shape's own requests take a shorter check (inputs.py): another dtype, an array subclass, a
    view of the max shape and a smaller one still get every check and conversion."""
    inst = Model(probe_graph((2, 6)), "toy").instance()
    with pytest.raises(EngineError, match="expected dtype float32, got float64"):
        inst.run({"x": values().astype(np.float64)})
    with pytest.raises(EngineError, match="expected dtype float32, got int32"):
        inst.run({"x": values().astype(np.int32)})
    np.testing.assert_array_equal(inst.run({"x": np.ma.masked_array(values())})["y"], values())
    np.testing.assert_array_equal(inst.run({"x": values((2, 12))[:, ::2]})["y"], values((2, 12))[:, ::2])
    with pytest.raises(EngineError, match="dim 1 is fixed to 6, got 7"):
        inst.run({"x": values((2, 7))})


@toys
def test_input_that_is_also_an_output_comes_back_as_a_copy():
    g = probe_graph()
    g.outputs = [g.inputs[0], *g.outputs]
    inst = Model(g, "toy").instance()
    x = values()
    out = inst.run({"x": x})
    np.testing.assert_array_equal(out["x"], x)
    np.testing.assert_array_equal(out["y"], x)
    assert not np.shares_memory(out["x"], x)


def inplace_graph(through_alias: bool) -> Graph:
    """x [-> T_View (alias)] -> T_Double (in place) -> y, with the alias view also an output when there is one."""
    g = Graph()
    x = g.value("x", (2, 6), np.float32)
    g.inputs = [x]
    src = g.add_node("T_View", [x], name="view").outputs[0] if through_alias else x
    y = g.add_node("T_Double", [src], name="double").outputs[0]
    y.name = "y"
    g.outputs = [y, src] if through_alias else [y]
    return g


@toys
@pytest.mark.parametrize("through_alias", [False, True])
@pytest.mark.parametrize("writeable", [True, False])
def test_inplace_op_never_writes_the_callers_array(through_alias, writeable):
    inst = Model(inplace_graph(through_alias), "toy").instance()
    p = inst.memory_plan
    assert p.inplace == {}  # T_Double would run in place on an arena value; on the caller's array it may not
    assert len(p.sizes) == 1  # only y: the alias view of x is the caller's memory too
    x = values()
    x.flags.writeable = writeable
    for _ in range(2):  # the second run reuses the cached binding
        out = inst.run({"x": x})
        np.testing.assert_array_equal(out["y"], 2 * values())
        np.testing.assert_array_equal(x, values())
        if through_alias:
            np.testing.assert_array_equal(out[inst.graph.outputs[1].name], values())
            assert not np.shares_memory(out[inst.graph.outputs[1].name], x)


@toys
def test_binding_keeps_no_request_alive():
    inst = Model(probe_graph(), "toy").instance()
    x = values()
    inst.run({"x": x})
    PROBED.clear()
    ref = weakref.ref(x)
    del x
    gc.collect()
    assert ref() is None


@toys
def test_each_run_reads_its_own_arrays():
    inst = Model(probe_graph((-1, 6)), "toy").instance(max_shapes={"x": (4, 6)})
    for n in (2, 4, 2, 1):
        x = values((n, 6)) * n
        assert inst.run({"x": x})["y"].tolist() == x.tolist()
        assert PROBED[-1][0] == x.ctypes.data


@pytest.mark.parametrize("name", fixture_names())
def test_fixture_models_read_only_inputs_untouched(name):
    """Every kernel the fixtures use reads its graph inputs and never writes them: requests' bytes come in
    read-only and are bound in place (the fixtures' image inputs are above SMALL_READ_ONLY)."""
    inst = engine.load(model_path(name)).instance(max_shapes=max_shapes(name))
    for feeds, want in cases(name):
        raw = {k: a.astype(a.dtype.newbyteorder("<")).tobytes() for k, a in feeds.items()}
        read_only = {k: np.frombuffer(raw[k], feeds[k].dtype.newbyteorder("<")).reshape(a.shape)
                     for k, a in feeds.items()}
        assert_close_to_torch(inst.run(read_only), want)
        assert {k: a.tobytes() for k, a in read_only.items()} == {k: a.tobytes() for k, a in feeds.items()}
