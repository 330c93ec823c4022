"""coder-eval's `sandbox.docker` block (`sandbox.driver: docker`), as evalsite reads it (no Django).

The keys are coder-eval 0.12.16's `DockerDriverConfig` and `DockerBuildConfig`
(`coder_eval/models/sandbox.py`); evalsite additions are marked "evalsite:". Three of coder-eval's
keys hand the worker's own environment or files to a container (`env_passthrough`,
`env_passthrough_extra`, `extra_mounts`): `unbuilt.py` refuses them by name. A key is otherwise
either taken as coder-eval takes it or refused here with what to do instead.

What the container driver reads (the contract with `runs_app.engine`):

- the image: `dockerfile_path` when set (built with `build`, the Dockerfile's folder as its
  context: `build_context`), else `image`, which the worker must already hold (nothing is pulled);
- `working_dir`: where the agent works inside the container (`auto`: the image's WORKDIR);
- `env`, `user`, `build_timeout` (evalsite's, set by Harbor task folders);
- the network is `sandbox.network` / `sandbox.allowed_hosts`, never `docker.network`, which only
  has to agree with them.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import re
from pathlib import PurePosixPath
from typing import Literal

from pydantic import Field, field_validator, model_validator

from experiments_app.specs.base import SpecError, SpecModel

# A Docker image reference: [host[:port]/]path[:tag][@digest], path components lowercase.
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
IMAGE_RE = re.compile(
    rf"^(?:[A-Za-z0-9.-]+(?::[0-9]+)?/)?{_COMPONENT}(?:/{_COMPONENT})*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?$"
)
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
USER_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*(?::[A-Za-z0-9_][A-Za-z0-9_.-]*)?$")
SECRET_ID_RE = re.compile(r"^[A-Za-z0-9_.-]+$")
# `$NAME` or `${NAME...}`: coder-eval expands these against the host's environment.
HOST_VARIABLE_RE = re.compile(r"\$(?:\{|[A-Za-z_])")

# Paths a working directory may not be: the root, the kernel's file systems, and where the
# driver puts Harbor's verifier files, the reference solution and the logs.
RESERVED_DIRS = ("/", "/proc", "/sys", "/dev", "/logs", "/tests", "/solution")
RESERVED_TREES = ("/proc/", "/sys/", "/dev/", "/logs/", "/tests/", "/solution/")
# Where `working_dir: auto` lands when the image names no WORKDIR (coder-eval's fallback).
AUTO_WORKDIR_FALLBACK = "/root"
# Harbor's default build timeout, and evalsite's bounds for `build_timeout`.
DEFAULT_BUILD_TIMEOUT = 600


def check_env(env: dict[str, str], what: str) -> dict[str, str]:
    """Environment variables a task sets in its container: plain names, none of evalsite's own."""
    for name, value in env.items():
        if not ENV_NAME_RE.match(name):
            raise ValueError(f"{what}: {name!r} is not a variable name (letters, digits and '_')")
        if name.upper().startswith("EVALSITE_"):
            raise ValueError(f"{what}: {name!r}: the EVALSITE_ variables are set by the worker, not a task")
        if "\x00" in value:
            raise ValueError(f"{what}: the value of {name!r} holds a NUL character")
    return env


def check_user(user: str | int | None, what: str) -> str | int | None:
    """A user name or uid (optionally `:group`), as `docker exec --user` takes it."""
    if isinstance(user, bool) or (isinstance(user, int) and user < 0):
        raise ValueError(f"{what} must be a user name or a uid >= 0, got {user!r}")
    if isinstance(user, str) and not USER_RE.match(user):
        raise ValueError(f"{what} {user!r} must be a user name or uid, optionally with ':group'")
    return user


class DockerBuild(SpecModel):
    """coder-eval's `docker build` settings, used when `dockerfile_path` is set."""

    # None: the worker's default; secrets need BuildKit.
    buildkit: bool | None = None
    # `--build-arg KEY=VALUE`, the value taken literally (coder-eval expands $VAR from the host).
    args: dict[str, str] = Field(default_factory=dict)
    # `--secret id=ID,env=NAME`: NAME is a variable of the worker's, passed only if the worker
    # lists it in EVALSITE_BUILD_SECRETS (a file of the worker's, `src=`, is refused).
    secrets: list[str] = Field(default_factory=list)
    # Only `--target NAME` (or `--target=NAME`): other `docker build` flags are refused.
    extra_args: list[str] = Field(default_factory=list)

    @field_validator("args")
    @classmethod
    def _args(cls, args: dict[str, str]) -> dict[str, str]:
        for key, value in args.items():
            if not ENV_NAME_RE.match(key):
                raise ValueError(f"build arg {key!r} is not a variable name (letters, digits and '_')")
            if HOST_VARIABLE_RE.search(value):
                raise ValueError(
                    f"build arg {key}={value!r} names a variable: coder-eval expands it from the host's "
                    "environment, and evalsite builds on any worker from the task's files alone: write "
                    "the value itself (a credential goes in build.secrets)"
                )
        return args

    @field_validator("secrets")
    @classmethod
    def _secrets(cls, secrets: list[str]) -> list[str]:
        for spec in secrets:
            problem = secret_problem(spec)
            if problem:
                raise ValueError(problem)
        return secrets

    @field_validator("extra_args")
    @classmethod
    def _extra_args(cls, args: list[str]) -> list[str]:
        i = 0
        while i < len(args):
            arg = args[i]
            if arg == "--target" and i + 1 < len(args) and _stage_name(args[i + 1]):
                i += 2
                continue
            if arg.startswith("--target=") and _stage_name(arg.removeprefix("--target=")):
                i += 1
                continue
            flag = arg.split("=", 1)[0]
            raise ValueError(
                f"docker build flag {flag!r} is refused: evalsite builds with the settings it models "
                "(args, secrets, buildkit) plus --target NAME; other flags could reach the worker's "
                "network or files, or change the image in ways its build context does not record"
            )
        return args

    @model_validator(mode="after")
    def _buildkit_for_secrets(self) -> DockerBuild:
        if self.secrets and self.buildkit is False:
            raise SpecError((("buildkit",), "build secrets need BuildKit: remove buildkit: false"))
        return self


def _stage_name(name: str) -> bool:
    return bool(re.match(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", name))


def secret_problem(spec: str) -> str | None:
    """Why a `--secret` spec is refused (None when it is `id=ID,env=NAME`)."""
    fields: dict[str, str] = {}
    for part in spec.split(","):
        key, equals, value = part.partition("=")
        if not equals or not value:
            return f"build secret {spec!r}: expected id=ID,env=NAME"
        fields[key.strip()] = value.strip()
    if "src" in fields or "source" in fields or fields.get("type", "env") != "env":
        return (
            f"build secret {spec!r} reads a file of the worker's: evalsite builds on any worker, and "
            "passes only environment variables the worker allows (id=ID,env=NAME)"
        )
    unknown = sorted(set(fields) - {"id", "env", "type"})
    if unknown:
        return f"build secret {spec!r}: unknown field {unknown[0]!r} (expected id=ID,env=NAME)"
    if not SECRET_ID_RE.match(fields.get("id", "")):
        return f"build secret {spec!r}: give an id (letters, digits, '.', '_', '-')"
    if not ENV_NAME_RE.match(fields.get("env", "")):
        return f"build secret {spec!r}: name the worker's variable that holds it: id=ID,env=NAME"
    return None


class DockerSpec(SpecModel):
    """coder-eval's `sandbox.docker`: the container of a `driver: docker` task."""

    image: str | None = None
    # Relative to the task file's folder; its folder is the build context, which travels in the
    # task's bundle. Wins over `image`, as in coder-eval.
    dockerfile_path: str | None = None
    build: DockerBuild = Field(default_factory=DockerBuild)
    # coder-eval's default is `bridge` (open internet). evalsite's network is sandbox.network
    # (none, or bridge to sandbox.allowed_hosts only); this key may only agree with it.
    network: Literal["bridge", "none"] | None = None
    # Where the agent works inside the container: an absolute path, or `auto` (the image's
    # WORKDIR, /root when it has none). None: the driver's own workspace folder.
    working_dir: str | None = None
    # coder-eval's; refused by name when not empty (`unbuilt.py`): they hand the worker's
    # environment or folders to the container.
    env_passthrough: list[str] = Field(default_factory=list)
    env_passthrough_extra: list[str] = Field(default_factory=list)
    extra_mounts: list[str] = Field(default_factory=list)
    # evalsite: variables set for every command in the container (Harbor's [environment].env).
    env: dict[str, str] = Field(default_factory=dict)
    # evalsite: who the agent (and pre_run, post_run) run as; None: the driver's non-root user.
    user: str | int | None = None
    # evalsite: seconds the image build may take (Harbor's build_timeout_sec; default 600).
    build_timeout: int | None = Field(default=None, ge=1, le=24 * 3600)

    @field_validator("image")
    @classmethod
    def _image(cls, image: str | None) -> str | None:
        if image is not None and (not IMAGE_RE.match(image) or len(image) > 255):
            raise ValueError(
                f"image {image!r} is not a Docker image reference (e.g. debian:bookworm-slim, "
                "registry.example.com/team/base:1.2)"
            )
        return image

    @field_validator("dockerfile_path")
    @classmethod
    def _dockerfile(cls, path: str | None) -> str | None:
        if path is None:
            return None
        norm = path.replace("\\", "/")
        if not norm.strip() or norm.startswith(("/", "~")) or re.match(r"^[A-Za-z]:/", norm):
            raise ValueError(f"dockerfile_path must be relative to the task file's folder, got {path!r}")
        if norm.endswith("/") or PurePosixPath(norm).name in ("", ".", ".."):
            raise ValueError(f"dockerfile_path names a file, got {path!r}")
        return path

    @field_validator("working_dir")
    @classmethod
    def _working_dir(cls, path: str | None) -> str | None:
        if path is None or path == "auto":
            return path
        if not path.startswith("/") or "\\" in path:
            raise ValueError(f"working_dir {path!r} must be an absolute path in the container, or 'auto'")
        norm = posixpath.normpath(path)
        if norm != path.rstrip("/") and path != "/":
            raise ValueError(f"working_dir {path!r} must be written plainly (no '..', '.' or '//')")
        if norm in RESERVED_DIRS or norm.startswith(RESERVED_TREES):
            raise ValueError(
                f"working_dir {path!r} is a folder the container driver keeps for itself "
                f"({', '.join(RESERVED_DIRS)}): use the image's own WORKDIR (e.g. /app), or 'auto'"
            )
        return path

    @field_validator("env")
    @classmethod
    def _env(cls, env: dict[str, str]) -> dict[str, str]:
        return check_env(env, "env")

    @field_validator("user")
    @classmethod
    def _user(cls, user: str | int | None) -> str | int | None:
        return check_user(user, "user")


def build_context(dockerfile_path: str) -> str:
    """The build context of a Dockerfile, relative to the task file's folder: the Dockerfile's
    own folder (coder-eval's rule), "." when it sits beside the task file."""
    return posixpath.dirname(posixpath.normpath(dockerfile_path.replace("\\", "/"))) or "."


def image_key(context: dict[str, bytes], dockerfile: str, build: dict) -> str:
    """What names a built image: the sha256 of its build context's files (paths relative to the
    context), the Dockerfile's path in it, and the build settings that change the result (`args`,
    the `--target`). Two trials whose keys are equal may share one image; the key is recorded on
    the trial as the image's digest."""
    digest = hashlib.sha256()
    settings = {
        "dockerfile": dockerfile,
        "args": build.get("args") or {},
        "extra_args": build.get("extra_args") or [],
    }
    digest.update(json.dumps(settings, sort_keys=True).encode())
    for name in sorted(context):
        digest.update(f"\0{len(name)}:{name}\0{len(context[name])}:".encode())
        digest.update(context[name])
    return digest.hexdigest()
