"""config.pbtxt parsing, auto-complete and validation, against model specs written out by hand."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from server import config as cfg
from server.errors import ModelLoadError
from server.model_config import model_config_pb2 as mc
from server.model_version import scheduler_config


@dataclass
class Spec:
    name: str
    shape: tuple[int, ...]
    datatype: str = "FP32"

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(np.float32)


@dataclass
class FakeModel:
    """Just the two attributes config code reads from an engine Model."""

    inputs: list[Spec]
    outputs: list[Spec]


DETECTOR = FakeModel([Spec("input", (1, 3, 240, 320))], [Spec("scores", (1, 4420, 2)), Spec("boxes", (1, 4420, 4))])
# the same detector exported with a dynamic batch dim
BATCHED_DETECTOR = FakeModel([Spec("input", (-1, 3, 240, 320))],
                             [Spec("scores", (-1, 4420, 2)), Spec("boxes", (-1, 4420, 4))])
DYNAMIC = FakeModel([Spec("in0", (-1, 3, -1, -1))], [Spec("out0", (-1, 10))])


@pytest.fixture(autouse=True)
def gpus(monkeypatch: pytest.MonkeyPatch):
    """The CUDA device count auto-complete and validation see: none, unless a test sets another."""
    count = {"n": 0}
    monkeypatch.setattr(cfg, "cuda_device_count", lambda: count["n"])
    return count


def complete(text: str, model: FakeModel, name: str = "m"):
    config = cfg.parse_config_text(text)
    has_mbs = "max_batch_size" in text
    cfg.auto_complete(config, name, "tnn", model, has_max_batch=has_mbs, default_max_batch_size=4)
    cfg.validate(config, name, model)
    return config


def test_empty_config_is_completed_from_the_model():
    config = complete("", BATCHED_DETECTOR)
    assert config.name == "m" and config.backend == "tnn" and config.max_batch_size == 4
    assert [(t.name, list(t.dims)) for t in config.input] == [("input", [3, 240, 320])]
    assert [t.name for t in config.output] == ["scores", "boxes"]
    assert config.version_policy.latest.num_versions == 1 and config.instance_group[0].count == 1
    assert cfg.max_shapes(config, "m") == {"input": [4, 3, 240, 320]}


@pytest.mark.parametrize("model", [
    DETECTOR,  # dim 0 fixed to 1 everywhere (a traced export)
    FakeModel([Spec("input", (1, 3, 240, 320))], [Spec("scores", (-1, 4420, 2))]),  # an input fixes it
    FakeModel([Spec("in0", (2, 4))], [Spec("out0", (2, 3))]),
    FakeModel([Spec("in0", (1, 4)), Spec("in1", ())], [Spec("out0", (-1, 3))]),  # a scalar input
])
def test_a_fixed_first_dim_gives_max_batch_size_0(model):
    """Triton's rule: only a model whose every input and output has a variable dim 0 batches; the others run the
    model's own shapes, dims being the full shape."""
    config = complete("", model)
    assert config.max_batch_size == 0
    assert [list(t.dims) for t in config.input] == [list(s.shape) for s in model.inputs]


def test_explicit_zero_batch_keeps_full_shapes():
    config = complete("max_batch_size: 0", DETECTOR)
    assert config.max_batch_size == 0 and list(config.input[0].dims) == [1, 3, 240, 320]


def test_dynamic_dims_need_a_max_shape_parameter():
    with pytest.raises(ModelLoadError, match='max_shape:in0'):
        complete("max_batch_size: 2", DYNAMIC)
    config = complete('max_batch_size: 2 parameters { key: "max_shape:in0" value { string_value: "3,64,48" } }',
                      DYNAMIC)
    assert cfg.max_shapes(config, "m") == {"in0": [2, 3, 64, 48]}
    with pytest.raises(ModelLoadError, match="one positive value per dim"):
        complete('max_batch_size: 2 parameters { key: "max_shape:in0" value { string_value: "4,64,48" } }', DYNAMIC)


def test_dynamic_batching_wait_parameter():
    """Triton's full wait by default; "adaptive" reaches the scheduler's config; anything else names the key."""
    base = "max_batch_size: 4 dynamic_batching { max_queue_delay_microseconds: 2000 }"
    assert scheduler_config(complete(base, DETECTOR)).wait_policy == "full"
    adaptive = base + ' parameters { key: "dynamic_batching_wait" value { string_value: "adaptive" } }'
    assert scheduler_config(complete(adaptive, DETECTOR)).wait_policy == "adaptive"
    with pytest.raises(ModelLoadError, match=r"parameters\['dynamic_batching_wait'\] = 'eager' must be one of"):
        complete(adaptive.replace('"adaptive"', '"eager"'), DETECTOR)


@pytest.mark.parametrize("text, words", [
    ('name: "other"', "must match the directory name"),
    ('max_batch_size: 1 input [ { name: "input" data_type: TYPE_FP16 dims: [3, 240, 320] } ]',
     "input[0].data_type TYPE_FP16"),
    ('max_batch_size: 1 input [ { name: "input" data_type: TYPE_FP32 dims: [3, 240, 321] } ]', "input[0].dims"),
    ('max_batch_size: 1 input [ { name: "image" data_type: TYPE_FP32 dims: [3, 240, 320] } ]',
     "input[0].name 'image'"),
    ('max_batch_size: 1 output [ { name: "boxes" data_type: TYPE_FP32 dims: [4420, 5] } ]', "output[0].dims"),
    ("instance_group [ { kind: KIND_GPU count: 1 } ]", "places instances on cuda:0, but this machine has no CUDA "
                                                       "device"),
    ("max_batch_size: 0 dynamic_batching { }", "dynamic_batching needs max_batch_size"),
    ("max_batch_size: 4 dynamic_batching { preferred_batch_size: [ 8 ] }", "preferred_batch_size 8"),
])
def test_contradictions_name_the_field(text, words):
    with pytest.raises(ModelLoadError, match=words.replace("[", r"\[").replace("(", r"\(")):
        complete(text, DETECTOR)


def test_syntax_error_names_file_and_line():
    with pytest.raises(ModelLoadError, match=r"models/m/config.pbtxt:2:"):
        cfg.parse_config_text('name: "m"\nmax_batch_size: "x"\n', "models/m/config.pbtxt")


def test_json_round_trip_prints_int64_as_numbers():
    config = complete("max_batch_size: 2 dynamic_batching { max_queue_delay_microseconds: 100 }", DETECTOR)
    doc = cfg.config_to_dict(config)
    assert doc["input"][0]["dims"] == [3, 240, 320]
    assert doc["dynamic_batching"]["max_queue_delay_microseconds"] == 100
    assert cfg.parse_config_json(cfg.config_to_json(config)) == config


def test_instance_count_sums_groups():
    config = complete("instance_group [ { count: 2 }, { count: 3 kind: KIND_CPU } ]", DETECTOR)
    assert cfg.instance_count(config) == 5


def test_kind_auto_is_gpu_when_there_are_devices(gpus):
    config = complete("instance_group [ { count: 2 } ]", DETECTOR)
    assert config.instance_group[0].kind == mc.ModelInstanceGroup.KIND_CPU
    gpus["n"] = 2
    config = complete("instance_group [ { count: 2 }, { count: 1 kind: KIND_CPU } ]", DETECTOR)
    group = config.instance_group[0]
    assert group.kind == mc.ModelInstanceGroup.KIND_GPU and list(group.gpus) == [0, 1]  # default: every device
    assert cfg.instance_devices(config) == ["cuda:0", "cuda:0", "cuda:1", "cuda:1", "cpu"]
    assert cfg.instance_count(config) == 5


def test_kind_gpu_places_count_instances_on_each_listed_gpu(gpus):
    gpus["n"] = 2
    config = complete("instance_group [ { count: 3 kind: KIND_GPU gpus: [ 1 ] } ]", DETECTOR)
    assert cfg.instance_devices(config) == ["cuda:1"] * 3
    with pytest.raises(ModelLoadError, match=r"model 'm': instance_group\[0\] \(KIND_GPU\) places instances on "
                                             r"cuda:2, but the devices here are cuda:0..cuda:1"):
        complete("instance_group [ { count: 1 kind: KIND_GPU gpus: [ 0, 2 ] } ]", DETECTOR)


def test_no_instance_group_is_one_cpu_instance_even_with_gpus(gpus):
    gpus["n"] = 1
    assert cfg.instance_devices(complete("", DETECTOR)) == ["cpu"]


RESHAPE = ('max_batch_size: 2 input [ { name: "in0" data_type: TYPE_FP32 dims: [ 3, -1, 8, 8 ] '
           'reshape { shape: [ 3, -1, 64 ] } } ] '
           'parameters { key: "max_shape:in0" value { string_value: "3,5,8,8" } } '
           'output [ { name: "out0" data_type: TYPE_FP32 dims: [ 2, 5 ] reshape { shape: [ 10 ] } } ]')
FLAT = FakeModel([Spec("in0", (-1, 3, -1, 64))], [Spec("out0", (-1, 10))])


def test_reshape_maps_api_shapes_to_the_models():
    config = complete(RESHAPE, FLAT)
    ins, outs = cfg.tensor_configs(config)
    assert ins[0].dims == [3, -1, 8, 8] and ins[0].reshape == [3, -1, 64] and outs[0].reshape == [10]
    assert cfg.max_shapes(config, "m") == {"in0": [2, 3, 5, 8, 8]}  # what requests are checked against
    assert cfg.engine_max_shapes(config, "m") == {"in0": (2, 3, 5, 64)}  # what the arena is planned for
    x = np.arange(2 * 3 * 4 * 64, dtype=np.float32).reshape(2, 3, 4, 8, 8)
    np.testing.assert_array_equal(ins[0].to_model(x, batching=True), x.reshape(2, 3, 4, 64))
    y = np.arange(20, dtype=np.float32).reshape(2, 10)
    np.testing.assert_array_equal(outs[0].to_api(y, batching=True), y.reshape(2, 2, 5))
    assert cfg.map_shape([7, 4], [-1, 4], [2, -1, 2]) == [2, 7, 2]


@pytest.mark.parametrize("text, words", [
    (RESHAPE.replace("shape: [ 3, -1, 64 ]", "shape: [ 3, -1, 65 ]"), "input[0].reshape.shape [3, -1, 65]"),
    (RESHAPE.replace("dims: [ 3, -1, 8, 8 ]", "dims: [ 3, -1, 8, 7 ]").replace("3,5,8,8", "3,5,8,7"),
     "must hold the same number of elements"),
    (RESHAPE.replace("dims: [ 2, 5 ]", "dims: [ -1, 5 ]"), "output[0].dims [-1, 5] and output[0].reshape.shape"),
])
def test_reshape_contradictions_name_the_field(text, words):
    with pytest.raises(ModelLoadError, match=words.replace("[", r"\[")):
        complete(text, FLAT)
