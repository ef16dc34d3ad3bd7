"""NaN, infinities, signed zeros and the bounds through every fused activation (Gemm, dense and depthwise Conv, with
oneDNN's post-op chains and with our numba epilogues) and through the activation ops, against the numpy reference.

A clamp that turned NaN into its bound would serve a plausible number for a NaN the model computed (oneDNN's own
relu/clip do: onednn/eltwise.py builds them from steps that keep it). Each output below is one input value, so a
mismatch names the value that went wrong.
"""

from __future__ import annotations

import numpy as np
import pytest
from op_harness import build_kernel, cpu_device, infos_of, make_node, reference, run_kernel

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the references meet NaN and inf

F32_MAX = float(np.finfo(np.float32).max)
# every value but -inf (see test_minus_inf_into_a_clamp) and the positive subnormals below 1 / F32_MAX
VALUES = np.array([np.nan, np.inf, 0.0, -0.0, 1e-30, -1e-30, -1e-40, 0.3, -0.3, 0.8, 0.95, 5.9, 6.0, 6.1, 1e30,
                   -1e30, F32_MAX, -F32_MAX], np.float32)

ACTS = {"relu": {}, "relu6": {}, "clip_0_hi": {"min": 0.0, "max": 0.8}, "clip_lo_hi": {"min": 0.1, "max": 0.8},
        "clip_hi": {"max": 0.8}, "clip_lo": {"min": 0.0}, "clip_none": {}, "clip_neg_hi": {"min": 0.0, "max": -1.0},
        "leaky_relu": {"alpha": 0.1}, "leaky_relu_0": {"alpha": 0.0}, "sigmoid": {}, "silu": {}, "tanh": {},
        "elu": {"alpha": 1.3}, "hardswish": {}, "hardsigmoid": {"alpha": 0.2, "beta": 0.5},
        "hardsigmoid_steep": {"alpha": 3.0, "beta": 0.5}, "gelu_tanh":
        {"approximate": "tanh"}, "gelu": {"approximate": "none"}}
CLAMPS = {"relu", "relu6", "clip_0_hi", "clip_lo", "hardsigmoid"}  # post-op chains (onednn/eltwise.py) or ours


def _name(key: str) -> str:
    return key.split("_")[0] if key.startswith(("clip", "gelu", "hardsigmoid")) else key.removesuffix("_0")


def _nodes(key: str, n: int) -> dict:
    """Gemm, dense 3x3 Conv and depthwise 3x3 Conv nodes whose outputs at _values_of are the n input values."""
    act = {"activation": _name(key), "activation_params": ACTS[key]}
    gemm = make_node("Gemm", 1, params=act, attrs={"weight": np.ones((16, 1), np.float32)})
    w = np.zeros((16, 16, 3, 3), np.float32)
    w[:, 0, 1, 1] = 1  # input channel 0 holds the values, 3 apart along a row, channels 1-15 zeros
    dense = make_node("Conv", 1, params={"kernel": [3, 3], "pads": [1] * 4, **act}, attrs={"weight": w})
    w = np.zeros((n, 1, 3, 3), np.float32)
    w[:, 0, 1, 1] = 1  # channel c holds value c at the centre, zeros around it
    depthwise = make_node("Conv", 1, params={"kernel": [3, 3], "pads": [1] * 4, "groups": n, **act},
                          attrs={"weight": w})
    return {"gemm": gemm, "dense": dense, "depthwise": depthwise}


def _inputs(kind: str, values: np.ndarray) -> np.ndarray:
    if kind == "gemm":
        return values.reshape(-1, 1).copy()
    if kind == "dense":
        x = np.zeros((1, 16, 3, 3 * values.size), np.float32)
        x[0, 0, 1, 1::3] = values
        return x
    x = np.zeros((1, values.size, 3, 3), np.float32)
    x[0, :, 1, 1] = values
    return x


def _values_of(kind: str, y: np.ndarray) -> np.ndarray:
    """The output for each input value, in order."""
    return {"gemm": lambda: y[:, 0], "dense": lambda: y[0, 0, 1, 1::3], "depthwise": lambda: y[0, :, 1, 1]}[kind]()


def _impl(node, x: np.ndarray, onednn: bool) -> str:
    return getattr(build_kernel(node, infos_of([x]), cpu_device(onednn=onednn))[0], "impl", "")


def _mismatches(got: np.ndarray, want: np.ndarray) -> list[tuple[float, float]]:
    """(reference, got) pairs that differ: NaN against NaN, infinities exactly, the rest within 2e-6 relative or
    1e-20 absolute (oneDNN's ELU gives 0 for -1e-30, the reference -1.3e-30)."""
    with np.errstate(invalid="ignore"):
        diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
        same = (got == want) | (np.isnan(got) & np.isnan(want)) | (diff <= 2e-6 * np.abs(want) + 1e-20)
    return [(float(w), float(g)) for g, w in zip(got[~same], want[~same], strict=True)]


@pytest.mark.parametrize("onednn", [True, False])
@pytest.mark.parametrize("key", sorted(ACTS))
def test_fused_activation_special_values(key, onednn):
    values = VALUES[~(VALUES > 1.7e38)] if onednn and key == "gelu" else VALUES  # oneDNN's erf GELU: below
    device = cpu_device(onednn=onednn)
    for kind, node in _nodes(key, values.size).items():
        x = _inputs(kind, values)
        assert _impl(node, x, onednn).startswith("onednn:") == onednn, (kind, _impl(node, x, onednn))
        got, want = run_kernel(node, [x], device=device)[0], reference(node, [x])[0]
        assert not _mismatches(got, want), (kind, "(reference, got):", _mismatches(got, want))
        nan = np.isnan(_values_of(kind, want))
        assert nan[0] and not nan[2:].all(), kind  # the NaN input's output, and the others are numbers


@pytest.mark.parametrize("key", sorted(CLAMPS))
def test_minus_inf_into_a_clamp(key):
    """-inf gives the lower bound, as the reference, or NaN where oneDNN's NaN-keeping post-op chain computes the
    clamp (documented in onednn/eltwise.py: only exp-based steps tell -inf from NaN, at 1.4x MobileNetV2's time);
    never another number. Our numba epilogues give the bound."""
    x_val = np.array([-np.inf, np.nan, 2.0], np.float32)
    for onednn in (True, False):
        for kind, node in _nodes(key, 3).items():
            x = _inputs(kind, x_val)
            got, want = run_kernel(node, [x], device=cpu_device(onednn=onednn))[0], reference(node, [x])[0]
            got, want = _values_of(kind, got), _values_of(kind, want)
            assert want[0] == 0 and np.isnan(want[1])  # every clamp here has lower bound 0
            assert np.isnan(got[1]) and got[2] == want[2], (kind, onednn, got)
            assert got[0] == 0 or (onednn and np.isnan(got[0])), (kind, onednn, got)


def test_onednn_erf_gelu_at_infinity():
    """oneDNN's erf GELU post-op gives NaN for +inf (the reference: +inf): documented in onednn/eltwise.py; the
    finite values around it are right (test_fused_activation_special_values)."""
    node = _nodes("gelu", 2)["gemm"]
    x = _inputs("gemm", np.array([np.inf, 1.0], np.float32))
    got = _values_of("gemm", run_kernel(node, [x], device=cpu_device(onednn=True))[0])
    assert np.isnan(got[0]) and abs(got[1] - 0.8413447) < 1e-6


OPS = {"Relu": {}, "Clip": {"min": 0.1, "max": 0.8}, "LeakyRelu": {"alpha": 0.1}, "HardSwish": {},
       "HardSigmoid": {"alpha": 0.2, "beta": 0.5}, "Elu": {"alpha": 1.3}, "Sigmoid": {}, "Silu": {}, "Tanh": {},
       "Gelu": {"approximate": "tanh"}, "Mish": {}, "Softplus": {}}


@pytest.mark.parametrize("size", [37, 1 << 16])  # our loops; oneDNN's eltwise primitive for large float32 tensors
@pytest.mark.parametrize("op", sorted(OPS))
def test_activation_ops_special_values(op, size):
    values = np.append(VALUES, -np.inf)
    x = np.resize(values, size).astype(np.float32)
    node = make_node(op, 1, params=OPS[op])
    got, want = run_kernel(node, [x])[0], reference(node, [x])[0]
    assert not _mismatches(got, want), ("(reference, got):", _mismatches(got, want)[:8])
