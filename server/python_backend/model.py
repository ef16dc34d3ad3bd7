"""The Python backend behind server/backend.py's seam: PythonModel (a BackendModel described by its config, which
the model's auto_complete_config may extend) and PythonInstance (a RequestsInstance and ClosableInstance: one
worker process running the user's TritonPythonModel).

The scheduler hands an instance the requests of an execution unmerged; the instance sends them to its worker in
one `execute` call and waits for it (up to the model's timeout). A default-mode model answers each request in the
call's reply; a decoupled model's responses come from the worker whenever the model sends them, and go to each
request's ResponseSink. A BLS request from the model runs on the server's event loop through ModelCalls, and its
responses go back to the worker. A worker that dies fails its call and its open decoupled requests with the reason,
and is started again (initialize runs again) for the next execution.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from engine import RunTimings
from server.backend import RequestContext, ResponseSink
from server.datatypes import config_type_to_wire, numpy_to_wire
from server.errors import (
    ClientDisconnectedError,
    InferenceError,
    InvalidArgumentError,
    ModelLoadError,
    ModelNotFoundError,
    ServerError,
    UnavailableError,
    UnsupportedError,
)
from server.inference import InferInput, InferRequest, RequestedOutput
from server.model_calls import ModelCalls
from server.model_config import model_config_pb2 as mc
from server.python_backend.ipc import Header, IpcError, Tensor
from server.python_backend.worker import Handlers, ModelFailed, WorkerGone, WorkerProcess
from server.repository_files import check_regular

log = logging.getLogger("nnserve.python")

BACKEND = "python"
MODEL_FILE = "model.py"
# How long the worker may take to answer one call (auto_complete_config, initialize, execute, finalize) before it
# is taken for hung and killed; a model parameter of this name overrides it.
TIMEOUT_PARAM = "nnserve_python_timeout_secs"
DEFAULT_TIMEOUT_SECS = 300.0
# The first calls of a worker (auto_complete_config, initialize) include starting Python and importing the
# model, slower on a loaded host: they get at least this long, as Triton's stub timeout (30 s) bounds them.
STARTUP_FLOOR_SECS = 30.0
# Triton's error codes (TritonError.code()) <-> what the server answers.
_ERRORS_BY_CODE: dict[int, type[ServerError]] = {2: ModelNotFoundError, 3: InvalidArgumentError, 4: UnavailableError,
                                                5: UnsupportedError, 7: ClientDisconnectedError}
_INT64 = frozenset({FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_SINT64,
                    FieldDescriptor.TYPE_FIXED64, FieldDescriptor.TYPE_SFIXED64})


@dataclass(frozen=True)
class Spec:
    name: str
    datatype: str
    shape: tuple[int, ...]


def model_file(version_dir: Path, config: mc.ModelConfig, name: str) -> Path:
    """The version's model.py (or the file `default_model_filename` names), a regular file."""
    filename = config.default_model_filename or MODEL_FILE
    if Path(filename).name != filename or not filename.endswith(".py"):
        raise ModelLoadError(f"model '{name}': default_model_filename '{filename}' must be a .py file name in the "
                             "version directory, without a path")
    path = version_dir / filename
    if not path.exists():
        raise ModelLoadError(f"model '{name}': {version_dir.name}/{filename} is missing (a Python-backend model "
                             "defines TritonPythonModel in it)")
    check_regular(path, f"model '{name}': {version_dir.name}/{filename}")
    return path


def config_dict(config: mc.ModelConfig) -> dict[str, Any]:
    """The config as Triton hands it to a Python model: every field, defaults included (`max_batch_size: 0`,
    `input: []`), enums by name, 64-bit integers as numbers."""
    doc = json_format.MessageToDict(config, preserving_proto_field_name=True,
                                    always_print_fields_with_no_presence=True)
    _numbers(config.DESCRIPTOR, doc)
    return doc


def _numbers(descriptor: Descriptor, doc: dict[str, Any]) -> None:
    """protobuf's JSON quotes 64-bit integers; Triton's does not."""
    for f in descriptor.fields:
        if f.name not in doc:
            continue
        value = doc[f.name]
        if f.message_type is not None and f.message_type.GetOptions().map_entry:
            inner = f.message_type.fields_by_name["value"]
            if inner.message_type is not None:
                for item in value.values():
                    _numbers(inner.message_type, item)
        elif f.message_type is not None:
            for item in value if f.is_repeated else [value]:
                _numbers(f.message_type, item)
        elif f.type in _INT64:
            doc[f.name] = [int(v) for v in value] if f.is_repeated else int(value)


def timeout_of(config: mc.ModelConfig, name: str) -> float:
    if TIMEOUT_PARAM not in config.parameters:
        return DEFAULT_TIMEOUT_SECS
    text = config.parameters[TIMEOUT_PARAM].string_value
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ModelLoadError(f"model '{name}': parameters['{TIMEOUT_PARAM}'] = '{text}' must be a positive number of "
                             "seconds")
    return value


class PythonModel:
    """A version of a Python-backend model: its model.py, and the config that describes its tensors."""

    def __init__(self, name: str, version_dir: Path, path: Path, calls: ModelCalls | None):
        self.name, self.version_dir, self.path, self.calls = name, version_dir, path, calls
        self.version = version_dir.name
        self.config_json = "{}"
        self.decoupled = False
        self.timeout = DEFAULT_TIMEOUT_SECS
        self._inputs: list[Spec] = []
        self._outputs: list[Spec] = []
        self._spare: WorkerProcess | None = None  # the worker auto_complete_config ran in, for the first instance
        self._instances = 0

    @property
    def inputs(self) -> Sequence[Spec]:
        return self._inputs

    @property
    def outputs(self) -> Sequence[Spec]:
        return self._outputs

    def complete_config(self, config: mc.ModelConfig) -> None:
        """Runs the model's auto_complete_config (when it has one) on `config`, in a worker kept for the first
        instance; the result replaces `config`."""
        worker = self._spare or self._worker(f"model '{self.name}'", None)
        self._spare = worker
        try:
            reply, _ = worker.call({"kind": "auto_complete", "config": config_dict(config)},
                                   timeout=max(timeout_of(config, self.name), STARTUP_FLOOR_SECS))
            completed = json_format.ParseDict(reply["config"], mc.ModelConfig())
        except (ModelFailed, WorkerGone) as exc:
            self.discard()
            raise ModelLoadError(f"model '{self.name}': auto_complete_config failed: {exc}") from None
        except (json_format.ParseError, KeyError, TypeError, ValueError) as exc:
            self.discard()
            raise ModelLoadError(f"model '{self.name}': auto_complete_config returned a config that is not a "
                                 f"ModelConfig: {exc}") from None
        config.CopyFrom(completed)

    def configure(self, config: mc.ModelConfig) -> None:
        """The final (auto-completed, validated) config the instances are made with."""
        self.config_json = json.dumps(config_dict(config))
        self.decoupled = config.model_transaction_policy.decoupled
        self.timeout = timeout_of(config, self.name)
        lead = (-1,) if config.max_batch_size > 0 else ()
        self._inputs = [Spec(t.name, config_type_to_wire(t.data_type), lead + tuple(t.dims)) for t in config.input]
        self._outputs = [Spec(t.name, config_type_to_wire(t.data_type), lead + tuple(t.dims)) for t in config.output]

    def instance(self, device: str, max_shapes: Mapping[str, tuple[int, ...]]) -> PythonInstance:
        """A worker running the model's initialize(); `max_shapes` plan nothing here (no arena)."""
        name = f"{self.name}_0_{self._instances}"
        self._instances += 1
        worker, self._spare = self._spare, None
        return PythonInstance(self, name, device, worker)

    def discard(self) -> None:
        """The load failed before an instance took the spare worker: stop it."""
        if self._spare is not None:
            self._spare.close(timeout=1.0)
            self._spare = None

    def _worker(self, label: str, handlers: Handlers | None) -> WorkerProcess:
        worker = WorkerProcess(label, self.path, handlers or _IGNORED)
        worker.start()
        return worker


def _ignore(*_: Any) -> None:
    pass


_IGNORED = Handlers(response=_ignore, bls=_ignore, gone=_ignore)


class PythonInstance:
    """One instance: one worker process. Used by one scheduler thread at a time, as every instance is."""

    device_memory_bytes = None
    memory_bytes = 0

    def __init__(self, model: PythonModel, name: str, device: str, worker: WorkerProcess | None):
        self.model, self.name, self.device_name = model, name, device
        self.label = f"model '{model.name}' instance {name}"
        handlers = Handlers(response=self._on_response, bls=self._on_bls, gone=self._on_gone)
        if worker is None:
            worker = WorkerProcess(self.label, model.path, handlers)
        worker.label, worker.handlers = self.label, handlers
        self.worker = worker
        self._tokens = itertools.count(1)
        self._open: dict[int, ResponseSink] = {}  # decoupled requests still waiting for their final response
        self._running: set[int] = set()  # default-mode requests of the execute in progress
        self._open_lock = threading.Lock()
        self._start()

    def device_memory(self) -> tuple[int, int] | None:
        return None

    def _start(self) -> None:
        if not self.worker.running:
            self.worker.start()
        kind, _, device_id = self.device_name.partition(":")
        args = {"model_config": self.model.config_json, "model_instance_kind": "GPU" if kind == "cuda" else "CPU",
                "model_instance_device_id": device_id or "0", "model_instance_name": self.name,
                "model_repository": str(self.model.version_dir.parent), "model_version": self.model.version,
                "model_name": self.model.name}
        try:
            self.worker.call({"kind": "initialize", "args": args, "decoupled": self.model.decoupled},
                             timeout=max(self.model.timeout, STARTUP_FLOOR_SECS))
        except (ModelFailed, WorkerGone) as exc:
            self.worker.kill("its initialize failed")
            raise ModelLoadError(f"{self.label}: initialize failed: {exc}") from None

    # ---- runs -------------------------------------------------------------------------------------------------
    def run_timed(self, inputs: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], RunTimings]:
        """One request (a warm-up sample)."""
        outputs, timings = self.run_requests([(inputs, RequestContext())])
        if isinstance(outputs[0], Exception):
            raise outputs[0]
        return outputs[0], timings

    def run_requests(self, requests: Sequence[tuple[Mapping[str, np.ndarray], RequestContext]]
                     ) -> tuple[list[dict[str, np.ndarray] | Exception], RunTimings]:
        t0 = time.perf_counter_ns()
        tokens = [next(self._tokens) for _ in requests]
        header = {"kind": "execute", "instance": self.name,
                  "requests": [_request_info(token, self.model.version, context)
                               for token, (_, context) in zip(tokens, requests, strict=True)]}
        tensors: list[Tensor] = [({"name": name, "request": i}, array)
                                 for i, (inputs, _) in enumerate(requests) for name, array in inputs.items()]
        if self.model.decoupled:
            self._register(tokens, [context.responses for _, context in requests])
        else:
            self._watch(tokens, [context for _, context in requests])
        try:
            if not self.worker.running:
                log.warning("%s: starting a new Python process (the last one %s)", self.label, self.worker.gone)
                self._start()
            t1 = time.perf_counter_ns()
            reply, outputs = self.worker.call(header, tensors, timeout=self.model.timeout)
        except (ModelFailed, WorkerGone, ModelLoadError, IpcError) as exc:
            error = InferenceError(str(exc))
            self._close_open(tokens, error)
            raise error from None
        finally:
            if not self.model.decoupled:
                with self._open_lock:
                    self._running.difference_update(tokens)
        t2 = time.perf_counter_ns()
        results = [{} for _ in requests] if self.model.decoupled else self._results(reply, outputs, len(requests))
        return results, RunTimings(t1 - t0, t2 - t1, time.perf_counter_ns() - t2)

    def _results(self, reply: Header, tensors: list[Tensor], count: int) -> list[dict[str, np.ndarray] | Exception]:
        infos = reply.get("responses")
        if not isinstance(infos, list) or len(infos) != count:
            raise InferenceError(f"{self.label}: the Python process answered {count} requests wrongly")
        results: list[dict[str, np.ndarray] | Exception] = []
        for i, info in enumerate(infos):
            error = info.get("error")
            if error:
                results.append(model_error(error))
            else:
                results.append({d["name"]: a for d, a in tensors if d.get("request") == i})
        return results

    # ---- decoupled responses ----------------------------------------------------------------------------------
    def _register(self, tokens: list[int], sinks: list[ResponseSink | None]) -> None:
        with self._open_lock:
            for token, sink in zip(tokens, sinks, strict=True):
                if sink is None:
                    raise InferenceError(f"{self.label}: a decoupled model's request has nowhere to send its "
                                         "responses (use the streaming API)")
                self._open[token] = sink
        for token, sink in zip(tokens, sinks, strict=True):
            sink.on_cancel(functools.partial(self._cancel, token))

    def _watch(self, tokens: list[int], contexts: list[RequestContext]) -> None:
        """Default-mode requests: a client that goes away while the execute runs makes is_cancelled() True."""
        with self._open_lock:
            self._running.update(tokens)
        for token, context in zip(tokens, contexts, strict=True):
            context.cancellation.on_cancel(functools.partial(self._cancel, token))

    def _cancel(self, token: int) -> None:
        """The request's client is gone: its model sees request.is_cancelled() (and its sender's) become True."""
        with self._open_lock:
            if token not in self._open and token not in self._running:
                return
        # sent from a thread of its own: this runs on the event loop, and a worker that stopped reading (hung, with
        # a large execute frame still going out under the link's send lock) must not stall the server with it
        threading.Thread(target=self.worker.send, args=({"kind": "cancel", "token": token},),
                         name=f"{self.label}: cancel", daemon=True).start()

    def _on_response(self, header: Header, tensors: list[Tensor]) -> None:
        token, final = int(header.get("token", -1)), bool(header.get("final"))
        with self._open_lock:
            sink = self._open.pop(token, None) if final else self._open.get(token)
        if sink is None:
            log.warning("%s: a response for a request that is not open (token %d) is dropped", self.label, token)
            return
        if header.get("empty"):
            sink.send(None, None, final, {})
            return
        error = header.get("error")
        sink.send({d["name"]: a for d, a in tensors}, model_error(error) if error else None, final,
                  _parameters(header.get("parameters")))

    def _on_gone(self, why: str) -> None:
        with self._open_lock:
            tokens = list(self._open)
        self._close_open(tokens, InferenceError(f"{self.label}: the Python process {why}"))

    def _close_open(self, tokens: list[int], error: ServerError) -> None:
        with self._open_lock:
            sinks = [self._open.pop(t) for t in tokens if t in self._open]
        for sink in sinks:
            sink.send(None, error, True, {})

    # ---- BLS --------------------------------------------------------------------------------------------------
    def _on_bls(self, header: Header, tensors: list[Tensor]) -> None:
        calls = self.model.calls
        if calls is None or calls.loop is None:
            self.worker.send(_answer(header, UnavailableError("BLS calls are not available here"), True))
            return
        asyncio.run_coroutine_threadsafe(self._bls(calls, header, tensors), calls.loop)

    async def _bls(self, calls: ModelCalls, header: Header, tensors: list[Tensor]) -> None:
        try:
            req = _bls_request(header, tensors)
            if header.get("decoupled"):
                async for item in calls.caller.infer_stream(req):
                    outputs = item.response.outputs if item.response else []
                    await self._answer(header, outputs, item.error, item.final)
                return
            response, _ = await calls.caller.infer_timed(req)
            await self._answer(header, response.outputs, None, True)
        except ServerError as err:
            await self._answer(header, [], err, True)
        except Exception as exc:  # a bug: the model still gets an answer, so it does not wait forever
            log.exception("%s: a BLS call failed", self.label)
            await self._answer(header, [], InferenceError(f"BLS call failed: {type(exc).__name__}: {exc}"), True)

    async def _answer(self, header: Header, outputs: Sequence[Any], error: ServerError | None, final: bool) -> None:
        frame = _answer(header, error, final)
        tensors = [({"name": o.name}, o.data) for o in outputs]
        await asyncio.to_thread(self.worker.send, frame, tensors)

    def close(self) -> None:
        self.worker.close(timeout=min(self.model.timeout, 30.0))


def _request_info(token: int, version: str, context: RequestContext) -> Header:
    info: Header = {"token": token, "id": context.request_id, "version": version,
                    "outputs": list(context.requested_outputs),
                    "parameters": context.model_parameters()}
    if context.sequence is not None:  # request.correlation_id() and flags(), as Triton's
        info["correlation_id"] = context.sequence.correlation_id
        info["flags"] = context.sequence.triton_flags
    return info


def _answer(header: Header, error: ServerError | None, final: bool) -> Header:
    frame: Header = {"kind": "bls_response", "call": header.get("call"), "final": final}
    if error is not None:
        frame["error"] = {"message": error.message, "code": triton_code(error)}
    return frame


def _bls_request(header: Header, tensors: list[Tensor]) -> InferRequest:
    params = _parameters(header.get("parameters"))
    if int(header.get("timeout") or 0) > 0:
        params["timeout"] = int(header["timeout"])
    version = int(header.get("model_version", -1))
    req = InferRequest(model_name=str(header.get("model_name", "")), model_version=str(version) if version > 0 else "",
                       id=str(header.get("request_id", "")), parameters=params)
    for d, array in tensors:
        req.inputs.append(InferInput(str(d["name"]), numpy_to_wire(array.dtype), list(array.shape), array))
    req.outputs = [RequestedOutput(str(n)) for n in header.get("outputs") or []]
    return req


def _parameters(value: Any) -> dict[str, Any]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return {}
    return dict(value) if isinstance(value, dict) else {}


def model_error(error: Any) -> ServerError:
    """A TritonError from the model as the server answers it (its code picks the status)."""
    message = str(error.get("message", "")) if isinstance(error, dict) else str(error)
    code = error.get("code", 1) if isinstance(error, dict) else 1
    return _ERRORS_BY_CODE.get(code, InferenceError)(message)


def triton_code(error: ServerError) -> int:
    for code, cls in _ERRORS_BY_CODE.items():
        if type(error) is cls:
            return code
    return {"INVALID_ARGUMENT": 3, "NOT_FOUND": 2, "UNAVAILABLE": 4, "UNIMPLEMENTED": 5}.get(error.grpc_code, 1)
