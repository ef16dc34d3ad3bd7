"""Property tests: random DAGs with random sizes, in-place and alias requests always give a valid plan."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from plan_check import assert_plan_valid

from engine.memory.planner import Step, plan


@st.composite
def random_dags(draw):
    n_inputs = draw(st.integers(1, 3))
    n_nodes = draw(st.integers(1, 25))
    values = [f"in{i}" for i in range(n_inputs)]
    sizes = {v: draw(st.integers(1, 5000)) for v in values}
    steps, inplace, aliases = [], {}, {}
    for i in range(n_nodes):
        reads = tuple(dict.fromkeys(draw(st.lists(st.sampled_from(values), min_size=1, max_size=3))))
        n_out = draw(st.integers(1, 2))
        writes = tuple(f"v{i}_{j}" for j in range(n_out))
        for w in writes:
            sizes[w] = draw(st.integers(1, 5000))
        kind = draw(st.sampled_from(["plain", "plain", "inplace", "alias"]))
        if kind == "inplace":
            sizes[writes[0]] = sizes[reads[0]]
            inplace[writes[0]] = reads[0]
        elif kind == "alias" and len(writes) == 1:
            sizes[writes[0]] = sizes[reads[0]]
            aliases[writes[0]] = reads[0]
        steps.append(Step(reads, writes))
        values.extend(writes)
    produced = [v for v in values if not v.startswith("in")]
    outputs = draw(st.lists(st.sampled_from(produced), min_size=1, max_size=3, unique=True))
    return steps, sizes, values[:n_inputs], outputs, inplace, aliases


@settings(max_examples=100, deadline=None)
@given(random_dags())
def test_random_dags_give_valid_plans(case):
    steps, sizes, inputs, outputs, inplace, aliases = case
    p = plan(steps, sizes, inputs=inputs, outputs=outputs, inplace=inplace, aliases=aliases)
    assert_plan_valid(steps, sizes, p, inputs=inputs, outputs=outputs, aliases=aliases, inplace=inplace)


@settings(max_examples=25, deadline=None)
@given(random_dags())
def test_plan_is_deterministic(case):
    steps, sizes, inputs, outputs, inplace, aliases = case
    a = plan(steps, sizes, inputs=inputs, outputs=outputs, inplace=inplace, aliases=aliases)
    b = plan(steps, sizes, inputs=inputs, outputs=outputs, inplace=inplace, aliases=aliases)
    assert a == b
