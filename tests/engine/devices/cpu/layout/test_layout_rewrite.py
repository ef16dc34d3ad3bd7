"""The CPU's blocked-layout rewrite (engine/devices/cpu/layout/rewrite.py) on synthetic graphs: which values go
blocked, where reorders land, names kept, the skip rule, and the rewritten graph's numpy references against plain
numpy (no oneDNN needed: the block is an argument)."""

from __future__ import annotations

import numpy as np
import pytest
from np_ref import conv2d

from engine.devices.cpu import CpuDevice
from engine.devices.cpu.layout.rewrite import decide, layout_blocked
from engine.ir import Graph, Value
from engine.passes.infer_shapes import infer_shapes

OPS = CpuDevice().ops  # the shared registry and the CPU's blocked-layout ops

B = 16
rng = np.random.default_rng(7)


def conv(g: Graph, x: Value, o: int, k: int = 3, name: str = "", z: Value | None = None, groups: int = 1,
         act: str | None = None) -> Value:
    c = x.shape[1]
    w = (rng.standard_normal((o, c // groups, k, k)) / np.sqrt(c * k * k)).astype(np.float32)
    params = {"stride": (1, 1), "pads": (k // 2,) * 4, "dilation": (1, 1), "groups": groups, "activation": act}
    ins = [x] if z is None else [x, z]
    out = g.add_node("Conv", ins, name=name or None, params=params,
                     attrs={"weight": w, "bias": rng.standard_normal(o).astype(np.float32)}).outputs[0]
    return _shaped(g, out)


def op(g: Graph, op_type: str, ins: list[Value], **params) -> Value:
    return _shaped(g, g.add_node(op_type, ins, params=params).outputs[0])


def _shaped(g: Graph, v: Value) -> Value:
    infer_shapes(g)
    return v


def graph_with_input(shape=(2, 3, 8, 8)) -> tuple[Graph, Value]:
    g = Graph()
    x = g.value("x", shape, np.float32)
    g.inputs = [x]
    return g, x


def evaluate(g: Graph, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every node's numpy reference in order."""
    env = {v: inputs[v.name] for v in g.inputs}
    for node in g.nodes:
        args = [v.const if v.is_const else env[v] for v in node.inputs]
        env.update(zip(node.outputs, OPS[node.op_type].reference(node, args), strict=True))
    return {v.name: env[v] for v in g.outputs}


def types(g: Graph) -> list[str]:
    return [n.op_type for n in g.nodes]


def check_same(g: Graph, new: Graph, x_shape) -> dict[str, np.ndarray]:
    x = rng.standard_normal(x_shape).astype(np.float32)
    want, got = evaluate(g, {"x": x}), evaluate(new, {"x": x})
    assert list(got) == list(want)
    for k in want:
        assert got[k].shape == want[k].shape
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-5)
    return got


def test_chain_stays_blocked_between_convs_and_matches_numpy():
    g, x = graph_with_input()
    y1 = conv(g, x, 32, name="c1", act="relu")
    y2 = op(g, "Relu", [conv(g, y1, 20, name="c2")])
    y3 = conv(g, y2, 24, k=1, name="c3")
    y3.name = "out"
    g.outputs = [y3]
    new, stats = layout_blocked(g, B)
    assert types(new) == ["ConvBlocked", "ConvBlocked", "Relu", "ConvBlocked"]
    c1, c2, relu, c3 = new.nodes
    assert (c1.params["src_blocked"], c1.params["dst_blocked"]) == (False, True)  # 3 channels: plain src
    assert (c2.params["src_blocked"], c2.params["dst_blocked"]) == (True, True)
    assert (c3.params["src_blocked"], c3.params["dst_blocked"]) == (True, False)  # graph output: plain
    assert c2.outputs[0].shape == (2, 2, 8, 8, 16)  # 20 channels: two blocks, 12 padding lanes
    assert relu.outputs[0].shape == (2, 2, 8, 8, 16)
    assert [v.name for v in new.outputs] == ["out"] and new.outputs[0].shape == (2, 24, 8, 8)
    assert (stats.to_plain, stats.to_blocked, stats.blocked_values, stats.convs) == (0, 0, 3, 3)
    assert g.nodes[0].op_type == "Conv" and g.outputs[0] is y3  # the input graph is untouched
    got = check_same(g, new, (2, 3, 8, 8))
    # Independent check of the chain with plain numpy.
    w = [n.attrs for n in g.nodes if n.op_type == "Conv"]
    x0 = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
    r1 = np.maximum(conv2d(x0, w[0]["weight"], w[0]["bias"], pad=1), 0)
    r2 = np.maximum(conv2d(r1, w[1]["weight"], w[1]["bias"], pad=1), 0)
    r3 = conv2d(r2, w[2]["weight"], w[2]["bias"], pad=0)
    np.testing.assert_allclose(evaluate(new, {"x": x0})["out"], r3, rtol=1e-4, atol=1e-4)
    assert got["out"].dtype == np.float32


def test_residual_is_read_blocked_in_the_output_layout():
    g, x = graph_with_input((1, 16, 6, 6))
    y1 = conv(g, x, 16, name="c1", act="relu")
    y2 = conv(g, y1, 16, name="c2", z=y1, act="relu")  # y = relu(conv(y1) + y1)
    y3 = conv(g, y2, 8, k=1, name="c3")
    g.outputs = [y3]
    new, stats = layout_blocked(g, B)
    assert types(new) == ["ToBlocked", "ConvBlocked", "ConvBlocked", "ConvBlocked"]  # 16 channels in: blocked
    c2 = new.nodes[2]
    assert c2.inputs[0] is c2.inputs[1] and c2.inputs[1].shape == (1, 1, 6, 6, 16)
    assert c2.params["dst_blocked"] and stats.to_blocked == 1
    check_same(g, new, (1, 16, 6, 6))


def test_plain_consumers_share_one_to_plain_and_outputs_keep_names():
    g, x = graph_with_input()
    y1 = conv(g, x, 32, name="c1")
    y1.name = "feat"
    y2 = conv(g, y1, 32, name="c2", act="relu")
    pool = op(g, "MaxPool", [y1], kernel=(2, 2), stride=(2, 2), pads=(0, 0, 0, 0))
    gap = op(g, "GlobalAvgPool", [y1])
    g.outputs = [y2, pool, gap, y1]  # y1 is also a graph output
    new, stats = layout_blocked(g, B)
    to_plain = {n.outputs[0].name: n for n in new.nodes if n.op_type == "ToPlain"}
    assert len(to_plain) == 2 and stats.to_plain == 2
    plain = to_plain["feat"].outputs[0]
    assert plain.shape == (2, 32, 8, 8)  # the output keeps its name, plain
    assert to_plain["feat"].inputs[0].name == "feat.blocked"
    assert {n.op_type for n in plain.consumers} == {"MaxPool"}  # its output is a graph output: it runs plain
    # the global pool runs blocked whatever reads it; its small output is what gets reordered
    gap_node = next(n for n in new.nodes if n.op_type == "GlobalPoolBlocked")
    assert gap_node.inputs[0].name == "feat.blocked" and to_plain[gap.name].inputs[0] is gap_node.outputs[0]
    assert [v.name for v in new.outputs] == [v.name for v in g.outputs]
    check_same(g, new, (2, 3, 8, 8))


def test_agnostic_ops_broadcast_and_concat_stay_blocked():
    g, x = graph_with_input((1, 32, 8, 8))
    y = conv(g, x, 32, name="c1")
    s = op(g, "Sigmoid", [conv(g, op(g, "GlobalAvgPool", [y]), 32, k=1, name="se")])
    scaled = op(g, "Mul", [y, s])  # (1,32,8,8) * (1,32,1,1): SE-style broadcast over H, W
    shifted = op(g, "Add", [scaled, g.const(np.array(0.5, np.float32))])  # a scalar constant operand
    cat = op(g, "Concat", [shifted, conv(g, y, 8, name="c2")], axis=1)  # 32 + 8: only the last is partial
    out = conv(g, cat, 16, name="c3")
    g.outputs = [out]
    new, _ = layout_blocked(g, B)
    by_name = {n.op_type: n for n in new.nodes}
    assert by_name["BroadcastBlocked"].outputs[0].shape == (1, 2, 8, 8, 16)
    assert by_name["BroadcastBlocked"].params == {"op": "Mul"}
    assert by_name["Add"].outputs[0].shape == (1, 2, 8, 8, 16)
    assert by_name["Concat"].outputs[0].shape == (1, 3, 8, 8, 16) and by_name["Concat"].params["axis"] == 1
    assert by_name["Sigmoid"].outputs[0].shape == (1, 2, 1, 1, 16)
    assert by_name["GlobalPoolBlocked"].params == {"mode": "avg"}
    assert [n.op_type for n in new.nodes if n.op_type.startswith("To")] == ["ToBlocked"]
    check_same(g, new, (1, 32, 8, 8))


@pytest.mark.parametrize("axes", [[2, 3], [-1, -2]])
def test_squeeze_excite_mean_over_h_w_runs_as_a_blocked_global_pool(axes):
    """torch.mean(x, (2, 3), keepdim=True) becomes GlobalPoolBlocked: no ToPlain before it nor ToBlocked after."""
    g, x = graph_with_input((2, 24, 7, 5))
    y = conv(g, x, 24, name="c1")
    s = op(g, "HardSigmoid", [conv(g, op(g, "ReduceMean", [y], axes=axes, keepdims=True), 24, k=1, name="se")])
    g.outputs = [conv(g, op(g, "Mul", [y, s]), 16, name="c2")]
    new, _ = layout_blocked(g, B)
    pools = [n for n in new.nodes if n.op_type == "GlobalPoolBlocked"]
    assert len(pools) == 1 and pools[0].params == {"mode": "avg"} and pools[0].outputs[0].shape == (2, 2, 1, 1, 16)
    assert "ReduceMean" not in types(new)
    # only the input's reorder: c2 writes its output plain
    assert [n.op_type for n in new.nodes if n.op_type.startswith("To")] == ["ToBlocked"]
    check_same(g, new, (2, 24, 7, 5))


@pytest.mark.parametrize("axes,keepdims", [([2, 3], False), ([1, 2, 3], True), ([3], True)])
def test_other_reductions_stay_plain(axes, keepdims):
    g, x = graph_with_input((1, 32, 6, 6))
    mean = op(g, "ReduceMean", [conv(g, x, 32, name="c1")], axes=axes, keepdims=keepdims)
    g.outputs = [mean]
    new, _ = layout_blocked(g, B)
    assert "GlobalPoolBlocked" not in types(new) and "ReduceMean" in types(new)
    check_same(g, new, (1, 32, 6, 6))


def test_concat_with_a_partial_block_first_runs_as_concat_blocked():
    g, x = graph_with_input((1, 3, 4, 4))
    cat = op(g, "Concat", [conv(g, x, 8, name="a"), conv(g, x, 16, name="b")], axis=1)
    g.outputs = [conv(g, cat, 16, name="c")]
    new, stats = layout_blocked(g, B)
    concat = next(n for n in new.nodes if n.op_type == "RegroupBlocked")
    assert concat.outputs[0].shape == (1, 2, 4, 4, 16) and concat.params["channels"] == [8, 16]
    assert stats.to_plain == stats.to_blocked == 0
    check_same(g, new, (1, 3, 4, 4))


def shuffle_unit(g: Graph, x: Value, c: int, name: str) -> Value:
    """ShuffleNetV2's stride-1 unit: split in halves, convs on one half, concat, channel shuffle."""
    split = g.add_node("Split", [x], 2, name=f"{name}.split", params={"axis": 1, "sizes": [c, c]})
    infer_shapes(g)
    left, right = split.outputs
    branch = conv(g, conv(g, conv(g, right, c, k=1, name=f"{name}.pw1"), c, name=f"{name}.dw", groups=c), c, k=1,
                  name=f"{name}.pw2", act="relu")
    return op(g, "ChannelShuffle", [op(g, "Concat", [left, branch], axis=1)], groups=2)


def test_shuffle_units_stay_blocked_through_split_concat_and_shuffle():
    g, x = graph_with_input((2, 3, 6, 6))
    y = conv(g, x, 116, name="stem")  # halves of 58 channels: not whole blocks
    for i in range(2):
        y = shuffle_unit(g, y, 58, f"u{i}")
    g.outputs = [conv(g, y, 24, k=1, name="head")]
    new, stats = layout_blocked(g, B)
    kinds = types(new)
    assert not {"Split", "Concat", "ChannelShuffle", "ToBlocked", "ToPlain", "Conv"} & set(kinds)
    assert stats.to_plain == stats.to_blocked == 0
    # the first split alone, then per unit concat -> shuffle -> (next unit's) split composed into one node
    regroups = [n for n in new.nodes if n.op_type == "RegroupBlocked"]
    assert [(len(n.inputs), len(n.outputs)) for n in regroups] == [(1, 2), (2, 2), (2, 1)]
    assert [v.shape for v in regroups[1].outputs] == [(2, 4, 6, 6, 16)] * 2
    assert regroups[1].params["channels"] == [58, 58]
    check_same(g, new, (2, 3, 6, 6))


def test_split_feeding_a_plain_op_gives_that_output_a_to_plain():
    g, x = graph_with_input((1, 16, 4, 4))
    split = g.add_node("Split", [conv(g, x, 40, name="a")], 2, params={"axis": 1, "sizes": [20, 20]})
    infer_shapes(g)
    left, right = split.outputs
    g.outputs = [conv(g, left, 16, name="b"), op(g, "Softmax", [right], axis=1)]
    new, stats = layout_blocked(g, B)
    assert "RegroupBlocked" in types(new) and stats.to_plain == 1
    check_same(g, new, (1, 16, 4, 4))


def test_dynamic_batch_keeps_minus_one_in_physical_shapes():
    g, x = graph_with_input((-1, 16, 8, 8))
    g.outputs = [conv(g, conv(g, x, 24, name="a"), 8, name="b")]
    new, _ = layout_blocked(g, B)
    assert new.nodes[1].outputs[0].shape == (-1, 2, 8, 8, 16)


def test_pools_between_convs_run_blocked():
    g, x = graph_with_input((1, 3, 12, 12))
    y = conv(g, x, 24, name="stem")
    pooled = op(g, "MaxPool", [y], kernel=(3, 3), stride=(2, 2), pads=(1, 1, 1, 1))
    g.outputs = [op(g, "GlobalAvgPool", [conv(g, pooled, 16, name="c")])]
    new, stats = layout_blocked(g, B)
    assert types(new) == ["ConvBlocked", "MaxPoolBlocked", "ConvBlocked", "GlobalPoolBlocked", "ToPlain"]
    assert new.nodes[1].params["kernel"] == (3, 3) and new.nodes[1].outputs[0].shape == (1, 2, 6, 6, 16)
    assert new.nodes[2].params["dst_blocked"]  # the last conv writes blocked: the pool after it reads that
    assert stats.to_plain == 1 and stats.to_blocked == 0
    check_same(g, new, (1, 3, 12, 12))


def test_skip_rule_returns_the_input_graph():
    g, x = graph_with_input((1, 32, 8, 8))
    y = conv(g, x, 32, name="c1")
    g.nodes[-1].params["pad_mode"] = "reflect"  # not convertible
    g.outputs = [conv(g, op(g, "MaxPool", [y], kernel=(2, 2), stride=(2, 2), pads=(0, 0, 0, 0)), 8, name="c2")]
    assert decide(g, B) is g  # nothing blocked: no conv converted, no reorder saved
    _, stats = layout_blocked(g, B)
    assert not stats.worth_it and stats.convs == 0


def test_groups_that_do_not_fill_blocks_stay_conv():
    g, x = graph_with_input((1, 32, 8, 8))
    y = conv(g, x, 32, name="grouped", groups=4)  # 8 channels per group
    g.outputs = [conv(g, conv(g, y, 32, name="dense"), 32, name="dw", groups=32)]
    new, _ = layout_blocked(g, B)
    assert types(new) == ["Conv", "ToBlocked", "ConvBlocked", "ConvBlocked"]
    check_same(g, new, (1, 32, 8, 8))


@pytest.mark.parametrize("block", [8, 16])
def test_block_size_is_an_argument(block: int):
    g, x = graph_with_input((1, 8, 5, 5))
    g.outputs = [conv(g, conv(g, x, 12, name="a"), 4, name="b")]
    new, _ = layout_blocked(g, block)
    assert new.nodes[-1].inputs[0].shape == (1, -(-12 // block), 5, 5, block)
    check_same(g, new, (1, 8, 5, 5))
