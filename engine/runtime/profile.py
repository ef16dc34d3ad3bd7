"""Per-op profile of an instance: time per node and per op kind over the runs since profiling was switched on, as
ONNX Runtime's profiling and TNN's per-layer timing give; `Instance.profile` collects it (run_timed with
`profiling` on), `nnserve run --profile` and a server's /v2/models/{m}/profile print it.

Each node names the kernel that ran it (its `impl`: "onednn:brg:avx512_core", "numba", ...) and whether that was
the numpy reference, a fallback that allocates (`reference (fallback)`): a supported op that lands there shows
in the table.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

FALLBACK = "reference (fallback)"


def kernel_label(kernel: object) -> str:
    """What ran a node: the kernel's own `impl` label, the reference fallback, or the module that built it."""
    if kernel is None:
        return "view (no kernel)"
    if getattr(kernel, "is_fallback", False):
        return FALLBACK
    impl = getattr(kernel, "impl", None)
    if impl:
        return str(impl)
    module = getattr(kernel, "__module__", "") or ""
    return module.removeprefix("engine.devices.").replace(".", "/") or type(kernel).__name__


@dataclass
class NodeProfile:
    name: str
    op: str
    kernel: str
    calls: int = 0
    seconds: float = 0.0

    @property
    def fallback(self) -> bool:
        return self.kernel == FALLBACK


@dataclass
class Profile:
    """Accumulated time per scheduled node (in execution order) over `runs` runs."""

    nodes: list[NodeProfile]
    runs: int = 0
    _index: dict[str, int] = field(default_factory=dict, repr=False)

    @classmethod
    def for_nodes(cls, nodes: Iterable[tuple[str, str, str]]) -> Profile:
        """(name, op type, kernel label) per node that runs code."""
        return cls([NodeProfile(n, op, k) for n, op, k in nodes])

    def __post_init__(self) -> None:
        self._index = {n.name: i for i, n in enumerate(self.nodes)}

    def add_run(self, node_times: Sequence[tuple[str, str, float]]) -> None:
        """One run's (name, op, seconds) per node, as Instance.run(timings=True) records them."""
        self.runs += 1
        for name, op, seconds in node_times:
            i = self._index.get(name)
            if i is None:
                self._index[name] = i = len(self.nodes)
                self.nodes.append(NodeProfile(name, op, "?"))
            entry = self.nodes[i]
            entry.calls += 1
            entry.seconds += seconds

    def merge(self, other: Profile) -> Profile:
        """Both profiles' runs together (the instances of one served model)."""
        out = Profile.for_nodes((n.name, n.op, n.kernel) for n in self.nodes)
        for p in (self, other):
            out.runs += p.runs
            for n in p.nodes:
                i = out._index.get(n.name)
                if i is None:
                    out._index[n.name] = i = len(out.nodes)
                    out.nodes.append(NodeProfile(n.name, n.op, n.kernel))
                out.nodes[i].calls += n.calls
                out.nodes[i].seconds += n.seconds
        return out

    @property
    def total_seconds(self) -> float:
        return sum(n.seconds for n in self.nodes)

    def by_op(self) -> list[dict]:
        """Per op kind: nodes, calls, total and per-run milliseconds, share of the total, fallback nodes; slowest
        first."""
        kinds: dict[str, dict] = {}
        for n in self.nodes:
            k = kinds.setdefault(n.op, {"op": n.op, "nodes": 0, "calls": 0, "seconds": 0.0, "fallback_nodes": 0})
            k["nodes"] += 1
            k["calls"] += n.calls
            k["seconds"] += n.seconds
            k["fallback_nodes"] += int(n.fallback)
        total = self.total_seconds or 1.0
        rows = sorted(kinds.values(), key=lambda k: -k["seconds"])
        for k in rows:
            k["ms_per_run"] = 1e3 * k["seconds"] / max(self.runs, 1)
            k["share"] = k["seconds"] / total
        return rows

    def by_node(self) -> list[dict]:
        """Per node, slowest first."""
        total = self.total_seconds or 1.0
        rows = [{"node": n.name, "op": n.op, "kernel": n.kernel, "fallback": n.fallback, "calls": n.calls,
                 "ms_per_run": 1e3 * n.seconds / max(self.runs, 1), "share": n.seconds / total}
                for n in self.nodes]
        return sorted(rows, key=lambda r: -r["ms_per_run"])

    @property
    def fallback_nodes(self) -> list[str]:
        return [n.name for n in self.nodes if n.fallback]

    def as_dict(self) -> dict:
        return {"runs": self.runs, "ms_per_run": 1e3 * self.total_seconds / max(self.runs, 1),
                "ops": self.by_op(), "nodes": self.by_node(), "fallback_nodes": self.fallback_nodes}

    def table(self, top: int | None = 20) -> str:
        """The per-op-kind table, then the slowest nodes (`top` of them; None: all), as text."""
        runs = max(self.runs, 1)
        lines = [f"profile: {self.runs} run(s), {1e3 * self.total_seconds / runs:.3f} ms per run in kernels", "",
                 f"{'op':<22} {'nodes':>5} {'ms/run':>9} {'share':>6}  fallback"]
        for k in self.by_op():
            lines.append(f"{k['op']:<22} {k['nodes']:>5} {k['ms_per_run']:>9.3f} {100 * k['share']:>5.1f}%"
                         f"  {k['fallback_nodes'] or ''}")
        nodes = self.by_node()
        shown = nodes if top is None else nodes[:top]
        lines += ["", f"{'node':<40} {'op':<18} {'ms/run':>9} {'share':>6}  kernel"]
        for r in shown:
            lines.append(f"{r['node'][:40]:<40} {r['op'][:18]:<18} {r['ms_per_run']:>9.3f} {100 * r['share']:>5.1f}%"
                         f"  {r['kernel']}")
        if len(shown) < len(nodes):
            lines.append(f"... {len(nodes) - len(shown)} more node(s)")
        if self.fallback_nodes:
            lines += ["", f"fallback (numpy reference, allocates): {', '.join(self.fallback_nodes)}"]
        return "\n".join(lines)
