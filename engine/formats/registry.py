"""FORMATS: every model format by name, with its file suffixes, reader, lowering (and the format op types that
lowering handles) and writer where one exists. The runtime, the CLI and the server find formats here; adding a
format means adding its folder beside this file and one entry below."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from engine.formats.pnnx.lowering.lower import HANDLED_TYPES as PNNX_TYPES
from engine.formats.pnnx.lowering.lower import REFUSED as PNNX_REFUSED
from engine.formats.pnnx.lowering.lower import lower_pnnx
from engine.formats.pnnx.reader import load_graph as read_pnnx
from engine.formats.tnn.lowering.lower import HANDLED_TYPES as TNN_TYPES
from engine.formats.tnn.lowering.lower import REFUSED as TNN_REFUSED
from engine.formats.tnn.lowering.lower import lower_tnn
from engine.formats.tnn.reader import load_graph as read_tnn
from engine.formats.tnn.writer.write import write_tnn
from engine.ir import Graph

MODEL_STEM = "model"  # a model repository's version folder holds model<graph_suffix> and model<weights_suffix>


@dataclass(frozen=True)
class Format:
    name: str  # graph.meta["format"], the prefix of its op types (`tnn:Convolution`), the server's backend name
    graph_suffix: str  # the file the reader is given; the weights file sits beside it
    weights_suffix: str
    read: Callable[[str | Path], Graph]  # graph file -> Graph of format ops
    lower: Callable[[Graph], Graph]  # format ops -> canonical ops
    lowered_types: frozenset[str]  # the format op types (without prefix) `lower` handles
    read_without_weights: Callable[[str | Path], Graph] | None = None  # the graph file alone, where the format can
    write: Callable[..., tuple[Path, ...]] | None = None  # canonical Graph -> files at a path prefix
    refused: Mapping[str, str] = field(default_factory=dict)  # format op types refused on purpose -> why

    @property
    def files(self) -> tuple[str, str]:
        """The file names in a model repository's version folder: the graph file, then its weights."""
        return f"{MODEL_STEM}{self.graph_suffix}", f"{MODEL_STEM}{self.weights_suffix}"


# In the order a version folder is searched for a model (TNN first, when a folder holds both).
FORMATS: dict[str, Format] = {f.name: f for f in (
    Format("tnn", ".tnnproto", ".tnnmodel", read_tnn, lower_tnn, TNN_TYPES,
           read_without_weights=partial(read_tnn, weights=False), write=write_tnn, refused=TNN_REFUSED),
    Format("pnnx", ".pnnx.param", ".pnnx.bin", read_pnnx, lower_pnnx, PNNX_TYPES, refused=PNNX_REFUSED),
)}


def format_of(path: str | Path) -> Format | None:
    """The format whose graph file `path` is, by suffix; None when no format's suffix matches."""
    name = Path(path).name
    return next((f for f in FORMATS.values() if name.endswith(f.graph_suffix)), None)
