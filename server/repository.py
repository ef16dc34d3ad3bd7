"""The model repository: scan <repo>/<model>/[config.pbtxt]/<version>/, load/unload/reload with an atomic swap,
version policy, and the three model control modes (none, poll, explicit).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import engine
from server import config as cfg
from server.backend import BackendModel
from server.errors import ModelControlError, ModelLoadError, ModelNotFoundError, ModelNotReadyError, UnknownModelError
from server.metrics import ServerMetrics
from server.model_config import model_config_pb2 as mc
from server.model_version import LOADING, READY, UNAVAILABLE, ModelVersion, load_version
from server.security import check_model_name, escaping_paths

log = logging.getLogger("nnserve.repository")
UNLOADED_REASON = "unloaded"


@dataclass
class ModelEntry:
    """What the repository knows about one model directory."""

    name: str
    versions: dict[str, ModelVersion] = field(default_factory=dict)
    config: mc.ModelConfig | None = None
    state: str = UNAVAILABLE
    reason: str = ""
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
    """Changes when any file of the model changes: what poll mode compares."""
    items = []
    for p in sorted(model_dir.rglob("*")):
        if p.is_file():
            st = p.stat()
            items.append((str(p.relative_to(model_dir)), st.st_size, st.st_mtime_ns))
    return tuple(items)


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
                    rows.append({"name": name, "version": v, "state": mv.state, "reason": ""})
            elif not ready_only:
                row = {"name": name}
                if entry:
                    row |= {"state": entry.state, "reason": entry.reason}
                rows.append(row)
        return [r for r in rows if not ready_only or r.get("state") == READY]

    # ---- load / unload ---------------------------------------------------------------------------------------
    def _lock(self, name: str) -> asyncio.Lock:
        return self._locks.setdefault(name, asyncio.Lock())

    async def load(self, name: str, config_json: str | None = None) -> None:
        """Load or reload `name`. The old versions keep serving until the new ones are READY, then swap."""
        problem = check_model_name(name)
        if problem:
            raise ModelLoadError(f"failed to load: {problem}")
        async with self._lock(name):
            old = self._models.get(name)
            model_dir = self.root / name
            if old is None or not old.versions:  # visible as LOADING in the index; a reload keeps serving the old
                self._models[name] = ModelEntry(name, state=LOADING)
            try:
                entry = await asyncio.to_thread(self._build, name, model_dir, config_json)
            except ModelLoadError as exc:
                log.error("failed to load '%s': %s", name, exc.message)
                if old is None or not old.versions:
                    self._models[name] = ModelEntry(name, state=UNAVAILABLE, reason=exc.message)
                raise
            for mv in entry.versions.values():
                await mv.scheduler.start()
            self._models[name] = entry  # the swap: new requests go to the new versions from here on
            if old is not None:
                await self._retire(old, keep=set())
            for mv in entry.versions.values():
                self._log_loaded(mv)

    def _build(self, name: str, model_dir: Path, config_json: str | None) -> ModelEntry:
        if not model_dir.is_dir():
            raise ModelLoadError(f"failed to load '{name}': no model directory '{name}' in the repository")
        outside = escaping_paths(self.root, model_dir)
        if outside:  # a symlink out of the repository: the load API must not read arbitrary files
            raise ModelLoadError(f"failed to load '{name}': {', '.join(sorted(outside)[:5])} resolves outside the "
                                 "model repository")
        if config_json is not None:
            config, has_mbs = cfg.parse_config_json(config_json), '"max_batch_size"' in config_json
        else:
            config, has_mbs = cfg.read_config(model_dir)
        available = version_dirs(model_dir)
        if not available:
            raise ModelLoadError(f"model '{name}': no version directory (1/, 2/, ...) in {model_dir.name}/")
        # Only the versions the policy selects are read (an old, broken or half-copied one must not stop the
        # newest); the newest of them is what auto-complete describes. The policy itself comes from config.pbtxt,
        # before auto-complete (which only fills the default, latest 1).
        config.name = config.name or name  # select_versions' errors name the model
        selected = select_versions(config, available)
        models = {v: self._read_model(name, model_dir / str(v)) for v in reversed(selected)}
        newest = models[selected[-1]]
        cfg.auto_complete(config, name, newest[1], newest[0], has_max_batch=has_mbs,
                          default_max_batch_size=self.default_max_batch_size)
        entry = ModelEntry(name, config=config, fingerprint=fingerprint(model_dir))
        try:
            for v in selected:
                self._load_one(entry, models[v], model_dir / str(v))
        except ModelLoadError:
            self._forget(entry)
            raise
        entry.state = READY
        return entry

    def _load_one(self, entry: ModelEntry, read: tuple[BackendModel, str, float], version_dir: Path) -> None:
        model, _, read_seconds = read
        name, v = entry.name, version_dir.name
        cfg.validate(entry.config, name, model)
        mv = load_version(model, entry.config, name, v, version_dir, self.metrics)
        mv.load_seconds += read_seconds
        entry.versions[v] = mv
        if self.metrics is not None:
            self.metrics.model_loaded(name, v, mv.load_seconds, mv.arena_bytes)

    def _forget(self, entry: ModelEntry) -> None:
        """A build that failed part way: the versions it did load never served (their schedulers were not
        started), but their metrics were set; take those back."""
        if self.metrics is not None:
            for v, mv in entry.versions.items():
                self.metrics.model_unloaded(entry.name, v, len(mv.instances))

    def _read_model(self, name: str, version_dir: Path) -> tuple[BackendModel, str, float]:
        backend = cfg.detect_backend(version_dir)
        if backend is None:
            wanted = " or ".join("+".join(f) for f in cfg.MODEL_FILES.values())
            raise ModelLoadError(f"model '{name}': {version_dir.parent.name}/{version_dir.name}/ has no {wanted}")
        t0 = time.perf_counter()
        try:
            model = self._load(cfg.model_path(version_dir, backend))
        except Exception as exc:  # engine errors name the file and line; keep their message
            raise ModelLoadError(f"model '{name}' version {version_dir.name}: {exc}") from exc
        return model, backend, time.perf_counter() - t0

    async def unload(self, name: str) -> None:
        async with self._lock(name):
            entry = self._models.get(name)
            if entry is None:
                if name not in self.names_on_disk():
                    raise UnknownModelError(f"failed to unload '{name}': Request for unknown model: '{name}' "
                                            "is not found")
                return
            self._models[name] = ModelEntry(name, state=UNAVAILABLE, reason=UNLOADED_REASON)
            await self._retire(entry, keep=set())
            log.info("unloaded model '%s'", name)

    async def _retire(self, entry: ModelEntry, keep: set[str], drain: bool = True) -> None:
        """Drain the old versions' queues (requests already accepted finish), then drop them."""
        for v, mv in entry.versions.items():
            if v in keep:
                continue
            mv.state = "UNLOADING"
            await mv.scheduler.stop(drain=drain)
            if self.metrics is not None:
                self.metrics.model_unloaded(entry.name, v, len(mv.instances))

    def _log_loaded(self, mv: ModelVersion) -> None:
        arena = sum(mv.arena_bytes)
        devices = [i.device_name for i in mv.instances]
        log.info("loaded model '%s' version %s (%s, max_batch_size %d, %d instance(s) on %s, arena %.1f MiB total, "
                 "max shapes %s) in %.2f s", mv.name, mv.version, mv.config.backend, mv.config.max_batch_size,
                 len(mv.instances), ", ".join(devices), arena / 2**20, mv.max_shapes, mv.load_seconds)

    # ---- control modes ---------------------------------------------------------------------------------------
    async def startup(self, load_models: list[str]) -> list[str]:
        """Initial loads per control mode; returns the names that failed."""
        if self.control_mode == "explicit":
            names = self.names_on_disk() if "*" in load_models else load_models
        else:
            names = self.names_on_disk()
        failed = []
        for name in names:
            try:
                await self.load(name)
            except ModelLoadError:
                failed.append(name)
        return failed

    def check_api_allowed(self, action: str) -> None:
        if self.control_mode != "explicit":
            raise ModelControlError(f"explicit model {action} is not allowed if model control is not enabled "
                                    "(start with --model-control-mode=explicit)")

    async def poll_once(self) -> None:
        """Poll mode: load new models, reload changed ones (a failed reload keeps the old), unload removed ones."""
        on_disk = set(self.names_on_disk())
        for name in sorted(on_disk):
            entry = self._models.get(name)
            if entry is not None and entry.fingerprint == fingerprint(self.root / name):
                continue
            try:
                await self.load(name)
            except ModelLoadError:
                if name in self._models:
                    self._models[name].fingerprint = fingerprint(self.root / name)
        for name in sorted(set(self._models) - on_disk):
            await self.unload(name)
            self._models.pop(name, None)

    async def poll_forever(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await self.poll_once()
            except Exception:  # a poll must never kill the server
                log.exception("repository poll failed")

    async def shutdown(self, drain: bool = True) -> None:
        """Stop every model; without drain, queued requests fail at once (the exit timeout is over)."""
        for name in list(self._models):
            entry = self._models[name]
            await self._retire(entry, keep=set(), drain=drain)
