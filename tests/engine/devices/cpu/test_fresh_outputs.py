"""Graph outputs written by native programs straight into the fresh arrays the caller then owns (runtime/bind.py's
direct outputs, fused_calls.Native.out_rebinds): each run's program writes that run's array and no other, every
earlier result stays as it was, the values are the kernels' Python path's bit for bit (itself checked against the
numpy references elsewhere), and a recording that would keep one run's array anywhere it does not rewrite is
refused. References: the ops' numpy references, and the same model with NNSERVE_NATIVE_CALLS=0.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
from op_harness import build_kernel, infos_of, make_node, reference, replay_recorded

from engine.devices.cpu.fused_calls import Segment, _Recorded
from engine.devices.cpu.onednn import objects as D
from engine.devices.cpu.onednn.blocked import native_block
from engine.ir import Graph
from engine.runtime import bind
from engine.runtime.instance import FUSE_AFTER_RUNS
from engine.runtime.model import Model

pytestmark = pytest.mark.skipif(not D.available(), reason="oneDNN is not installed (the native programs are its)")


def _block() -> int:
    block = native_block()
    if not block:
        pytest.skip("no blocked layout on this CPU")
    return block


@pytest.mark.parametrize("shape", [(1, 20, 9, 11), (1, 32, 9, 11), (2, 32, 9, 11), (2, 8, 9, 11), (1, 3, 4, 4)],
                         ids=["partial-block", "whole-blocks", "batch-of-whole", "batch-under-a-block", "three"])
def test_a_to_plain_writes_each_run_s_fresh_output(shape):
    """ToPlain into a graph's output: its records (oneDNN's reorder of the whole blocks, the last block's lanes,
    or the reorder alone) with the destination rebound before each replay write the reference's values into that
    run's array, and the arrays of earlier runs keep theirs."""
    block = _block()
    rng = np.random.default_rng(31)
    n, c, h, w = shape
    blocked = rng.standard_normal((n, -(-c // block), h, w, block)).astype(np.float32)
    node = make_node("ToPlain", 1, params={"block": block, "channels": c})
    kernel, workspace = build_kernel(node, infos_of([blocked]))
    out = np.empty(shape, np.float32)
    kernel([blocked], [out], workspace)  # the Python path first, as the runtime runs it before merging
    assert kernel.writes_fresh(out)
    outs = [out]
    nat = kernel.native_rebound([blocked], outs, workspace, (), (0,))
    assert nat is not None and {j for j, _, _ in nat.out_rebinds} == {0} and nat.rebinds == []
    rec = _Recorded([nat], [(kernel, [blocked], outs)])
    assert rec.stray_addresses([(kernel, [blocked], outs)]) == []
    results = []
    for _ in range(3):
        blocked[...] = rng.standard_normal(blocked.shape)
        outs[0] = np.full(shape, np.nan, np.float32)
        assert rec.rebind([(kernel, [blocked], outs)])
        assert replay_recorded(rec) is None
        results.append((outs[0], reference(node, [blocked])[0]))
    for got, want in results:
        np.testing.assert_array_equal(got, want)
    assert kernel.native_rebound([blocked], outs, workspace, (0,), ()) is None  # its input is never the caller's


def test_a_to_plain_of_several_images_with_a_partial_block_keeps_its_copy():
    """Several images whose last block is partial take one reorder each, at offsets of the output's address, which
    are not rebound: such an output is not asked of it (writes_fresh) and not recorded as a fresh one."""
    block = _block()
    blocked = np.ones((2, 2, 5, 5, block), np.float32)
    node = make_node("ToPlain", 1, params={"block": block, "channels": block + 3})
    kernel, workspace = build_kernel(node, infos_of([blocked]))
    out = np.empty((2, block + 3, 5, 5), np.float32)
    kernel([blocked], [out], workspace)
    assert not kernel.writes_fresh(out)
    assert kernel.native_rebound([blocked], [out], workspace, (), (0,)) is None


@pytest.mark.parametrize("softmax", [False, True])
def test_an_int8_detector_s_joined_heads_write_each_run_s_fresh_output(softmax):
    """Int8DequantizeConcatNhwc into a graph's output (a detector's scores or boxes): its record with the output's
    job word rebound writes each run's array, the same bits as its Python run; earlier arrays keep theirs."""
    rng = np.random.default_rng(32)
    heads = [rng.integers(-128, 128, (1, 30, 40, 6), dtype=np.int8), rng.integers(-128, 128, (1, 15, 20, 4),
                                                                                   dtype=np.int8)]
    scales = [rng.uniform(0.01, 0.05, h.shape[3]).astype(np.float32) for h in heads]
    node = make_node("Int8DequantizeConcatNhwc", 1, params={"trailing": [2], "softmax": softmax},
                     attrs={"scales": scales})
    kernel, workspace = build_kernel(node, infos_of(heads, node=node))
    want_shape = reference(node, heads)[0].shape
    out = np.empty(want_shape, np.float32)
    kernel(heads, [out], workspace)
    assert kernel.writes_fresh(out)
    outs = [out]
    nat = kernel.native_rebound(heads, outs, workspace, (), (0,))
    if nat is None:
        pytest.skip("the join records nothing here (no OpenMP runtime, or its team not running native regions)")
    assert kernel.native_rebound(heads, outs, workspace, (0,), ()) is None  # its inputs are never the caller's
    rec = _Recorded([nat], [(kernel, heads, outs)])
    results = []
    for _ in range(3):
        for h in heads:
            h[...] = rng.integers(-128, 128, h.shape, dtype=np.int8)
        outs[0] = np.full(want_shape, np.nan, np.float32)
        assert rec.rebind([(kernel, heads, outs)])
        assert replay_recorded(rec) is None
        python = np.empty(want_shape, np.float32)
        kernel(heads, [python], workspace)
        results.append((outs[0], python))
    for got, want in results:
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("shape", [(1, 4420, 2), (3, 7, 1000)], ids=["scores", "classifier"])
def test_a_softmax_reads_the_caller_s_input_and_writes_each_run_s_fresh_output(shape):
    """Softmax over the last axis as a graph's last op (a detector's class scores) or its only one: its record with
    the input's and the output's job words rebound writes each run's array, the same bits as its Python run, and
    earlier arrays keep theirs."""
    rng = np.random.default_rng(37)
    node = make_node("Softmax", 1, params={"axis": -1})
    x = rng.standard_normal(shape).astype(np.float32)
    kernel, workspace = build_kernel(node, infos_of([x]))
    out = np.empty(shape, np.float32)
    kernel([x], [out], workspace)
    assert kernel.writes_fresh(out)
    ins, outs = [x], [out]
    nat = kernel.native_rebound(ins, outs, workspace, (0,), (0,))
    if nat is None:
        pytest.skip("the rows' loop records nothing here (no OpenMP runtime, or its team not running regions)")
    assert kernel.native_rebound(ins, outs, workspace, (1,), ()) is None  # it has one input
    rec = _Recorded([nat], [(kernel, ins, outs)])
    assert rec.stray_addresses([(kernel, ins, outs)]) == []
    results = []
    for _ in range(3):
        ins[0] = (rng.standard_normal(shape) * 4).astype(np.float32)
        outs[0] = np.full(shape, np.nan, np.float32)
        assert rec.rebind([(kernel, ins, outs)])
        assert replay_recorded(rec) is None
        python = np.empty(shape, np.float32)
        kernel([ins[0]], [python], workspace)
        results.append((outs[0], python, ins[0]))
    for got, want, x in results:
        np.testing.assert_array_equal(got, want)
        np.testing.assert_allclose(got, reference(node, [x])[0], rtol=1e-5, atol=1e-7)


def _conv_graph(context: str, c: int, hw: int) -> Graph:
    """3x3 depthwise convs with ReLU over `c` channels: two NCHW ones (`plain`; one alone would be a single call,
    never a program), or one between blocked layers as bench/layers.py times it (ToBlocked -> ConvBlocked ->
    ToPlain)."""
    rng = np.random.default_rng(33)
    g = Graph()
    x = g.value("x", (None, c, hw, hw), np.float32)  # any batch
    g.inputs = [x]
    params = {"stride": (1, 1), "pads": (1, 1, 1, 1), "dilation": (1, 1), "groups": c, "activation": "relu"}
    attrs = {"weight": rng.standard_normal((c, 1, 3, 3)).astype(np.float32),
             "bias": rng.standard_normal(c).astype(np.float32)}
    if context == "plain":
        u = g.add_node("Conv", [x], params=params, attrs=attrs).outputs[0]
        y = g.add_node("Conv", [u], params=params, attrs=attrs).outputs[0]
    else:
        block = _block()
        xb = g.add_node("ToBlocked", [x], params={"block": block, "channels": c}).outputs[0]
        params = dict(params, src_blocked=True, dst_blocked=True, block=block)
        yb = g.add_node("ConvBlocked", [xb], params=params, attrs=attrs).outputs[0]
        y = g.add_node("ToPlain", [yb], params={"block": block, "channels": c}).outputs[0]
    y.name = "y"
    g.outputs = [y]
    return g


@pytest.mark.parametrize("context", ["plain", "blocked"])
@pytest.mark.parametrize("c,hw", [(640, 7), (144, 12), (32, 28)], ids=["640@7", "144@12", "32@28"])
def test_a_graph_s_output_is_written_by_its_program_into_the_caller_s_arrays(context, c, hw, monkeypatch):
    """A conv graph whose output (25-250 KB) is below DIRECT_MIN_BYTES: computed by the program into a fresh
    array each run (no copy out of the arena), the caller's input read in place, no Python of the calls; every
    result is the Python path's bit for bit and stays so after later runs, batches 1 and 2 taking turns (a binding
    each: the plans re-pointed in between); no result shares memory with the arena or another result."""
    g = _conv_graph(context, c, hw)
    model = Model(g, "convs")
    shapes = {"x": (2, c, hw, hw)}
    fused = model.instance("cpu", max_shapes=shapes)
    monkeypatch.setenv("NNSERVE_NATIVE_CALLS", "0")
    python = model.instance("cpu", max_shapes=shapes)
    monkeypatch.delenv("NNSERVE_NATIVE_CALLS")
    rng = np.random.default_rng(34)

    def feed(batch):
        return {"x": rng.standard_normal((batch, c, hw, hw)).astype(np.float32)}

    for batch in (1, 2):
        for _ in range(FUSE_AFTER_RUNS):
            fused.run(feed(batch))
    segments = []
    for bound in fused._bound.values():
        assert len(bound.direct) == 1 and bind.NATIVE_DIRECT_MIN_BYTES <= bound.outputs[0][1].nbytes
        assert bound.outputs[0][1].nbytes < bind.DIRECT_MIN_BYTES
        (seg, _, _), = bound.fused[0]
        if not isinstance(seg, Segment):
            pytest.skip("the kernels record nothing here (native regions off)")
        assert seg.varying[0][0] == (0,) and seg.varying[-1][1] == (0,)
        segments.append(seg)
    results = []
    for seg in segments:
        monkeypatch.setattr(seg, "_python", lambda: pytest.fail("the program should have run"))
    for batch in (1, 2, 1, 2, 2, 1):
        feeds = feed(batch)
        results.append((fused.run(feeds)["y"], python.run(feeds)["y"]))
    for k, (got, want) in enumerate(results):
        np.testing.assert_array_equal(got, want)
        assert not np.shares_memory(got, fused.arena)
        assert not any(np.shares_memory(got, other) for other, _ in results[k + 1:])


def test_a_direct_output_read_by_a_later_conv(monkeypatch):
    """A graph output that the next conv reads too (a feature map handed out and convolved further): both convs
    record, the second reading this run's fresh array; both outputs of every run stay right after later runs."""
    rng = np.random.default_rng(36)
    c, hw = 144, 12
    g = Graph()
    x = g.value("x", (1, c, hw, hw), np.float32)
    g.inputs = [x]
    params = {"stride": (1, 1), "pads": (1, 1, 1, 1), "dilation": (1, 1), "groups": c, "activation": "relu"}
    ys = []
    for v in (x, None):
        attrs = {"weight": rng.standard_normal((c, 1, 3, 3)).astype(np.float32),
                 "bias": rng.standard_normal(c).astype(np.float32)}
        ys.append(g.add_node("Conv", [v if v is not None else ys[-1]], params=params, attrs=attrs).outputs[0])
    ys[0].name, ys[1].name = "y1", "y2"
    g.outputs = ys
    model = Model(g, "convs")
    fused = model.instance("cpu")
    monkeypatch.setenv("NNSERVE_NATIVE_CALLS", "0")
    python = model.instance("cpu")
    monkeypatch.delenv("NNSERVE_NATIVE_CALLS")

    def feed():
        return {"x": rng.standard_normal((1, c, hw, hw)).astype(np.float32)}

    for _ in range(FUSE_AFTER_RUNS):
        fused.run(feed())
    bound = next(iter(fused._bound.values()))
    assert sorted(d.index for d in bound.direct) == [0, 1]
    (seg, _, _), = bound.fused[0]
    if not isinstance(seg, Segment):
        pytest.skip("the kernels record nothing here (native regions off)")
    assert seg.varying == [((0,), (0,)), ((0,), (0,))]
    monkeypatch.setattr(seg, "_python", lambda: pytest.fail("the program should have run"))
    results = []
    for _ in range(4):
        feeds = feed()
        results.append((fused.run(feeds), python.run(feeds)))
    for got, want in results:
        for k in ("y1", "y2"):
            np.testing.assert_array_equal(got[k], want[k])


def test_a_recording_that_keeps_a_fresh_array_is_refused(monkeypatch, caplog):
    """A kernel whose records would hold the output's address where no rebind rewrites it (here: a job of its
    own keeping it) would write a caller's array after it was handed over: the recording is refused with an
    error in the log, and the calls run their Python, right."""
    g = _conv_graph("blocked", 144, 12)
    model = Model(g, "convs")
    shapes = {"x": (1, 144, 12, 12)}
    fused = model.instance("cpu", max_shapes=shapes)
    monkeypatch.setenv("NNSERVE_NATIVE_CALLS", "0")
    python = model.instance("cpu", max_shapes=shapes)
    monkeypatch.delenv("NNSERVE_NATIVE_CALLS")
    rng = np.random.default_rng(35)
    feeds = {"x": rng.standard_normal((1, 144, 12, 12)).astype(np.float32)}
    fused.run(feeds)
    bound = next(iter(fused._bound.values()))
    (to_plain, _, outs), = [call for call, node in zip(bound.calls, bound.call_nodes, strict=True)
                             if node.op_type == "ToPlain"]
    real = to_plain.native_rebound

    def leaky(inputs, outputs, workspace, reads, writes):
        nat = real(inputs, outputs, workspace, reads, writes)
        if nat is not None:
            nat.keep.append(np.array([0, outputs[0].ctypes.data], np.int64))  # a job word no rebind rewrites
        return nat

    monkeypatch.setattr(to_plain, "native_rebound", leaky)
    with caplog.at_level(logging.ERROR, logger="engine.devices.cpu"):
        for _ in range(FUSE_AFTER_RUNS + 2):
            np.testing.assert_array_equal(fused.run(feeds)["y"], python.run(feeds)["y"])
    assert "would keep one run's array" in caplog.text and "output 0" in caplog.text
    assert bound.fused is False or not any(isinstance(fn, Segment) and "ToPlain" in {n.op_type for n in fn.nodes}
                                           for fn, _, _ in bound.fused[0])
