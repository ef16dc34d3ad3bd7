"""The Dockerfile, read statically (no Docker engine is needed): stages, install command, user, ports, health."""

from __future__ import annotations

import re
import shlex
import tomllib

import pytest
from dockerfile import Dockerfile, Stage, dockerignore_allows, dockerignore_patterns
from kube import DEPLOY_DIR, REPO_ROOT

from server import settings
from server.cli import build_parser

VARIANTS = {"cpu": {}, "cuda": {"VARIANT": "cuda"}}
COMPILERS = re.compile(r"\b(build-essential|gcc|g\+\+|clang|cc|make|[\w.+-]+-dev)\b")
INSTALL_MARKER = "<!-- install-command"


@pytest.fixture(scope="module")
def dockerfile() -> Dockerfile:
    return Dockerfile.parse(REPO_ROOT / "Dockerfile")


def final_stage(df: Dockerfile) -> Stage:
    return df.stages[-1]  # what `docker build` without --target produces


def builder_stage(df: Dockerfile) -> Stage:
    """The stage the final stage copies its wheels from (RUN --mount=...,from=<stage> or COPY --from=<stage>)."""
    text = " ".join(i.value for i in final_stage(df).instructions)
    name = re.search(r"from=([\w.-]+)", text).group(1)
    return df.stage(name)


def documented_install_commands() -> list[list[str]]:
    """The fenced block after the install-command marker in deploy/README.md, one argv per line."""
    text = (DEPLOY_DIR / "README.md").read_text()
    after = text[text.index(INSTALL_MARKER):]
    block = re.search(r"```sh\n(.*?)```", after, re.S).group(1)
    return [shlex.split(line) for line in block.splitlines() if line.strip()]


def run_commands(df: Dockerfile, stage: Stage, build_args: dict[str, str]) -> list[list[str]]:
    """Every `&&`-separated command of the stage's RUN lines, as argv with the stage's ENV expanded."""
    env = df.env(stage, build_args)
    out = []
    for ins in stage.all("RUN"):
        body = re.sub(r"^(--\S+\s+)+", "", ins.value)  # RUN --mount=... flags
        for part in body.split("&&"):
            argv = [re.sub(r"\$\{(\w+)\}", lambda m: env.get(m.group(1), m.group(0)), a) for a in shlex.split(part)]
            out.append(argv)
    return out


def test_multi_stage_with_slim_python_by_default(dockerfile: Dockerfile) -> None:
    assert len(dockerfile.stages) >= 2
    assert dockerfile.image(final_stage(dockerfile)) == "python:3.11-slim"
    assert dockerfile.image(builder_stage(dockerfile)) == "python:3.11-slim"
    cuda = dockerfile.image(final_stage(dockerfile), VARIANTS["cuda"])
    assert cuda.startswith("nvidia/cuda:") and "runtime" in cuda


@pytest.mark.parametrize("variant", VARIANTS)
def test_final_stage_installs_no_compiler(dockerfile: Dockerfile, variant: str) -> None:
    args = VARIANTS[variant]
    final = final_stage(dockerfile)
    assert "devel" not in dockerfile.image(final, args)
    for stage in dockerfile.chain(final, args):
        for argv in run_commands(dockerfile, stage, args):
            if "apt-get" in argv or "apk" in argv:
                assert not COMPILERS.search(" ".join(argv)), f"{variant}: compiler in the runtime: {argv}"
    # the builder is where wheels get built
    assert any(argv[:2] == ["pip", "wheel"] for s in dockerfile.chain(builder_stage(dockerfile), args)
               for argv in run_commands(dockerfile, s, args))


def test_install_command_is_the_documented_one(dockerfile: Dockerfile) -> None:
    wheel_cmd, install_cmd = documented_install_commands()
    assert wheel_cmd in run_commands(dockerfile, builder_stage(dockerfile), {})
    assert install_cmd in run_commands(dockerfile, final_stage(dockerfile), {})
    # the CUDA variant is the same command with the `cuda` extra added
    cuda_env = dockerfile.env(final_stage(dockerfile), VARIANTS["cuda"])
    assert cuda_env["NNSERVE_EXTRAS"] == "server,cuda"
    extras = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert {"server", "cuda"} <= set(extras)


def test_ci_installs_what_the_image_installs() -> None:
    """`make test` (CI) installs the project editable with the `test` extra, which pulls in the image's extra;
    `make serve` installs the image's extra alone."""
    installs = [shlex.split(ln.split("pip", 1)[1]) for ln in (REPO_ROOT / "Makefile").read_text().splitlines()
                if "pip install" in ln and "-e" in ln and "[dev]" not in ln]  # the fixture makers' own venv
    (install,) = [i for i in installs if ".[test]" in i]
    assert install[0] == "install" and ".[test]" in install
    (_, install_cmd) = documented_install_commands()
    image_extra = re.fullmatch(r"nnserve\[(\w+)\]", install_cmd[-1]).group(1)
    extras = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert f"nnserve[{image_extra}]" in extras["test"]
    (serve,) = [i for i in installs if ".[test]" not in i]
    assert serve[0] == "install" and serve[-1] == f".[{image_extra}]"


def test_runs_as_a_non_root_user(dockerfile: Dockerfile) -> None:
    users = final_stage(dockerfile).all("USER")
    assert users, "the final stage sets no USER"
    uid = users[-1].value.split(":")[0]
    assert uid.isdigit() and int(uid) != 0, "numeric non-root UID (Kubernetes runAsNonRoot can only check numbers)"


def test_ports_healthcheck_and_entrypoint_match_the_server(dockerfile: Dockerfile) -> None:
    final = final_stage(dockerfile)
    exposed = {int(p) for ins in final.all("EXPOSE") for p in ins.value.split()}
    assert exposed == {settings.HTTP_PORT, settings.GRPC_PORT, settings.METRICS_PORT}
    (health,) = final.all("HEALTHCHECK")
    assert f"127.0.0.1:{settings.HTTP_PORT}{settings.READY_PATH}" in health.value
    assert "curl" not in health.value and "wget" not in health.value
    (entrypoint,) = final.all("ENTRYPOINT")
    assert entrypoint.exec_form() == ["nnserve", "serve"]
    scripts = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["nnserve"] == "server.cli:main"
    (cmd,) = final.all("CMD")
    args = build_parser().parse_args(entrypoint.exec_form()[1:] + cmd.exec_form())
    copies = [ins.value.split() for ins in final.all("COPY")]
    assert any(c[-2].rstrip("/") == "model_repository" and c[-1].rstrip("/") == str(args.model_repository)
               for c in copies), "the bundled repository is where CMD points"
    assert args.http_port == settings.HTTP_PORT and args.grpc_port == settings.GRPC_PORT


def test_numba_cache_is_a_writable_directory_of_the_user(dockerfile: Dockerfile) -> None:
    final = final_stage(dockerfile)
    cache = dockerfile.env(final)["NUMBA_CACHE_DIR"]
    chowns = [i.value for i in final.all("RUN") if "chown" in i.value]
    assert any(cache.rsplit("/", 1)[0] in c for c in chowns)


def test_dockerignore_lets_in_exactly_what_is_copied(dockerfile: Dockerfile) -> None:
    patterns = dockerignore_patterns(REPO_ROOT / ".dockerignore")
    sources = [src for s in dockerfile.stages for ins in s.all("COPY") if "--from" not in ins.value
               for src in ins.value.split()[:-1] if not src.startswith("--")]
    assert {"pyproject.toml", "engine/", "server/", "proto/", "model_repository/"} <= set(sources)
    for src in sources:
        assert src != "." and dockerignore_allows(patterns, src), f"COPY {src} is excluded by .dockerignore"
    for local in (".git", ".venv", ".venv-dev", "tests", "bench/models", "engine/ops/__pycache__", "nnserve.egg-info"):
        assert not dockerignore_allows(patterns, local), f"{local} would be sent to the build"
