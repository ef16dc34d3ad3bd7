"""`nnserve import`: put a model file into a model repository under the names the server looks for, with a
config.pbtxt inferred by the server's own auto-complete (server/config.py) and checked the way a load checks it.

The plan is made (and every check run) before anything is written, so a refused import leaves the repository as it
was; an existing model is replaced only when asked (`force`).
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from google.protobuf import text_format

import engine
from engine import Format, format_of
from server import config as cfg
from server.backend import BackendModel
from server.errors import ModelLoadError
from server.model_config import model_config_pb2 as mc

MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


class ModelImportError(Exception):
    """What stops an import; the message says what to change."""


@dataclass(frozen=True)
class ImportPlan:
    """What an import writes: the model's two files copied into `version_dir`, and `config` as config.pbtxt."""

    name: str
    sources: tuple[Path, Path]  # graph file, weights file
    targets: tuple[Path, Path]  # the same under the names FORMATS gives them in the version folder
    config_path: Path
    config: mc.ModelConfig
    notes: tuple[str, ...] = ()  # choices made for the user, printed beside the config

    @property
    def version_dir(self) -> Path:
        return self.targets[0].parent


def plan_import(graph_file: Path, repository: Path, name: str, *, version: int = 1, max_batch_size: int | None = None,
                max_shapes: Mapping[str, tuple[int, ...]] | None = None, default_max_batch_size: int) -> ImportPlan:
    """Reads the model, infers its config and checks that the server can load it at its max shapes."""
    fmt = _format(graph_file)
    weights = _weights_file(graph_file, fmt)
    _check_name(name, version)
    try:
        model = engine.load(graph_file)
    except engine.EngineError as exc:
        raise ModelImportError(str(exc)) from None
    config, notes = _infer_config(model, name, fmt, max_batch_size, dict(max_shapes or {}), default_max_batch_size)
    _check_plans(model, config, name, graph_file)
    model_dir = repository / name
    targets = tuple(model_dir / str(version) / f for f in fmt.files)
    return ImportPlan(name, (graph_file, weights), targets, model_dir / cfg.CONFIG_FILE, config, tuple(notes))


def _format(graph_file: Path) -> Format:
    fmt = format_of(graph_file)
    if fmt is None:
        known = ", ".join(f"MODEL{f.graph_suffix}" for f in engine.FORMATS.values())
        raise ModelImportError(f"{graph_file}: not a model graph file (expected {known}, weights beside it)")
    if not graph_file.is_file():
        raise ModelImportError(f"{graph_file}: no such file")
    return fmt


def _weights_file(graph_file: Path, fmt: Format) -> Path:
    weights = graph_file.with_name(graph_file.name.removesuffix(fmt.graph_suffix) + fmt.weights_suffix)
    if not weights.is_file():
        raise ModelImportError(f"{graph_file}: its weights file {weights} does not exist (a {fmt.name} model is "
                               f"the {fmt.graph_suffix} file and the {fmt.weights_suffix} file beside it)")
    return weights


def _check_name(name: str, version: int) -> None:
    if not MODEL_NAME.fullmatch(name):
        raise ModelImportError(f"--name {name!r}: a model name is a directory name of letters, digits, '_', '-' "
                               "and '.', not starting with '.', '_' or '-'")
    if version < 1:
        raise ModelImportError(f"--model-version {version}: version directories are numbered from 1")


def _infer_config(model: BackendModel, name: str, fmt: Format, max_batch_size: int | None,
                  max_shapes: dict[str, tuple[int, ...]], default_max_batch_size: int
                  ) -> tuple[mc.ModelConfig, list[str]]:
    """The server's auto-complete on an empty config; the import only picks the max_batch_size it starts from."""
    config, notes = mc.ModelConfig(), []
    if max_batch_size is None and _batch_fixed_to_one(model):  # the engine cannot run it at a larger batch
        max_batch_size = 1
        notes.append("the model fixes dim 0 to 1, so max_batch_size is 1 (a model with a dynamic dim 0 can take more)")
    if max_batch_size is not None:
        config.max_batch_size = max_batch_size
    cfg.auto_complete(config, name, fmt.name, model, has_max_batch=max_batch_size is not None,
                      default_max_batch_size=default_max_batch_size)
    inputs = {t.name: list(t.dims) for t in config.input}
    for input_name, shape in max_shapes.items():
        if input_name not in inputs:
            raise ModelImportError(f"--max-shape {input_name}=...: the model's inputs are {', '.join(inputs)}")
        config.parameters[cfg.MAX_SHAPE_PARAM + input_name].string_value = ",".join(str(d) for d in shape)
    try:
        cfg.validate(config, name, model)
    except ModelLoadError as exc:
        raise ModelImportError(_with_flags(str(exc), config)) from None
    return config, notes


def _batch_fixed_to_one(model: BackendModel) -> bool:
    specs = list(model.inputs) + list(model.outputs)
    return all(len(s.shape) > 0 and s.shape[0] in (-1, 1) for s in specs) and any(s.shape[0] == 1 for s in specs)


def _with_flags(message: str, config: mc.ModelConfig) -> str:
    """A load error in the words of this command's flags (the config parameter becomes --max-shape)."""
    batch = " (without the batch dim)" if config.max_batch_size > 0 else ""
    for t in config.input:
        key = cfg.MAX_SHAPE_PARAM + t.name
        if key not in message:
            continue
        if key in config.parameters:
            given = config.parameters[key].string_value.replace(",", "x")
            return (f"--max-shape {t.name}={given}: give one positive value per dim of {list(t.dims)}{batch}, "
                    "equal to the fixed ones")
        dims = "x".join("D" if d == -1 else str(d) for d in t.dims)
        return (f"input '{t.name}' has dynamic dims {list(t.dims)}: pass --max-shape {t.name}={dims} with the "
                f"largest value of each D{batch}, so the server can size the model's memory")
    return message


def _check_plans(model: BackendModel, config: mc.ModelConfig, name: str, graph_file: Path) -> None:
    """Plans one CPU instance at the config's max shapes, as a load does, so what would fail there fails here."""
    try:
        model.instance("cpu", cfg.engine_max_shapes(config, name))
    except engine.EngineError as exc:
        hint = ""
        if config.max_batch_size > 1:
            hint = (f"; with max_batch_size {config.max_batch_size} the model must take batches that large: pass "
                    "--max-batch-size 1 (or 0), or export the model with a dynamic batch dim")
        raise ModelImportError(f"{graph_file}: the server could not load it: {exc}{hint}") from None


# config.pbtxt as a person writes it: the fields an import sets, in this order, one line per tensor. Auto-complete fills
# the rest (platform, version_policy) as it did here, so the server ends with the config printed by the import.
CONFIG_FIELDS = ("name", "backend", "max_batch_size", "input", "output", "instance_group", "parameters")


def config_text(config: mc.ModelConfig) -> str:
    lines = []
    for field in CONFIG_FIELDS:
        value = getattr(config, field)
        if field == "parameters":
            lines += [_one_line(mc.ModelConfig(parameters={key: value[key]})) for key in sorted(value)]
        elif field in ("input", "output", "instance_group"):
            items = ",\n".join(f"  {{ {_one_line(item)} }}" for item in value)
            lines += [f"{field} [\n{items}\n]"] if items else []
        else:  # proto3 omits a zero max_batch_size, but an absent one means "auto-complete it": always write it
            lines.append(f"max_batch_size: {value}" if field == "max_batch_size"
                         else _one_line(mc.ModelConfig(**{field: value})))
    return "\n".join(lines) + "\n"


def _one_line(message: object) -> str:
    return text_format.MessageToString(message, as_one_line=True, use_short_repeated_primitives=True)


def existing_files(plan: ImportPlan) -> list[Path]:
    """What the import would replace: the config and any model file of any format in the version folder."""
    found = [plan.config_path] if plan.config_path.exists() else []
    for fmt in engine.FORMATS.values():
        found += [p for p in (plan.version_dir / f for f in fmt.files) if p.exists()]
    return found


def write_import(plan: ImportPlan, *, force: bool) -> list[Path]:
    """Copies the model's files and writes config.pbtxt; returns the paths written."""
    replaced = existing_files(plan)
    if replaced and not force:
        raise ModelImportError(f"model '{plan.name}' already has {', '.join(str(p) for p in replaced)}: pass "
                               "--force to replace them")
    try:
        for path in replaced:  # another format's files left beside the new ones would be loaded instead (TNN first)
            path.unlink()
        plan.version_dir.mkdir(parents=True, exist_ok=True)
        for source, target in zip(plan.sources, plan.targets, strict=True):
            shutil.copyfile(source, target)
        plan.config_path.write_text(config_text(plan.config))
    except OSError as exc:
        raise ModelImportError(f"cannot write {exc.filename or plan.version_dir}: {exc.strerror or exc}") from None
    return [*plan.targets, plan.config_path]
