"""What a worker host says of itself on the workers page: the versions of its agent CLIs, and
whether it runs containers."""

import json
import os
import re
import subprocess
import tempfile
from pathlib import Path

from experiments_app.specs.agent_kinds import KINDS, AgentKindInfo
from runs_app.engine.agents.base import find_cli

# The model CLIs the kinds drive.
AGENT_CLIS: tuple[AgentKindInfo, ...] = tuple(kind for kind in KINDS.values() if kind.cli)


def agent_versions(cache_file: Path) -> dict[str, str]:
    """Each installed agent CLI's `--version` line (a CLI that is not installed is left out):
    two hosts whose claude differs run different agents under one variant's name.

    Asking all five costs about 4 s of CPU, so answers are kept in `cache_file` per binary
    (its real path, size and modification time): a restarted worker asks again only after an
    upgrade."""
    try:
        cache = json.loads(cache_file.read_text())
    except (OSError, ValueError):
        cache = {}
    versions, fresh = {}, {}
    for kind in AGENT_CLIS:
        binary, _missing = find_cli(kind.name, kind.cli, {}, kind.cli_variable)
        if binary is None:
            continue
        real = os.path.realpath(binary)
        stat = os.stat(real)
        key = f"{real}:{stat.st_size}:{stat.st_mtime_ns}"
        versions[kind.name] = fresh[key] = cache.get(key) or _ask_version([binary, *kind.version_args])
    if fresh != cache:
        _write_atomically(cache_file, json.dumps(fresh))
    return versions


def _ask_version(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    lines = (done.stdout.strip() or done.stderr.strip()).splitlines()
    return lines[0][:120] if done.returncode == 0 and lines else "unknown"


def _write_atomically(path: Path, text: str) -> None:
    handle, scratch = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(handle, "w") as out:
            out.write(text)
        os.replace(scratch, path)
    except OSError:
        Path(scratch).unlink(missing_ok=True)


# What `make containers` makes (scripts/containers.sh): task Dockerfiles start FROM these offline.
BASE_IMAGES = ("evalsite/busybox", "debian:bookworm-slim", "python:3.11-slim-bookworm")


# Image families without the GNU C library: the worker's agent CLIs (node, Python, opencode's
# binary), linked against it, cannot run in them.
WITHOUT_GLIBC = re.compile(r"(^|/)(busybox|alpine)(:|$)|[-:.]alpine|[-:.]musl")
# Where a glibc image keeps its loader (x86-64 and arm64).
GLIBC_LOADERS = ("lib64/ld-linux-x86-64.so.2", "lib/ld-linux-aarch64.so.1")


def image_refuses_agent(config: dict) -> str | None:
    """Why the agent of a container trial cannot run in its named image (launching refuses it),
    or None. Images built from a Dockerfile are checked by the worker when it starts them."""
    kind = (config.get("agent") or {}).get("type") or ""
    info = KINDS.get(kind)
    image = ((config.get("sandbox") or {}).get("docker") or {}).get("image") or ""
    if not runs_in_container(config) or info is None or not info.cli or not image:
        return None
    if WITHOUT_GLIBC.search(image):
        return (
            f"agent kind {kind} runs the worker's {info.cli} CLI, which needs the GNU C library, and "
            f"image {image} has none (busybox, alpine): use a glibc image (debian, ubuntu, python:*-slim)"
        )
    return None


def runs_in_container(config: dict) -> bool:
    """Whether a trial with this resolved config runs in a container (the one rule: launching
    refuses and routes by it)."""
    return (config.get("sandbox") or {}).get("driver") == "docker"


def container_engine(engine: str, cli: str) -> dict:
    """This host's container engine as a worker reports it: `{"containers": True, "engine":
    "docker 20.10.24", "images": [...], "missing": [...]}` (the base images present and not), or
    `{"containers": False, "reason": ...}` saying what to do. `engine` is EVALSITE_CONTAINER_ENGINE,
    `cli` the engine's client. Costs two client calls (~50 ms)."""
    if engine == "none":
        return _without("EVALSITE_CONTAINER_ENGINE=none: this host takes no container trials")
    if os.geteuid() != 0:  # the container driver mounts each phase's folders into the container
        return _without("the worker is not root, and the container driver runs on root workers only")
    if not os.access(cli, os.X_OK):
        return _without(f"no {cli}: install Debian's docker.io (make containers)")
    answer = _ask_engine([cli, "version", "--format", "{{.Server.Version}}"])
    if isinstance(answer, str):
        return _without(f"the engine does not answer ({answer}): start it (make containers)")
    filters = [arg for image in BASE_IMAGES for arg in ("--filter", f"reference={image}")]
    listed = _ask_engine([cli, "image", "ls", "--format", "{{.Repository}}:{{.Tag}}", *filters])
    present = set() if isinstance(listed, str) else set(listed)
    images = [image for image in BASE_IMAGES if image in present or f"{image}:latest" in present]
    return {
        "containers": True,
        "engine": f"docker {answer[0] if answer else '?'}",
        "images": images,
        "missing": [image for image in BASE_IMAGES if image not in images],
    }


def _without(reason: str) -> dict:
    return {"containers": False, "reason": reason}


def _ask_engine(argv: list[str]) -> list[str] | str:
    """The client's output lines, or why it failed (its last error line)."""
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, errors="replace", timeout=20, stdin=subprocess.DEVNULL
        )
    except subprocess.TimeoutExpired:
        return "no answer within 20 s"
    except OSError as exc:
        return str(exc)
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        return (lines[-1] if lines else f"exit {done.returncode}")[:300]
    return done.stdout.split()


def capabilities(at_start: dict, now: dict) -> dict:
    """What a worker reports: it takes container trials only if its engine answered when it started
    (its queues are fixed then) and still answers now."""
    if at_start.get("containers") or not now.get("containers"):
        return now
    return _without("the engine answers now but did not when this worker started: restart the worker")
