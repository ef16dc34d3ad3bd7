"""The committed PNNX fixtures with PyTorch's outputs, run with the blocked layout (the CPU default when oneDNN
is there) and with NNSERVE_LAYOUT=nchw: both match PyTorch; the CNNs do run blocked convolutions."""

from __future__ import annotations

import numpy as np
import pytest
from test_pnnx_models import DYNAMIC, NAMES, assert_outputs_match

import engine
from engine.devices.cpu.conv import winograd_blocked as W
from engine.devices.cpu.onednn import objects as onednn

ONEDNN = pytest.mark.skipif(not onednn.available(),
                            reason="oneDNN (libdnnl.so.3 from the onednn-cpu-gomp wheel) is not installed: the "
                                   "blocked layout is not used")
# Fixtures whose graphs keep most activations blocked (checked, so the comparison is not vacuous).
CNNS = {"mobilenet_v2", "mobilenet_v3", "resnet", "resnet_wide", "efficientnet", "squeezenet", "yolo", "unet"}


def op_types(inst) -> set[str]:
    return {n.op_type for n in inst.graph.nodes}


@ONEDNN
@pytest.mark.parametrize("name", NAMES)
def test_blocked_layout_matches_pytorch(name: str, load_fixture, monkeypatch) -> None:
    monkeypatch.delenv("NNSERVE_LAYOUT", raising=False)
    monkeypatch.delenv("NNSERVE_ONEDNN", raising=False)
    fx = load_fixture(name)
    model = engine.load(fx.param)
    inst = model.instance(device="cpu", max_shapes=fx.max_shapes)
    if name in CNNS:
        assert "ConvBlocked" in op_types(inst)
    assert [v.name for v in inst.graph.inputs] == [t.name for t in model.inputs]
    assert [v.name for v in inst.graph.outputs] == [t.name for t in model.outputs]
    assert "ConvBlocked" not in {n.op_type for n in model.graph.nodes}  # the model's graph is not rewritten
    assert_outputs_match(inst.run(fx.inputs), fx.expected, name)


@pytest.mark.parametrize("name", NAMES)
def test_nchw_layout_matches_pytorch(name: str, load_fixture, monkeypatch) -> None:
    monkeypatch.setenv("NNSERVE_LAYOUT", "nchw")
    fx = load_fixture(name)
    inst = engine.load(fx.param).instance(device="cpu", max_shapes=fx.max_shapes)
    assert not op_types(inst) & {"ConvBlocked", "ToBlocked", "ToPlain"}
    assert_outputs_match(inst.run(fx.inputs), fx.expected, name)


@ONEDNN
@pytest.mark.parametrize("name", DYNAMIC)
def test_blocked_layout_dynamic_cases(name: str, load_fixture, monkeypatch) -> None:
    monkeypatch.delenv("NNSERVE_LAYOUT", raising=False)
    fx = load_fixture(name)
    inst = engine.load(fx.param).instance(device="cpu", max_shapes=fx.max_shapes)
    for k in [*range(len(fx.cases)), 0]:  # the max shape, smaller ones, the max again
        case_in, case_out = fx.cases[k]
        got = inst.run(case_in)
        assert_outputs_match(got, case_out, f"{name} case {k}")
        assert all(np.isfinite(v).all() for v in got.values())


@ONEDNN
def test_wide_resnet_runs_winograd_and_matches_pytorch(load_fixture, monkeypatch) -> None:
    """resnet_wide's 96/128-channel 3x3 convs take the Winograd path (residual ones too), and the model still
    matches PyTorch; with NNSERVE_WINOGRAD=0 none does."""
    monkeypatch.delenv("NNSERVE_LAYOUT", raising=False)
    monkeypatch.setattr(W, "MIN_WORK", 0)  # the fixture is kept small (2.9 MB): its convs are under the work floor
    monkeypatch.setattr(W, "WIDE_MIN_MACS", 0)  # ... and under the ones for AVX-512 blocks
    monkeypatch.setattr(W, "WIDE_MIN_TILES", 0)
    fx = load_fixture("resnet_wide")
    model = engine.load(fx.param)

    def winograd_convs():
        inst = model.instance(device="cpu", max_shapes=fx.max_shapes)
        kernels = [c for c in inst._compiled.nodes if c.node.op_type == "ConvBlocked"]
        assert_outputs_match(inst.run(fx.inputs), fx.expected, "resnet_wide")
        return [c.node for c in kernels if getattr(c.kernel, "impl", "").startswith("winograd")]

    wino = winograd_convs()
    assert len(wino) == 5 and sum(len(n.inputs) == 2 for n in wino) == 3  # 2 + 3 blocks' convs, 3 residual
    monkeypatch.setenv("NNSERVE_WINOGRAD", "0")
    assert winograd_convs() == []


# Classifiers whose every logit depends on every pixel (global pooling): one NaN pixel must make every logit NaN,
# as in PyTorch. A clamp that turned the NaN into 0 (oneDNN's own relu / clip post-ops) would serve plausible logits.
CLASSIFIERS = ["efficientnet", "mobilenet_v2", "mobilenet_v3", "resnet", "squeezenet"]


@pytest.mark.parametrize("layout", ["blocked", "nchw"])
@pytest.mark.parametrize("name", CLASSIFIERS)
def test_a_nan_pixel_reaches_every_logit(name: str, layout: str, load_fixture, monkeypatch) -> None:
    if layout == "blocked" and not onednn.available():
        pytest.skip("oneDNN is not installed: the blocked layout is not used")
    monkeypatch.setenv("NNSERVE_LAYOUT", layout)
    monkeypatch.delenv("NNSERVE_ONEDNN", raising=False)
    fx = load_fixture(name)
    inst = engine.load(fx.param).instance(device="cpu", max_shapes=fx.max_shapes)
    assert ("ConvBlocked" in op_types(inst)) == (layout == "blocked")
    (key, x), = fx.inputs.items()
    x = x.copy()
    x.flat[x.size // 3] = np.nan
    for out in inst.run({key: x}).values():
        assert np.isnan(out).all(), f"{name}: {np.isnan(out).mean():.0%} of the outputs are NaN"
    assert all(np.isfinite(v).all() for v in inst.run(fx.inputs).values())  # and the next request is clean
