"""Transport-agnostic inference request/response, numpy-backed. REST and gRPC codecs convert to and from these."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class InferInput:
    name: str
    datatype: str
    shape: list[int]
    data: np.ndarray


@dataclass
class RequestedOutput:
    name: str
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass
class InferRequest:
    model_name: str
    model_version: str = ""
    id: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)
    inputs: list[InferInput] = field(default_factory=list)
    outputs: list[RequestedOutput] = field(default_factory=list)

    @property
    def priority(self) -> int:
        return int(self.parameters.get("priority", 0) or 0)

    @property
    def timeout_us(self) -> int | None:
        value = self.parameters.get("timeout")
        return int(value) if value else None


@dataclass
class OutputTensor:
    name: str
    datatype: str
    shape: list[int]
    data: np.ndarray
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass
class InferResponse:
    model_name: str
    model_version: str
    id: str
    outputs: list[OutputTensor]
    parameters: dict[str, Any] = field(default_factory=dict)
