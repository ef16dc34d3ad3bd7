"""Graph outputs computed straight into fresh caller-owned arrays (no copy out of the arena) where their storage
allows it; every other output still copied out. Results against plain numpy either way."""

from __future__ import annotations

import numpy as np
import pytest
from toy_ops import _add_kernel

from engine.devices.cpu.kernels import register_kernel
from engine.ir import Graph
from engine.runtime import bind
from engine.runtime.model import Model

pytestmark = pytest.mark.usefixtures("toys")


@pytest.fixture(autouse=True)
def any_size(monkeypatch):
    """The toy graphs' outputs are small: every size takes the direct path here (but in the last test)."""
    monkeypatch.setattr(bind, "DIRECT_MIN_BYTES", 0)
    monkeypatch.setattr(bind, "NATIVE_DIRECT_MIN_BYTES", 0)


def x_in(g: Graph, k: int = 32):
    x = g.value("x", (2, k), np.float32)
    g.inputs = [x]
    return x


def run_twice(g: Graph, names: list[str]):
    """(outputs of a first run, outputs of a second on other data, the instance, its binding)."""
    inst = Model(g, "toy").instance()
    x = np.arange(64, dtype=np.float32).reshape(2, 32) - 7
    first = inst.run({"x": x})
    second = inst.run({"x": -3 * x})
    bound = next(iter(inst._bound.values()))
    for out in (first, second):
        assert sorted(out) == sorted(set(names))
        for a in out.values():
            assert not np.shares_memory(a, inst.arena)
    return x, first, second, bound


def direct_names(g: Graph, bound) -> list[str]:
    return [g.outputs[d.index].name for d in bound.direct]


def tile(x):
    return np.concatenate([x] * 4, axis=-1)


def test_output_read_by_a_later_node_and_its_alias():
    """t = Tile4(x) is an output and, through the alias view r, the input of y = SumLast(r): both direct."""
    g = Graph()
    x = x_in(g)
    t = g.add_node("T_Tile4", [x], name="tile").outputs[0]
    r = g.add_node("T_SplitLast", [t], name="split", params={"parts": 8}).outputs[0]
    y = g.add_node("T_SumLast", [r], name="sum").outputs[0]
    t.name, y.name = "t", "y"
    g.outputs = [t, y]
    xv, first, second, bound = run_twice(g, ["t", "y"])
    assert direct_names(g, bound) == ["t", "y"]
    for data, out in ((xv, first), (-3 * xv, second)):
        np.testing.assert_array_equal(out["t"], tile(data))
        np.testing.assert_allclose(out["y"], tile(data).reshape(2, 8, -1).sum(-1), rtol=1e-6)
    # the binding holds the arena views again, not the caller's arrays
    held = [a for _, ins, outs in bound.calls for a in ins + outs if a is not None]
    assert not any(np.shares_memory(a, out[name]) for a in held for out in (first, second) for name in out)


def test_alias_view_as_the_output():
    g = Graph()
    x = x_in(g)
    t = g.add_node("T_Tile4", [x], name="tile").outputs[0]
    r = g.add_node("T_SplitLast", [t], name="split", params={"parts": 4}).outputs[0]
    r.name = "r"
    g.outputs = [r]
    xv, first, second, bound = run_twice(g, ["r"])
    assert direct_names(g, bound) == ["r"]
    np.testing.assert_array_equal(first["r"], tile(xv).reshape(2, 4, -1))
    np.testing.assert_array_equal(second["r"], tile(-3 * xv).reshape(2, 4, -1))


def test_in_place_partner_is_copied_out():
    """d = Double(t) in place over t: d shares t's storage, so it is copied out as before."""
    g = Graph()
    x = x_in(g)
    t = g.add_node("T_Tile4", [x], name="tile").outputs[0]
    d = g.add_node("T_Double", [t], name="double").outputs[0]
    d.name = "d"
    g.outputs = [d]
    xv, first, second, bound = run_twice(g, ["d"])
    assert bound.direct == [] and g.outputs[0] in bound_inplace(g)
    np.testing.assert_array_equal(first["d"], 2 * tile(xv))
    np.testing.assert_array_equal(second["d"], -6 * tile(xv))


def bound_inplace(g: Graph):
    inst = Model(g, "toy").instance()
    return inst.memory_plan.inplace


def test_outputs_sharing_storage_are_copied_out():
    """An output listed twice, and an output with an alias view of it also an output: separate copies."""
    g = Graph()
    x = x_in(g)
    t = g.add_node("T_Tile4", [x], name="tile").outputs[0]
    r = g.add_node("T_SplitLast", [t], name="split", params={"parts": 4}).outputs[0]
    y = g.add_node("T_Add", [x, x], name="add").outputs[0]
    t.name, r.name, y.name = "t", "r", "y"
    g.outputs = [t, r, y, y]
    xv, first, second, bound = run_twice(g, ["t", "r", "y"])
    assert bound.direct == []
    assert not np.shares_memory(first["t"], first["r"])
    np.testing.assert_array_equal(first["r"], tile(xv).reshape(2, 4, -1))
    np.testing.assert_array_equal(second["t"], tile(-3 * xv))
    np.testing.assert_array_equal(second["y"], -6 * xv)


def test_small_outputs_are_copied_out(monkeypatch):
    """Below DIRECT_MIN_BYTES an output is copied (cheaper than a fresh array for kernels that remember their
    buffers' addresses), unless its kernel writes fresh arrays natively (`writes_fresh`): then from
    NATIVE_DIRECT_MIN_BYTES on."""
    g = Graph()
    x = x_in(g)
    t = g.add_node("T_Tile4", [x], name="tile").outputs[0]  # 2 x 128 floats: 1 KiB
    y = g.add_node("T_Add", [x, x], name="add").outputs[0]  # 256 bytes
    t.name, y.name = "t", "y"
    g.outputs = [t, y]
    monkeypatch.setattr(bind, "DIRECT_MIN_BYTES", 1024)
    monkeypatch.setattr(bind, "NATIVE_DIRECT_MIN_BYTES", 256)
    xv, first, second, bound = run_twice(g, ["t", "y"])
    assert direct_names(g, bound) == ["t"]
    np.testing.assert_array_equal(first["y"], 2 * xv)
    np.testing.assert_array_equal(second["t"], tile(-3 * xv))
    seen = []

    def fresh_add(backends, node, ins):  # T_Add's kernel, saying it writes fresh arrays natively
        run = _add_kernel(backends, node, ins)
        run.writes_fresh = lambda view: seen.append(view.shape) or True
        return run

    register_kernel("T_Add", fresh_add, replace=True)  # the toys fixture removes it after the test
    xv, first, second, bound = run_twice(g, ["t", "y"])
    assert direct_names(g, bound) == ["t", "y"] and seen == [(2, 32)]
    np.testing.assert_array_equal(first["y"], 2 * xv)
    np.testing.assert_array_equal(second["y"], -6 * xv)
    monkeypatch.setattr(bind, "NATIVE_DIRECT_MIN_BYTES", 512)  # 256 bytes: copied whatever the kernel says
    assert direct_names(g, run_twice(g, ["t", "y"])[3]) == ["t"]


def test_varying_names_what_changes_from_run_to_run():
    """Bound.varying, what Device.fuse_calls is told of each call: (inputs, outputs) new each run: ((), ()) for
    arena arrays only, the indices of the inputs that are the caller's arrays (an alias view of one too, at any
    position), those of the outputs that are direct ones (fresh memory each run)."""
    g = Graph()
    x = x_in(g)
    u = g.add_node("T_Tile4", [x], name="tile_x").outputs[0]                       # reads the caller's x
    w = g.add_node("T_Tile4", [u], name="tile_u").outputs[0]                       # arena only
    xs = g.add_node("T_SplitLast", [x], name="view_x", params={"parts": 2}).outputs[0]  # an alias view of x
    v = g.add_node("T_SumLast", [xs], name="sum_view").outputs[0]                  # reads that view
    ws = g.add_node("T_SplitLast", [w], name="view_w", params={"parts": 32}).outputs[0]
    d = g.add_node("T_SumLast", [ws], name="sum_w").outputs[0]                     # arena only, (2, 32)
    a = g.add_node("T_Add", [d, x], name="add").outputs[0]                         # x as its second input
    y = g.add_node("T_SumLast", [a], name="sum").outputs[0]                        # writes a direct output
    t = g.add_node("T_Tile4", [v], name="tile_v").outputs[0]
    z = g.add_node("T_SumLast", [t], name="sum_v").outputs[0]
    y.name, z.name = "y", "z"
    g.outputs = [y, z]
    inst = Model(g, "toy").instance()
    inst.run({"x": np.ones((2, 32), np.float32)})
    bound = next(iter(inst._bound.values()))
    got = {node.name: vary for node, vary in zip(bound.call_nodes, bound.varying(), strict=True)}
    assert direct_names(g, bound) == ["y", "z"]
    assert got == {"tile_x": ((0,), ()), "tile_u": ((), ()), "sum_view": ((0,), ()), "sum_w": ((), ()),
                   "add": ((1,), ()), "sum": ((), (0,)), "tile_v": ((), ()), "sum_v": ((), (0,))}
