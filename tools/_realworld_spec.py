"""What one model of the real-world suite is (tools/make_realworld.py): how to build it, what it is fed, and the
shapes of its dynamic-shape variant."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

Shapes = list[tuple[int, ...]]


@dataclass(frozen=True)
class Feed:
    """One model input. kind: `float` (standard normal), `ids` (int64 token ids below `high`) or `mask` (an int64
    attention mask of ones whose trailing positions are zero: padding, so the masked path is what gets traced)."""

    name: str
    shape: tuple[int, ...]
    kind: str = "float"
    high: int = 0


@dataclass(frozen=True)
class Dynamic:
    """The inputshape2 variant: exported at `max_shapes` (the instance's max shapes) with `inputshape2`, then run
    at every shape of `cases` on one instance. Dims that differ between the two export shapes become dynamic."""

    max_shapes: Shapes
    inputshape2: Shapes
    cases: list[Shapes]
    what: str  # which dims vary, for the report: "batch, sequence", "image size"


@dataclass
class Spec:
    name: str
    family: str
    arch: str  # the configuration, in words
    build: Callable[[], nn.Module]  # a module whose forward takes the feeds positionally and returns tensor(s)
    feeds: list[Feed]
    dynamic: Dynamic | None = None
    # torch's eval fast path traces nn.TransformerEncoderLayer / MultiheadAttention to fused aten calls pnnx
    # leaves unconverted; users exporting with pnnx turn it off the same way.
    mha_fastpath: bool = True
    notes: list[str] = field(default_factory=list)


class Outputs(nn.Module):
    """Wraps a Hugging Face style model called with keyword inputs; returns the named output fields in order."""

    def __init__(self, model: nn.Module, input_names: list[str], output_fields: list[str], **call_kwargs):
        super().__init__()
        self.model, self.input_names, self.output_fields = model, input_names, output_fields
        self.call_kwargs = call_kwargs

    def forward(self, *inputs: torch.Tensor):
        out = self.model(**dict(zip(self.input_names, inputs, strict=True)), **self.call_kwargs)
        picked = tuple(out[f] for f in self.output_fields)
        return picked[0] if len(picked) == 1 else picked


def make_feed(feed: Feed, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    if feed.kind == "ids":
        return torch.randint(0, feed.high, shape, generator=gen, dtype=torch.int64)
    if feed.kind == "mask":
        mask = torch.ones(shape, dtype=torch.int64)
        length = shape[-1]
        for row in range(shape[0]):
            # Row r pads its last (r + 1) * length // 8 positions (at least one): every row has padding.
            mask[row, length - max(1, (row + 1) * length // 8) :] = 0
        return mask
    return torch.randn(shape, generator=gen)
