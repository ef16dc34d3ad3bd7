"""config.pbtxt fuzzed: valid configs mutated at random (slices cut, duplicated or replaced, tokens of the schema and
of hostile text inserted, bytes flipped, so not UTF-8 either) load, or fail with a ModelLoadError; never another
exception, which would be a crash of the load. One that does not parse names the file (and line); one that parses
and is refused names the model. A bounded run in `make test` (hypothesis' examples below); a real server then loads
a fixed set of such configs and serves on."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import httpx
import pytest
from google.protobuf import text_format
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from serverproc import AFFINE_CONFIG, FIXTURES, ServerProcess

from server.errors import ModelLoadError
from server.model_config import model_config_pb2 as mc
from server.repository import ModelRepository

ROOT = Path(__file__).resolve().parents[2]
SEEDS = [AFFINE_CONFIG.replace('"affine"', '"m"'),
         (ROOT / "model_repository" / "ultraface_pnnx" / "config.pbtxt").read_text().replace('"ultraface_pnnx"', '"m"'),
         'max_batch_size: 2\nversion_policy { specific { versions: [ 1 ] } }\ninstance_group [ { count: 1 } ]\n'
         'parameters { key: "dynamic_batching_wait" value { string_value: "adaptive" } }\n'
         'dynamic_batching { preferred_batch_size: [ 2 ] default_queue_policy { max_queue_size: 3 } }\n'
         'model_warmup [ { name: "w" batch_size: 1 inputs { key: "in0" value { data_type: TYPE_FP32 dims: [ 4 ] '
         "random_data: true } } } ]\n"]
FIELDS = sorted({f.name for d in mc.DESCRIPTOR.message_types_by_name.values() for f in d.fields})
# Numbers stay small where they size memory or repeat work (max_batch_size, warm-up counts): the fuzz is for the
# parser and the checks, not for how long a config may legitimately make a load take.
TOKENS = [*FIELDS, "{", "}", "[", "]", ":", ",", ";", "<", ">", '"', "'", "\\", "#", "\n", " ", "0", "1", "-1",
          "4", "64", "1.5", "nan", "-inf", "0x10", "99999999999999999999999", "true", "false", "KIND_GPU",
          "KIND_MODEL", "TYPE_STRING", "TYPE_FP16", "FORMAT_NHWC", '"in0"', '"m"', '"x\\xff"', '"\\u00e9"',
          "{" * 200, "[" * 200, "\x00", "\ufeff", "é", "💥", "\r\n"]
OPS = ("cut", "insert", "replace", "duplicate", "flip")


def mutate(text: str, ops: list[tuple[str, float, int, int]]) -> bytes:
    """Apply (operation, position as a fraction, length, token index) edits; "flip" works on the UTF-8 bytes."""
    data = text.encode()
    for op, where, length, token in ops:
        at = int(where * len(data))
        piece = TOKENS[token % len(TOKENS)].encode()
        if op == "cut":
            data = data[:at] + data[at + length:]
        elif op == "insert":
            data = data[:at] + piece + data[at:]
        elif op == "replace":
            data = data[:at] + piece + data[at + length:]
        elif op == "duplicate":
            data = data[:at] + data[at:at + length] * 2 + data[at + length:]
        elif data:
            data = data[:at] + bytes([data[min(at, len(data) - 1)] ^ (1 << (token % 8))]) + data[at + 1:]
    return data


def edits() -> st.SearchStrategy[list[tuple[str, float, int, int]]]:
    return st.lists(st.tuples(st.sampled_from(OPS), st.floats(0, 1), st.integers(0, 40), st.integers(0, 10**6)),
                    min_size=1, max_size=4)


def parses(raw: bytes) -> bool:
    try:
        text_format.Parse(raw.decode("utf-8"), mc.ModelConfig())
    except Exception:  # noqa: BLE001 - any failure to parse counts, whatever protobuf raises
        return False
    return True


def check_load(root: Path, raw: bytes) -> None:
    (root / "m" / "config.pbtxt").write_bytes(raw)
    try:
        ModelRepository(root)._build("m", root / "m", None)
    except ModelLoadError as exc:
        where = "m/config.pbtxt" if not parses(raw) else "model 'm'"
        assert where in exc.message, (raw, exc.message)


@pytest.fixture(scope="module")
def model_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fuzz")
    shutil.copytree(FIXTURES / "affine", root / "m")
    return root


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.sampled_from(SEEDS), ops=edits())
def test_mutated_configs_load_or_fail_with_a_load_error(model_root, seed, ops):
    check_load(model_root, mutate(seed, ops))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
def test_arbitrary_bytes_fail_with_a_load_error(model_root, raw):
    check_load(model_root, raw)


@pytest.mark.slow
def test_a_server_loads_fuzzed_configs_and_serves_on(tmp_path):
    rng = random.Random(17)
    configs: dict[str, bytes] = {}
    while len(configs) < 24:
        ops = [(rng.choice(OPS), rng.random(), rng.randrange(40), rng.randrange(10**6))
               for _ in range(rng.randint(1, 4))]
        raw = mutate(rng.choice(SEEDS), ops)
        if not parses(raw):  # the malformed ones: each must fail alone, naming its file
            configs[f"fuzz{len(configs):02d}"] = raw
    repo = tmp_path / "repo"
    shutil.copytree(FIXTURES / "affine", repo / "affine")
    (repo / "affine" / "config.pbtxt").write_text(AFFINE_CONFIG)
    for name, raw in configs.items():
        shutil.copytree(FIXTURES / "affine", repo / name)
        (repo / name / "config.pbtxt").write_bytes(raw)
    srv = ServerProcess(repo, "--exit-on-error=false", "--strict-readiness=false")
    try:
        rows = {r["name"]: r for r in httpx.post(f"http://{srv.http_url}/v2/repository/index", json={}).json()}
        assert rows["affine"]["state"] == "READY"
        for name in configs:
            assert rows[name]["state"] == "UNAVAILABLE" and f"{name}/config.pbtxt" in rows[name]["reason"], rows[name]
        body = {"inputs": [{"name": "in0", "shape": [1, 4], "datatype": "FP32", "data": [1.0, 2.0, 3.0, 4.0]}]}
        assert httpx.post(f"http://{srv.http_url}/v2/models/affine/infer", json=body, timeout=60).status_code == 200
    finally:
        assert srv.stop() == 0, srv.log_text
