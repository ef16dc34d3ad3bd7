"""A plain (NCHW) Conv on the blocked Winograd between its own reorders (engine/devices/cpu/conv/winograd_nchw.py)
against the numpy float64 reference: every epilogue, residuals, pads, smaller shapes that switch to oneDNN's plan on
the same workspace and back, the convs it must leave to oneDNN, the option that turns it off, no allocation."""

from __future__ import annotations

import numpy as np
import pytest
from op_harness import build_kernel, cpu_device, infer, infos_of, kernel_peak_bytes, make_node, reference

from engine.devices.cpu.conv import winograd_blocked as W
from engine.devices.cpu.onednn import objects as onednn
from engine.devices.cpu.onednn.blocked import native_block
from engine.devices.cpu.threads import get_threads, set_threads
from engine.errors import KernelError
from engine.ops.conv_geometry import conv_geom

if not onednn.available() or not native_block():
    pytest.skip("oneDNN (libdnnl.so.3 from the onednn-cpu-gomp wheel) with a blocked layout is not installed",
                allow_module_level=True)

RNG = np.random.default_rng(5)
C = 64  # whole blocks of 8 and of 16 lanes
WINO = "reorder+winograd-f4x4+onednn-matmul"


@pytest.fixture(autouse=True)
def avx2_rule(monkeypatch):
    """The 8-lane rule on any CPU (16-lane blocks take Winograd only for big convs, W.pays_on_wide_vectors), on two
    threads: below MIN_WORK the rule also asks for W.SPLIT_TILES tiles a thread, which a 16-core machine's count
    would turn these small shapes down for."""
    monkeypatch.setattr(W, "WIDE_BLOCK", 1 << 30)
    before = get_threads()
    set_threads(2)
    yield
    set_threads(before)


def rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def conv(c: int, o: int, residual: bool = False, act: str | None = None, act_params: dict | None = None,
         **params):
    params = {"pads": (1, 1, 1, 1), **params}
    if act is not None:
        params.update(activation=act, activation_params=act_params or {})
    return make_node("Conv", 2 if residual else 1, params=params,
                     attrs={"weight": rand(o, c, 3, 3) * 0.2, "bias": rand(o)})


def arrays_for(node, shape: tuple[int, ...]) -> list[np.ndarray]:
    x = rand(*shape)
    return [x] if len(node.inputs) == 1 else [x, rand(*infer(node, [x])[0].shape)]


def check_runs(node, shapes: list[tuple[int, ...]], device=None) -> str:
    """Builds at the first shape, runs every shape in turn on the one workspace; returns the kernel's impl."""
    fn, ws = build_kernel(node, infos_of(arrays_for(node, shapes[0]), node=node), device)
    params = {k: v for k, v in node.params.items() if k not in ("activation", "activation_params")}
    linear = make_node("Conv", len(node.inputs), params=params, attrs=node.attrs)
    for shape in shapes:
        arrays = arrays_for(node, shape)
        want = reference(node, arrays)[0]
        out = np.full(want.shape, np.nan, np.float32)
        fn(arrays, [out], ws)
        # Winograd's rounding scales with the conv's sums, which a clipping activation hides from `want`
        scale = float(np.abs(reference(linear, arrays)[0]).max())
        np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4 * max(1.0, scale))
    return fn.impl


@pytest.mark.parametrize("act,act_params", [(None, None), ("relu", None), ("relu6", None),
                                            ("leaky_relu", {"alpha": 0.1}), ("clip", {"min": -0.3, "max": 0.4}),
                                            ("silu", None), ("gelu", None)])
@pytest.mark.parametrize("residual", [False, True])
def test_matches_reference_with_every_epilogue(act, act_params, residual):
    node = conv(C, C, residual, act, act_params)
    # 20x20: 25 tiles an image (Winograd); 7x9: 6 tiles (oneDNN's plan on the same workspace); then Winograd again
    assert check_runs(node, [(2, C, 20, 20), (1, C, 20, 20), (1, C, 7, 9), (2, C, 20, 20)]) == WINO


def test_odd_sizes_and_no_padding():
    node = conv(C, 2 * C, pads=(0, 0, 0, 0))
    assert check_runs(node, [(1, C, 27, 22)]) == WINO  # 25x20 out: the last tile row and column clipped


@pytest.mark.parametrize("c,o,shape,params", [
    (C, C, (1, C, 20, 20), {"stride": (2, 2)}),
    (C, C, (1, C, 20, 20), {"dilation": (2, 2), "pads": (2, 2, 2, 2)}),
    (36, 40, (1, 36, 20, 20), {}),  # channels that do not fill whole blocks
    (C, C, (1, C, 8, 8), {}),  # 4 tiles
    (16, 16, (1, 16, 40, 40), {}),  # too few channels (W.MIN_CHANNELS)
])
def test_other_convs_stay_on_onednn(c, o, shape, params):
    assert check_runs(conv(c, o, **params), [shape]).startswith("onednn:")


def test_f2x2_shapes_stay_on_onednn():
    """W.choose's F(2x2) (wide layers on small maps) does not pay against oneDNN's plain kernel."""
    node = conv(256, 256)
    geo_shape = (1, 256, 7, 7)
    assert W.choose(conv_geom(node, geo_shape), 8) == 2
    assert check_runs(node, [geo_shape]).startswith("onednn:")


def test_switched_off_by_the_option():
    node = conv(C, C, act="relu")
    assert check_runs(node, [(1, C, 20, 20)], device=cpu_device(winograd=False)).startswith("onednn:")


def test_does_not_allocate_activations():
    node = conv(C, C, residual=True, act="relu")
    arrays = arrays_for(node, (2, C, 40, 40))
    assert check_runs(node, [(2, C, 40, 40)]) == WINO
    assert kernel_peak_bytes(node, arrays) < arrays[0].nbytes // 8


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf, 3e38])
def test_non_finite_inputs_never_give_a_wrong_finite_number(bad):
    """A NaN, an infinity or a value near float32's range spreads NaN over Winograd's tiles (winograd_blocked.py):
    every output the reference makes non-finite is non-finite here, and every finite output here is the
    reference's."""
    node = conv(C, C, residual=True, act="relu")
    arrays = arrays_for(node, (1, C, 20, 20))
    arrays[0][0, 3, 9, 10] = bad
    fn, ws = build_kernel(node, infos_of(arrays, node=node))
    assert fn.impl == WINO
    with np.errstate(all="ignore"):
        want = reference(node, arrays)[0]
    out = np.full(want.shape, 7.0, np.float32)
    fn(arrays, [out], ws)
    assert not np.isfinite(out[~np.isfinite(want)]).any()
    finite = np.isfinite(out)
    assert finite.sum() > out.size // 2  # only the tiles around the bad pixel
    np.testing.assert_allclose(out[finite], want[finite], rtol=1e-4, atol=1e-3)


def test_two_threads_and_beyond_the_max_shape():
    """Two threads (avx2_rule; W.choose's tiles per thread: 25 an image pass at batch 1), and an input larger than
    the max shape refused like oneDNN's kernel refuses it."""
    node = conv(C, C, residual=True, act="silu")
    assert check_runs(node, [(2, C, 20, 20), (1, C, 20, 20)]) == WINO
    fn, ws = build_kernel(node, infos_of(arrays_for(node, (1, C, 20, 20)), node=node))
    big = arrays_for(node, (1, C, 24, 24))
    with pytest.raises(KernelError, match="beyond the max shape"):
        fn(big, [np.empty((1, C, 24, 24), np.float32)], ws)
