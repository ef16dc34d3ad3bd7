"""The direct depthwise and grouped conv loops split as one native OpenMP region (conv/direct.py `_loop_run`,
conv/loops.direct_team) and recorded into native programs: bit for bit the one-thread Python loop's numbers, with a
residual and fused activations, NaN, at the max shape and below."""

from __future__ import annotations

import numpy as np
import pytest
from op_harness import build_kernel, cpu_device, force_native_regions, infer, infos_of, make_node, reference, replay

from engine.devices.cpu import native_program as N
from engine.devices.cpu import threads as T
from engine.devices.cpu.conv import direct

RNG = np.random.default_rng(8)
DIRECT = cpu_device(onednn=False)  # the direct loops for every case (with oneDNN most depthwise convs take its)
CASES = {  # name: (c, o, k, groups, stride, dilation, pads)
    "depthwise3": (20, 20, 3, 20, 1, 1, 1),
    "depthwise5_s2_d2": (12, 12, 5, 12, 2, 2, 4),
    "grouped": (16, 24, 3, 8, 1, 1, 1),
}


def _node(name: str, act: str | None, residual: bool):
    c, o, k, groups, stride, dil, pads = CASES[name]
    attrs = {"weight": RNG.standard_normal((o, c // groups, k, k)).astype(np.float32),
             "bias": RNG.standard_normal(o).astype(np.float32)}
    params = {"stride": [stride] * 2, "dilation": [dil] * 2, "pads": [pads] * 4, "groups": groups,
              "activation": act, "activation_params": {}}
    return make_node("Conv", 2 if residual else 1, params=params, attrs=attrs), c


def infos_of_out(node, x: np.ndarray) -> tuple:
    """The conv's output shape for input x."""
    return tuple(infer(make_node("Conv", 1, params=node.params, attrs=node.attrs), [x])[0].shape)


@pytest.fixture
def team(monkeypatch, request):
    """Regions forced on (every size), over 2 threads unless a test sets another count; records whether each
    region ran."""
    monkeypatch.setattr(direct, "NATIVE_DIRECT_TAPS", 0)
    return force_native_regions(monkeypatch, request, 2, direct)


def _python_loop(monkeypatch, fn, ws, ins, out_shape) -> np.ndarray:
    """The kernel on this thread alone, from Python (no region, no split)."""
    with monkeypatch.context() as m:
        m.setattr(direct, "native_regions", lambda: False)
        m.setattr(T, "MIN_WORK", 1 << 62)
        out = np.full(out_shape, 7.0, np.float32)
        fn(ins, [out], ws)
    return out


@pytest.mark.parametrize("threads_n", [2, 3])
@pytest.mark.parametrize("act,residual", [(None, False), ("relu6", True), ("hardsigmoid", False), ("silu", True)])
@pytest.mark.parametrize("name", sorted(CASES))
def test_region_and_records_give_the_python_loops_bits(name, act, residual, threads_n, team, monkeypatch):
    T.set_threads(threads_n)
    node, c = _node(name, act, residual)
    big = [RNG.standard_normal((3, c, 17, 19)).astype(np.float32)]
    if residual:
        big.append(RNG.standard_normal(infos_of_out(node, big[0])).astype(np.float32))
    fn, ws = build_kernel(node, infos_of(big, node=node), DIRECT)
    assert fn.impl.startswith("direct:") and fn.impl.split(":")[1] in ("depthwise", "grouped")
    small = [big[0][:2, :, :11, :13].copy()]
    if residual:
        small.append(RNG.standard_normal(infos_of_out(node, small[0])).astype(np.float32))
    for ins in (big, small):
        ins[0][0, 0, 0, 0] = np.nan  # NaN stays NaN through every path
        shape = infos_of_out(node, ins[0])
        want = _python_loop(monkeypatch, fn, ws, ins, shape)
        ran_before = len(team)
        out = np.full(shape, 7.0, np.float32)
        fn(ins, [out], ws)
        assert team[ran_before:] == [True]
        np.testing.assert_array_equal(out, want)
        ref = reference(node, ins)[0]
        np.testing.assert_array_equal(np.isnan(out), np.isnan(ref))
        ok = ~np.isnan(ref)
        np.testing.assert_allclose(out[ok], ref[ok], rtol=1e-4, atol=1e-4)
        out[...] = 7.0
        native = fn.native(ins, [out], ws)
        assert native.records[0][0] == N.OP_REGION
        assert replay(native) is None
        np.testing.assert_array_equal(out, want)


def test_small_loops_stay_on_this_thread_as_one_call(team, monkeypatch):
    """Under NATIVE_DIRECT_TAPS (regions running) the loop runs where it is called, recorded as one call."""
    monkeypatch.setattr(direct, "NATIVE_DIRECT_TAPS", 1 << 40)
    monkeypatch.setattr(T, "MIN_WORK", 1 << 20)  # the fixture's 0 would split even work 0
    node, c = _node("depthwise3", None, False)
    x = RNG.standard_normal((1, c, 9, 9)).astype(np.float32)
    fn, ws = build_kernel(node, infos_of([x], node=node), DIRECT)
    out = np.empty(infos_of_out(node, x), np.float32)
    fn([x], [out], ws)
    assert team == []
    native = fn.native([x], [out], ws)
    assert [r[0] for r in native.records] == [N.OP_CALL]
    got = out.copy()
    out[...] = 7.0
    assert replay(native) is None
    np.testing.assert_array_equal(out, got)
