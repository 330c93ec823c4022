"""A container task's trial (`sandbox.driver: docker`): its image on this host, its container
(the container driver of `runs_app.engine.sandbox.docker`), the worker's runtimes an agent CLI
needs inside it, and what runs there after the agent (the reference's script, the verifier).

- The image: `sandbox.docker.dockerfile_path` built from its folder (cached by the context's
  digest, per host; pushed to and pulled from EVALSITE_IMAGE_REGISTRY), or `sandbox.docker.image`
  held by the host. Its id is the trial's `image_digest`.
- The workspace: the driver's own folder, mounted where commands run; or, with
  `working_dir` (Harbor's `/app`, `auto` for the image's WORKDIR), the image's own folder, which
  the engine copies in (`push`) and out (`pull`) around the phases that read it on the host.
- The user: `sandbox.docker.user`; else the image's USER in the image's folder (Harbor runs as
  the image says, usually root), else an unprivileged uid of the worker's.
- Agent CLIs: the worker's runtimes (its Python, node_modules, .agents, a copy of its `node`),
  read-only at their own paths, for the agent's command only; the gateway's forwarder is static.
  Keys never enter: the gateway's socket does.
- The verifier (Harbor's tests/test.sh): after the agent, `tests_dir` at /tests, an empty
  /logs/verifier, `bash /tests/<script>`; its reward file gives the criterion's results.
"""

from __future__ import annotations

import functools
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from django.conf import settings

from experiments_app.specs import agent_kinds
from experiments_app.specs.criteria import verifier_rewards
from experiments_app.specs.docker import AUTO_WORKDIR_FALLBACK, DEFAULT_BUILD_TIMEOUT
from runs_app.engine import hosts
from runs_app.engine.outcome import TrialAborted
from runs_app.engine.sandbox import DiskCap, Mount, Phase, Sandbox, open_sandbox
from runs_app.engine.sandbox import docker as container
from runs_app.engine.sandbox.bubblewrap.command import runtime_dirs, searchable_by_others, staged
from runs_app.engine.sandbox.docker import images

if TYPE_CHECKING:
    from runs_app.engine.trial_sandbox import TrialSandbox

# Where Harbor's files go in the container: the verifier's tests, the reference, the logs.
TESTS = Path("/tests")
SOLUTION = Path("/solution")
LOGS = Path("/logs")
VERIFIER_LOGS = LOGS / "verifier"
REWARD_CAP = 1 << 20  # a reward file is a number or a small JSON object
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass
class ImageBuild:
    """What getting the trial's image printed (a build's output), for the trial's transcript."""

    command: str = ""
    lines: list[str] = field(default_factory=list)
    error: str = ""


def open_container(box: TrialSandbox, root: Path, shared: list[Mount], env: dict[str, str]) -> Sandbox:
    """The trial's container, started: its image had (built, pulled or held), its user, working
    folder, caps and mount roots."""
    spec = (box.config.get("sandbox") or {}).get("docker") or {}
    box.image = _task_image(box, spec)
    found = box.image.config or container.image_config(box.image.reference)
    working_dir = spec.get("working_dir")
    if working_dir == "auto":
        working_dir = found.workdir if found.workdir not in ("", "/") else AUTO_WORKDIR_FALLBACK
    box.in_image = working_dir is not None
    user = spec.get("user")
    if user is None and box.in_image:
        user = found.user or "root"
    limits = (box.config.get("sandbox") or {}).get("limits") or {}
    node = node_folder()
    box.runtime_mounts = runtime_mounts(node)
    env = {
        **env,
        **(spec.get("env") or {}),
        "PATH": f"{node}:{found.env.get('PATH') or DEFAULT_PATH}"
        if node
        else found.env.get("PATH") or DEFAULT_PATH,
    }
    sandbox = open_sandbox(
        "docker", root, stage_root=Path(settings.SANDBOX_ROOT) / "runtimes", shared=shared, env=env,
        disk=DiskCap(box.caps.disk_bytes, box.caps.max_inodes), image=box.image.reference,
        user=None if user is None else str(user), workdir=working_dir, in_image=box.in_image,
        resources=container.Resources(
            memory_bytes=box.caps.memory_bytes, cpus=limits.get("max_cpus"), pids=box.caps.max_processes
        ),
        mount_roots=[TESTS, SOLUTION, LOGS, *(mount.path for mount in box.runtime_mounts)],
    )  # fmt: skip
    sandbox.start()
    _check_agent_runs(box, sandbox)
    return sandbox


def _check_agent_runs(box: TrialSandbox, sandbox: Sandbox) -> None:
    """An agent CLI of the worker needs the GNU C library in the image: an image without it is
    the environment's fault, said before the agent's phase, not the agent's error."""
    kind = agent_kinds.KINDS.get((box.config.get("agent") or {}).get("type") or "")
    if kind is None or not kind.cli:
        return
    assert isinstance(sandbox, container.ContainerSandbox) and sandbox.cgroup is not None
    image_root = Path(f"/proc/{sandbox.cgroup.init_pid}/root")
    if not any(os.path.lexists(image_root / loader) for loader in hosts.GLIBC_LOADERS):
        raise TrialAborted(
            "environment",
            f"agent kind {kind.name} runs the worker's {kind.cli} CLI, which needs the GNU C library, and "
            f"the task's image has none (busybox, alpine): base the image on a glibc one (debian, "
            "ubuntu, python:*-slim)",
        )


def _task_image(box: TrialSandbox, spec: dict) -> images.TaskImage:
    build = box.image_build
    try:
        if not spec.get("dockerfile_path"):
            build.command = f"docker image inspect {spec.get('image')}"
            return images.named_image(str(spec.get("image")))
        bundle_dir, yaml_dir = box.origin("sandbox.docker.dockerfile_path")
        dockerfile = (bundle_dir / yaml_dir / spec["dockerfile_path"]).resolve()
        if not dockerfile.is_relative_to(bundle_dir.resolve()) or not dockerfile.is_file():
            raise TrialAborted(
                "environment",
                f"sandbox.docker.dockerfile_path {spec['dockerfile_path']!r} is not a file of the task",
            )
        context = dockerfile.parent
        options = spec.get("build") or {}
        key = images.image_key_for(context, dockerfile.name, options)
        build.command = f"docker build --tag {images.TASK_REPOSITORY}:{key} {spec['dockerfile_path']}"
        secrets = {name: os.environ[name] for name in settings.BUILD_SECRET_NAMES if name in os.environ}
        return images.built_image(
            key, context, dockerfile.name, options, lock_dir=Path(settings.SANDBOX_ROOT) / "images",
            log=build.lines.append, timeout=float(spec.get("build_timeout") or DEFAULT_BUILD_TIMEOUT),
            registry=settings.IMAGE_REGISTRY, network=settings.BUILD_NETWORK, should_stop=box.should_stop,
            secrets_env=secrets,
        )  # fmt: skip
    except images.ImageError as exc:
        build.error = str(exc)
        if exc.log and not build.lines:
            build.lines = exc.log.splitlines()
        raise TrialAborted("environment", str(exc)) from None


@functools.cache
def node_folder() -> str:
    """A folder holding the worker's `node` (a hard link, else a copy), which the agent CLIs of
    node_modules run with in any glibc image; "" when the worker has no node."""
    found = shutil.which("node")
    if not found:
        return ""
    binary = Path(found).resolve()
    stage = Path(settings.SANDBOX_ROOT) / "runtimes" / f"node-{binary.stat().st_mtime_ns}"
    if not (stage / "node").exists():
        stage.mkdir(parents=True, exist_ok=True)
        os.chmod(stage.parent, 0o711)
        os.chmod(stage, 0o755)
        partial = stage / f".node.{os.getpid()}"
        try:
            os.link(binary, partial)
        except OSError:
            shutil.copy2(binary, partial)
        os.chmod(partial, 0o755)
        os.replace(partial, stage / "node")
    return str(stage)


def runtime_mounts(node: str) -> list[Mount]:
    """The worker's runtimes, read-only at their own paths (a copy any uid can reach when the
    folder is not), and the folder of its node."""
    stage_root = Path(settings.SANDBOX_ROOT) / "runtimes"
    mounts = []
    for folder in runtime_dirs():
        source = folder if searchable_by_others(folder) else staged(folder, stage_root)
        mounts.append(Mount(folder, source=source))
    if node:
        mounts.append(Mount(Path(node)))
    return mounts


# --- after the agent ----------------------------------------------------------------------------


def reference_script_mounts(box: TrialSandbox, reference: Path) -> list[Mount]:
    """The reference folder at /solution (a copy the script may change) for its script."""
    copy = box.root / "solution"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(reference, copy, symlinks=True)
    _give(copy, box)
    return [Mount(SOLUTION, writable=True, source=copy)]


@dataclass
class VerifierRun:
    rewards: dict[str, float]
    details: dict


def run_verifier(box: TrialSandbox, params: dict) -> VerifierRun:
    """Harbor's verifier in the trial's container (see `specs.criteria.Verifier`): raises
    ValueError when it leaves no usable reward (the criterion's error, never a score)."""
    bundle_dir, yaml_dir = box.origin("success_criteria")
    tests = (bundle_dir / yaml_dir / params.get("tests_dir", "tests")).resolve()
    if not tests.is_relative_to(bundle_dir.resolve()) or not tests.is_dir():
        raise ValueError(f"tests_dir {params.get('tests_dir')!r} is not a folder of the task")
    copy = box.root / "verifier-tests"
    logs = box.root / "verifier-logs"
    for folder in (copy, logs):
        shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(tests, copy, symlinks=True)
    logs.mkdir()
    (logs / "verifier").mkdir()
    for folder in (copy, logs):
        _give(folder, box)
    script = PurePosixPath(TESTS) / str(params.get("script") or "test.sh")
    timeout = float(params.get("timeout") or 600)
    user = params.get("user")
    result = box.run(
        ["bash", str(script)],
        limits=box.limits(Phase.GRADING, timeout),
        env={str(key): str(value) for key, value in (params.get("env") or {}).items()},
        mounts=[Mount(TESTS, writable=True, source=copy), Mount(LOGS, writable=True, source=logs)],
        user=None if user is None else str(user),
    )
    details = {
        "script": str(script),
        "exit_code": result.exit_code,
        "stdout": result.stdout[-4000:],
        "stderr": result.stderr[-4000:],
    }
    if result.timed_out:
        raise ValueError(
            f"the verifier ran past its timeout of {timeout:.0f} s (Harbor's VerifierTimeoutError)"
        )
    reward_json = _read(logs / "verifier" / "reward.json")
    rewards = verifier_rewards(reward_json, _read(logs / "verifier" / "reward.txt"))
    return VerifierRun(rewards, {**details, "reward_json": reward_json is not None})


def _read(path: Path) -> bytes | None:
    """A reward file the verifier wrote (never through a link it planted), capped."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ValueError(f"{path.name} cannot be read: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as handle:
        if not os.path.isfile(f"/proc/self/fd/{handle.fileno()}"):
            raise ValueError(f"{path.name} is not a plain file")
        data = handle.read(REWARD_CAP + 1)
    if len(data) > REWARD_CAP:
        raise ValueError(f"{path.name} is larger than {REWARD_CAP >> 10} KiB")
    return data


def _give(folder: Path, box: TrialSandbox) -> None:
    """A folder the container's user works in: owned by it (its uid on the host)."""
    uid = box.paths.uid
    os.chmod(folder, 0o755)
    if uid is None:
        return
    for dirpath, dirnames, filenames in os.walk(folder):
        os.chown(dirpath, uid, uid)
        for name in [*dirnames, *filenames]:
            os.lchown(os.path.join(dirpath, name), uid, uid)
