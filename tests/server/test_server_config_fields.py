"""Every config.pbtxt field a Triton user writes either works or is refused with a message naming the field and
saying why: none is silently ignored, and no Triton field is a raw protobuf parse error (proto/model_config.proto
is Triton's whole ModelConfig). default_model_filename works as in Triton: it names the model file in each version
directory."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx
import numpy as np
import pytest
from serverproc import AFFINE_CONFIG, FIXTURES, ServerProcess, affine_reference, make_repository

from server import config as cfg
from server.config_fields import HONOURED, check_supported
from server.errors import ModelLoadError
from server.model_config import model_config_pb2 as mc

BASE = 'name: "m"\n'

# (config.pbtxt text as Triton users write it, words the refusal must contain)
REFUSED = [
    ('backend: "onnxruntime"', 'backend "onnxruntime" is not a backend nnserve has; it has "tnn", "pnnx"'),
    ('platform: "onnxruntime_onnx"', 'platform "onnxruntime_onnx" is not a backend nnserve has'),
    ('platform: "tensorrt_plan"', 'platform "tensorrt_plan"'),
    ('backend: "pnnx" platform: "tnn"', 'backend "pnnx" and platform "tnn" disagree'),
    ('runtime: "model.py"', "runtime: not supported"),
    ("sequence_batching { iterative_sequence: true }", "sequence_batching.iterative_sequence: iterative sequences"),
    ("sequence_batching { state [ { input_name: \"s\" output_name: \"t\" use_growable_memory: true } ] }",
     "sequence_batching.state[0].use_growable_memory: not supported"),
    ("sequence_batching { oldest { preserve_ordering: true } }", "sequence_batching.oldest.preserve_ordering: not "
                                                                 "implemented"),
    ('ensemble_scheduling { step [ { model_name: "a" model_version: -1 input_map { key: "x" value: "y" } } ] }',
     'ensemble_scheduling cannot be set for a model whose platform is not "ensemble"'),
    ('platform: "ensemble"', 'platform "ensemble" needs ensemble_scheduling'),
    ('platform: "ensemble" ensemble_scheduling { step [ { model_name: "a" } ] } instance_group [ { count: 2 } ]',
     "instance_group should not be specified for ensemble 'm'"),
    ('platform: "ensemble" ensemble_scheduling { step [ { model_name: "a" model_namespace: "ns" } ] }',
     "ensemble_scheduling.step[0].model_namespace: model namespaces are not supported"),
    ('backend: "tnn" model_transaction_policy { decoupled: true }',
     "model_transaction_policy.decoupled: decoupled models (several responses per request) need the Python backend"),
    ('backend: "python" parameters { key: "EXECUTION_ENV_PATH" value { string_value: "env.tar.gz" } }',
     "parameters['EXECUTION_ENV_PATH']: custom execution environments are not supported"),
    ("optimization { execution_accelerators { cpu_execution_accelerator [ { name: \"openvino\" } ] } }",
     "optimization.execution_accelerators.cpu_execution_accelerator: not supported: the engine plans"),
    ("optimization { cuda { graphs: true } }", "optimization.cuda.graphs: not supported: the engine plans"),
    ("optimization { priority: PRIORITY_MAX }", "optimization.priority: not supported: the engine plans"),
    ("optimization { eager_batching: true }", "optimization.eager_batching"),
    ("optimization { graph { level: 1 } }", "optimization.graph.level"),
    ("model_transaction_policy { decoupled: true }", "model_transaction_policy.decoupled: decoupled models"),
    ('batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "n" data_type: TYPE_FP32 source_input: "x" } ]',
     "batch_input: ragged batching"),
    ('input [ { name: "in0" data_type: TYPE_FP32 dims: [ 4 ] optional: true } ]', "input[0].optional: optional"),
    ('input [ { name: "in0" data_type: TYPE_FP32 dims: [ 4 ] allow_ragged_batch: true } ]',
     "input[0].allow_ragged_batch: ragged batching"),
    ('input [ { name: "in0" data_type: TYPE_FP32 dims: [ 4 ] is_shape_tensor: true } ]',
     "input[0].is_shape_tensor: not supported: shape tensors are a TensorRT feature"),
    ("instance_group [ { count: 1 kind: KIND_CPU rate_limiter { resources [ { name: \"r\" count: 1 } ] } } ]",
     "instance_group[0].rate_limiter.resources: the rate limiter is not implemented"),
    ("instance_group [ { count: 1 kind: KIND_CPU passive: true } ]", "instance_group[0].passive"),
    ('instance_group [ { count: 1 kind: KIND_GPU profile: [ "0" ] } ]', "instance_group[0].profile: not supported"),
    ("dynamic_batching { priority_levels: 2 priority_queue_policy { key: 1 value { max_queue_size: 4 } } }",
     "dynamic_batching.priority_queue_policy: per-priority queue policies are not implemented"),
    ('cc_model_filenames { key: "7.5" value: "model_sm75.plan" }', "cc_model_filenames: not supported"),
    ('metric_tags { key: "team" value: "vision" }', "metric_tags: per-model metric tags are not implemented"),
    ('model_operations { op_library_filename: [ "libcustom.so" ] }', "model_operations.op_library_filename: custom "
                                                                     "operation libraries"),
    ('model_repository_agents { agents [ { name: "checksum" } ] }', "model_repository_agents.agents: repository "
                                                                    "agents"),
    ('model_metrics { metric_control [ { metric_identifier { family: "f" } } ] }', "model_metrics.metric_control"),
    ('parameters { key: "EXECUTION_ENV_PATH" value { string_value: "$$TRITON_MODEL_DIRECTORY/env.tar.gz" } }',
     "parameters['EXECUTION_ENV_PATH'] is not a parameter nnserve reads"),
]

# Fields that are set but mean nothing beyond their default, and the honoured ones: accepted.
ACCEPTED = [
    "response_cache { enable: false }",
    "response_cache { enable: true }",  # with the server's --cache-config (tests/server/test_server_response_cache.py)
    'output [ { name: "out0" data_type: TYPE_FP32 dims: [ 3 ] label_filename: "labels.txt" } ]',  # classification
    "model_transaction_policy { decoupled: false }",
    "optimization { }",
    # Triton's own config answer holds these (its defaults): a config saved from a Triton server loads
    "optimization { input_pinned_memory { enable: true } output_pinned_memory { enable: true } }",
    'instance_group [ { name: "cpu_pool" count: 2 kind: KIND_CPU } ]',
    "version_policy { all { } }",
    'parameters { key: "max_shape:in0" value { string_value: "4" } }',
    'backend: "pnnx" platform: "pnnx"',
    'backend: "python" model_transaction_policy { decoupled: true } parameters { key: "k" value { string_value: "" } }',
    'platform: "ensemble" ensemble_scheduling { step [ { model_name: "a" input_map { key: "x" value: "y" } } ] }',
    "sequence_batching { }",
    "sequence_batching { max_sequence_idle_microseconds: 5000000 oldest { max_candidate_sequences: 4 } }",
    'sequence_batching { control_input [ { name: "S" control [ { kind: CONTROL_SEQUENCE_START '
    "int32_false_true: [ 0, 1 ] } ] } ] direct { max_queue_delay_microseconds: 10 } }",
]


@pytest.mark.parametrize("text, words", REFUSED)
def test_each_unimplemented_field_is_refused_with_its_reason(text, words):
    config = cfg.parse_config_text(BASE + text)  # parses: the schema is Triton's whole ModelConfig
    with pytest.raises(ModelLoadError) as info:
        check_supported(config, "m")
    assert info.value.message.startswith("model 'm': ") and words in info.value.message, info.value.message


@pytest.mark.parametrize("text", ACCEPTED)
def test_honoured_and_default_valued_fields_are_accepted(text):
    check_supported(cfg.parse_config_text(BASE + text), "m")


def test_every_field_is_honoured_or_refused():
    """Walk Triton's whole schema from ModelConfig: every field that nnserve does not honour, set alone to a
    non-default value (inside the honoured messages that hold it), is refused with a message naming it."""
    checked = []
    for path, make in _unhonoured(mc.ModelConfig.DESCRIPTOR, lambda: (mc.ModelConfig(name="m"),) * 2):
        config, holder = make()
        field = holder.DESCRIPTOR.fields_by_name[path.rsplit(".", 1)[-1]]
        _set_non_default(holder, field)
        with pytest.raises(ModelLoadError) as info:
            check_supported(config, "m")
        assert field.name in info.value.message, (path, info.value.message)
        checked.append(path)
    assert "ModelSequenceBatching.iterative_sequence" in checked and "ModelInput.optional" in checked
    assert len(checked) >= 24, checked  # the fields nnserve refuses, listed with their reasons


def _unhonoured(desc, make):  # noqa: ANN001, ANN202 - descriptor, () -> (config, message of that descriptor)
    """(path, make) of every unhonoured field reachable through honoured message fields; make() builds a config
    with the messages leading to it and returns (config, the message to set the field in)."""
    name = desc.full_name.removeprefix("inference.")
    honoured = HONOURED.get(name, frozenset())
    for field in desc.fields:
        if field.name not in honoured:
            yield f"{name}.{field.name}", make
        elif field.message_type is not None and not _scalar_map(field):  # a map of strings holds no fields
            yield from _unhonoured(_value_type(field), _child_maker(make, field))


def _scalar_map(field) -> bool:  # noqa: ANN001
    entry = field.message_type
    return entry.GetOptions().map_entry and entry.fields_by_name["value"].message_type is None


def _value_type(field):  # noqa: ANN001, ANN202
    entry = field.message_type
    return entry.fields_by_name["value"].message_type or entry if entry.GetOptions().map_entry else entry


def _child_maker(make, field):  # noqa: ANN001, ANN202
    def child():  # noqa: ANN202
        config, parent = make()
        value = getattr(parent, field.name)
        if field.message_type.GetOptions().map_entry:
            key = field.message_type.fields_by_name["key"]
            return config, value[("k" if key.type == key.TYPE_STRING else 1)]
        if field.is_repeated:
            return config, value.add()
        value.SetInParent()
        return config, value
    return child


def _set_non_default(message, field) -> None:  # noqa: ANN001
    if field.message_type is not None:
        entry = field.message_type
        if entry.GetOptions().map_entry:
            key, value = entry.fields_by_name["key"], entry.fields_by_name["value"]
            container = getattr(message, field.name)
            k = "k" if key.type == key.TYPE_STRING else 1
            if value.message_type is not None:
                _fill(container[k])
            else:
                container[k] = _scalar(value)
            return
        sub = getattr(message, field.name).add() if field.is_repeated else getattr(message, field.name)
        sub.SetInParent()
        _fill(sub)
    elif field.is_repeated:
        getattr(message, field.name).append(_scalar(field))
    else:
        setattr(message, field.name, _scalar(field))


def _fill(message) -> None:  # noqa: ANN001 - sets its first field, so the message holds something
    if message.DESCRIPTOR.fields:
        _set_non_default(message, message.DESCRIPTOR.fields[0])


def _scalar(field):  # noqa: ANN001, ANN202
    if field.enum_type is not None:
        return field.enum_type.values[-1].number
    return {field.TYPE_BOOL: True, field.TYPE_STRING: "x", field.TYPE_BYTES: b"x", field.TYPE_FLOAT: 1.5,
            field.TYPE_DOUBLE: 1.5}.get(field.type, 1)


def test_unknown_fields_in_the_load_api_json_are_refused():
    with pytest.raises(ModelLoadError, match="no_such_field"):
        cfg.parse_config_json(json.dumps({"name": "m", "no_such_field": 1}))


def test_a_misspelt_field_in_config_pbtxt_names_file_and_line():
    with pytest.raises(ModelLoadError, match=r"m/config.pbtxt:2:1: .*max_batch_sizes"):
        cfg.parse_config_text('name: "m"\nmax_batch_sizes: 4\n', "m/config.pbtxt")


# ---- default_model_filename ------------------------------------------------------------------------------------
def named_version(tmp_path: Path, stem: str) -> Path:
    version = tmp_path / "m" / "1"
    version.mkdir(parents=True)
    for f in (FIXTURES / "affine" / "1").iterdir():
        shutil.copy(f, version / f.name.replace("model", stem, 1))
    return version


def test_default_model_filename_names_the_graph_file(tmp_path):
    version = named_version(tmp_path, "affine_v7")
    config = cfg.parse_config_text('default_model_filename: "affine_v7.pnnx.param"')
    assert cfg.model_files(version, config, "m") == ("pnnx", version / "affine_v7.pnnx.param",
                                                     version / "affine_v7.pnnx.bin")
    with pytest.raises(ModelLoadError, match=r"1/ has no model.tnnproto\+model.tnnmodel or "
                                             r"model.pnnx.param\+model.pnnx.bin"):
        cfg.model_files(version, mc.ModelConfig(), "m")  # without it, the default names are looked for


@pytest.mark.parametrize("text, words", [
    ('default_model_filename: "model.onnx"', "must end in one of .tnnproto, .pnnx.param"),
    ('default_model_filename: "../other/model.pnnx.param"', "must be a file name in the version directory"),
    ('default_model_filename: "affine_v7.pnnx.param" backend: "tnn"', "is a pnnx model, but the backend is "
                                                                      '"tnn"'),
    ('default_model_filename: "missing.pnnx.param"', "1/ has no missing.pnnx.param+missing.pnnx.bin"),
])
def test_default_model_filename_errors(tmp_path, text, words):
    version = named_version(tmp_path, "affine_v7")
    with pytest.raises(ModelLoadError) as info:
        cfg.model_files(version, cfg.parse_config_text(text), "m")
    assert words in info.value.message, info.value.message


def test_backend_looks_for_its_own_files_only(tmp_path):
    version = named_version(tmp_path, "model")
    with pytest.raises(ModelLoadError, match=r"1/ has no model.tnnproto\+model.tnnmodel$"):
        cfg.model_files(version, cfg.parse_config_text('backend: "tnn"'), "m")


# ---- on a real server ------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_triton_configs_on_a_running_server(tmp_path):
    """Refused fields fail their model's load with the reason (400) while the others serve; default_model_filename
    serves the named files; an unknown field in the load API's JSON is a 400 naming it."""
    configs = {"affine": AFFINE_CONFIG,
               "onnx": AFFINE_CONFIG.replace('backend: "pnnx"', 'backend: "onnxruntime"'),
               "cached": AFFINE_CONFIG + "response_cache { enable: true }\n",
               "stateful": AFFINE_CONFIG.replace("dynamic_batching { max_queue_delay_microseconds: 20000 }",
                                                 "sequence_batching { iterative_sequence: true }"),
               "tuned": AFFINE_CONFIG + "optimization { graph { level: 1 } }\n",
               "named": AFFINE_CONFIG + 'default_model_filename: "affine_v7.pnnx.param"\n'}
    repo = make_repository(tmp_path / "repo", configs)
    for f in (repo / "named" / "1").iterdir():
        f.rename(f.with_name(f.name.replace("model", "affine_v7", 1)))
    srv = ServerProcess(repo, "--model-control-mode", "explicit", "--load-model", "affine")
    url = f"http://{srv.http_url}"
    try:
        for model, words in (("onnx", 'backend "onnxruntime" is not a backend nnserve has'),
                             ("stateful", "sequence_batching.iterative_sequence: iterative sequences"),
                             ("tuned", "optimization.graph.level")):
            r = httpx.post(f"{url}/v2/repository/models/{model}/load", timeout=60)
            assert r.status_code == 400 and words in r.json()["error"], r.text
            assert f"model '{model}'" in r.json()["error"]
        index = {row["name"]: row for row in httpx.post(f"{url}/v2/repository/index", json={}).json()}
        assert index["onnx"]["state"] == "UNAVAILABLE" and "onnxruntime" in index["onnx"]["reason"]
        for model in ("named", "cached"):  # response_cache without the server's cache: every request runs
            assert httpx.post(f"{url}/v2/repository/models/{model}/load", timeout=60).status_code == 200
        x = np.array([[0.5, -1.0, 2.0, 1.5]], np.float32)
        body = {"inputs": [{"name": "in0", "shape": [1, 4], "datatype": "FP32", "data": x.ravel().tolist()}]}
        for model in ("affine", "named", "cached"):
            r = httpx.post(f"{url}/v2/models/{model}/infer", json=body, timeout=60)
            assert r.status_code == 200, r.text
            out = {o["name"]: np.array(o["data"]).reshape(o["shape"]) for o in r.json()["outputs"]}
            np.testing.assert_allclose(out["out0"], affine_reference(x)["out0"], rtol=1e-5, atol=1e-6)
        r = httpx.post(f"{url}/v2/repository/models/affine/load", timeout=60,
                       json={"parameters": {"config": json.dumps({"name": "affine", "max_batch_sizes": 2})}})
        assert r.status_code == 400 and "max_batch_sizes" in r.json()["error"], r.text
        assert httpx.get(f"{url}/v2/models/affine/ready").status_code == 200  # the served version is untouched
    finally:
        assert srv.stop() == 0, srv.log_text
