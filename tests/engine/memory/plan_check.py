"""assert_plan_valid: the generic invariant checker every planner test ends with.

It recomputes liveness from the steps itself instead of trusting the plan's lifetimes.
"""

from __future__ import annotations

from engine.memory.planner import ALIGNMENT, MemoryPlan, Step


def live_ranges(steps: list[Step], sizes: dict, inputs=(), outputs=()) -> dict:
    first = {k: 0 for k in inputs}
    last = dict(first)
    for i, s in enumerate(steps):
        for k in (*s.writes, *s.reads):
            if k in sizes:
                first.setdefault(k, i)
                last[k] = max(last.get(k, i), i)
    end = max(len(steps) - 1, 0)
    for k in sizes:
        first.setdefault(k, 0)
        last.setdefault(k, first[k])
        if k in outputs:
            last[k] = end
    return {k: (first[k], last[k]) for k in sizes}


def assert_plan_valid(steps, sizes, plan: MemoryPlan, inputs=(), outputs=(), aliases=None, inplace=None):
    aliases, inplace = aliases or {}, inplace or {}
    ranges = live_ranges(steps, sizes, inputs, outputs)
    writer = {k: i for i, s in enumerate(steps) for k in s.writes}
    keys = list(sizes)
    for k in keys:
        off = plan.offsets[k]
        assert off % ALIGNMENT == 0, f"{k} at {off} is not aligned"
        assert 0 <= off and off + sizes[k] <= plan.arena_bytes, f"{k} leaves the arena"
    for i, a in enumerate(keys):
        for b in keys[i + 1:]:
            (fa, la), (fb, lb) = ranges[a], ranges[b]
            if la < fb or lb < fa:
                continue  # never live together
            if plan.storage[a] == plan.storage[b]:
                continue  # one storage group: checked below
            oa, ob = plan.offsets[a], plan.offsets[b]
            assert oa + sizes[a] <= ob or ob + sizes[b] <= oa, f"{a} and {b} are live together and overlap"
    for out, src in plan.inplace.items():
        assert inplace.get(out) == src, f"in-place {src}->{out} was not requested"
        assert src not in inputs and src not in outputs, f"in-place reuse of pinned {src}"
        assert ranges[src][1] == writer[out], f"{src} is still read after {out} overwrites it"
    for k in keys:
        root = plan.storage[k]
        if root != k:
            assert plan.offsets[k] == plan.offsets[root]
    # Every merge is an alias or an accepted in-place pair.
    merged = {k for k in keys if plan.storage[k] != k}
    for k in merged:
        linked = {k, plan.storage[k]}
        assert any(linked & {o, s} for o, s in [*aliases.items(), *plan.inplace.items()]), f"{k} merged silently"
    assert plan.arena_bytes >= plan.peak_live_bytes, "arena below the live peak"
    assert plan.arena_bytes <= plan.naive_bytes, "arena above the naive sum"
