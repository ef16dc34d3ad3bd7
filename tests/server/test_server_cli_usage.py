"""The `nnserve` command line as a newcomer meets it: --version, every flag of every command with help and its
default, output piped into a reader that stops early (`| head`) ending quietly, and every command in the README."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from serverproc import nnserve_command

from server.cli import build_parser

REPO = Path(__file__).resolve().parents[2]
MODEL = REPO / "docs" / "smallnet" / "smallnet.pnnx.param"


def subcommands() -> dict[str, argparse.ArgumentParser]:
    return next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices


def nnserve(*args: object, stdout: int | None = subprocess.PIPE) -> subprocess.CompletedProcess:
    return subprocess.run([*nnserve_command(), *map(str, args)], stdout=stdout, stderr=subprocess.PIPE, text=True,
                          timeout=120, cwd=REPO)


def test_version_is_the_packages():
    proc = nnserve("--version")
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert proc.returncode == 0 and proc.stdout == f"nnserve {version}\n"
    assert metadata.version("nnserve") == version


@pytest.mark.parametrize("command", sorted(subcommands()))
def test_every_flag_has_help_and_shows_its_default(command):
    parser = subcommands()[command]
    text = parser.format_help()
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        assert action.help, f"nnserve {command}: {action.option_strings or action.dest} has no help"
        if action.option_strings and not action.required and not isinstance(action, argparse._StoreTrueAction):
            helped = parser._get_formatter()._get_help_string(action)
            assert "default:" in helped, f"nnserve {command} {action.option_strings[0]}: no default shown"
    assert "%(" not in text


def test_serve_help_spells_the_defaults_as_flags_take_them():
    text = " ".join(subcommands()["serve"].format_help().split())
    for shown in ("KServe v2 REST port; 0 = any free port (default: 8000)", "serve REST (default: true)",
                  "(repeatable) (default: none)", "(default: the HTTP address)", "(default: 67108864)",
                  "--model-control-mode {none,poll,explicit}"):
        assert shown in text


def closed_pipe_run(*args: object) -> subprocess.CompletedProcess:
    """As `nnserve ... | head` once head has exited: every write to stdout fails with EPIPE."""
    read, write = os.pipe()
    os.close(read)
    try:
        return nnserve(*args, stdout=write)
    finally:
        os.close(write)


@pytest.mark.slow
@pytest.mark.parametrize("args", [
    ["inspect", MODEL], ["inspect", MODEL, "--graph-only"], ["run", MODEL, "--input", "in0=docs/smallnet/input.npy",
                                                            "--output-dir", "{tmp}"],
    ["import", MODEL, "--repository", "{tmp}", "--name", "m", "--dry-run"], ["--version"], ["--help"],
    ["serve", "--help"], ["convert", MODEL, "--to", "tnn", "--output", "{tmp}/m", "--input-shape", "in0=1x3x64x64"],
], ids=lambda a: " ".join(str(x) for x in a[:2]))
def test_a_reader_that_stops_early_ends_the_command_quietly(args, tmp_path):
    proc = closed_pipe_run(*[str(a).replace("{tmp}", str(tmp_path)) for a in args])
    assert proc.returncode in (0, 141), proc.stderr  # 141: as a process killed by SIGPIPE (`cat`)
    assert proc.stderr == "", proc.stderr


def test_engine_commands_alone_end_quietly_too():
    read, write = os.pipe()
    os.close(read)
    proc = subprocess.run([sys.executable, "-m", "engine.cli", "inspect", str(MODEL)], stdout=write,
                          stderr=subprocess.PIPE, text=True, timeout=120)
    os.close(write)
    assert proc.returncode == 141 and proc.stderr == ""


def test_the_readme_shows_every_command():
    readme = (REPO / "README.md").read_text()
    for command in subcommands():
        assert f"nnserve {command} " in readme, f"the README never shows `nnserve {command}`"
    assert "nnserve --version" in readme
