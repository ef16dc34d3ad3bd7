"""The graph IR: plain data with producer and consumer links. Loaders build it, passes rewrite it."""

from engine.ir.dtypes import DTYPES, to_dtype
from engine.ir.graph import Graph, Node, Value, drop_uses

__all__ = ["DTYPES", "Graph", "Node", "Value", "drop_uses", "to_dtype"]
