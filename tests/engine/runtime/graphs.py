"""Hand-built graphs over the toy ops, with their plain-numpy expected outputs."""

from __future__ import annotations

import numpy as np

from engine.ir import Graph


def tile_sum_graph(k: int = 256) -> Graph:
    """x (N, k) -> Tile4 -> Double (in place) -> SplitLast 16 (alias) -> SumLast -> y (N, 16); also z = x + x.

    The activations (N, 4k) dwarf the outputs, which is what the no-allocation test needs.
    """
    g = Graph()
    x = g.value("x", (-1, k), np.float32)
    g.inputs = [x]
    t = g.add_node("T_Tile4", [x], name="tile").outputs[0]
    d = g.add_node("T_Double", [t], name="double").outputs[0]
    r = g.add_node("T_SplitLast", [d], name="split", params={"parts": 16}).outputs[0]
    y = g.add_node("T_SumLast", [r], name="sum").outputs[0]
    z = g.add_node("T_Add", [x, x], name="add").outputs[0]
    y.name, z.name = "y", "z"
    g.outputs = [y, z]
    return g


def tile_sum_expected(x: np.ndarray) -> dict[str, np.ndarray]:
    big = np.concatenate([x] * 4, axis=-1) * 2
    return {"y": big.reshape(x.shape[0], 16, -1).sum(-1), "z": x + x}


def fallback_graph() -> Graph:
    """x (2, 3) -> Neg (reference fallback) -> Double -> y; plus the host-side shape of x as an output."""
    g = Graph()
    x = g.value("x", (2, 3), np.float32)
    g.inputs = [x]
    n = g.add_node("T_Neg", [x], name="neg").outputs[0]
    y = g.add_node("T_Double", [n], name="double").outputs[0]
    s = g.add_node("T_Shape", [x], name="shape").outputs[0]
    y.name, s.name = "y", "s"
    g.outputs = [y, s]
    return g
