"""How a model calls other models of the same server: a Python model's BLS requests (InferenceRequest.exec) and an
ensemble's steps. Both go through the data plane, as a client's request would (validation, scheduling, statistics
of the called model), but the data plane is built after the repository that loads those models: the repository
owns a ModelCalls, which the data plane binds itself to.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Protocol

from server.errors import UnavailableError
from server.inference import InferRequest, InferResponse, StreamResponse
from server.scheduling import Execution


class ModelCaller(Protocol):
    """What the data plane offers to models calling models."""

    async def infer_timed(self, req: InferRequest) -> tuple[InferResponse, Execution]:
        """One response, with the execution it ran in (an ensemble's: its steps' phases added up)."""

    def infer_stream(self, req: InferRequest) -> AsyncIterator[StreamResponse]:
        """0..n responses of a decoupled model, one of any other."""


class ModelCalls:
    """The caller (the data plane) and the event loop it runs on, once both exist."""

    def __init__(self) -> None:
        self._caller: ModelCaller | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

    def bind(self, caller: ModelCaller) -> None:
        self._caller = caller

    def attach_loop(self) -> None:
        """Called from the event loop (the repository's loads run there): worker threads schedule calls onto it."""
        self.loop = asyncio.get_running_loop()

    @property
    def caller(self) -> ModelCaller:
        if self._caller is None:
            raise UnavailableError("calls between models are not available: the server's data plane is not set up")
        return self._caller
