"""Runs of oneDNN calls replayed as one native program (engine/devices/cpu/fused_calls.py): from a binding's
second run on, the same numbers as every kernel's own Python (bit for bit), whatever happened in between: other
input shapes, another thread, another thread count, a plan re-pointed by a call outside the program; a failing C
call names its node. References: the same model with NNSERVE_NATIVE_CALLS=0 (the kernels' Python path, itself
checked against torch by test_realworld_models.py) and torch's outputs saved with the fixture.
"""

from __future__ import annotations

import threading
import weakref

import numpy as np
import pytest

import engine
from engine.devices.cpu import native_program as N
from engine.devices.cpu import tensor as tensor_kernels
from engine.devices.cpu import threads as T
from engine.devices.cpu.fused_calls import Segment
from engine.devices.cpu.layout import kernels as layout_kernels
from engine.devices.cpu.onednn import objects as D
from engine.errors import InputValueError, KernelError
from engine.runtime.instance import FUSE_AFTER_RUNS

pytestmark = pytest.mark.skipif(not D.available(), reason="oneDNN is not installed (the fused calls are its)")

# Models whose kernels cover the recorded paths: SiLU / sigmoid passes after the primitive and residual sums
# (EfficientNet, MobileNetV3), squeeze-excite binaries and average pools (EfficientNet, GhostNetV2), lane regroups and
# concats (GhostNetV2), ReLU chains and reorders (ResNet-D, RepVGG), convolutions, GEMMs and LayerNorms around
# attention (MobileViT), lane permutes of concat-shuffle-splits (ShuffleNetV2, a pnnx fixture)
MODELS = ["efficientnet_b0", "mobilenetv3", "resnet50d", "repvgg", "regnety", "ghostnetv2", "mobilevit",
          "shufflenet_v2"]
KINDS = {"shufflenet_v2": "pnnx"}  # the fixture folder of each model not in "realworld"
RECORDED = {"ConvBlocked", "BroadcastBlocked", "GlobalPoolBlocked", "RegroupBlocked", "Concat", "ToBlocked", "Gemm",
            "LayerNorm", "Transpose"}
REL_TOL = 1e-3


def _instances(fx, monkeypatch, max_shapes=None):
    model = engine.load(fx.param)
    shapes = max_shapes or fx.max_shapes
    fused = model.instance("cpu", max_shapes=shapes)
    monkeypatch.setenv("NNSERVE_NATIVE_CALLS", "0")
    python = model.instance("cpu", max_shapes=shapes)
    monkeypatch.delenv("NNSERVE_NATIVE_CALLS")
    assert fused.device.options.native_calls and not python.device.options.native_calls
    return fused, python


def _warm(inst, feeds) -> list[dict]:
    """The runs of the kernels' own Python before the binding's calls are merged (FUSE_AFTER_RUNS), their outputs."""
    return [inst.run(feeds) for _ in range(FUSE_AFTER_RUNS)]


def _segments(inst) -> list[Segment]:
    bound = next(iter(inst._bound.values()))
    assert bound.fused, "nothing was fused"
    return [fn for fn, _, _ in bound.fused[0] if isinstance(fn, Segment)]


def _same(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def _close_to_torch(got: dict, want: dict) -> None:
    for k, w in want.items():
        scale = max(float(np.abs(w).max()), 1e-6)
        assert float(np.abs(got[k].astype(np.float64) - w).max()) <= REL_TOL * scale, k


@pytest.mark.parametrize("name", MODELS)
def test_fused_runs_match_the_kernels_python_bit_for_bit(name, load_fixture, monkeypatch):
    fx = load_fixture(name, KINDS.get(name, "realworld"))
    fused, python = _instances(fx, monkeypatch)
    want = python.run(fx.inputs)
    first = _warm(fused, fx.inputs)  # the Python path, then the fusion
    segments = _segments(fused)
    assert sum(len(s.calls) for s in segments) >= 5, segments
    for _ in range(3):
        got = fused.run(fx.inputs)
        _same(got, want)
    for out in first:
        _same(out, want)
    _close_to_torch(got, fx.expected)
    # another input gives its own numbers (nothing of the first input is replayed)
    other = {k: (v[..., ::-1, :].copy() if v.ndim == 4 else v) for k, v in fx.inputs.items()}
    _same(fused.run(other), python.run(other))


def test_a_binding_is_merged_only_once_it_is_used_again(load_fixture):
    """A binding run once (a client cycling through more input shapes than the instance keeps bindings for) never
    pays for a merge it would not use."""
    fx = load_fixture("efficientnet_b0", "realworld")
    inst = engine.load(fx.param).instance("cpu", max_shapes=fx.max_shapes)
    inst.run(fx.inputs)
    bound = next(iter(inst._bound.values()))
    assert FUSE_AFTER_RUNS >= 2 and bound.fused is None and bound.runs == 1
    _warm(inst, fx.inputs)
    assert bound.fused


def test_every_recorded_kind_is_recorded_somewhere(load_fixture):
    """Each kernel kind that offers records is in some model's program (a kind that stopped offering them would
    run its Python again, silently slower)."""
    seen = set()
    for name in MODELS:
        fx = load_fixture(name, KINDS.get(name, "realworld"))
        inst = engine.load(fx.param).instance("cpu", max_shapes=fx.max_shapes)
        _warm(inst, fx.inputs)
        seen |= {n.op_type for s in _segments(inst) for n in s.nodes}
    assert RECORDED <= seen, RECORDED - seen


def test_threads_and_callers_in_between(load_fixture, monkeypatch):
    """A different thread count (another program, recorded for it) and a run from another thread (its own oneDNN
    stream): each run equals the Python path's."""
    fx = load_fixture("efficientnet_b0", "realworld")
    fused, python = _instances(fx, monkeypatch)
    want = python.run(fx.inputs)
    for _ in range(2):
        _same(fused.run(fx.inputs), want)
    threads = fused.threads
    try:
        fused.threads = python.threads = 1
        for _ in range(2):
            _same(fused.run(fx.inputs), python.run(fx.inputs))
    finally:
        fused.threads = python.threads = threads
    _same(fused.run(fx.inputs), want)
    if threads > 1:
        assert len(_segments(fused)[0].programs) >= 2, "a second thread count should have recorded a program"
    got: list = []
    worker = threading.Thread(target=lambda: got.append(fused.run(fx.inputs)))
    worker.start()
    worker.join()
    _same(got[0], want)
    _same(fused.run(fx.inputs), want)


def test_lane_permutes_split_over_the_team_inside_a_program(load_fixture, monkeypatch):
    """ShuffleNetV2's concat-shuffle-splits as permute regions on OpenMP's team (every size, the team forced on) in a
    program: the same numbers as the Python path's, which splits the same way."""
    fx = load_fixture("shufflenet_v2", "pnnx")
    fused, python = _instances(fx, monkeypatch)
    if T.pool_kind(T.get_policy(), T._openmp is not None) != "openmp" or T.get_threads() < 2:
        pytest.skip("our kernels do not split over OpenMP's team here (no oneDNN, `short` policy or one thread)")
    monkeypatch.setattr(layout_kernels, "native_regions", lambda: True)
    monkeypatch.setattr(layout_kernels, "NATIVE_PERMUTE_FLOATS", 0)
    _region_in_program(fx, fused, python, layout_kernels.LL.permute_team().address, "permute")


def test_concats_split_over_the_team_inside_a_program(load_fixture, monkeypatch):
    """SqueezeNet's fire concats as copies_team regions on OpenMP's team (every size, the team forced on) in a program:
    the same numbers as the Python path's, which runs the same region."""
    fx = load_fixture("squeezenet", "pnnx")
    fused, python = _instances(fx, monkeypatch)
    if T.pool_kind(T.get_policy(), T._openmp is not None) != "openmp" or T.get_threads() < 2:
        pytest.skip("our kernels do not split over OpenMP's team here (no oneDNN, `short` policy or one thread)")
    monkeypatch.setattr(tensor_kernels, "native_regions", lambda: True)
    monkeypatch.setattr(tensor_kernels, "JOIN_TEAM_BYTES", 0)
    _region_in_program(fx, fused, python, tensor_kernels.copies_team().address, "concat")


def _region_in_program(fx, fused, python, fn: int, what: str) -> None:
    """The fused instance records a region of function `fn` into its programs and, run twice, gives the Python
    path's numbers, which are torch's."""
    want = python.run(fx.inputs)
    _warm(fused, fx.inputs)
    words = np.concatenate([rec.program.words for s in _segments(fused) for rec in s.programs.values()])
    regions = words[words[:, 0] == N.OP_REGION]
    assert (regions[:, 2] == fn).any(), f"no {what} region was recorded"
    for _ in range(2):
        _same(fused.run(fx.inputs), want)
    _close_to_torch(want, fx.expected)


def test_a_plan_repointed_outside_the_program_is_noticed(load_fixture, monkeypatch):
    """A conv plan that ran on other arrays since the program was recorded (another binding of the same shape)
    points its memories elsewhere: the segment runs its Python (which points them back) instead of the program."""
    fx = load_fixture("efficientnet_b0", "realworld")
    fused, python = _instances(fx, monkeypatch)
    want = python.run(fx.inputs)
    _warm(fused, fx.inputs)
    seg = _segments(fused)[0]
    k = next(i for i, (nd, v) in enumerate(zip(seg.nodes, seg.varying, strict=True))
             if "Conv" in nd.op_type and v == ((), ()))
    fn, ins, outs = seg.calls[k]  # a conv on arena arrays (the first reads the caller's, attached per run)
    fn([a.copy() for a in ins], [np.empty_like(o) for o in outs], fused.workspace)  # re-points its plan
    assert not next(iter(seg.programs.values())).valid()
    _same(fused.run(fx.inputs), want)
    _same(fused.run(fx.inputs), want)  # recorded again
    assert next(iter(seg.programs.values())).valid()


def test_a_failing_call_names_its_node_and_is_not_replayed_again(load_fixture, monkeypatch):
    fx = load_fixture("efficientnet_b0", "realworld")
    fused, python = _instances(fx, monkeypatch)
    want = python.run(fx.inputs)
    _warm(fused, fx.inputs)
    seg = _segments(fused)[0]
    (regime, rec), = seg.programs.items()
    rec.program.words[0, 0] = 99  # an operation the program does not know: its status -1
    with pytest.raises(KernelError, match=f"{seg.nodes[0].name!r}.*status -1"):
        fused.run(fx.inputs)
    assert regime not in seg.programs  # dropped: never replayed again
    for _ in range(2):
        _same(fused.run(fx.inputs), want)  # recorded anew
    assert seg.programs[regime] is not rec


def test_a_fusion_or_recording_that_fails_leaves_the_kernels_python(load_fixture, monkeypatch):
    """Merging is an optimisation: when it raises, the runs go on with every kernel's own calls."""
    from engine.devices.cpu import device as cpu_device

    fx = load_fixture("efficientnet_b0", "realworld")
    fused, python = _instances(fx, monkeypatch)
    want = python.run(fx.inputs)

    def broken(*args):
        raise RuntimeError("no JIT today")

    with monkeypatch.context() as m:
        m.setattr(cpu_device, "fuse", broken)
        for _ in range(3):
            _same(fused.run(fx.inputs), want)
        assert next(iter(fused._bound.values())).fused is False
    fresh = engine.load(fx.param).instance("cpu", max_shapes=fx.max_shapes)
    _warm(fresh, fx.inputs)
    seg = _segments(fresh)[0]
    seg.programs.clear()
    fn = seg.calls[seg.varying.index(((), ()))][0]  # a call on arena arrays, recorded through `native`
    with monkeypatch.context() as m:
        m.setattr(fn, "native", broken)
        for _ in range(2):
            _same(fresh.run(fx.inputs), want)
        assert not seg.programs and sum(seg.misses.values()) == 2
    for _ in range(2):
        _same(fresh.run(fx.inputs), want)
    assert seg.programs, "recorded once its kernel could say its records again"


@pytest.mark.parametrize("name", ["mobilenet_v2", "resnet"])
def test_int8_convs_adds_and_fixups_replay_bit_for_bit(name, tmp_path, load_fixture, monkeypatch):
    """A model `nnserve quantize` wrote, on the int8 kernels: convolutions (their fix-ups of TNN's roundings
    included) and int8 adds in programs, outputs equal to the kernels' Python path's."""
    from engine.quantize import quantize

    fx = load_fixture(name)
    rng = np.random.default_rng(3)
    shape = tuple(fx.meta["inputs"][0]["shape"])
    samples = [{"in0": rng.standard_normal(shape).astype(np.float32)} for _ in range(4)]
    result = quantize(fx.param, samples, tmp_path / "q")
    model = engine.load(result.proto)
    fused = model.instance("cpu")
    monkeypatch.setenv("NNSERVE_NATIVE_CALLS", "0")
    python = model.instance("cpu")
    feeds = {model.graph.inputs[0].name: fx.inputs["in0"]}
    want = python.run(feeds)
    for out in _warm(fused, feeds):  # the Python path, then the fusion
        _same(out, want)
    for _ in range(3):
        _same(fused.run(feeds), want)
    kinds = {n.op_type for s in _segments(fused) for n in s.nodes}
    assert "Int8ConvNhwc" in kinds, kinds  # (its adds are fused into the convs: the add's records are tested below)


@pytest.fixture(scope="module")
def quantized_mobilenet(tmp_path_factory, load_fixture):
    """mobilenet_v2's fixture written as a TNN int8 model by `nnserve quantize`, and its input."""
    from engine.quantize import quantize

    fx = load_fixture("mobilenet_v2")
    rng = np.random.default_rng(4)
    shape = tuple(fx.meta["inputs"][0]["shape"])
    result = quantize(fx.param, [{"in0": rng.standard_normal(shape).astype(np.float32)} for _ in range(2)],
                      tmp_path_factory.mktemp("q") / "m")
    return result.proto, fx.inputs["in0"]


@pytest.mark.parametrize("threads", [None, 1], ids=["default-threads", "one-thread"])
def test_the_quantization_of_the_callers_input_joins_the_program(threads, quantized_mobilenet, monkeypatch,
                                                                 request):
    """An int8 model's first op reads the caller's array (TnnQuantize of the image): its record joins the program,
    the address of each run's array written into its job before the replay. Every kind of array a caller sends
    (a new one each run, a strided one the runtime copies, a read-only one) gives the kernels' Python path's
    outputs bit for bit, with no Python of the calls, in the program fuse() recorded and in one recorded again
    later (another regime, a re-pointed plan); a NaN is refused after the program with the quantization's error
    and the next run is right; no caller's array is kept after its run; an array unlike the recorded one (another
    dtype) runs the calls' Python."""
    proto, x0 = quantized_mobilenet
    before = T.get_threads()  # an instance of its own count sets the process's; later tests' instances take it
    request.addfinalizer(lambda: T.set_threads(before))
    model = engine.load(proto)
    name = model.graph.inputs[0].name
    fused = model.instance("cpu", threads=threads)
    monkeypatch.setenv("NNSERVE_NATIVE_CALLS", "0")
    python = model.instance("cpu", threads=threads)
    monkeypatch.delenv("NNSERVE_NATIVE_CALLS")
    _warm(fused, {name: x0})
    bound = next(iter(fused._bound.values()))
    seg = bound.fused[0][0][0]
    assert isinstance(seg, Segment) and seg.nodes[0].op_type == "Int8QuantizeNhwc" and seg.varying[0] == ((0,), ())
    rng = np.random.default_rng(5)
    shape = x0.shape
    for recorded in ("by fuse", "again"):
        if recorded == "again":
            seg.programs.clear()  # as after a regime change or a plan re-pointed by another binding
        wide = rng.standard_normal(shape[:-1] + (2 * shape[-1],)).astype(np.float32)
        frozen = rng.standard_normal(shape).astype(np.float32)
        frozen.flags.writeable = False
        arrays = [rng.standard_normal(shape).astype(np.float32) * 3 for _ in range(2)] + [wide[..., ::2], frozen]
        with monkeypatch.context() as m:
            m.setattr(seg, "_python", lambda: pytest.fail("the program should have run"))
            for x in arrays:
                _same(fused.run({name: x}), python.run({name: x}))
            bad = arrays[0].copy()
            bad[0, 1, 5, 7] = np.nan
            with pytest.raises(InputValueError, match=r"met a NaN, which int8 cannot represent"):
                fused.run({name: bad})
            _same(fused.run({name: arrays[1]}), python.run({name: arrays[1]}))
        assert seg.programs, recorded
    # a C-contiguous array whose size-1 batch axis has another stride than recorded: the calls' Python, a safe miss
    odd = np.lib.stride_tricks.as_strided(arrays[0], shape, (8,) + arrays[0].strides[1:])
    assert odd.flags.c_contiguous and odd.strides != arrays[0].strides
    pythons: list = []
    with monkeypatch.context() as m:
        real = seg._python
        m.setattr(seg, "_python", lambda: pythons.append(1) or real())
        _same(fused.run({name: odd}), python.run({name: odd}))
        _same(fused.run({name: arrays[2]}), python.run({name: arrays[2]}))
    assert pythons == [1]
    pool = T.region_pool()
    if any(rec.regions for rec in seg.programs.values()) and pool is not None:
        assert pool.busy.acquire(blocking=False)  # another thread's region: the calls' Python runs instead
        try:
            with pytest.raises(InputValueError, match=r"met a NaN, which int8 cannot represent"):
                fused.run({name: bad})
            _same(fused.run({name: arrays[0]}), python.run({name: arrays[0]}))
        finally:
            pool.busy.release()
    gone = rng.standard_normal(shape).astype(np.float32)
    ref = weakref.ref(gone)
    fused.run({name: gone})
    del gone
    assert ref() is None, "a caller's array outlived its run"
    ins = seg.calls[0][1]
    ins[0] = arrays[0].astype(np.float64)  # as no request can attach it (the input's dtype is checked before)
    try:
        with pytest.raises(KernelError, match="reads float32"):
            seg([], [], None)
    finally:
        ins[0] = None


@pytest.mark.parametrize("shape", [(1, 20, 9, 11), (1, 32, 9, 11), (2, 20, 9, 11), (2, 8, 9, 11), (1, 3, 4, 4)],
                         ids=["partial-block", "whole-blocks", "batch-of-partial", "batch-under-a-block", "three"])
def test_a_to_blocked_of_the_callers_input_replays_on_each_run_s_array(shape):
    """ToBlocked reading the caller's input (a graph's first op): its records (oneDNN's reorder of the whole
    blocks, the last block's lanes, or oneDNN's reorder alone) with the source pointers rebound before each replay
    give the reference's blocked values, zero padding lanes included, for array after array; its records for an
    arena input rebind nothing."""
    from op_harness import build_kernel, infos_of, make_node, reference, replay_recorded

    from engine.devices.cpu.fused_calls import _Recorded
    from engine.devices.cpu.onednn.blocked import native_block

    block = native_block()
    if not block:
        pytest.skip("no blocked layout on this CPU")
    node = make_node("ToBlocked", 1, params={"block": block, "channels": shape[1]})
    rng = np.random.default_rng(11)
    first = rng.standard_normal(shape).astype(np.float32)
    kernel, workspace = build_kernel(node, infos_of([first]))
    out = np.full(reference(node, [first])[0].shape, 5.0, np.float32)
    kernel([first], [out], workspace)  # the Python path first, as the runtime runs it before merging
    ins = [first]
    nat = kernel.native_rebound(ins, [out], workspace, (0,), ())  # maps this small: the lanes' loop on this thread
    assert nat is not None and nat.rebinds and {j for j, _, _ in nat.rebinds} == {0}
    assert kernel.native([first], [out], workspace).rebinds == []
    rec = _Recorded([nat], [(kernel, ins, [out])])
    for _ in range(3):
        ins[0] = rng.standard_normal(shape).astype(np.float32)
        out[...] = np.nan
        assert rec.rebind([(kernel, ins, [out])])
        assert replay_recorded(rec) is None
        np.testing.assert_array_equal(out, reference(node, ins)[0])
    assert kernel.native_rebound(ins, [out], workspace, (1,), ()) is None  # only its first input is read


@pytest.mark.parametrize("shape,groups", [((1, 20, 24, 24), 20), ((1, 32, 24, 24), 1), ((2, 20, 12, 12), 20)],
                         ids=["depthwise-partial-block", "dense-whole-blocks", "batch-of-two"])
def test_a_blocked_graph_s_first_reorder_joins_the_program(shape, groups, monkeypatch):
    """ToBlocked -> ConvBlocked -> ToPlain (a conv between blocked layers, as bench/layers.py times it): the
    reorder of the caller's input joins the program, which replays on every new array the caller sends as the
    kernels' Python path computes it."""
    from engine.devices.cpu.onednn.blocked import native_block
    from engine.ir import Graph
    from engine.runtime.model import Model

    block = native_block()
    if not block:
        pytest.skip("no blocked layout on this CPU")
    rng = np.random.default_rng(12)
    n, c, h, w = shape
    o = c if groups > 1 else 24
    g = Graph()
    x = g.value("x", shape, np.float32)
    g.inputs = [x]
    xb = g.add_node("ToBlocked", [x], params={"block": block, "channels": c}).outputs[0]
    params = {"stride": (1, 1), "pads": (1, 1, 1, 1), "dilation": (1, 1), "groups": groups, "activation": "relu",
              "src_blocked": True, "dst_blocked": True, "block": block}
    attrs = {"weight": rng.standard_normal((o, c // groups, 3, 3)).astype(np.float32),
             "bias": rng.standard_normal(o).astype(np.float32)}
    yb = g.add_node("ConvBlocked", [xb], params=params, attrs=attrs).outputs[0]
    y = g.add_node("ToPlain", [yb], params={"block": block, "channels": o}).outputs[0]
    y.name = "y"
    g.outputs = [y]
    model = Model(g, "blocked")
    fused = model.instance("cpu")
    monkeypatch.setenv("NNSERVE_NATIVE_CALLS", "0")
    python = model.instance("cpu")
    monkeypatch.delenv("NNSERVE_NATIVE_CALLS")
    _warm(fused, {"x": rng.standard_normal(shape).astype(np.float32)})
    seg = next(iter(fused._bound.values())).fused[0][0][0]
    if not isinstance(seg, Segment):
        pytest.skip("the kernels record nothing here (native regions off)")
    assert [nd.op_type for nd in seg.nodes] == ["ToBlocked", "ConvBlocked", "ToPlain"]
    with monkeypatch.context() as m:
        m.setattr(seg, "_python", lambda: pytest.fail("the program should have run"))
        for _ in range(3):
            xv = rng.standard_normal(shape).astype(np.float32)
            _same(fused.run({"x": xv}), python.run({"x": xv}))


@pytest.mark.parametrize("name", ["efficientnet_b0", "regnety"])
def test_a_float_model_s_first_conv_joins_the_program_on_a_source_of_its_own(name, load_fixture, monkeypatch):
    """A float model's first conv reads the caller's array: its program points a source memory of its own at each
    run's array, so the plan's memories keep what its Python run set. Runs on new arrays, the calls' Python in
    between (an input the program does not take: strides unlike the recorded ones) on the array that run last
    saw and on new ones, then the program again: each equals the kernels' Python path bit for bit."""
    fx = load_fixture(name, "realworld")
    fused, python = _instances(fx, monkeypatch)
    (key, x0), = fx.inputs.items()
    _warm(fused, fx.inputs)
    seg = next(iter(fused._bound.values())).fused[0][0][0]
    assert isinstance(seg, Segment) and seg.varying[0] == ((0,), ()), seg
    rng = np.random.default_rng(13)

    def fresh():
        return (x0 + rng.standard_normal(x0.shape).astype(np.float32) * 0.1).astype(np.float32)

    def odd(a):  # the same values, C-contiguous, another stride on the size-1 batch axis
        assert a.shape[0] == 1
        return np.lib.stride_tricks.as_strided(a, a.shape, (8,) + a.strides[1:])

    for _ in range(2):
        a = fresh()
        _same(fused.run({key: a}), python.run({key: a}))
    b = fresh()
    for x in (odd(b), odd(b), odd(fresh()), fresh(), odd(b), fresh()):
        _same(fused.run({key: x}), python.run({key: x}))
    # after the calls' Python ran on other arrays (above), a traced run, a program dropped (as on a change of
    # regime): the program is recorded again and runs on array after array (kept alive: each at its own address)
    fused.run({key: fresh()}, timings=True)
    seg.programs.clear()
    kept = []
    with monkeypatch.context() as m:
        for k in range(4):
            if k == 1:  # recorded on the first run after the drop
                m.setattr(seg, "_python", lambda: pytest.fail("the program should have run"))
            kept.append(fresh())
            _same(fused.run({key: kept[-1]}), python.run({key: kept[-1]}))
    # no caller's array outlives its run (the first conv's Python shortcut forgets its array once recorded)
    gone = fresh()
    ref = weakref.ref(gone)
    fused.run({key: gone})
    del gone
    assert ref() is None, "a caller's array outlived its run"


@pytest.mark.parametrize("relu", [False, True])
def test_an_int8_adds_records_compute_its_run(relu):
    """Int8AddNhwc's records (add_team on this thread) against its run, on the same arrays; a non-contiguous
    operand gets no records (its run would read a copy)."""
    from op_harness import build_kernel, infos_of, make_node

    rng = np.random.default_rng(9)
    a, b = (rng.integers(-128, 128, (2, 5, 6, 7), dtype=np.int8) for _ in range(2))
    scales = {k: rng.uniform(0.01, 0.05, 7).astype(np.float32) for k in ("scale_a", "scale_b", "scale_out")}
    node = make_node("Int8AddNhwc", 2, params={"relu": relu}, attrs=scales)
    kernel, workspace = build_kernel(node, infos_of([a, b]))
    want, got = np.empty_like(a), np.full_like(a, 7)
    kernel([a, b], [want], workspace)
    native = kernel.native([a, b], [got], workspace)
    assert N.Program(native.records, native.keep).run() is None
    np.testing.assert_array_equal(got, want)
    assert kernel.native([a[:, :, ::-1], b], [got], workspace) is None


def test_the_team_loops_compute_what_their_python_calls_do():
    """layernorm_team and add_team, called as a program calls them (outside a region: one thread, every item),
    against the numba loops (layernorm: within rounding, see below; int8 add: bit for bit): rows whose float64 sums
    depend on their order (large values cancelling), every weight / bias combination, NaN, and int8 adds with a
    zero output scale."""
    import ctypes

    from op_harness import cpu_device

    from engine.devices.cpu.int8 import loops as I8
    from engine.devices.cpu.loops import normalize as LN

    cpu_device()  # the device loads the OpenMP runtime whose functions the jobs name (alone, no model did yet)

    call = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((37, 77)) * np.logspace(0, 20, 77)).astype(np.float32)
    x[3, 5] = np.nan
    for has_w in (False, True):
        for has_b in (False, True):
            w = rng.standard_normal(77) if has_w else np.zeros(1)
            b = rng.standard_normal(77) if has_b else np.zeros(1)
            want, got = np.empty_like(x), np.empty_like(x)
            LN.layernorm_rows(x, x, False, want, w, b, 1e-5, has_w, has_b, 0, 37)
            eps = np.array([1e-5])
            job = T.region_job(LN.LN_LEN)
            job[LN.LN_ROWS], job[LN.LN_N] = x.shape
            job[LN.LN_X], job[LN.LN_OUT], job[LN.LN_WEIGHT], job[LN.LN_BIAS], job[LN.LN_EPS] = (
                a.ctypes.data for a in (x, got, w, b, eps))
            job[LN.LN_HAS_W], job[LN.LN_HAS_B] = has_w, has_b
            call(LN.layernorm_team().address)(job.ctypes.data)
            # the dispatcher's loop (the Python split's over callbacks) may round its reassociated float64 sums
            # differently in the last bit: where records are made, the kernel's Python calls this cfunc itself
            # (test_norm_kernels.test_float32_layernorm_python_path_region_and_records_give_the_same_bits)
            np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    a, b2 = (rng.integers(-128, 128, (50, 24), dtype=np.int8) for _ in range(2))
    sa, sb, so = (rng.uniform(0.01, 0.1, 24).astype(np.float32) for _ in range(3))
    so[3] = 0
    want, got = np.empty_like(a), np.empty_like(a)
    I8.add(a, b2, sa, sb, so, np.int8(-128), want, 0, 50)
    job = T.region_job(I8.ADD_LEN)
    job[I8.ADD_P], job[I8.ADD_C] = a.shape
    job[I8.ADD_A:I8.ADD_FLOOR] = [v.ctypes.data for v in (a, b2, sa, sb, so)]
    job[I8.ADD_FLOOR], job[I8.ADD_OUT] = -128, got.ctypes.data
    call(I8.add_team().address)(job.ctypes.data)
    np.testing.assert_array_equal(got, want)


def test_native_calls_setting_is_checked():
    from engine.devices.cpu.options import CpuOptions

    assert CpuOptions.from_env({}).native_calls
    assert not CpuOptions.from_env({"NNSERVE_NATIVE_CALLS": "0"}).native_calls
    with pytest.raises(ValueError, match="NNSERVE_NATIVE_CALLS"):
        CpuOptions.from_env({"NNSERVE_NATIVE_CALLS": "yes please"})


def test_program_copies_and_reports_the_failing_record():
    import ctypes

    src, dst = np.arange(16, dtype=np.uint8), np.zeros(16, np.uint8)
    copy = (N.OP_COPY, N.address_of(ctypes.memmove), dst.ctypes.data, src.ctypes.data, 16)
    assert N.Program([copy], [src, dst]).run() is None
    np.testing.assert_array_equal(dst, src)
    assert N.Program([copy, (77,)], []).run() == (1, -1)
    assert T.regime() == T.regime()
