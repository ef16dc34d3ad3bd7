"""Property test: random DAGs of in-place, alias, fallback and plain ops run through the planner and the
runtime give exactly what evaluating the same graph with plain numpy gives."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from toy_ops import toy_ops

from engine.ir import Graph
from engine.runtime.model import Model

# op -> (arity, numpy semantics)
SEMANTICS = {
    "T_Double": (1, lambda a: a * 2),
    "T_Neg": (1, lambda a: -a),
    "T_View": (1, lambda a: a),
    "T_Add": (2, lambda a, b: a + b),
    "T_AddInplace": (2, lambda a, b: a + b),
}


@st.composite
def random_programs(draw):
    n_inputs = draw(st.integers(1, 3))
    program = []
    n_values = n_inputs
    for _ in range(draw(st.integers(1, 14))):
        op = draw(st.sampled_from(sorted(SEMANTICS)))
        args = [draw(st.integers(0, n_values - 1)) for _ in range(SEMANTICS[op][0])]
        program.append((op, args))
        n_values += 1
    produced = list(range(n_inputs, n_values))
    outputs = draw(st.lists(st.sampled_from(produced), min_size=1, max_size=3, unique=True))
    return n_inputs, program, outputs


def build(n_inputs, program, outputs) -> Graph:
    g = Graph()
    values = [g.value(f"in{i}", (-1, 5), np.float32) for i in range(n_inputs)]
    g.inputs = list(values)
    for i, (op, args) in enumerate(program):
        values.append(g.add_node(op, [values[a] for a in args], name=f"n{i}").outputs[0])
    for k in outputs:
        values[k].name = f"out{k}"
    g.outputs = [values[k] for k in outputs]
    return g


def evaluate(feeds, program, outputs):
    values = list(feeds)
    for op, args in program:
        values.append(SEMANTICS[op][1](*[values[a] for a in args]))
    return {f"out{k}": values[k] for k in outputs}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_programs(), st.integers(1, 4))
def test_random_graphs_match_numpy(case, batch):
    n_inputs, program, outputs = case
    rng = np.random.default_rng(batch)
    with toy_ops():
        inst = Model(build(n_inputs, program, outputs), "random").instance(
            max_shapes={f"in{i}": (4, 5) for i in range(n_inputs)})
        for n in (batch, 4):
            feeds = [rng.standard_normal((n, 5)).astype(np.float32) for _ in range(n_inputs)]
            got = inst.run({f"in{i}": x for i, x in enumerate(feeds)})
            want = evaluate(feeds, program, outputs)
            for k, w in want.items():
                np.testing.assert_allclose(got[k], w, rtol=1e-6, atol=1e-6)
