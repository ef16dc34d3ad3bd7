"""Auto-complete derives batching from the model, as Triton does (every input and output with a variable dim 0:
max_batch_size from --backend-config, default 4; a dim 0 fixed, to 1 or anything else: 0), for both formats, and
never produces a config that its own loader rejects: every committed fixture model, with no config.pbtxt, loads. The
one thing a model file cannot say is the largest value of a variable non-batch dim (the arena is planned for it);
there the load error names the parameter to add, and with it the model loads."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from realworld_known import KNOWN, PNNX_BROKEN

import engine
from server import config as cfg
from server.errors import ModelLoadError
from server.repository import ModelRepository
from tests.engine.formats.pnnx.test_pnnx_data_dependent_followers import REFUSED as DATA_DEPENDENT_REFUSED

ROOT = Path(__file__).resolve().parents[2]
GRAPH_SUFFIXES = tuple(f.graph_suffix for f in engine.FORMATS.values())


def fixture_models() -> list[Path]:
    """The graph file of every committed model: tests/fixtures, the bundled repository, the server's fixtures."""
    found = []
    for base in (ROOT / "tests" / "fixtures", ROOT / "model_repository", ROOT / "tests" / "server" / "fixtures"):
        found += [p for p in sorted(base.rglob("*")) if p.name.endswith(GRAPH_SUFFIXES)]
    return found


def fixture_id(path: Path) -> str:
    return str(path.parent.relative_to(ROOT))


# Committed real-world models the engine refuses, whatever the config (tests/realworld_known.py: static exports whose
# index tensors pnnx lost, and one that pnnx exports wrongly). Strict xfails: one that starts loading fails here
# until it is taken off that list.
# Likewise the exports of ops after a mask that cannot follow the kept count (test_pnnx_data_dependent_followers).
REFUSED = {f"tests/fixtures/realworld/{n}" for n in (*KNOWN, *PNNX_BROKEN)} | {
    f"tests/fixtures/pnnx_dd/{n}" for n in DATA_DEPENDENT_REFUSED}


def fixture_params() -> list:
    refused = pytest.mark.xfail(strict=True, raises=(engine.EngineError, ModelLoadError),
                                reason="the engine refuses this model at load")
    return [pytest.param(p, id=fixture_id(p), marks=[refused] if fixture_id(p) in REFUSED else [])
            for p in fixture_models()]


def copy_as_model(graph: Path, repo: Path, name: str) -> Path:
    """`graph` and its weights as <repo>/<name>/1/model.*, with no config.pbtxt."""
    fmt = next(f for f in engine.FORMATS.values() if graph.name.endswith(f.graph_suffix))
    version = repo / name / "1"
    version.mkdir(parents=True)
    weights = graph.with_name(graph.name[: -len(fmt.graph_suffix)] + fmt.weights_suffix)
    (version / fmt.files[0]).write_bytes(graph.read_bytes())
    (version / fmt.files[1]).write_bytes(weights.read_bytes())
    return repo / name


def largest_inputs(folder: Path, names: list[str]) -> dict[str, list[int]]:
    """The largest shape each input takes in the fixture's own cases (meta.json's max_shapes, else its .npz files)."""
    meta = folder / "meta.json"
    if meta.exists() and json.loads(meta.read_text()).get("max_shapes"):
        return {k: list(v) for k, v in json.loads(meta.read_text())["max_shapes"].items()}
    shapes: dict[str, list[int]] = {}
    for npz in sorted(folder.glob("*.npz")):
        with np.load(npz) as z:
            for name in set(z.files) & set(names):
                old = shapes.get(name, [0] * z[name].ndim)
                shapes[name] = [max(a, b) for a, b in zip(old, z[name].shape, strict=True)]
    return shapes


def build(repo: Path, name: str) -> None:
    ModelRepository(repo)._build(name, repo / name, None)


@pytest.mark.parametrize("graph", fixture_params())
def test_every_fixture_model_loads_without_a_config(tmp_path, graph):
    model_dir = copy_as_model(graph, tmp_path, "m")
    model = engine.load(graph)
    dynamic = any(-1 in s.shape[1 if cfg.batchable(model) else 0:] for s in model.inputs)
    if not dynamic:
        build(tmp_path, "m")
        return
    # A variable non-batch dim: the load error says which parameter bounds it; given it, the model loads.
    with pytest.raises(ModelLoadError, match='add parameters { key: "max_shape:'.replace("{", r"\{")):
        build(tmp_path, "m")
    skip = 1 if cfg.batchable(model) else 0
    largest = largest_inputs(graph.parent, [s.name for s in model.inputs])
    params = "".join(f'parameters {{ key: "max_shape:{name}" value {{ string_value: '
                     f'"{",".join(map(str, shape[skip:]))}" }} }}\n' for name, shape in largest.items())
    (model_dir / "config.pbtxt").write_text(params)
    build(tmp_path, "m")


def test_the_bundled_face_detectors_batch_as_triton_says(tmp_path):
    """Their files fix dim 0 to 1: max_batch_size 0 and the full shape as dims, and they load."""
    for name in ("ultraface_tnn", "ultraface_pnnx"):
        graph = next(p for p in (ROOT / "model_repository" / name / "1").iterdir() if p.name.endswith(GRAPH_SUFFIXES))
        copy_as_model(graph, tmp_path, name)
        repo = ModelRepository(tmp_path)
        entry = repo._build(name, tmp_path / name, None)
        assert entry.config.max_batch_size == 0
        assert [list(t.dims) for t in entry.config.input] == [[1, 3, 240, 320]]


@dataclass
class Spec:
    name: str
    shape: tuple[int, ...]
    datatype: str = "FP32"


@dataclass
class FakeModel:
    inputs: list[Spec]
    outputs: list[Spec]


def specs(prefix: str) -> st.SearchStrategy[list[Spec]]:
    """Tensors whose dim 0 is variable, 1 or fixed, and whose other dims are fixed."""
    dim0 = st.sampled_from([-1, 1, 2, 7])
    rest = st.lists(st.integers(1, 9), max_size=3)
    return st.lists(st.tuples(dim0, rest), min_size=1, max_size=3).map(
        lambda ts: [Spec(f"{prefix}{i}", (d0, *r)) for i, (d0, r) in enumerate(ts)])


@settings(max_examples=200, deadline=None)
@given(inputs=specs("in"), outputs=specs("out"), default=st.integers(0, 16))
def test_auto_complete_gives_configs_its_validation_accepts(inputs, outputs, default):
    model = FakeModel(inputs, outputs)
    config = cfg.auto_complete(cfg.parse_config_text(""), "m", "pnnx", model, has_max_batch=False,
                               default_max_batch_size=default)
    variable = all(s.shape[0] == -1 for s in inputs + outputs)
    assert config.max_batch_size == (default if variable else 0)
    if any(-1 in t.dims for t in config.input):  # a variable dim that is not the batch: no file bounds it
        with pytest.raises(ModelLoadError, match="max_shape:"):
            cfg.validate(config, "m", model)
        return
    cfg.validate(config, "m", model)
    shapes = cfg.max_shapes(config, "m")
    for s in inputs:
        assert shapes[s.name] == ([default] + list(s.shape[1:]) if variable else list(s.shape))
