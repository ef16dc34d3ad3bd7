"""Conv on oneDNN (engine/devices/cpu/conv/onednn.py) against the numpy float64 reference: every geometry family, every
fused activation (each eltwise post-op checked numerically), residuals, smaller shapes after the max shape,
1 and 2 threads, the workspace bound; and the numpy/numba kernels still right with oneDNN switched off."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from op_harness import build_kernel as build_op_kernel
from op_harness import (
    check_kernel,
    cpu_device,
    infer,
    infos_of,
    kernel_peak_bytes,
    kernel_workspace,
    make_node,
    reference,
)

from engine.devices.cpu import threads as _threads
from engine.devices.cpu.conv import direct
from engine.devices.cpu.conv import kernels as conv_kernels
from engine.devices.cpu.conv import onednn as _conv_onednn
from engine.devices.cpu.onednn import binding as _onednn_lib
from engine.devices.cpu.onednn import eltwise as eltwise_module
from engine.devices.cpu.onednn import objects as _onednn
from engine.devices.cpu.onednn.blocked import native_block
from engine.errors import KernelError
from engine.ops.conv_geometry import conv_geom
from engine.ops.registry import TensorInfo

if not _onednn.available():
    pytest.skip("oneDNN (libdnnl.so.3 from the onednn-cpu-gomp wheel) is not installed", allow_module_level=True)

REPO_ROOT = Path(__file__).resolve().parents[5]
RNG = np.random.default_rng(11)
TOL = dict(rtol=1e-4, atol=1e-5)


def rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def conv_node(c: int, o: int, k=(3, 3), bias: bool = True, residual: bool = False, **params):
    g = params.get("groups", 1)
    attrs = {"weight": rand(o, c // g, *k)}
    if bias:
        attrs["bias"] = rand(o)
    return make_node("Conv", 2 if residual else 1, params=params, attrs=attrs)


def inputs_for(node, x: np.ndarray) -> list[np.ndarray]:
    """x, plus a residual of the output's shape when the node takes one."""
    if len(node.inputs) == 1:
        return [x]
    return [x, rand(*infer(node, [x])[0].shape)]


# (channels in, out, kernel, input shape, params): the shapes oneDNN picks different implementations for.
GEOMETRIES = {
    "3x3_s1": (16, 24, (3, 3), (2, 16, 10, 9), dict(pads=(1, 1, 1, 1))),
    "1x1": (24, 32, (1, 1), (2, 24, 7, 7), {}),
    "1x1_s2": (16, 8, (1, 1), (1, 16, 9, 9), dict(stride=(2, 2))),
    "depthwise_s1": (32, 32, (3, 3), (2, 32, 11, 12), dict(groups=32, pads=(1, 1, 1, 1))),
    "depthwise_s2": (24, 24, (3, 3), (1, 24, 13, 13), dict(groups=24, stride=(2, 2), pads=(1, 1, 1, 1))),
    "depthwise_7x7_odd": (20, 20, (7, 7), (2, 20, 15, 13), dict(groups=20, pads=(3, 3, 3, 3))),
    "depthwise_5x5_mult2": (8, 16, (5, 5), (1, 8, 9, 9), dict(groups=8, pads=(2, 2, 2, 2))),
    "grouped_dilated_asym": (6, 9, (3, 3), (2, 6, 11, 10), dict(groups=3, dilation=(2, 1), pads=(2, 0, 1, 2))),
    "first_7x7_s2": (3, 16, (7, 7), (1, 3, 32, 30), dict(stride=(2, 2), pads=(3, 3, 3, 3))),
    "5x5_dil2": (8, 12, (5, 5), (1, 8, 14, 14), dict(dilation=(2, 2), pads=(4, 4, 4, 4))),
    "rect_s21": (5, 7, (3, 1), (2, 5, 9, 8), dict(stride=(2, 1), pads=(0, 1, 2, 0))),
    "same_upper_s2": (8, 8, (3, 3), (1, 8, 10, 11), dict(auto_pad="same_upper", stride=(2, 2))),
    "no_bias": (8, 16, (3, 3), (1, 8, 8, 8), dict(pads=(1, 1, 1, 1), bias=False)),
}

ACTIVATIONS = {
    "relu": None,
    "relu6": None,
    "leaky_relu": dict(alpha=0.1),
    "clip": dict(min=-0.5, max=1.5),
    "clip_max_only": dict(max=0.5),
    "sigmoid": None,
    "silu": None,
    "hardswish": None,
    "hardsigmoid": dict(alpha=0.2, beta=0.5),
    "gelu": None,
    "gelu_tanh": dict(approximate="tanh"),
    "tanh": None,
    "elu": dict(alpha=0.7),
}


def act_params(name: str) -> dict:
    act = {"clip_max_only": "clip", "gelu_tanh": "gelu"}.get(name, name)
    return dict(activation=act, activation_params=ACTIVATIONS[name])


def build_args(name: str, residual: bool = False, **extra):
    c, o, k, shape, params = GEOMETRIES[name]
    params = {**params, **extra}
    bias = params.pop("bias", True)
    return conv_node(c, o, k, bias=bias, residual=residual, **params), shape


@pytest.fixture(autouse=True)
def onednn_for_every_conv(monkeypatch):
    """Every supported conv on oneDNN here, the plain 1x1s the dispatch keeps on the GEMM path included."""
    monkeypatch.setattr(conv_kernels, "_use_onednn",
                        lambda backends, node, ins: backends.onednn and _conv_onednn.supported(node, ins))


@pytest.mark.parametrize("name,onednn", [("3x3_s1", True), ("depthwise_s2", True), ("1x1_s2", True),
                                         ("1x1", False)])
def test_dispatch(name, onednn, monkeypatch):
    monkeypatch.undo()  # the real dispatch
    node, shape = build_args(name)
    fn = build_op_kernel(node, [TensorInfo(shape, np.dtype(np.float32))])[0]
    assert getattr(fn, "impl", "").startswith("onednn:") == onednn


@pytest.mark.parametrize("dilation,groups", [(1, 24), (12, 24), (1, 6), (2, 12)])
def test_depthwise_or_grouped_take_the_direct_kernel_where_onednn_has_no_jit_one(dilation, groups, monkeypatch):
    """oneDNN's gemm-based depthwise or grouped conv (im2col per group: dilation 12, 4 or 2 channels a group, on
    AVX2) loses to the direct numba kernel."""
    monkeypatch.undo()  # the real dispatch
    node = conv_node(24, 24, pads=(dilation,) * 4, dilation=(dilation, dilation), groups=groups, residual=True,
                     **act_params("relu6"))
    shape = (2, 24, 2 * dilation + 6, 2 * dilation + 5)
    impl = _conv_onednn.primitive_impl(_conv_onednn.ConvSpec(node, True), shape)
    fn = build_op_kernel(node, infos_of(inputs_for(node, rand(*shape)), node=node))[0]
    kind = "depthwise" if groups == 24 else "grouped"
    assert fn.impl == (f"onednn:{impl}" if _conv_onednn.is_jit(impl) else f"direct:{kind}")
    check_kernel(node, inputs_for(node, rand(*shape)), **TOL)


@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
def test_long_conv1d_runs_as_im2col_and_gemm(residual, monkeypatch):
    """A dense conv over one row with a large output (Whisper's 80->384 k3 @3000, CONV1D_DIRECT_OUTPUTS) takes the
    direct im2col + GEMM path, activation and residual included, at its max shape and a smaller one; a smaller
    output, two rows or groups keep oneDNN."""
    monkeypatch.undo()  # the real dispatch
    monkeypatch.setattr(conv_kernels, "CONV1D_DIRECT_OUTPUTS", 64 * 400)

    def impl(node, shape):
        return build_op_kernel(node, infos_of(inputs_for(node, rand(*shape)), node=node))[0].impl

    node = conv_node(6, 64, (1, 3), residual=residual, pads=(0, 1, 0, 1), **act_params("gelu"))
    assert impl(node, (2, 6, 1, 400)) == "direct:im2col"
    big = rand(2, 6, 1, 400)
    check_kernel(node, inputs_for(node, big), **TOL)
    check_kernel(node, inputs_for(node, rand(1, 6, 1, 157)), inputs_for(node, big), **TOL)
    strided = conv_node(6, 64, (1, 3), stride=(1, 2), pads=(0, 1, 0, 1))
    assert impl(strided, (1, 6, 1, 799)) == "direct:im2col"  # 64 x 400 outputs
    assert impl(strided, (1, 6, 1, 797)).startswith("onednn:")  # 64 x 399
    assert impl(conv_node(6, 64, (3, 3), pads=(0, 1, 0, 1)), (1, 6, 3, 400)).startswith("onednn:")  # over three rows
    assert impl(conv_node(6, 64, (1, 3), groups=2, pads=(0, 1, 0, 1)), (1, 6, 1, 400)).startswith("onednn:")


@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
@pytest.mark.parametrize("name", GEOMETRIES)
def test_geometry_matches_reference(name, residual):
    node, shape = build_args(name, residual, activation="relu" if residual else None)
    check_kernel(node, inputs_for(node, rand(*shape)), **TOL)


@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
@pytest.mark.parametrize("act", ACTIVATIONS)
def test_activation_is_an_exact_post_op(act, residual):
    # sigmoid and (on 8-lane vectors) SiLU and erf GELU are the exception: our rational approximations after the
    # primitive beat oneDNN's post-ops; hard-sigmoid and a clip whose lower bound is not 0 have no post-op chain
    # keeping NaN (onednn/eltwise.py) and are our pass too
    node, shape = build_args("3x3_s1", residual, **act_params(act))
    elt = _conv_onednn.conv_post_op(node.params["activation"], node.params["activation_params"])
    ours = ("sigmoid", "clip", "clip_max_only", "hardsigmoid") + (("gelu", "silu") if native_block() < 16 else ())
    assert (elt is None) == (act in ours)
    x = rand(*shape) * 2  # spread across every activation's bends
    check_kernel(node, inputs_for(node, x), **TOL)


@pytest.mark.parametrize("act", ["silu", "gelu_tanh", "hardswish"])
def test_activation_without_post_op_runs_on_the_nchw_output(act, monkeypatch):
    monkeypatch.setattr(_conv_onednn, "conv_post_op", lambda name, params: None)
    node, shape = build_args("depthwise_s1", True, **act_params(act))
    check_kernel(node, inputs_for(node, rand(*shape)), **TOL)


@pytest.mark.parametrize("lanes", [8, 16])
@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
@pytest.mark.parametrize("act", ["gelu", "silu"])
def test_erf_gelu_and_silu_are_fused_only_on_16_lane_vectors(lanes, residual, act, monkeypatch):
    """Erf GELU and SiLU are oneDNN's post-ops where its convolutions work in 16-lane vectors (AVX-512) and our pass
    after the primitive elsewhere; both match the reference (the other path is forced by what `conv_post_op`
    reads); sigmoid stays ours."""
    monkeypatch.setattr(eltwise_module, "native_block", lambda: lanes)
    node, shape = build_args("depthwise_s1", residual, **act_params(act))
    elt = _conv_onednn.conv_post_op(node.params["activation"], node.params["activation_params"])
    fused = {"gelu": (("gelu_erf", 0.0, 0.0),), "silu": (("swish", 1.0, 0.0),)}[act]
    assert elt == (fused if lanes == 16 else None)
    assert _conv_onednn.conv_post_op("sigmoid", None) is None
    check_kernel(node, inputs_for(node, rand(*shape) * 3), **TOL)


def build_kernel(node, shape):
    ins = infos_of(inputs_for(node, np.zeros(shape, np.float32)), node=node)
    return build_op_kernel(node, ins)


def run(fn, ws, node, arrays):
    out = np.full(infer(node, arrays)[0].shape, np.nan, np.float32)
    fn(arrays, [out], ws)
    return out


@pytest.mark.parametrize("name", ["3x3_s1", "depthwise_s2", "first_7x7_s2", "grouped_dilated_asym", "1x1"])
def test_smaller_shapes_after_the_max_shape_use_cached_primitives(name):
    node, shape = build_args(name, True, activation="relu6")
    big = (4, *shape[1:])
    fn, ws = build_kernel(node, big)
    for n, h, w in [(4, big[2], big[3]), (1, big[2], big[3]), (2, big[2] - 3, big[3] - 2), (1, big[2], big[3])]:
        arrays = inputs_for(node, rand(n, shape[1], h, w))
        want = reference(node, arrays)[0]
        np.testing.assert_allclose(run(fn, ws, node, arrays), want, rtol=1e-4, atol=1e-5 * max(1, np.abs(want).max()))
    assert len(fn.plans) == 3  # the max shape and two smaller ones, each built once
    assert all(p.private is None and p.nbytes <= ws.nbytes for p in fn.plans.values())


@pytest.fixture(params=[1, 2], ids=["1thread", "2threads"])
def threads(request):
    before = _threads.get_threads()
    _threads.set_threads(request.param)
    yield request.param
    _threads.set_threads(before)


def test_threads_setting_reaches_openmp(threads):
    node, shape = build_args("3x3_s1", True, activation="silu")
    big = (3, *shape[1:])
    check_kernel(node, inputs_for(node, rand(*big)), **TOL)
    check_kernel(node, inputs_for(node, rand(*shape)), inputs_for(node, rand(*big)), **TOL)
    assert _onednn_lib.OMP.omp_get_max_threads() == threads


@pytest.mark.parametrize("name", ["3x3_s1", "depthwise_s1", "1x1"])
def test_kernel_does_not_allocate_activations(name):
    node, shape = build_args(name, True, activation="relu")
    x = rand(16, *shape[1:])
    arrays = inputs_for(node, x)
    out_bytes = arrays[1].nbytes
    assert kernel_peak_bytes(node, arrays) < min(out_bytes, x.nbytes) // 8
    # the workspace is what the blocked copies and the scratchpad need, not more
    ws = kernel_workspace(node, infos_of(arrays, node=node))
    assert ws <= 2 * (x.nbytes + out_bytes) + (1 << 20)


def test_weights_are_reordered_once_per_layout():
    node, shape = build_args("3x3_s1")
    fn, ws = build_kernel(node, (4, *shape[1:]))
    first = next(iter(fn.plans.values())).weights.ctypes.data
    for n in (1, 2):
        run(fn, ws, node, [rand(n, *shape[1:])])
    plans = list(fn.plans.values())
    assert plans[0].weights.ctypes.data == first
    mds = [p.pd.md(_onednn_lib.QUERY_WEIGHTS_MD) for p in plans]
    for i in range(len(plans)):
        for j in range(i):
            assert (mds[i] == mds[j]) == (plans[i].weights.ctypes.data == plans[j].weights.ctypes.data)


def test_failed_call_names_the_function_and_status():
    with pytest.raises(KernelError, match=r"dnnl_memory_desc_create_with_tag failed with status \d+"):
        _onednn.MemoryDesc.any([2, -3])  # a negative dimension


def test_unsupported_pad_modes_keep_the_numpy_path():
    node, shape = build_args("3x3_s1", pad_mode="reflect")
    assert not _conv_onednn.supported(node, infos_of([rand(*shape)], node=node))
    fn = build_op_kernel(node, infos_of([rand(*shape)], node=node))[0]
    assert fn.impl == "direct:im2col"
    check_kernel(node, [rand(*shape)], **TOL)


# -- the numpy/numba kernels with oneDNN off ---------------------------------------------------------
NUMPY_PATHS = {
    "gemm": ("1x1", "relu"),
    "depthwise": ("depthwise_s2", "hardswish"),
    "winograd": ("3x3_s1", "silu"),
    "im2col": ("5x5_dil2", "relu6"),
    "grouped": ("grouped_dilated_asym", "relu6"),
}


@pytest.mark.parametrize("kind", NUMPY_PATHS)
def test_numpy_path_with_onednn_off(kind, monkeypatch):
    monkeypatch.setattr(direct, "WINOGRAD_MIN_TILES", 4)
    off = cpu_device(onednn=False)
    name, act = NUMPY_PATHS[kind]
    node, shape = build_args(name, True, activation=act)
    assert direct.kind(conv_geom(node, shape)) == kind
    fn = build_op_kernel(node, infos_of(inputs_for(node, rand(*shape)), node=node), off)[0]
    assert fn.impl == f"direct:{kind}"
    check_kernel(node, inputs_for(node, rand(*shape)), **TOL, device=off)


def test_env_switch_disables_onednn():
    """NNSERVE_ONEDNN=0, read with the rest of the environment, gives a CPU device that never loads libdnnl."""
    env = {**os.environ, "NNSERVE_ONEDNN": "0"}
    code = ("from engine.devices.cpu import CpuDevice; from engine.devices.cpu.onednn import binding; "
            "from engine.runtime.options import environment_options; "
            "device = CpuDevice(environment_options().cpu); print(device.backends.onednn, binding.LIB is None)")
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO_ROOT, capture_output=True, text=True,
                         timeout=120, check=True)
    assert out.stdout.strip() == "False True"


def test_kernels_run_concurrently_from_two_threads():
    """Two instances' kernels on two server threads at once: each thread has its own stream and OpenMP team."""
    from concurrent.futures import ThreadPoolExecutor

    node, shape = build_args("depthwise_s1", True, activation="relu6")
    kernels = [build_kernel(node, shape) for _ in range(2)]
    cases = [inputs_for(node, rand(*shape)) for _ in range(2)]
    wants = [reference(node, arrays)[0] for arrays in cases]

    def work(i: int) -> float:
        fn, ws = kernels[i]
        return max(float(np.abs(run(fn, ws, node, cases[i]) - wants[i]).max()) for _ in range(30))

    with ThreadPoolExecutor(2) as pool:
        errors = list(pool.map(work, [0, 1]))
    assert max(errors) < 1e-4
