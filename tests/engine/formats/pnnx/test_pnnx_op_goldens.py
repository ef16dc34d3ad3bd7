"""Real pnnx exports of one op (or one attribute variant) each, from tools/make_pnnx_op_goldens.py, against PyTorch's
own outputs: through the whole engine (lowering, passes, planner, CPU kernels) and node by node through the ops'
numpy references. Integer and bool outputs must be equal; float ones within 1e-4 of the output's scale."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import engine
from engine.formats.pnnx.lowering.lower import lower_pnnx
from engine.formats.pnnx.reader import load_graph
from engine.ops import get_op

CASES = Path(__file__).resolve().parents[3] / "fixtures" / "pnnx_ops"
NAMES = sorted(p.name for p in CASES.iterdir() if (p / "model.pnnx.param").exists())
# pnnx drops `.half()` casts (the whole graph then runs in float32): the file annotates float32 where torch's
# output was float16, and the engine, following the file, answers in float32 within float16's precision.
FLOAT16_DROPPED = {"half_ops"}


def _ios(case: Path) -> list[dict[str, np.ndarray]]:
    return [dict(np.load(f)) for f in sorted(case.glob("io*.npz"))]


def _inputs(io: dict[str, np.ndarray]) -> list[np.ndarray]:
    return [io[f"in{i}"] for i in range(sum(k.startswith("in") for k in io))]


def assert_matches(got: np.ndarray, want: np.ndarray, what: str, name: str) -> None:
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    if name in FLOAT16_DROPPED:
        assert got.dtype == (np.float32 if want.dtype == np.float16 else want.dtype), what
        np.testing.assert_allclose(got, want.astype(got.dtype), rtol=4e-3, atol=4e-3, err_msg=what)
        return
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    if want.dtype.kind in "iub":
        np.testing.assert_array_equal(got, want, err_msg=what)
        return
    finite = np.isfinite(want)
    np.testing.assert_array_equal(np.isfinite(got), finite, err_msg=f"{what}: inf/nan positions")
    np.testing.assert_array_equal(got[~finite], want[~finite], err_msg=f"{what}: infinities")
    scale = max(1.0, float(np.abs(want[finite]).max(initial=0.0)))
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-4, atol=1e-5 * scale, err_msg=what)


def test_the_cases_are_there():
    assert len(NAMES) >= 25, NAMES


@pytest.mark.parametrize("name", NAMES)
def test_engine_matches_torch(name):
    case = CASES / name
    ios = _ios(case)
    model = engine.load(case / "model.pnnx.param")
    max_shapes = {spec.name: tuple(max(np.shape(_inputs(io)[i])[d] for io in ios) for d in range(len(spec.shape)))
                  for i, spec in enumerate(model.inputs)}
    inst = model.instance("cpu", max_shapes=max_shapes)
    for k, io in enumerate(ios):
        feeds = {spec.name: x for spec, x in zip(model.inputs, _inputs(io), strict=True)}
        outs = list(inst.run(feeds).values())
        assert len(outs) == sum(key.startswith("out") for key in io)
        for i, got in enumerate(outs):
            assert_matches(np.asarray(got), io[f"out{i}"], f"{name} io{k} out{i}", name)


@pytest.mark.parametrize("name", NAMES)
def test_references_match_torch(name):
    """The lowered graph run node by node with each op's numpy reference: the oracle the kernels are tested
    against must itself be torch's answer."""
    graph = lower_pnnx(load_graph(CASES / name / "model.pnnx.param"))
    for k, io in enumerate(_ios(CASES / name)):
        env = {id(v): a for v, a in zip(graph.inputs, _inputs(io), strict=True)}
        for node in graph.nodes:
            ins = [v.const if v.is_const else env[id(v)] for v in node.inputs]
            env.update((id(v), a) for v, a in zip(node.outputs, get_op(node.op_type).reference(node, ins),
                                                  strict=True))
        for i, v in enumerate(graph.outputs):
            got = v.const if v.is_const else env[id(v)]
            assert_matches(np.asarray(got), io[f"out{i}"], f"{name} io{k} out{i} (references)", name)
