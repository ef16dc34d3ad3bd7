"""Planner scenarios on synthetic step lists; each ends with the generic invariant checker."""

from __future__ import annotations

from plan_check import assert_plan_valid

from engine.memory.planner import Step, plan

MB = 1 << 20


def chain(n: int) -> list[Step]:
    """x -> b1 -> b2 -> ... -> b{n}: step i reads b{i} and writes b{i+1}."""
    return [Step(reads=(f"b{i}",), writes=(f"b{i + 1}",)) for i in range(n)]


def test_chain_reuses_two_slots():
    steps = chain(6)
    sizes = {f"b{i}": MB for i in range(7)}
    p = plan(steps, sizes, inputs=["b0"], outputs=["b6"])
    assert_plan_valid(steps, sizes, p, inputs=["b0"], outputs=["b6"])
    assert p.arena_bytes == 2 * MB  # ping-pong
    assert p.peak_live_bytes == 2 * MB
    assert p.naive_bytes == 7 * MB


def test_diamond_keeps_both_branches_live():
    steps = [Step(("x",), ("a",)), Step(("a",), ("l",)), Step(("a",), ("r",)), Step(("l", "r"), ("y",))]
    sizes = {"x": MB, "a": MB, "l": 2 * MB, "r": 2 * MB, "y": MB}
    p = plan(steps, sizes, inputs=["x"], outputs=["y"])
    assert_plan_valid(steps, sizes, p, inputs=["x"], outputs=["y"])
    assert p.peak_live_bytes == 5 * MB  # a, l, r at step 2 ... l, r, y at step 3
    assert p.arena_bytes == p.peak_live_bytes


def test_fan_out_input_lives_until_last_reader():
    steps = [Step(("x",), (f"o{i}",)) for i in range(4)] + [Step(tuple(f"o{i}" for i in range(4)), ("y",))]
    sizes = {"x": MB, "y": MB, **{f"o{i}": MB for i in range(4)}}
    p = plan(steps, sizes, inputs=["x"], outputs=["y"])
    assert_plan_valid(steps, sizes, p, inputs=["x"], outputs=["y"])
    assert p.lifetimes["x"] == (0, 3)
    assert p.arena_bytes == 5 * MB


def test_inplace_chain_uses_one_slot():
    steps = [Step(("x",), ("b1",))] + [Step((f"b{i}",), (f"b{i + 1}",)) for i in range(1, 4)]
    sizes = {"x": MB, **{f"b{i}": MB for i in range(1, 5)}}
    inplace = {f"b{i + 1}": f"b{i}" for i in range(1, 4)}
    p = plan(steps, sizes, inputs=["x"], outputs=["b4"], inplace=inplace)
    assert_plan_valid(steps, sizes, p, inputs=["x"], outputs=["b4"], inplace=inplace)
    assert p.inplace == inplace
    assert p.arena_bytes == 2 * MB  # x plus one slot that b1..b4 overwrite in turn
    assert len({p.offsets[f"b{i}"] for i in range(1, 5)}) == 1


def test_inplace_refused_when_input_is_read_later_or_pinned():
    steps = [Step(("x",), ("a",)), Step(("a",), ("b",)), Step(("a", "b"), ("y",))]
    sizes = {"x": MB, "a": MB, "b": MB, "y": MB}
    inplace = {"b": "a", "a": "x"}  # a is still read at step 2; x is a graph input
    p = plan(steps, sizes, inputs=["x"], outputs=["y"], inplace=inplace)
    assert p.inplace == {}
    assert_plan_valid(steps, sizes, p, inputs=["x"], outputs=["y"], inplace=inplace)


def test_inplace_refused_for_size_mismatch_and_graph_output():
    steps = [Step(("x",), ("a",)), Step(("a",), ("b",)), Step(("b",), ("c",))]
    sizes = {"x": MB, "a": MB, "b": 2 * MB, "c": 2 * MB}
    p = plan(steps, sizes, inputs=["x"], outputs=["b", "c"], inplace={"b": "a", "c": "b"})
    assert p.inplace == {}  # a->b differ in size, b is a graph output
    assert_plan_valid(steps, sizes, p, inputs=["x"], outputs=["b", "c"])


def test_alias_chain_shares_storage_and_extends_lifetime():
    # a -> reshape -> r1 -> reshape -> r2, r2 read at the last step: a must stay live until then.
    steps = [Step(("x",), ("a",)), Step(("a",), ("r1",)), Step(("r1",), ("r2",)), Step(("x",), ("t",)),
             Step(("r2", "t"), ("y",))]
    sizes = {"x": MB, "a": MB, "r1": MB, "r2": MB, "t": MB, "y": MB}
    aliases = {"r1": "a", "r2": "r1"}
    p = plan(steps, sizes, inputs=["x"], outputs=["y"], aliases=aliases)
    assert_plan_valid(steps, sizes, p, inputs=["x"], outputs=["y"], aliases=aliases)
    assert p.offsets["a"] == p.offsets["r1"] == p.offsets["r2"]
    assert p.lifetimes["a"] == (0, 4)
    assert p.naive_bytes == 4 * MB  # aliases have no storage of their own


def test_output_in_the_middle_survives_to_the_end():
    steps = chain(5)
    sizes = {f"b{i}": MB for i in range(6)}
    p = plan(steps, sizes, inputs=["b0"], outputs=["b2", "b5"])
    assert_plan_valid(steps, sizes, p, inputs=["b0"], outputs=["b2", "b5"])
    assert p.lifetimes["b2"] == (1, 4)
    assert p.arena_bytes == 3 * MB


def test_external_keys_are_ignored_and_unread_outputs_get_storage():
    steps = [Step(("x", "weight"), ("a", "unused")), Step(("a",), ("y",))]
    sizes = {"x": 100, "a": 100, "unused": 100, "y": 100}
    p = plan(steps, sizes, inputs=["x"], outputs=["y"])
    assert_plan_valid(steps, sizes, p, inputs=["x"], outputs=["y"])
    assert "weight" not in p.offsets
    assert p.lifetimes["unused"] == (0, 0)


def test_greedy_beats_sweep_on_a_fragmenting_pattern():
    # Small buffers freed around a big one fragment a first-come sweep; both are tried, the smaller kept.
    steps = [Step((), ("s1",)), Step(("s1",), ("big1",)), Step((), ("s2",)), Step(("big1", "s2"), ("big2",)),
             Step(("big2",), ("y",))]
    sizes = {"s1": 64, "big1": 1024, "s2": 64, "big2": 1024, "y": 1088}
    p = plan(steps, sizes, outputs=["y"])
    assert_plan_valid(steps, sizes, p, outputs=["y"])
    assert p.arena_bytes <= 1.05 * p.peak_live_bytes


def test_empty_plan():
    p = plan([], {})
    assert p.arena_bytes == 0 and p.naive_bytes == 0 and p.peak_live_bytes == 0


# (size, first step, last step) of the buffers of a real shape-op-heavy graph (chunk, split, stack, unbind,
# reductions) on which both plain strategies leave gaps above the live peak.
SHAPES_NET = [(2304, 0, 0), (2304, 0, 25), (2304, 1, 2), (1152, 2, 4), (1152, 2, 5), (1152, 3, 12), (576, 3, 19),
              (576, 3, 19), (1152, 4, 5), (2304, 5, 6), (1152, 6, 16), (1152, 6, 16), (288, 7, 24), (360, 8, 10),
              (24, 9, 14), (72, 10, 11), (24, 11, 14), (288, 12, 13), (8, 13, 14), (24, 14, 15), (24, 15, 28),
              (1152, 16, 17), (1152, 17, 18), (1152, 18, 28), (576, 19, 20), (576, 20, 21), (576, 21, 22),
              (288, 22, 23), (240, 23, 28), (8, 24, 26), (8, 25, 26), (8, 26, 28), (1152, 27, 28), (288, 28, 28)]


def test_perturbed_greedy_closes_the_gap_to_the_live_peak():
    n_steps = 29
    writes = [[] for _ in range(n_steps)]
    reads = [[] for _ in range(n_steps)]
    sizes = {}
    for i, (size, first, last) in enumerate(SHAPES_NET):
        sizes[i] = size
        writes[first].append(i)
        reads[last].append(i)
    steps = [Step(tuple(r), tuple(w)) for r, w in zip(reads, writes, strict=True)]
    p = plan(steps, sizes)
    assert_plan_valid(steps, sizes, p)
    assert p.strategy == "greedy_perturbed"
    assert p.arena_bytes == p.peak_live_bytes == 9216
