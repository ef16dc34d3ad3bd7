"""The test-time guard of issue 19: on every committed fixture model, a node that runs an op's numpy reference (the
allocating fallback path) is listed as a fallback in the per-op profile, and only ops without a CPU kernel get
there.

Every reference function of the engine (each `*reference*` callable taking (node, arrays) in an engine module, ops
and kernels alike) is wrapped to record the node it ran for, before the instances are built; each fixture then runs
its inputs with profiling on.
"""

from __future__ import annotations

import functools
import inspect
import sys
from pathlib import Path

import numpy as np
import pytest
from realworld_known import refused

import engine
from engine.devices.cpu.kernels import KERNELS
from engine.ir import Node

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
# Ops with a CPU kernel whose node may still take the reference, and why (none today).
ALLOWED: dict[str, str] = {}


def _fixture_models() -> list[Path]:
    found = sorted(FIXTURES.glob("*/*/model.pnnx.param")) + sorted(FIXTURES.glob("*/*/*.tnnproto"))
    return [p for p in found if (p.parent / "inputs.npz").exists()
            and not (p.parent.parent.name == "realworld" and refused(p.parent.name))]


def _inputs(folder: Path) -> dict[str, np.ndarray]:
    with np.load(folder / "inputs.npz") as z:
        return {k: z[k] for k in z.files}


@pytest.fixture(scope="module")
def reference_calls():
    """{node name} of every reference call, with every engine reference function wrapped (restored after)."""
    calls: set[str] = set()
    patched = []

    def wrap(fn):
        @functools.wraps(fn)
        def recorded(node, arrays, *args, **kwargs):
            if isinstance(node, Node):
                calls.add(node.name)
            return fn(node, arrays, *args, **kwargs)
        return recorded

    wrapped: dict[int, object] = {}
    for name, module in list(sys.modules.items()):
        if not name.startswith("engine.") or module is None:
            continue
        for attr, value in list(vars(module).items()):
            if "reference" not in attr or not inspect.isfunction(value) or attr == "reference_fallback":
                continue
            params = list(inspect.signature(value).parameters)
            if params[:2] != ["node", "arrays"]:
                continue
            new = wrapped.setdefault(id(value), wrap(value))
            setattr(module, attr, new)
            patched.append((module, attr, value))
    from engine.devices.cpu.device import PRIVATE_OPS
    from engine.ops.registry import all_ops

    for op in [*all_ops().values(), *PRIVATE_OPS.values()]:  # the OpDefs hold their reference themselves
        if op.reference is not None and op.reference not in wrapped.values():
            patched.append((op, "reference", op.reference))
            object.__setattr__(op, "reference", wrapped.setdefault(id(op.reference), wrap(op.reference)))
    yield calls
    for owner, attr, value in patched:
        if isinstance(owner, type(sys)):
            setattr(owner, attr, value)
        else:
            object.__setattr__(owner, attr, value)


@pytest.mark.parametrize("path", _fixture_models(), ids=lambda p: f"{p.parent.parent.name}/{p.parent.name}")
def test_every_reference_fallback_is_in_the_profile(path, reference_calls):
    model = engine.load(path)
    feeds = _inputs(path.parent)
    inst = model.instance("cpu", max_shapes={k: v.shape for k, v in feeds.items()})
    # The first run binds these input shapes: host values (shape arithmetic, index tensors made from sizes) are
    # computed then, once per shape, by the ops' references. What the guard watches is the steady run after it.
    inst.run(feeds)
    reference_calls.clear()
    inst.start_profile()
    inst.run(feeds)
    profile = inst.stop_profile()
    listed = set(profile.fallback_nodes)
    assert listed == set(inst.fallback_nodes)
    assert reference_calls <= listed, f"nodes ran a numpy reference without being listed: {reference_calls - listed}"
    ops = {n.name: n.op_type for n in inst.graph.nodes}
    supported = {n: ops[n] for n in listed if ops[n] in KERNELS and ops[n] not in ALLOWED}
    assert not supported, f"ops with a CPU kernel fell back to the reference: {supported}"
