"""CLI flag parsing and the repository's pure helpers (version directories and version policy)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from server import settings
from server.cli import build_parser, settings_from_args
from server.config import parse_config_text
from server.errors import ModelLoadError
from server.metrics import MAX_RETIRED, ServerMetrics
from server.repository import select_versions, version_dirs


def parse(*argv: str):
    return settings_from_args(build_parser().parse_args(["serve", *argv]))


def test_triton_flag_names_and_defaults(tmp_path):
    s = parse("--model-repository", str(tmp_path))
    assert (s.http_port, s.grpc_port, s.metrics_port) == (settings.HTTP_PORT, settings.GRPC_PORT,
                                                          settings.METRICS_PORT) == (8000, 8001, 8002)
    assert s.model_control_mode == "none" and s.exit_timeout_secs == 30 and s.default_max_batch_size == 4
    s = parse("--model-repository", str(tmp_path), "--http-port", "0", "--model-control-mode", "explicit",
              "--load-model", "a", "--load-model", "b", "--exit-on-error=false", "--strict-readiness", "0",
              "--backend-config", "tnn,default-max-batch-size=16", "--log-verbose", "1")
    assert s.http_port == 0 and s.load_models == ["a", "b"] and not s.exit_on_error and not s.strict_readiness
    assert s.default_max_batch_size == 16 and s.log_verbose == 1
    assert parse("--model-repository", str(tmp_path)).log_format == "text"
    assert parse("--model-repository", str(tmp_path), "--log-format", "json").log_format == "json"
    with pytest.raises(SystemExit):
        parse("--model-repository", str(tmp_path), "--log-format", "xml")


def test_bad_flags_are_refused(tmp_path):
    with pytest.raises(SystemExit):
        parse("--model-repository", str(tmp_path), "--model-control-mode", "sometimes")
    with pytest.raises(SystemExit):
        parse("--model-repository", str(tmp_path), "--exit-on-error", "maybe")
    with pytest.raises(SystemExit, match="must be the only"):
        parse("--model-repository", str(tmp_path), "--load-model", "*", "--load-model", "a")


def test_version_dirs_follow_triton_rules(tmp_path):
    for name in ("1", "3", "10", "007", "latest", "0"):
        (tmp_path / name).mkdir()
    (tmp_path / "2").write_text("a file, not a version")
    assert version_dirs(tmp_path) == [1, 3, 10]


@pytest.mark.parametrize("policy, expected", [
    ("", [10]),
    ("version_policy { latest { num_versions: 2 } }", [3, 10]),
    ("version_policy { all { } }", [1, 3, 10]),
    ("version_policy { specific { versions: [1, 10] } }", [1, 10]),
])
def test_version_policy(policy, expected):
    config = parse_config_text(f'name: "m" {policy}')
    assert select_versions(config, [1, 3, 10]) == expected


def test_specific_version_without_directory_is_a_load_error():
    config = parse_config_text('name: "m" version_policy { specific { versions: [4] } }')
    with pytest.raises(ModelLoadError, match=r"versions \[4\]"):
        select_versions(config, [1, 3])


def test_unloaded_versions_remembered_are_bounded():
    """A client loading and unloading ever new model names must not grow the metrics' memory of them for ever; the
    versions unloaded last still drop a late request's figures."""
    m = ServerMetrics()
    for i in range(MAX_RETIRED + 50):
        m.model_loaded(f"m{i}", "1", 0.1, [64])
        m.model_unloaded(f"m{i}", "1", instances=1)
    assert len(m._retired) == MAX_RETIRED
    last = f"m{MAX_RETIRED + 49}"
    m.request_ok(last, "1", total_ns=3000, queue_ns=1000, input_ns=100, infer_ns=1500, output_ns=200, batch=1)
    assert f'model="{last}"' not in m.render().decode()


def test_metrics_render_triton_counters_without_total_suffix():
    m = ServerMetrics()
    m.model_loaded("m", "1", 0.5, [1024])
    m.request_ok("m", "1", total_ns=3000, queue_ns=1000, input_ns=100, infer_ns=1500, output_ns=200, batch=2)
    m.execution("m", "1", 2)
    text = m.render().decode()
    assert "# TYPE nv_inference_count counter" in text and "nv_inference_count_total" not in text
    assert 'nv_inference_count{model="m",version="1"} 2.0' in text
    assert 'nv_inference_queue_duration_us{model="m",version="1"} 1.0' in text
    assert 'nnserve_arena_bytes{device="cpu",instance="0",model="m",version="1"} 1024.0' in text
    assert 'nnserve_batch_size_bucket{le="2.0",model="m",version="1"} 1.0' in text
    m.model_unloaded("m", "1", instances=1)
    text = m.render().decode()  # as in Triton, an unloaded version's series go: gauges, counters, histograms
    assert "nnserve_arena_bytes{" not in text and 'model="m"' not in text
    m.request_ok("m", "1", total_ns=3000, queue_ns=1000, input_ns=100, infer_ns=1500, output_ns=200, batch=2)
    assert 'model="m"' not in m.render().decode()  # a request that finishes after the unload records nothing
    m.model_loaded("m", "1", 0.5, [1024])
    assert 'nv_inference_count{model="m",version="1"} 0.0' in m.render().decode()  # loaded again: from 0


def test_the_environment_is_read_into_the_settings():
    args = build_parser().parse_args(["serve", "--model-repository", "repo"])
    assert settings_from_args(args, {"NNSERVE_PLUGINS": " faulty_ops, more ,,"}).plugins == ["faulty_ops", "more"]
    assert settings_from_args(args, {}).plugins == []


def test_the_readme_configuration_table_lists_every_flag_and_variable():
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("## Configuration", 1)[1].split("\n## ", 1)[0]
    rows = {line.split("|")[1].strip().strip("`").split()[0] for line in section.splitlines()
            if line.startswith("| `")}
    subparsers = next(a for a in build_parser()._actions if a.dest == "command")
    flags = {a.option_strings[0] for a in subparsers.choices["serve"]._actions if a.option_strings[0] != "-h"}
    assert flags <= rows, sorted(flags - rows)
    assert settings.PLUGINS_ENV in rows


def test_an_invalid_engine_setting_stops_the_server_at_start(tmp_path):
    # a misspelt NNSERVE_* value must not serve on the default: `nnserve serve` exits naming it, no traceback
    r = subprocess.run([sys.executable, "-m", "server.cli", "serve", "--model-repository", str(tmp_path),
                        "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0"],
                       capture_output=True, text=True, timeout=120, env={**os.environ, "NNSERVE_NUM_THREADS": "two"})
    assert r.returncode != 0, r.stderr
    assert "NNSERVE_NUM_THREADS='two': expected a whole number of threads" in r.stderr
    assert "Traceback" not in r.stderr
