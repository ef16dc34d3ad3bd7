"""The model repository: scan <repo>/<model>/[config.pbtxt]/<version>/, load/unload/reload with an atomic swap,
version policy, and the three model control modes (none, poll, explicit).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import engine
from server import config as cfg
from server.backend import BackendModel
from server.config_fields import ENSEMBLE_PLATFORM, PYTHON_BACKEND, check_supported
from server.ensemble.graph import check_mappings, order_steps, steps_of
from server.errors import (
    ModelControlError,
    ModelLoadError,
    ModelNotFoundError,
    ModelNotReadyError,
    RepositoryPollError,
    ServerError,
    UnknownModelError,
)
from server.metrics import ServerMetrics
from server.model_calls import ModelCalls
from server.model_config import model_config_pb2 as mc
from server.model_version import (
    LOADING,
    READY,
    UNAVAILABLE,
    ModelVersion,
    close_instances,
    load_ensemble_version,
    load_version,
)
from server.python_backend.model import PythonModel, model_file
from server.repository_files import check_regular
from server.security import check_model_name, escaping_paths
from server.tensor_names import bind_names

log = logging.getLogger("nnserve.repository")
UNLOADED_REASON = "unloaded"


@dataclass
class ModelEntry:
    """What the repository knows about one model directory."""

    name: str
    versions: dict[str, ModelVersion] = field(default_factory=dict)
    config: mc.ModelConfig | None = None
    state: str = UNAVAILABLE
    reason: str = ""  # why it is not READY; with versions serving: why the last reload failed
    fingerprint: tuple = ()


def version_dirs(model_dir: Path) -> list[int]:
    """Numeric subdirectories; names starting with 0 are ignored, as Triton does."""
    return sorted(int(p.name) for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit()
                  and not p.name.startswith("0"))


def select_versions(config: mc.ModelConfig, available: list[int]) -> list[int]:
    policy = config.version_policy.WhichOneof("policy_choice")
    if policy == "all":
        return available
    if policy == "specific":
        wanted = set(config.version_policy.specific.versions)
        missing = wanted - set(available)
        if missing:
            raise ModelLoadError(f"model '{config.name}': version_policy.specific lists versions {sorted(missing)} "
                                 "that have no directory")
        return sorted(wanted)
    n = config.version_policy.latest.num_versions or 1
    return available[-n:]


def fingerprint(model_dir: Path) -> tuple:
    """Changes when any file of the model changes: what poll mode compares. Files that vanish while it is taken are
    left out (the next poll sees the directory as it is then)."""
    items = []
    for p in sorted(model_dir.rglob("*")):
        try:
            st = p.stat()
        except OSError:
            continue
        items.append((str(p.relative_to(model_dir)), st.st_mode, st.st_size, st.st_mtime_ns))
    return tuple(items)


def _release_loader_threads() -> None:
    """A load's warm-up ran kernels on this loader thread, which gave it a team of OpenMP threads; kept, they would
    cut every serving thread's spin between ops (server/scheduling/workers.py), so they go with the load."""
    try:
        engine.release_thread()
    except Exception:  # an optimisation: never the load's outcome
        log.exception("releasing the loader thread's kernel threads failed")


class ModelRepository:
    def __init__(self, root: Path, *, control_mode: str = "none", default_max_batch_size: int = 4,
                 metrics: ServerMetrics | None = None, load_fn: Callable[[Path], BackendModel] = engine.load):
        self.root = Path(root)
        self.control_mode = control_mode
        self.default_max_batch_size = default_max_batch_size
        self.metrics = metrics
        self._load = load_fn
        self._models: dict[str, ModelEntry] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._loads: set[asyncio.Task[None]] = set()  # loads under way; a caller going away does not stop one
        # per model whose load is under way: set by an unload or the shutdown, so that its warm-up stops between runs
        self._cancels: dict[str, threading.Event] = {}
        self._stopping = False
        self._building: set[str] = set()  # models whose load thread runs (one per name: loads hold its lock)
        self.calls = ModelCalls()  # how models call models (BLS, ensemble steps): the data plane binds itself

    # ---- lookups ---------------------------------------------------------------------------------------------
    def names_on_disk(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if p.is_dir() and not p.name.startswith("."))

    def get(self, name: str, version: str = "") -> ModelVersion:
        """The version to serve; raises Triton's errors for unknown / unloaded / not-ready models."""
        entry = self._models.get(name)
        if entry is None or not entry.versions:
            if entry is None and name not in self.names_on_disk():
                raise UnknownModelError(f"Request for unknown model: '{name}' is not found")
            raise ModelNotFoundError(f"Request for unknown model: '{name}' has no available versions")
        if version:
            mv = entry.versions.get(version)
            if mv is None:
                raise ModelNotFoundError(f"Request for unknown model: '{name}' version {version} is not found")
        else:
            mv = entry.versions[max(entry.versions, key=int)]
        if mv.state != READY:
            raise ModelNotReadyError(f"Request for model '{name}' version {mv.version} is not at ready state")
        return mv

    def entry(self, name: str) -> ModelEntry | None:
        return self._models.get(name)

    def loaded(self) -> list[ModelVersion]:
        return [mv for e in self._models.values() for mv in e.versions.values()]

    def all_ready(self) -> bool:
        """Strict readiness: every model we were asked to serve is READY (an explicit unload does not count)."""
        return all(e.state == READY for e in self._models.values() if e.reason != UNLOADED_REASON)

    def index(self, ready_only: bool = False) -> list[dict[str, str]]:
        rows = []
        for name in sorted(set(self.names_on_disk()) | set(self._models)):
            entry = self._models.get(name)
            if entry and entry.versions:
                for v, mv in sorted(entry.versions.items(), key=lambda kv: int(kv[0])):
                    rows.append({"name": name, "version": v, "state": mv.state, "reason": entry.reason})
            elif not ready_only:
                row = {"name": name}
                if entry:
                    row |= {"state": entry.state, "reason": entry.reason}
                rows.append(row)
        return [r for r in rows if not ready_only or r.get("state") == READY]

    # ---- load / unload ---------------------------------------------------------------------------------------
    def _lock(self, name: str) -> asyncio.Lock:
        return self._locks.setdefault(name, asyncio.Lock())

    async def load(self, name: str, config_json: str | None = None, model_dir: Path | None = None) -> None:
        """Load or reload `name`. The old versions keep serving until the new ones are READY, then swap; a failed
        reload leaves them serving, with the reason in the index. A caller that goes away (a client disconnecting
        from the load API) does not stop the load: it runs to its end, so no model is left LOADING. `model_dir`
        replaces the repository's directory for this load (model files sent with the request)."""
        problem = check_model_name(name)
        if problem:
            raise ModelLoadError(f"failed to load: {problem}")
        if model_dir is None and not (self.root / name).is_dir():  # nothing is recorded for a name it lacks
            raise RepositoryPollError(f"failed to load '{name}', failed to poll from model repository")  # Triton's
        self.calls.attach_loop()
        task = asyncio.create_task(self._load_locked(name, config_json, model_dir or self.root / name),
                                   name=f"nnserve-load-{name}")
        self._loads.add(task)
        task.add_done_callback(self._load_done)
        await asyncio.shield(task)

    def _load_done(self, task: asyncio.Task[None]) -> None:
        self._loads.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved here too, for a load whose caller went away

    async def _load_locked(self, name: str, config_json: str | None, model_dir: Path) -> None:
        async with self._lock(name):
            old = self._models.get(name)
            serving = old if old is not None and old.versions else None
            if serving is None:  # visible as LOADING in the index; a reload keeps serving the old
                self._models[name] = ModelEntry(name, state=LOADING)
            log.info("loading model '%s'", name)
            cancel = self._cancels.setdefault(name, threading.Event())
            if self._stopping:  # a load the shutdown did not see start: stopped at its warm-up
                cancel.set()
            try:
                await self._load_dependencies(name, config_json)
                entry = await asyncio.to_thread(self._build_tracked, name, model_dir, config_json)
            except Exception as exc:  # any failure is this model's alone
                message = _load_failure(name, exc)
                if serving is not None:
                    serving.reason = f"reload failed, still serving the previous load: {message}"
                    log.error("model '%s': reload failed, versions %s keep serving: %s", name,
                              ", ".join(sorted(serving.versions, key=int)), message)
                else:
                    self._models[name] = ModelEntry(name, state=UNAVAILABLE, reason=message)
                    log.error("model '%s' UNAVAILABLE: %s", name, message)
                raise ModelLoadError(_api_failure(name, message)) from None
            finally:
                if self._cancels.get(name) is cancel:
                    del self._cancels[name]
            for mv in entry.versions.values():
                await mv.scheduler.start()
            self._models[name] = entry  # the swap: new requests go to the new versions from here on
            if old is not None:
                await self._retire(old, keep=set())
            for mv in entry.versions.values():
                self._log_loaded(mv)

    def _build_tracked(self, name: str, model_dir: Path, config_json: str | None) -> ModelEntry:
        """_build, known to loading() while its thread runs (which may outlast the task that awaits it)."""
        self._building.add(name)
        try:
            return self._build(name, model_dir, config_json)
        finally:
            self._building.discard(name)
            _release_loader_threads()

    def _build(self, name: str, model_dir: Path, config_json: str | None) -> ModelEntry:
        if not model_dir.is_dir():
            raise RepositoryPollError(f"failed to load '{name}', failed to poll from model repository")  # Triton's
        outside = escaping_paths(model_dir.parent, model_dir)
        if outside:  # a symlink out of the repository: the load API must not read arbitrary files
            raise ModelLoadError(f"failed to load '{name}': {', '.join(sorted(outside)[:5])} resolves outside the "
                                 "model repository")
        if config_json is not None:
            config, has_mbs = cfg.parse_config_json(config_json), '"max_batch_size"' in config_json
        else:
            config, has_mbs = cfg.read_config(model_dir)
        if config.name and config.name != name:  # before anything names the model by its config
            raise ModelLoadError(f"model '{name}': config.name '{config.name}' must match the directory name")
        check_supported(config, name)
        available = version_dirs(model_dir)
        if not available:
            raise ModelLoadError(f"model '{name}': no version directory (1/, 2/, ...) in {model_dir.name}/")
        # Only the versions the policy selects are read (an old, broken or half-copied one must not stop the
        # newest); the newest of them is what auto-complete describes. The policy itself comes from config.pbtxt,
        # before auto-complete (which only fills the default, latest 1).
        config.name = config.name or name  # select_versions' errors name the model
        selected = select_versions(config, available)
        if config.platform == ENSEMBLE_PLATFORM:
            return self._build_ensemble(name, model_dir, config, selected)
        models: dict[int, tuple[BackendModel, str, float]] = {}
        entry = ModelEntry(name, config=config, fingerprint=fingerprint(model_dir))
        try:
            for v in reversed(selected):
                models[v] = self._read_model(name, config, model_dir / str(v))
            newest = models[selected[-1]]
            if isinstance(newest[0], PythonModel):  # its auto_complete_config first, as Triton runs it
                t0 = time.perf_counter()
                newest[0].complete_config(config)
                newest = models[selected[-1]] = (newest[0], newest[1], newest[2] + time.perf_counter() - t0)
            cfg.auto_complete(config, name, newest[1], newest[0], has_max_batch=has_mbs,
                              default_max_batch_size=self.default_max_batch_size)
            for v in selected:
                self._load_one(entry, models[v], model_dir / str(v))
        except Exception:
            self._forget(entry)
            for model, _, _ in models.values():
                if isinstance(model, PythonModel):
                    model.discard()
            raise
        entry.state = READY
        return entry

    def _build_ensemble(self, name: str, model_dir: Path, config: mc.ModelConfig, selected: list[int]) -> ModelEntry:
        """Its steps checked against the composing models loaded now (the dependencies were loaded first)."""
        steps = order_steps(name, [t.name for t in config.input], [t.name for t in config.output], steps_of(config))
        composing = {}
        for step in steps:
            try:
                composing[step.index] = self.get(step.model_name, step.model_version).config
            except ServerError:
                version = f" version {step.model_version}" if step.model_version else ""
                raise ModelLoadError(f"ensemble '{name}' depends on '{step.model_name}'{version} which has no loaded "
                                     "version.") from None
        check_mappings(name, config, steps, composing)
        if not config.HasField("version_policy"):
            config.version_policy.latest.num_versions = 1
        entry = ModelEntry(name, config=config, fingerprint=fingerprint(model_dir))
        for v in selected:
            mv = load_ensemble_version(config, name, str(v), steps, self.calls, self.metrics, model_dir)
            entry.versions[str(v)] = mv
            if self.metrics is not None:
                self.metrics.model_loaded(name, str(v), mv.load_seconds, [])
        entry.state = READY
        return entry

    async def _load_dependencies(self, name: str, config_json: str | None) -> None:
        """An ensemble's composing models, loaded first when they are not loaded (as Triton does); a cycle of
        ensembles is refused before anything loads."""
        for dep in await asyncio.to_thread(self._dependencies, name, config_json):
            entry = self._models.get(dep)
            if entry is not None and entry.versions:
                continue
            if dep not in self.names_on_disk():
                raise ModelLoadError(f"ensemble '{name}' depends on '{dep}', which is not in the model repository")
            try:
                await self.load(dep)
            except ModelLoadError as exc:
                raise ModelLoadError(f"ensemble '{name}' depends on '{dep}' which has no loaded version. Model "
                                     f"'{dep}' loading failed with error: {exc.message}") from None

    def _dependencies(self, name: str, config_json: str | None) -> list[str]:
        """The models `name`'s steps run (none for a model that is not an ensemble); ModelLoadError for ensembles
        that depend on each other in a circle."""
        direct = self._steps_models(name, config_json)
        pending = [(dep, [name, dep]) for dep in direct]
        while pending:
            model, chain = pending.pop()
            for dep in self._steps_models(model, None):
                if dep == name:
                    raise ModelLoadError(f"circular dependency between ensembles: {' -> '.join([*chain, name])}")
                if dep not in chain:
                    pending.append((dep, [*chain, dep]))
        return direct

    def _steps_models(self, name: str, config_json: str | None) -> list[str]:
        """The composing models an ensemble's config names; [] where it is no ensemble or cannot be read (its own
        load then says why)."""
        try:
            if config_json is not None:
                config = cfg.parse_config_json(config_json)
            elif (self.root / name).is_dir():
                config = cfg.read_config(self.root / name)[0]
            else:
                return []
        except ModelLoadError:
            return []
        return list(dict.fromkeys(s.model_name for s in config.ensemble_scheduling.step if s.model_name))

    def _load_one(self, entry: ModelEntry, read: tuple[BackendModel, str, float], version_dir: Path) -> None:
        model, _, read_seconds = read
        name, v = entry.name, version_dir.name
        if isinstance(model, PythonModel):  # described by its config: validation then checks the config alone
            model.configure(entry.config)
        else:
            model = bind_names(entry.config, name, model)  # a PNNX model's in0/out0 under the config's names
        cfg.validate(entry.config, name, model)
        mv = load_version(model, entry.config, name, v, version_dir, self.metrics, self._cancels.get(name))
        mv.load_seconds += read_seconds
        entry.versions[v] = mv
        if self.metrics is not None:
            self.metrics.model_loaded(name, v, mv.load_seconds, mv.arena_bytes)

    def _forget(self, entry: ModelEntry) -> None:
        """A build that failed part way: the versions it did load never served (their schedulers were not
        started), but their metrics were set; take those back."""
        for v, mv in entry.versions.items():
            close_instances(mv.instances)
            if self.metrics is not None:
                self.metrics.model_unloaded(entry.name, v, len(mv.instances))

    def _read_model(self, name: str, config: mc.ModelConfig, version_dir: Path) -> tuple[BackendModel, str, float]:
        if config.backend == PYTHON_BACKEND:  # its model.py runs in worker processes, started by its instances
            model = PythonModel(name, version_dir, model_file(version_dir, config, name), self.calls)
            return model, PYTHON_BACKEND, 0.0
        backend, graph, weights = cfg.model_files(version_dir, config, name)
        for path in (graph, weights):  # the engine opens them: a FIFO would block it forever
            check_regular(path, f"model '{name}': {version_dir.name}/{path.name}")
        t0 = time.perf_counter()
        try:
            model = self._load(graph)
        except Exception as exc:  # engine errors name the file and line; keep their message
            raise ModelLoadError(f"model '{name}' version {version_dir.name}: {exc}") from None
        return model, backend, time.perf_counter() - t0

    async def unload(self, name: str) -> None:
        if name in self._cancels:  # a load under way (in its warm-up) stops instead of being waited for
            self._cancels[name].set()
        async with self._lock(name):
            entry = self._models.get(name)
            if entry is None:  # Triton 2.51: unloading a model that is not loaded (or not known) succeeds
                return
            self._models[name] = ModelEntry(name, state=UNAVAILABLE, reason=UNLOADED_REASON)
            await self._retire(entry, keep=set())
            log.info("model '%s' UNAVAILABLE: unloaded", name)

    async def _retire(self, entry: ModelEntry, keep: set[str], drain: bool = True) -> None:
        """Drain the old versions' queues (requests already accepted finish), then drop them."""
        for v, mv in entry.versions.items():
            if v in keep:
                continue
            mv.state = "UNLOADING"
            await mv.scheduler.stop(drain=drain)
            await asyncio.to_thread(close_instances, mv.instances)
            if self.metrics is not None:
                self.metrics.model_unloaded(entry.name, v, len(mv.instances))

    def _log_loaded(self, mv: ModelVersion) -> None:
        if mv.config.platform == ENSEMBLE_PLATFORM:
            steps = " -> ".join(s.model_name for s in mv.config.ensemble_scheduling.step)
            log.info("loaded ensemble '%s' version %s: READY (steps: %s)", mv.name, mv.version, steps)
            return
        log.info("loaded model '%s' version %s: READY (%s, max_batch_size %d, %s, arena %.1f MiB total, "
                 "max shapes %s) in %.2f s", mv.name, mv.version, mv.config.backend, mv.config.max_batch_size,
                 instances_text([i.device_name for i in mv.instances]), sum(mv.arena_bytes) / 2**20, mv.max_shapes,
                 mv.load_seconds)

    # ---- control modes ---------------------------------------------------------------------------------------
    def loading(self) -> list[str]:
        """The models whose load thread is running."""
        return sorted(self._building.copy())  # copied at once: load threads change it

    async def startup(self, load_models: list[str]) -> list[str]:
        """Initial loads per control mode; returns the names that failed."""
        if self.control_mode == "explicit":
            names = self.names_on_disk() if "*" in load_models else load_models
        else:
            names = self.names_on_disk()
        failed = []
        for name in names:
            entry = self._models.get(name)
            if entry is not None and entry.versions:  # loaded already, as an ensemble's dependency
                continue
            try:
                await self.load(name)
            except (ModelLoadError, RepositoryPollError):  # --load-model of a name the repository lacks
                failed.append(name)
        log.info("models:\n%s", self.status_table())
        return failed

    def status_table(self) -> str:
        """The models and their state as Triton prints them once loading is done: name, version, status (with the
        reason where there is one)."""
        rows = []
        for r in self.index():
            status = r.get("state", "")
            if r.get("reason"):
                status = f"{status}: {r['reason']}" if status else r["reason"]
            rows.append((r["name"], r.get("version", "-"), status or "not loaded"))
        return format_table(("Model", "Version", "Status"), rows)

    def check_api_allowed(self, action: str) -> None:
        if self.control_mode != "explicit":
            raise ModelControlError(f"explicit model {action} is not allowed if model control is not enabled "
                                    "(start with --model-control-mode=explicit)")

    async def poll_once(self) -> None:
        """Poll mode: load new models, reload changed ones (a failed reload keeps the old), unload removed ones."""
        on_disk = set(self.names_on_disk())
        for name in sorted(on_disk):
            try:  # one model's trouble (a load error, a file vanishing mid-scan) must not stop the others' poll
                await self._poll_model(name)
            except Exception as exc:
                log.error("repository poll: model '%s': %s", name, _load_failure(name, exc))
        for name in sorted(set(self._models) - on_disk):
            try:
                await self.unload(name)
            except Exception as exc:
                log.error("repository poll: unloading model '%s': %s", name, _load_failure(name, exc))
            self._models.pop(name, None)

    async def _poll_model(self, name: str) -> None:
        entry = self._models.get(name)
        now = fingerprint(self.root / name)
        if entry is not None and entry.fingerprint == now:
            return
        try:
            await self.load(name)
        except ModelLoadError:
            if name in self._models:  # not retried until its files change again
                self._models[name].fingerprint = now

    async def poll_forever(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await self.poll_once()
            except Exception:  # a poll must never kill the server
                log.exception("repository poll failed")

    async def shutdown(self, drain: bool = True) -> None:
        """Stop every model; without drain, queued requests fail at once (the exit timeout is over). With drain, loads
        under way finish first, so none starts a model after this; without, they are not waited for (one may be stuck
        in a warm-up, and the process is about to exit). Warm-ups under way stop at their next run."""
        self._stopping = True
        for cancel in self._cancels.values():
            cancel.set()
        if drain:
            await asyncio.gather(*self._loads, return_exceptions=True)
        for name in list(self._models):
            entry = self._models[name]
            await self._retire(entry, keep=set(), drain=drain)


def _api_failure(name: str, message: str) -> str:
    """The load API's answer: Triton's clients (simple_*_model_control) match "failed to load" in it."""
    return message if message.startswith("failed to load") else f"failed to load '{name}': {message}"


def _load_failure(name: str, exc: BaseException) -> str:
    """The reason a load failed, for the index, the log and the caller: a ModelLoadError's own message; anything
    else is a bug, logged with its traceback, and named by its type."""
    if isinstance(exc, ModelLoadError):
        return exc.message
    log.error("model '%s': unexpected error while loading", name, exc_info=exc)
    return f"model '{name}': unexpected error while loading: {type(exc).__name__}: {exc}"


def instances_text(devices: list[str]) -> str:
    """"2 instances on cpu", "3 instances: 2 on cuda:0, 1 on cpu"."""
    counts = Counter(devices)
    total = f"{len(devices)} instance{'s' if len(devices) != 1 else ''}"
    if len(counts) == 1:
        return f"{total} on {devices[0]}"
    return f"{total}: " + ", ".join(f"{n} on {d}" for d, n in counts.items())


def format_table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    """A text table as Triton logs its model table (+---+ rules, | cells |), on lines of its own."""
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows, strict=True)]
    rule = "+" + "+".join("-" * (w + 2) for w in widths) + "+"

    def line(cells: tuple[str, ...]) -> str:
        return "|" + "|".join(f" {str(c):<{w}} " for c, w in zip(cells, widths, strict=True)) + "|"

    return "\n".join([rule, line(header), rule, *(line(r) for r in rows), rule])
