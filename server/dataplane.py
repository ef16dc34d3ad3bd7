"""The transport-agnostic data plane: health, metadata, config, statistics, repository control and inference.

REST and gRPC handlers only convert wire formats and call these methods; every error is a ServerError.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import Any

import numpy as np

from engine import EngineError, ShapeError, holds_nan
from server import request_extensions as rx
from server import settings as defaults
from server.backend import Cancellation, OpProfile, ProfilingInstance, RequestContext
from server.config import config_to_dict
from server.datatypes import numpy_to_wire
from server.errors import (
    InferenceError,
    InvalidArgumentError,
    ModelLoadError,
    ModelNotReadyError,
    NotFoundError,
    ServerError,
    UnavailableError,
    UnsupportedError,
)
from server.inference import InferRequest, InferResponse, OutputTensor, StreamResponse
from server.logging_setup import LogControl
from server.metrics import ServerMetrics
from server.model_config import model_config_pb2 as mc
from server.model_upload import poll_failure, remove_directory, write_model_directory
from server.model_version import ModelVersion
from server.repository import ModelRepository
from server.request_limits import check_json, check_model_name, check_version, quoted
from server.response_cache import ResponseCache, hashing_cost, request_key
from server.scheduling import Execution, InferResult
from server.security import check_model_name as path_problem
from server.shared_memory import Lease, SystemSharedMemory, cuda_unsupported
from server.tracing import Trace, Tracer
from server.tracing import parse_update as parse_trace_update

log = logging.getLogger("nnserve.dataplane")
# Which front end refuses a decoupled model, in Triton's words (a decoupled model answers on streams only).
HTTP_ENDPOINT = "HTTP end point"
GRPC_ENDPOINT = "ModelInfer RPC"


class DataPlane:
    def __init__(self, repository: ModelRepository, metrics: ServerMetrics | None = None, *,
                 strict_readiness: bool = True, log_tensors: bool = False, name: str = defaults.SERVER_NAME,
                 shared_memory: SystemSharedMemory | None = None, tracer: Tracer | None = None,
                 cache: ResponseCache | None = None, log_control: LogControl | None = None,
                 max_load_file_bytes: int = defaults.MODEL_LOAD_MAX_FILE_BYTES):
        self.repository = repository
        self.metrics = metrics
        self.strict_readiness = strict_readiness
        self.name = name
        self.draining = False  # SIGTERM: readiness fails at once, requests still in flight finish
        self.exiting = False  # drain window over: new requests are refused
        self.inflight = 0  # requests between arrival and answer, what a graceful shutdown waits for
        self.started = False  # the initial model loads are done: until then the server is live but not ready
        # Tensor contents reach the log only when asked for (--log-verbose >= 2): they may be private data.
        self.log_tensors = log_tensors
        repository.calls.bind(self)  # models calling models (BLS, ensembles) go through here
        # Triton's extensions: client shared memory (off unless --allow-client-shm), tracing, the response cache
        # (None unless --cache-config), the logging settings
        self.shared_memory = shared_memory or SystemSharedMemory(allowed=False)
        self.tracer = tracer or Tracer()
        self.cache = cache
        self.log_control = log_control or LogControl(log_format="text")
        self.max_load_file_bytes = max_load_file_bytes
        self._cache_warned: set[str] = set()

    # ---- health & metadata -----------------------------------------------------------------------------------
    def live(self) -> bool:
        return not self.exiting

    def ready(self) -> bool:
        if self.draining or self.exiting or not self.started:
            return False
        return self.repository.all_ready() if self.strict_readiness else True

    def model_ready(self, name: str, version: str = "") -> bool:
        """Triton's answer (InferenceServer::ModelIsReady): whether that version serves; an unknown, unloaded or
        loading model, or a version it lacks, is simply not ready (gRPC ready=false, HTTP 400), not an error.
        Before the initial loads are done and from SIGTERM on, 503 "Server not ready"; a malformed name is 400."""
        if not self.started or self.draining or self.exiting:
            raise UnavailableError("Server not ready")
        try:
            self.get(name, version)
        except (NotFoundError, ModelNotReadyError):
            return False
        return True

    def get(self, name: str, version: str = "") -> ModelVersion:
        """The model version a request names (Triton's errors when there is none); names and versions are checked
        first, so that an error never quotes an unbounded one."""
        check_model_name(name)
        check_version(version)
        return self.repository.get(name, version)

    def server_metadata(self) -> dict[str, Any]:
        return {"name": self.name, "version": defaults.SERVER_VERSION,
                "extensions": list(defaults.EXTENSIONS)}

    def model_metadata(self, name: str, version: str = "") -> dict[str, Any]:
        mv = self.get(name, version)
        entry = self.repository.entry(name)
        versions = sorted(entry.versions, key=int) if entry else [mv.version]
        return {
            "name": name,
            "versions": versions,
            "platform": mv.config.platform or mv.config.backend,
            "inputs": [{"name": t.name, "datatype": t.datatype, "shape": t.wire_shape(mv.batching)}
                       for t in mv.inputs],
            "outputs": [{"name": t.name, "datatype": t.datatype, "shape": t.wire_shape(mv.batching)}
                        for t in mv.outputs],
        }

    def model_config(self, name: str, version: str = "") -> mc.ModelConfig:
        return self.get(name, version).config

    def model_config_dict(self, name: str, version: str = "") -> dict[str, Any]:
        return config_to_dict(self.model_config(name, version))

    def statistics(self, name: str = "", version: str = "") -> list[dict[str, Any]]:
        if name:
            if version:
                return [self.get(name, version).stats.as_dict()]
            self.get(name)  # raises for unknown / unloaded models
            entry = self.repository.entry(name)
            return [mv.stats.as_dict() for _, mv in sorted(entry.versions.items(), key=lambda kv: int(kv[0]))]
        return [mv.stats.as_dict() for mv in self.repository.loaded()]

    # ---- profiling -------------------------------------------------------------------------------------------
    def model_profile(self, name: str, version: str = "", action: str = "") -> dict[str, Any]:
        """The per-op profile of a model's instances (engine/runtime/profile.py), over the requests run since
        profiling was started: `action` "start" (re)starts collecting on every instance, "stop" stops and answers
        what was collected, "" answers what is being collected so far."""
        mv = self.repository.get(name, version)
        if action not in ("", "start", "stop"):
            raise InvalidArgumentError(f"profile action must be 'start' or 'stop', got {action!r}")
        instances = [i for i in mv.instances if isinstance(i, ProfilingInstance)]
        if len(instances) != len(mv.instances):
            raise InvalidArgumentError(f"model '{name}' runs on a backend without per-op profiling")
        profiles: list[OpProfile | None]
        if action == "start":
            profiles = [i.start_profile() for i in instances]
        elif action == "stop":
            profiles = [i.stop_profile() for i in instances]
        else:
            profiles = [i.profile for i in instances]
        collected = [p for p in profiles if p is not None]
        profiling = action != "stop" and bool(collected)
        doc: dict[str, Any] = {"name": mv.name, "version": mv.version, "profiling": profiling}
        if collected:
            merged = collected[0]
            for p in collected[1:]:
                merged = merged.merge(p)
            doc.update(merged.as_dict(), table=merged.table(top=None))
        return doc

    # ---- repository ------------------------------------------------------------------------------------------
    def repository_index(self, ready_only: bool = False) -> list[dict[str, str]]:
        return self.repository.index(ready_only)

    async def load_model(self, name: str, config_json: str | None = None,
                         files: dict[str, bytes] | None = None) -> None:
        """Load or reload `name`; with `files` (Triton's `file:<path>` parameters) the model's directory for this
        load is made of them and the `config` override (server/model_upload.py)."""
        self.repository.check_api_allowed("load")
        check_model_name(name)
        if config_json is not None:
            check_json(config_json, "the 'config' parameter")
        if not files:
            await self.repository.load(name, config_json)
            return
        problem = path_problem(name)
        if problem:
            raise ModelLoadError(f"failed to load: {problem}")
        if config_json is None:
            raise poll_failure(name, "Load parameter 'config' must be specified for model file override")
        root = await asyncio.to_thread(write_model_directory, name, files, self.max_load_file_bytes)
        try:
            await self.repository.load(name, config_json, model_dir=root / name)
        finally:
            await asyncio.to_thread(remove_directory, root)

    async def unload_model(self, name: str) -> None:
        self.repository.check_api_allowed("unload")
        check_model_name(name)
        await self.repository.unload(name)

    # ---- shared memory, trace, logging (Triton's extensions) -------------------------------------------------
    def shm_register(self, name: str, key: Any, offset: Any, byte_size: Any) -> None:
        self.shared_memory.register(name, key, offset, byte_size)

    def shm_status(self, name: str = "") -> list[dict[str, Any]]:
        return self.shared_memory.status(name)

    def shm_unregister(self, name: str = "") -> None:
        self.shared_memory.unregister(name)

    def cuda_shm_register(self, name: str) -> None:
        self.shared_memory.check_allowed()
        if not name:
            raise InvalidArgumentError("'region name' is necessary to register cuda shared memory region")
        raise cuda_unsupported(name)

    def cuda_shm_status(self, name: str = "") -> list[dict[str, Any]]:
        if name in self.shared_memory:  # Triton's words
            raise NotFoundError(f"The region named '{quoted(name)}' is registered as system shared memory, not CUDA "
                                "shared memory")
        if name:  # no CUDA region can exist
            raise NotFoundError(f"Unable to find cuda shared memory region: '{quoted(name)}'")
        return []

    def cuda_shm_unregister(self, name: str = "") -> None:
        self.shared_memory.check_allowed()  # nothing registered: unregistering is a no-op, as for system regions

    def trace_settings(self, model: str = "", update: dict[str, Any] | None = None) -> dict[str, Any]:
        """The trace settings (of `model`, else global), after applying `update` (a request's settings)."""
        if model:
            self.get(model)  # Triton's errors for unknown or unloaded models
        if update:
            self.tracer.update(parse_trace_update(update), model)
        return self.tracer.settings(model)

    def log_settings(self, update: dict[str, Any] | None = None) -> dict[str, Any]:
        if update:
            self.log_control.update(update)
            self.log_tensors = self.log_control.verbose >= 2
        return self.log_control.settings()

    # ---- inference -------------------------------------------------------------------------------------------
    async def infer(self, req: InferRequest, endpoint: str = HTTP_ENDPOINT) -> InferResponse:
        """One request, one response; `endpoint` names the front end in the refusal of a decoupled model."""
        return (await self.infer_timed(req, endpoint))[0]

    async def infer_timed(self, req: InferRequest, endpoint: str = HTTP_ENDPOINT) -> tuple[InferResponse, Execution]:
        """infer(), with the execution the request ran in (what an ensemble adds up for its own statistics)."""
        if self.exiting:
            raise UnavailableError("Server exiting")
        self.inflight += 1
        if self.log_tensors:
            log.debug("infer %s/%s id=%r inputs: %s", req.model_name, req.model_version or "-", req.id,
                      {t.name: t.data.tolist() if t.data is not None else f"<shared memory {t.shm}>"
                       for t in req.inputs})
        try:
            return await self._infer(req, endpoint)
        finally:
            self.inflight -= 1

    async def infer_stream(self, req: InferRequest) -> AsyncIterator[StreamResponse]:
        """A request on a stream: a decoupled model's 0..n responses as the model sends them (the last one final),
        any other model's one response. Errors come as responses too (the stream goes on)."""
        if self.exiting:
            yield StreamResponse(None, UnavailableError("Server exiting"))
            return
        self.inflight += 1
        try:
            mv = self.get(req.model_name, req.model_version)
            if mv.decoupled:
                async for item in self._infer_decoupled(mv, req):
                    yield item
            else:
                yield StreamResponse((await self._infer(req, GRPC_ENDPOINT))[0])
        except ServerError as err:
            yield StreamResponse(None, err)
        finally:
            self.inflight -= 1

    async def _infer(self, req: InferRequest, endpoint: str) -> tuple[InferResponse, Execution]:
        t0 = req.arrival_ns or time.perf_counter_ns()  # the request's time in the server starts at its arrival
        mv = self.get(req.model_name, req.model_version)
        if mv.decoupled:
            raise UnsupportedError(f"{endpoint} doesn't support models with decoupled transaction policy")
        trace = self.tracer.sample(mv.name, mv.version, req.id, req.traceparent)
        if trace is not None:
            trace.stamp("REQUEST_START", t0)
        leases: list[Lease] = []
        try:
            return await self._run(mv, req, t0, leases, trace)
        finally:
            for lease in leases:
                self.shared_memory.release(lease)
            if trace is not None:
                trace.stamp("REQUEST_END", time.perf_counter_ns())
                trace.finish()

    async def _run(self, mv: ModelVersion, req: InferRequest, t0: int, leases: list[Lease],
                   trace: Trace | None) -> tuple[InferResponse, Execution]:
        """The request's inputs (from its body or shared memory), its outputs from the response cache or a run, then
        classified and written where the client asked; with the execution it ran in (none ran for a cache hit)."""
        cached: dict[str, np.ndarray] | None = None
        key, lookup_ns, copies = b"", 0, []
        try:
            priority, timeout_us = req.priority, req.timeout_us  # checked even where a cache hit needs neither
            options = rx.output_options(req)
            await rx.read_inputs(req, rx.lease_inputs(self.shared_memory, req, leases), req.max_shm_input_bytes)
            out_leases = rx.lease_outputs(self.shared_memory, options, leases)
            feed, batch = validate_inputs(mv, req)
            wanted = requested_outputs(mv, req)
            context = request_context(mv, req)
            # a request of a sequence is never answered from the cache: its answer depends on the sequence's state
            # (an ensemble whose step keeps one), which no key holds
            if req.sequence is None and self._caches(mv):
                t_lookup = time.perf_counter_ns()
                copies = self._served_copies(mv)
                key = await cache_key_off_loop(mv, feed, context, copies)
                cached = self.cache.get(key) if self.cache is not None else None
                lookup_ns = time.perf_counter_ns() - t_lookup
            if cached is None:
                queued = time.perf_counter_ns()
                scheduled(req)
                result = await mv.scheduler.submit(feed, priority=priority, timeout_us=timeout_us, context=context)
                if trace is not None:
                    _stamp_execution(trace, queued, result)
        except asyncio.CancelledError:  # the client went away (gRPC deadline, HTTP disconnect): dropped
            self._record_failure(mv, "CANCELED", time.perf_counter_ns() - t0)
            raise
        except ServerError as err:
            # re-raised as it is: `raise err from err` would make the error its own cause, a reference cycle that
            # pins its traceback's frames, and with them the request's tensors, until the cyclic GC runs
            self._record_failure(mv, err.reason, time.perf_counter_ns() - t0)
            raise
        except Exception as exc:
            # raised straight from the call: held in a local, the error would reference this frame (through its
            # traceback) and the frame the error: a cycle again
            raise self._failed(mv, exc, t0) from exc
        try:
            # stored only under the copies that answered: none missing when the key was made (a step model loaded
            # during the run answered, not "no model", which a later request must fail on) and none changed since
            if cached is None and key and self.cache is not None and 0 not in copies \
                    and self._served_copies(mv) == copies:
                t_insert = time.perf_counter_ns()
                if hashing_cost(result.outputs) >= rx.THREAD_BYTES:  # copying and weighing them too
                    await asyncio.to_thread(self.cache.put, key, result.outputs)
                else:
                    self.cache.put(key, result.outputs)
                lookup_ns += time.perf_counter_ns() - t_insert
            outputs = api_outputs(mv, result.outputs if cached is None else cached, wanted)
            outputs = await rx.classify(outputs, options, mv.batching, mv.labels)
            await rx.write_outputs(outputs, out_leases)
        except ServerError as err:
            self._record_failure(mv, err.reason, time.perf_counter_ns() - t0)
            raise
        total = time.perf_counter_ns() - t0
        response = InferResponse(mv.name, mv.version, req.id, outputs)
        if cached is not None:
            mv.stats.record_cache_hit(total_ns=total, lookup_ns=lookup_ns)
            if self.metrics:
                self.metrics.cache_hit(mv.name, mv.version, total_ns=total, lookup_ns=lookup_ns)
            return response, Execution(batch, 1, 0, 0, 0)  # nothing ran
        self._record_success(mv, result, batch, total)
        if key:
            mv.stats.record_cache_miss(lookup_ns)
            if self.metrics:
                self.metrics.cache_miss(mv.name, mv.version, miss_ns=lookup_ns)
        return response, result.execution

    async def _infer_decoupled(self, mv: ModelVersion, req: InferRequest) -> AsyncIterator[StreamResponse]:
        """The model's responses as they come (its sink feeds a queue from the worker's thread); the execution's
        figures count once the final response is in. Shared-memory inputs are read as for any request (and their
        regions held until the final response)."""
        t0 = req.arrival_ns or time.perf_counter_ns()
        leases: list[Lease] = []
        try:
            try:
                _ = req.priority, req.timeout_us  # checked before the model gets the request
                await rx.read_inputs(req, rx.lease_inputs(self.shared_memory, req, leases), req.max_shm_input_bytes)
                feed, batch = validate_inputs(mv, req)
                wanted = requested_outputs(mv, req)
            except ServerError as err:
                self._record_failure(mv, err.reason, time.perf_counter_ns() - t0)
                raise
            async for item in self._decoupled_responses(mv, req, feed, batch, wanted, t0):
                yield item
        finally:
            for lease in leases:
                self.shared_memory.release(lease)

    async def _decoupled_responses(self, mv: ModelVersion, req: InferRequest, feed: dict[str, np.ndarray],
                                   batch: int, wanted: AbstractSet[str], t0: int) -> AsyncIterator[StreamResponse]:
        sink = StreamSink(mv, req.id, wanted)
        context = RequestContext(req.id, req.parameters, tuple(o.name for o in req.outputs), responses=sink,
                                 sequence=req.sequence, cancellation=sink.cancellation)

        async def submit() -> InferResult | None:
            try:
                return await mv.scheduler.submit(feed, priority=req.priority, timeout_us=req.timeout_us,
                                                 context=context)
            except Exception as exc:  # the execution failed: that is this request's final response
                sink.put(StreamResponse(None, as_server_error(exc, mv)))
                return None

        task = asyncio.create_task(submit())  # tasks start in creation order: the scheduler gets them in order
        scheduled(req)
        failed, finished = None, False
        try:
            while True:
                item = await sink.queue.get()
                failed = failed or item.error
                yield item
                if item.final:
                    break
            result = await task
            finished = True
        finally:
            sink.close(cancelled=not finished)  # responses the model still sends are dropped: nobody reads them
            if not task.done():  # the client went away: a request still queued is dropped
                task.cancel()
            if not finished:  # the stream stopped reading before the final response (cancelled)
                self._record_failure(mv, "CANCELED", time.perf_counter_ns() - t0)
        if failed is not None or result is None:
            self._record_failure(mv, failed.reason if failed else "BACKEND", time.perf_counter_ns() - t0)
        else:
            self._record_success(mv, result, batch, time.perf_counter_ns() - t0)

    def _record_success(self, mv: ModelVersion, result: InferResult, batch: int, total_ns: int) -> None:
        run = result.execution
        phases = dict(total_ns=total_ns, queue_ns=result.queue_ns, input_ns=run.compute_input_ns,
                      infer_ns=run.compute_infer_ns, output_ns=run.compute_output_ns, batch=batch)
        mv.stats.record_success(**phases)
        if self.metrics:
            self.metrics.request_ok(mv.name, mv.version, **phases)

    def _served_copies(self, mv: ModelVersion) -> list[int]:
        """The loaded copies whose outputs make `mv`'s answer: its own and, for an ensemble, those its steps' models
        resolve to now (a step without a version takes the newest), through nested ensembles. A step model that is
        not served now counts as 0: the request then fails, and nothing is stored."""
        copies = [mv.load_id]
        for step in mv.steps:
            try:
                copies += self._served_copies(self.repository.get(step.model_name, step.model_version))
            except ServerError:
                copies.append(0)
        return copies

    def _caches(self, mv: ModelVersion) -> bool:
        """Whether this model's responses are cached: its config asks (response_cache { enable: true }) and the
        server has a cache (--cache-config); asked without one, Triton runs every request, and so does nnserve,
        saying so once per model in the log."""
        if not mv.config.response_cache.enable:
            return False
        if self.cache is None and mv.name not in self._cache_warned:
            self._cache_warned.add(mv.name)
            log.warning("model '%s' enables response_cache, but the server has no cache (start it with "
                        "--cache-config local,size=BYTES): every request runs the model", mv.name)
        return self.cache is not None

    def _failed(self, mv: ModelVersion, exc: Exception, t0: int) -> ServerError:
        err = as_server_error(exc, mv)
        self._record_failure(mv, err.reason, time.perf_counter_ns() - t0)
        return err

    def _record_failure(self, mv: ModelVersion, reason: str, total_ns: int) -> None:
        mv.stats.record_failure(total_ns)
        if self.metrics:
            self.metrics.request_failed(mv.name, mv.version, reason, total_ns)


class StreamSink:
    """A decoupled request's ResponseSink: responses from the model's thread, queued on the event loop as the
    stream's responses (outputs checked and shaped as any response's)."""

    def __init__(self, mv: ModelVersion, request_id: str, wanted: AbstractSet[str]):
        self.mv, self.request_id, self.wanted = mv, request_id, wanted
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue[StreamResponse] = asyncio.Queue()
        self.closed = False
        self.cancellation = Cancellation()  # hooks come from the instance's thread, the cancel from the loop

    def on_cancel(self, callback: Callable[[], None]) -> None:
        self.cancellation.on_cancel(callback)

    def close(self, cancelled: bool) -> None:
        """No more responses are read; `cancelled`: before the final one, so the model is told (on_cancel)."""
        self.closed = True
        if cancelled:
            self.cancellation.cancel()

    def send(self, outputs: dict[str, np.ndarray] | None, error: Exception | None, final: bool,
             parameters: Mapping[str, Any]) -> None:
        self.loop.call_soon_threadsafe(self._convert, outputs, error, final, dict(parameters))

    def _convert(self, outputs: dict[str, np.ndarray] | None, error: Exception | None, final: bool,
                 parameters: dict[str, Any]) -> None:
        mv, response = self.mv, None
        try:
            if outputs is not None and error is None:
                response = InferResponse(mv.name, mv.version, self.request_id, api_outputs(mv, outputs, self.wanted),
                                         parameters)
        except ServerError as err:
            error = err
        self.put(StreamResponse(response, None if error is None else as_server_error(error, mv), final))

    def put(self, item: StreamResponse) -> None:
        """On the event loop; nothing after the final response."""
        if self.closed:
            return
        self.closed = item.final
        self.queue.put_nowait(item)


def scheduled(req: InferRequest) -> None:
    """Tell whoever waits for it that `req` is being handed to its scheduler (which queues it before suspending)."""
    if req.on_scheduled is not None:
        req.on_scheduled()


def request_context(mv: ModelVersion, req: InferRequest) -> RequestContext | None:
    """What a backend taking requests one by one gets besides the inputs, and what a sequence model's scheduler
    needs (the request's sequence); None for the engine's other models."""
    if not mv.takes_requests and not mv.sequence:
        return None
    return RequestContext(req.id, req.parameters, tuple(o.name for o in req.outputs), sequence=req.sequence)


def cache_key(mv: ModelVersion, feed: Mapping[str, np.ndarray], context: RequestContext | None,
              copies: Sequence[int] = ()) -> bytes:
    """The response cache's key: the inputs, and what else of the request the model sees (a Python model's answer
    may depend on the outputs asked for and on the request's parameters), and the loaded copies that answer
    (served_copies). Classification and binary_data only change how the cached outputs are answered, so they are
    not part of it."""
    if context is None or not mv.takes_requests:
        return request_key(mv.name, mv.version, feed, copies=copies)
    return request_key(mv.name, mv.version, feed, context.requested_outputs, context.model_parameters(), copies)


async def cache_key_off_loop(mv: ModelVersion, feed: Mapping[str, np.ndarray], context: RequestContext | None,
                             copies: Sequence[int] = ()) -> bytes:
    """cache_key, in a worker thread where the inputs are large (a million BYTES elements take a second to hash)."""
    if hashing_cost(feed) >= rx.THREAD_BYTES:
        return await asyncio.to_thread(cache_key, mv, feed, context, copies)
    return cache_key(mv, feed, context, copies)


def _stamp_execution(trace: Trace, queued: int, result: InferResult) -> None:
    """Triton's activity timestamps of a request that ran, from when it was queued and its execution's phases."""
    run = result.execution
    start = queued + result.queue_ns
    trace.stamp("QUEUE_START", queued)
    trace.stamp("COMPUTE_START", start)
    trace.stamp("COMPUTE_INPUT_END", start + run.compute_input_ns)
    trace.stamp("COMPUTE_OUTPUT_START", start + run.compute_input_ns + run.compute_infer_ns)
    trace.stamp("COMPUTE_END", start + run.compute_ns)


def as_server_error(exc: Exception, mv: ModelVersion) -> ServerError:
    """The one place engine and unexpected errors become ServerErrors (transports then map those once)."""
    if isinstance(exc, ServerError):
        return exc
    if isinstance(exc, ShapeError):
        return InvalidArgumentError(f"model '{mv.name}': {exc}")
    if isinstance(exc, EngineError):
        return InferenceError(f"model '{mv.name}' failed: {exc}")
    log.exception("unexpected error in model '%s'", mv.name)
    return InferenceError(f"model '{mv.name}' failed: {type(exc).__name__}: {exc}")


def validate_inputs(mv: ModelVersion, req: InferRequest) -> tuple[dict[str, np.ndarray], int]:
    """Check names, datatypes and shapes against the config (Triton's messages); returns (feed, batch size)."""
    expected = mv.input_configs
    given = {t.name: t for t in req.inputs}
    if len(given) != len(req.inputs):
        seen: set[str] = set()
        twice = next(t.name for t in req.inputs if t.name in seen or seen.add(t.name))
        raise InvalidArgumentError(f"input '{twice}' already exists in request")  # Triton's words
    if given.keys() != expected.keys():
        _name_mismatch(mv, expected, given)
    feed, batch = {}, 1
    for name, t in expected.items():
        inp = given[name]
        if inp.datatype != t.datatype:
            raise InvalidArgumentError(f"inference input '{name}' data-type is '{inp.datatype}', but model "
                                       f"'{mv.name}' expects '{t.datatype}'")
        batch = _check_shape(mv, name, inp.shape, t.dims)
        feed[name] = t.to_model(inp.data, mv.batching)  # a config `reshape` gives the model its own shape
        if name in mv.quantized_inputs:
            _refuse_nan(mv, name, feed[name])
    return feed, batch


def _name_mismatch(mv: ModelVersion, expected: dict[str, Any], given: dict[str, Any]) -> None:
    for name in given:
        if name not in expected:
            raise InvalidArgumentError(f"unexpected inference input '{name}' for model '{mv.name}'")
    missing = [n for n in expected if n not in given]
    raise InvalidArgumentError(f"expected {len(expected)} inputs but got {len(given)} inputs for model "
                               f"'{mv.name}'. Got input(s) {sorted(given)}, but missing required input(s) "
                               f"{missing}. Please provide all required input(s).")


def _refuse_nan(mv: ModelVersion, name: str, array: np.ndarray) -> None:
    """Here, per request, rather than in the run: the engine refuses the NaN too (engine.InputValueError), but a run
    fails every request batched with the one that held it. A NaN the model computes from numbers (an infinity
    through float layers) is met in the run: a model failure (500), not the request's."""
    if holds_nan(array):
        raise InvalidArgumentError(f"input '{name}' holds NaN: model '{mv.name}' quantizes it to int8, which cannot "
                                   f"represent NaN")


def _check_shape(mv: ModelVersion, name: str, shape: list[int], dims: list[int]) -> int:
    batching = mv.batching
    full = [-1, *dims] if batching else dims
    if len(shape) != len(full) or any(e != -1 and e != s for s, e in zip(shape, full, strict=False)):
        raise InvalidArgumentError(f"unexpected shape for input '{name}' for model '{mv.name}'. Expected "
                                   f"{list(full)}, got {shape}")
    batch = shape[0] if batching else 1
    if batching and not 1 <= batch <= mv.max_batch_size:
        raise InvalidArgumentError(f"inference request batch-size must be <= {mv.max_batch_size} for "
                                   f"'{mv.name}', got {batch}")
    limit = mv.max_shapes.get(name)
    if limit and any(s > m for s, m in zip(shape[1:] if batching else shape, limit[1:] if batching else limit,
                                          strict=False)):
        raise InvalidArgumentError(f"input '{name}' shape {shape} exceeds the max shape {limit} model '{mv.name}' "
                                   "was loaded for")
    return batch


def api_outputs(mv: ModelVersion, outputs: dict[str, np.ndarray], wanted: AbstractSet[str]) -> list[OutputTensor]:
    """The requested outputs in the shapes the config's dims give them (a `reshape` undone)."""
    configs = mv.output_configs
    picked = []
    for name, array in outputs.items():
        if name not in wanted:
            continue
        if mv.takes_requests:  # the model's own code made it: it must be what the config says
            check_output_type(mv, name, array)
        if name in configs:
            try:
                array = configs[name].to_api(array, mv.batching)
            except ValueError as exc:  # the model produced a shape its config's reshape cannot express
                raise InferenceError(f"model '{mv.name}': output '{name}' of shape {list(array.shape)} does not "
                                     f"fit the config's dims {configs[name].dims}: {exc}") from exc
        picked.append(OutputTensor(name, numpy_to_wire(array.dtype), list(array.shape), array))
    return picked


def requested_outputs(mv: ModelVersion, req: InferRequest) -> AbstractSet[str]:
    names = mv.output_configs.keys()
    if not req.outputs:
        return names
    if len({o.name for o in req.outputs}) != len(req.outputs):
        seen: set[str] = set()
        twice = next(o.name for o in req.outputs if o.name in seen or seen.add(o.name))
        raise InvalidArgumentError(f"output '{twice}' already exists in request")
    for out in req.outputs:
        if out.name not in names:
            raise InvalidArgumentError(f"unexpected inference output '{out.name}' for model '{mv.name}'")
    return {o.name for o in req.outputs}


def check_output_type(mv: ModelVersion, name: str, array: np.ndarray) -> None:
    declared = mv.output_configs[name].datatype if name in mv.output_configs else None
    produced = numpy_to_wire(array.dtype)
    if declared is not None and produced != declared:
        raise InferenceError(f"model '{mv.name}': output '{name}' is {produced}, but the model config declares "
                             f"{declared}")
