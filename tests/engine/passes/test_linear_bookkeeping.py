"""Loading is linear in the op count: the pnnx lowering and every pass keep their node bookkeeping in dicts and
sets by node identity and rebuild the node list once, never list.index / remove / insert / `in` on the node list
per node (each a scan of the list: a 20k-op export took minutes). Checked by counting those calls, not by timing:
a graph whose node list counts them goes through lower_pnnx and the pass pipeline, on every pnnx fixture (convs
with BatchNorm and activations to fuse, layer scales, attention, constants to fold, no-ops) and on a generated
chain of element-wise ops, and the result is the same graph the plain path gives."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from engine.formats.pnnx.lowering.lower import lower_pnnx
from engine.formats.pnnx.reader import load_graph
from engine.ir import Graph
from engine.passes.pipeline import run_pipeline

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "pnnx"
SHAPE = "(1,8)f32"


class CountingList(list):
    """A node list that counts the calls that scan it."""

    calls: Counter = Counter()

    def index(self, *args):
        CountingList.calls["index"] += 1
        return super().index(*args)

    def remove(self, item):
        CountingList.calls["remove"] += 1
        super().remove(item)

    def insert(self, index, item):
        CountingList.calls["insert"] += 1
        super().insert(index, item)

    def __contains__(self, item):
        CountingList.calls["in"] += 1
        return super().__contains__(item)

    def count(self, item):
        CountingList.calls["count"] += 1
        return super().count(item)


class CountingGraph(Graph):
    """A Graph whose node list stays a CountingList when a pass assigns a new one."""

    @property
    def nodes(self):
        return self._counted

    @nodes.setter
    def nodes(self, value):
        self._counted = CountingList(value)


def counting(graph: Graph) -> CountingGraph:
    return CountingGraph(nodes=graph.nodes, inputs=graph.inputs, outputs=graph.outputs, path=graph.path,
                         meta=graph.meta, _names=graph._names)


def chain(tmp_path: Path, n: int) -> Path:
    """n element-wise ops: in place (nn.ReLU), emitted (a pnnx.Expression), a residual on the graph input (a value
    read by n/4 nodes), bypassed (nn.Dropout)."""
    lines, cur = [f"pnnx.Input in0 0 1 v0 #v0={SHAPE}"], "v0"
    for i in range(n):
        out = f"v{i + 1}"
        lines.append([f"nn.ReLU relu_{i} 1 1 {cur} {out}",
                      f"pnnx.Expression expr_{i} 1 1 {cur} {out} expr=add(@0,1.000000e+00)",
                      f"pnnx.Expression res_{i} 2 1 {cur} v0 {out} expr=add(@0,@1) #v0={SHAPE}",
                      f"nn.Dropout drop_{i} 1 1 {cur} {out}"][i % 4] + f" #{cur}={SHAPE} #{out}={SHAPE}")
        cur = out
    lines.append(f"pnnx.Output out0 1 0 {cur} #{cur}={SHAPE}")
    path = tmp_path / "chain.pnnx.param"
    path.write_text(f"7767517\n{len(lines)} {n + 1}\n" + "\n".join(lines) + "\n")
    return path


def pools(tmp_path: Path, n: int) -> Path:
    """n 1-D poolings, each lowered through its 2-D form by a handler inside a handler."""
    lines, cur, shape = ["pnnx.Input in0 0 1 v0 #v0=(1,2,8)f32"], "v0", "(1,2,8)f32"
    for i in range(n):
        out = f"v{i + 1}"
        kind = ["nn.MaxPool1d", "nn.AvgPool1d"][i % 2]
        lines.append(f"{kind} pool_{i} 1 1 {cur} {out} ceil_mode=False kernel_size=1 padding=0 stride=1 "
                     f"#{cur}={shape} #{out}={shape}")
        cur = out
    lines.append(f"pnnx.Output out0 1 0 {cur}")
    path = tmp_path / "pools.pnnx.param"
    path.write_text(f"7767517\n{len(lines)} {n + 1}\n" + "\n".join(lines) + "\n")
    return path


def summary(graph: Graph) -> list[tuple]:
    return [(n.op_type, n.name, [v.name for v in n.inputs], [v.name for v in n.outputs]) for n in graph.nodes]


def check_no_scans(path: Path) -> None:
    plain = run_pipeline(lower_pnnx(load_graph(path)))
    CountingList.calls.clear()
    counted = run_pipeline(lower_pnnx(counting(load_graph(path))))
    assert not CountingList.calls, f"{path}: node list scans {dict(CountingList.calls)}"
    assert summary(counted) == summary(plain)


@pytest.mark.parametrize("name", sorted(p.name for p in FIXTURES.iterdir() if (p / "model.pnnx.param").exists()))
def test_lowering_and_passes_never_scan_the_node_list(name):
    check_no_scans(FIXTURES / name / "model.pnnx.param")


def test_a_long_chain_never_scans_the_node_list(tmp_path):
    path = chain(tmp_path, 2000)
    check_no_scans(path)
    graph = run_pipeline(lower_pnnx(load_graph(path)))
    assert len(graph.nodes) == 1500  # the Dropouts bypassed, every other op kept, in order
    assert [n.op_type for n in graph.nodes[:3]] == ["Relu", "Add", "Add"]


def test_one_d_poolings_never_scan_the_node_list(tmp_path):
    path = pools(tmp_path, 200)
    lowered = lower_pnnx(load_graph(path))
    assert [n.op_type for n in lowered.nodes[:4]] == ["Unsqueeze", "MaxPool", "Squeeze", "Unsqueeze"]
    check_no_scans(path)
