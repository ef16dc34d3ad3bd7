"""The worker process of one Python-backend model instance: `python -m server.python_backend.stub FD MODEL_FILE`.

It imports the user's model.py (with `triton_python_backend_utils` registered as pb_utils.py), then serves the
server's calls on the socket FD, one at a time, in order: auto_complete, initialize, execute, finalize. The main
thread only reads frames: calls go to one call thread, BLS answers to the model thread that waits for them, so a
model blocked in a BLS call or in its own threads never stops the link. When the server goes away (the socket
closes) the process exits, whatever the model is doing.

numpy and the standard library only (and the user's imports).
"""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
import itertools
import os
import queue
import socket
import sys
import threading
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from server.python_backend import pb_utils
from server.python_backend.ipc import Header, IpcError, Link, Tensor

MODULE_NAME = "triton_python_backend_utils"


class Worker:
    """The worker's side of the link, and what pb_utils calls back into (responses, BLS, logs)."""

    def __init__(self, link: Link, model_file: Path):
        self.link = link
        self.model_file = model_file
        self.decoupled = False
        self.name = model_file.parent.parent.name
        self.model: Any = None
        self._class: Any = None  # TritonPythonModel, once model.py is imported
        self.calls: queue.Queue[tuple[Header, list[Tensor]] | None] = queue.Queue()
        self._bls: dict[int, queue.Queue[tuple[Header, list[Tensor]]]] = {}
        self._bls_ids = itertools.count(1)
        self._bls_lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None  # runs an `async def execute`
        # Cancellation (the server sends "cancel" when a client goes away). The server's tokens grow, and its frames
        # arrive in order: a cancel for a token above any executed one is for a request still on its way (kept); one
        # for a token neither open nor on its way is late (its final response already went, or its execute
        # returned) and is dropped, so the set holds only open requests' tokens.
        self._tokens_lock = threading.Lock()
        self._open_tokens: set[int] = set()  # decoupled: until the final response; default mode: until execute ends
        self._cancelled: set[int] = set()
        self._last_token = 0  # the highest token of an execute frame read

    # ---- the main thread: frames in ---------------------------------------------------------------------------
    def read_forever(self) -> None:
        try:
            while (frame := self.link.receive()) is not None:
                header, tensors = frame
                if header.get("kind") == "bls_response":
                    with self._bls_lock:
                        waiting = self._bls.get(int(header.get("call", -1)))
                    if waiting is not None:
                        waiting.put((header, tensors))
                elif header.get("kind") == "cancel":
                    self._cancel(int(header.get("token", -1)))
                else:
                    if header.get("kind") == "execute":
                        self._opened([int(r["token"]) for r in header.get("requests", [])])
                    self.calls.put((header, tensors))
        except (OSError, IpcError) as exc:
            print(f"nnserve Python worker for '{self.name}': link to the server failed: {exc}", file=sys.stderr)
        os._exit(0)  # the server is gone: nothing this process does matters any more

    def _opened(self, tokens: list[int]) -> None:
        with self._tokens_lock:
            self._open_tokens.update(tokens)
            self._last_token = max([self._last_token, *tokens])
            # a cancel kept for a request that never came (the server failed it before sending it) goes now
            self._cancelled = {t for t in self._cancelled if t in self._open_tokens or t > self._last_token}

    def _closed(self, tokens: list[int]) -> None:
        with self._tokens_lock:
            self._open_tokens.difference_update(tokens)
            self._cancelled.difference_update(tokens)

    def _cancel(self, token: int) -> None:
        with self._tokens_lock:
            if token in self._open_tokens or token > self._last_token:
                self._cancelled.add(token)

    def is_cancelled(self, token: int) -> bool:
        with self._tokens_lock:
            return token in self._cancelled

    # ---- the call thread --------------------------------------------------------------------------------------
    def serve_calls(self) -> None:
        while (call := self.calls.get()) is not None:
            header, tensors = call
            kind = header.get("kind")
            try:
                reply = self._dispatch(kind, header, tensors)
            except BaseException as exc:  # the model's error: the server fails this call with it
                self.link.send({"kind": "failed", "error": error_text(exc)})
                continue
            if reply is not None:
                self.link.send(*reply)
            if kind == "finalize":
                sys.stdout.flush()
                os._exit(0)

    def _dispatch(self, kind: Any, header: Header, tensors: list[Tensor]) -> tuple[Header, list[Tensor]] | None:
        if kind == "auto_complete":
            return {"kind": "done", "config": self.auto_complete(header["config"])}, []
        if kind == "initialize":
            self.initialize(header)
            return {"kind": "done"}, []
        if kind == "execute":
            try:
                return self.execute(header, tensors)
            finally:
                if not self.decoupled:  # its requests are answered: a later cancel for them is late
                    self._closed([int(r["token"]) for r in header.get("requests", [])])
        if kind == "finalize":
            if self.model is not None and hasattr(self.model, "finalize"):
                self.model.finalize()
            return {"kind": "done"}, []
        raise pb_utils.TritonModelException(f"unknown call '{kind}' from the server")

    def model_class(self) -> Any:
        sys.path.insert(0, str(self.model_file.parent))
        spec = importlib.util.spec_from_file_location("model", self.model_file)
        if spec is None or spec.loader is None:
            raise pb_utils.TritonModelException(f"cannot import {self.model_file.name}")
        module = importlib.util.module_from_spec(spec)
        sys.modules["model"] = module
        spec.loader.exec_module(module)
        cls = getattr(module, "TritonPythonModel", None)
        if cls is None:
            raise pb_utils.TritonModelException(f"{self.model_file.name} defines no class TritonPythonModel")
        return cls

    def auto_complete(self, config: dict[str, Any]) -> dict[str, Any]:
        cls = self._class = self.model_class()
        hook = getattr(cls, "auto_complete_config", None)
        if hook is None:
            return config
        result = hook(pb_utils.ModelConfig(config))
        if not isinstance(result, pb_utils.ModelConfig):
            raise pb_utils.TritonModelException("auto_complete_config must return the pb_utils.ModelConfig it was "
                                                f"given, got {type(result).__name__}")
        return result.as_dict()

    def initialize(self, header: Header) -> None:
        self.decoupled = bool(header.get("decoupled"))
        self.model = (self._class or self.model_class())()
        if hasattr(self.model, "initialize"):
            self._run(self.model.initialize(header["args"]))

    def execute(self, header: Header, tensors: list[Tensor]) -> tuple[Header, list[Tensor]]:
        requests = [self._request(r, i, tensors) for i, r in enumerate(header["requests"])]
        try:
            returned = self._run(self.model.execute(requests))
        except BaseException as exc:
            message = f"Failed to process the request(s) for model '{header['instance']}', message: " + \
                error_text(exc)
            if self.decoupled:  # requests still open get the error as their final response
                for request in requests:
                    sender = request.get_response_sender()
                    if not sender.closed:
                        self.send_response(request, pb_utils.InferenceResponse(error=pb_utils.TritonError(message)),
                                           True)
                return {"kind": "executed"}, []
            raise pb_utils.TritonModelException(message) from None
        if self.decoupled:
            if returned is not None:
                raise pb_utils.TritonModelException(f"Python model '{header['instance']}' is using the decoupled "
                                                    "mode and the execute function must return None.")
            return {"kind": "executed"}, []
        return self._responses(requests, returned)

    def _run(self, value: Any) -> Any:
        """A coroutine (an `async def` method) run to its end on this thread's event loop; anything else as is."""
        if not inspect.iscoroutine(value):
            return value
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        return self._loop.run_until_complete(value)

    def _request(self, info: Header, index: int, tensors: list[Tensor]) -> pb_utils.InferenceRequest:
        inputs = [pb_utils.Tensor(d["name"], a) for d, a in tensors if d.get("request") == index]
        request = pb_utils.InferenceRequest(
            model_name=self.name, inputs=inputs, requested_output_names=info.get("outputs", []),
            request_id=info.get("id", ""), correlation_id=info.get("correlation_id", 0),
            model_version=int(info.get("version", -1)), flags=int(info.get("flags", 0)),
            parameters=info.get("parameters") or {})
        request.token = int(info["token"])
        return request

    def _responses(self, requests: list[pb_utils.InferenceRequest], returned: Any) -> tuple[Header, list[Tensor]]:
        if returned is None:  # a default-mode model that sent its responses through the senders
            returned = [r.get_response_sender().collected for r in requests]
            if any(r is None for r in returned):
                raise pb_utils.TritonModelException("execute returned None, but not every request's response sender "
                                                    "sent a response")
        if not isinstance(returned, list):
            raise pb_utils.TritonModelException(f"Expected a list in the execute return, found type "
                                                f"'{type(returned)}'.")
        if len(returned) != len(requests):
            raise pb_utils.TritonModelException(
                "Number of InferenceResponse objects do not match the number of InferenceRequest objects. "
                f"InferenceRequest(s) size is:{len(requests)}, and InferenceResponse(s) size is:{len(returned)}")
        infos, out = [], []
        for i, response in enumerate(returned):
            if not isinstance(response, pb_utils.InferenceResponse):
                raise pb_utils.TritonModelException("Expected an 'InferenceResponse' object in the execute function "
                                                    f"return list, found type '{type(response)}'.")
            infos.append(response_info(response))
            out += [({"name": t.name(), "request": i}, t.as_numpy()) for t in response.output_tensors()]
        return {"kind": "executed", "responses": infos}, out

    # ---- what pb_utils calls ----------------------------------------------------------------------------------
    def send_response(self, request: pb_utils.InferenceRequest, response: pb_utils.InferenceResponse | None,
                      final: bool) -> None:
        info = response_info(response) if response is not None else {}
        tensors = [({"name": t.name()}, t.as_numpy()) for t in response.output_tensors()] if response else []
        self.link.send({"kind": "response", "token": request.token, "final": final, "empty": response is None,
                        **info}, tensors)
        if final and self.decoupled:
            self._closed([request.token])

    def call_model(self, request: pb_utils.InferenceRequest, decoupled: bool) -> Iterator[pb_utils.InferenceResponse]:
        """Sends a BLS request; its responses come back on the main thread into a queue of this call's own."""
        call = next(self._bls_ids)
        answers: queue.Queue[tuple[Header, list[Tensor]]] = queue.Queue()
        with self._bls_lock:
            self._bls[call] = answers
        header = {"kind": "bls", "call": call, "model_name": request.model_name(),
                  "model_version": request.model_version(), "request_id": request.request_id(),
                  "outputs": request.requested_output_names(), "parameters": request.parameters(),
                  "timeout": request.timeout(), "decoupled": decoupled}
        try:
            self.link.send(header, [({"name": t.name()}, t.as_numpy()) for t in request.inputs()])
        except Exception:
            self._forget(call)
            raise
        return self._answers(call, answers)

    def _answers(self, call: int, answers: queue.Queue[tuple[Header, list[Tensor]]]
                 ) -> Iterator[pb_utils.InferenceResponse]:
        try:
            while True:
                header, tensors = answers.get()
                error = header.get("error")
                yield pb_utils.InferenceResponse(
                    [pb_utils.Tensor(d["name"], a) for d, a in tensors],
                    error=pb_utils.TritonError(error["message"], error.get("code", 1)) if error else None,
                    parameters=header.get("parameters") or {})
                if header.get("final"):
                    return
        finally:
            self._forget(call)

    def _forget(self, call: int) -> None:
        with self._bls_lock:
            self._bls.pop(call, None)

    def log(self, level: str, message: str) -> None:
        self.link.send({"kind": "log", "level": level, "message": message})


def response_info(response: pb_utils.InferenceResponse) -> Header:
    error = response.error()
    info: Header = {"parameters": response.parameters()}
    if error is not None:
        info["error"] = {"message": error.message(), "code": error.code()}
    return info


def error_text(exc: BaseException) -> str:
    """What the server reports: the model's own message for its exceptions, the type too for Python's."""
    if isinstance(exc, pb_utils.TritonModelException):
        return str(exc)
    last = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
    where = f" (at {Path(last[0].filename).name}:{last[0].lineno})" if last else ""
    return f"{type(exc).__name__}: {exc}{where}"


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m server.python_backend.stub FD MODEL_FILE", file=sys.stderr)
        return 2
    sock = socket.socket(fileno=int(argv[0]))
    worker = Worker(Link(sock), Path(argv[1]))
    pb_utils._worker = worker
    sys.modules[MODULE_NAME] = pb_utils
    threading.Thread(target=worker.serve_calls, name="nnserve-python-calls", daemon=True).start()
    worker.read_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
