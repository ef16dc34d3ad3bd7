"""Instance on hand-built graphs: outputs against plain numpy, shapes below the max, arena reuse."""

from __future__ import annotations

import collections
import logging
import re
import tracemalloc
import zipfile

import numpy as np
import pytest
from graphs import fallback_graph, tile_sum_expected, tile_sum_graph

import engine
from engine.devices import cuda_device_count
from engine.errors import ArenaOverflowError, EngineError, KernelError, ShapeError
from engine.ir import Graph
from engine.runtime.model import Model

pytestmark = pytest.mark.usefixtures("toys")


def make(graph: Graph, max_shapes=None):
    return Model(graph, "toy").instance(max_shapes=max_shapes)


def test_runs_at_max_and_smaller_shapes_in_one_arena():
    inst = make(tile_sum_graph(), {"x": (8, 256)})
    arena, address = inst.arena, inst.arena.ctypes.data
    rng = np.random.default_rng(0)
    for n in (8, 1, 3, 8, 5):
        x = rng.standard_normal((n, 256), dtype=np.float32)
        out = inst.run({"x": x})
        for name, want in tile_sum_expected(x).items():
            np.testing.assert_allclose(out[name], want, rtol=1e-5, atol=1e-5)
    assert inst.arena is arena and inst.arena.ctypes.data == address


def test_outputs_are_owned_by_the_caller():
    inst = make(tile_sum_graph(), {"x": (2, 256)})
    x = np.ones((2, 256), np.float32)
    first = inst.run({"x": x})["z"]
    inst.run({"x": 3 * x})
    np.testing.assert_array_equal(first, 2 * x)
    assert not np.shares_memory(first, inst.arena)


def test_memory_plan_uses_inplace_and_alias():
    inst = make(tile_sum_graph(), {"x": (8, 256)})
    p = inst.memory_plan
    big = 8 * 1024 * 4
    # z, tile/double/split share one slot, y: naive counts tile and double apart, not the alias; the input x is
    # read where the caller holds it, so it has no slot at all
    assert p.naive_bytes == 8 * 256 * 4 + 2 * big + 8 * 16 * 4
    assert inst.graph.inputs[0] not in p.sizes
    assert p.peak_live_bytes <= p.arena_bytes <= 1.05 * p.peak_live_bytes
    assert p.arena_bytes < p.naive_bytes
    assert p.workspace_bytes == 0 and p.weights_bytes == 0
    assert inst.arena.nbytes == p.arena_bytes and inst.arena.ctypes.data % 64 == 0


def test_run_allocates_no_activation_memory():
    inst = make(tile_sum_graph(k=4096), {"x": (8, 4096)})
    assert inst.fallback_nodes == []
    x = np.ones((8, 4096), np.float32)
    inst.run({"x": x})  # binds the call list for this shape
    activation = 8 * 4 * 4096 * 4  # the tiled tensor: 512 KiB
    tracemalloc.start()
    tracemalloc.reset_peak()
    before = tracemalloc.get_traced_memory()[0]
    out = inst.run({"x": x})
    peak = tracemalloc.get_traced_memory()[1] - before
    tracemalloc.stop()
    outputs = sum(a.nbytes for a in out.values())
    assert peak < outputs + activation // 4, f"run allocated {peak} bytes"


def test_reference_fallback_and_host_values():
    inst = make(fallback_graph())
    assert inst.fallback_nodes == ["neg"]
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    out = inst.run({"x": x})
    np.testing.assert_array_equal(out["y"], -2 * x)
    np.testing.assert_array_equal(out["s"], [2, 3])
    # The shape is computed at infer time: never scheduled, never in the arena.
    assert [c.node.name for c in inst._compiled.nodes] == ["neg", "double"]


def test_input_validation_messages():
    inst = make(tile_sum_graph(), {"x": (4, 256)})
    x = np.zeros((2, 256), np.float32)
    with pytest.raises(EngineError, match=r"unknown \['w'\].*missing \['x'\]"):
        inst.run({"w": x})
    filling = collections.defaultdict(lambda: x)  # a mapping that makes up missing keys: still refused
    filling["w"] = x
    with pytest.raises(EngineError, match=r"unknown \['w'\].*missing \['x'\]"):
        inst.run(filling)
    assert list(filling) == ["w"]
    with pytest.raises(EngineError, match=r"unknown \['w'\].*missing \[\]"):
        inst.run({"x": x, "w": x})
    with pytest.raises(EngineError, match="expected dtype float32, got float64"):
        inst.run({"x": x.astype(np.float64)})
    with pytest.raises(ShapeError, match="expected rank 2"):
        inst.run({"x": x[0]})
    with pytest.raises(ShapeError, match="dim 1 is fixed to 256"):
        inst.run({"x": np.zeros((2, 128), np.float32)})
    with pytest.raises(ArenaOverflowError, match="dim 0 is 5, larger than the instance's max 4"):
        inst.run({"x": np.zeros((5, 256), np.float32)})


def test_dynamic_dim_needs_max_shapes():
    with pytest.raises(EngineError, match="pass max_shapes"):
        make(tile_sum_graph())
    with pytest.raises(EngineError, match="unknown inputs"):
        make(tile_sum_graph(), {"nope": (1, 256)})
    with pytest.raises(ShapeError, match="fixed to 256"):
        make(tile_sum_graph(), {"x": (1, 255)})
    with pytest.raises(ShapeError, match="has rank 3"):
        make(tile_sum_graph(), {"x": (1, 1, 256)})


def test_value_growing_below_the_max_shape_is_an_arena_overflow():
    g = Graph()
    x = g.value("x", (-1,), np.float32)
    g.inputs = [x]
    g.outputs = [g.add_node("T_Shrinking", [x], name="odd", source="toy.param:3").outputs[0]]
    inst = make(g, {"x": (8,)})
    assert inst.run({"x": np.ones(8, np.float32)})[g.outputs[0].name].shape == (8,)
    with pytest.raises(ArenaOverflowError, match=r"toy.param:3: value .* of shape \(16,\) needs 64 bytes"):
        inst.run({"x": np.ones(4, np.float32)})


def test_kernel_error_names_node_and_op():
    g = Graph()
    x = g.value("x", (2,), np.float32)
    g.inputs = [x]
    y = g.add_node("T_Boom", [x], name="boom", source="toy.param:7").outputs[0]
    g.outputs = [y]
    inst = make(g)
    with pytest.raises(KernelError, match=r"toy.param:7: kernel of T_Boom node 'boom' failed: ValueError"):
        inst.run({"x": np.zeros(2, np.float32)})


def test_workspace_is_preallocated_once():
    g = Graph()
    x = g.value("x", (3,), np.float32)
    g.inputs = [x]
    g.outputs = [g.add_node("T_Scratch", [x]).outputs[0]]
    inst = make(g)
    ws = inst.workspace
    assert inst.memory_plan.workspace_bytes == 1000 and ws.nbytes == 1000
    np.testing.assert_array_equal(inst.run({"x": np.ones(3, np.float32)})[g.outputs[0].name], 1)
    assert inst.workspace is ws


def test_timings_and_debug_trace(caplog):
    inst = make(tile_sum_graph(), {"x": (2, 256)})
    x = np.ones((2, 256), np.float32)
    inst.run({"x": x})
    assert inst.last_timings["compute_s"] >= 0 and "nodes" not in inst.last_timings
    inst.run({"x": x}, timings=True)
    assert [n for n, _, _ in inst.last_timings["nodes"]] == ["tile", "double", "sum", "add"]
    inst.debug = 1  # ENGINE_DEBUG=1
    with caplog.at_level(logging.DEBUG, logger="engine.runtime"):
        inst.run({"x": x})
    assert "#0 T_Tile4 tile in=[(2, 256)] out=[(2, 1024)] offset=" in caplog.text
    inst.debug = 2
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="engine.runtime"):
        inst.run({"x": x})
    assert "#3 min=2 max=2 mean=2" in caplog.text  # z = x + x


def _cuda_devices() -> int:
    try:
        return cuda_device_count()
    except EngineError:  # numba-cuda not installed
        return 0


def test_cuda_device_is_a_clean_error():
    # without a GPU the device cannot be made; with one, this graph's Tile has no CUDA kernel (and no CPU fallback)
    why = "T_Tile4 has no CUDA kernel" if _cuda_devices() else "CUDA device support is not installed/available"
    with pytest.raises(EngineError, match=why):
        Model(tile_sum_graph(), "toy").instance(device="cuda", max_shapes={"x": (1, 256)})
    with pytest.raises(EngineError, match="unknown device 'tpu'; supported devices: cpu, cuda"):
        Model(tile_sum_graph(), "toy").instance(device="tpu", max_shapes={"x": (1, 256)})


def test_one_thread_at_a_time():
    inst = make(tile_sum_graph(), {"x": (1, 256)})
    inst._lock.acquire()
    try:
        with pytest.raises(EngineError, match="one instance per thread"):
            inst.run({"x": np.ones((1, 256), np.float32)})
    finally:
        inst._lock.release()


@pytest.mark.parametrize("dim", [1_000_000, 4_294_967_296])  # 4 TB of float32; a size numpy refuses
def test_an_arena_larger_than_the_machine_is_refused_naming_the_model(tmp_path, dim):
    """A file's annotated input shape sizes the arena: one beyond this machine's memory is an ArenaOverflowError
    naming the file and the shapes before anything is allocated (it was a bare MemoryError, or numpy's "Maximum
    allowed dimension exceeded")."""
    shape = f"#0=({dim},{dim})f32"
    param = tmp_path / "big.pnnx.param"
    param.write_text(f"7767517\n3 3\npnnx.Input in0 0 1 0 {shape}\nnn.ReLU r 1 1 0 1 {shape} #1=({dim},{dim})f32\n"
                     "pnnx.Output out0 1 0 1\n")
    zipfile.ZipFile(tmp_path / "big.pnnx.bin", "w").close()
    model = engine.load(param)
    with pytest.raises(ArenaOverflowError, match=re.escape(f"big.pnnx.param: max shapes {{'in0': ({dim}, {dim})}}")
                       + ".*more than this machine's memory"):
        model.instance()
