"""A trial's sandbox as the runner, the suite and a re-grade use it: the sandbox object of the
task's driver (`runs_app.engine.sandbox`) in a fresh folder of the host, the task's bundles,
the environment the task builds (template sources, venv, env_packages), and one way to run a
command of a phase, with that phase's limits and mounts:

- setup, pre_run, hooks and post_run see the workspace, HOME, /tmp and the host's task
  environments;
- the agent sees its script, if any, and reaches its model through its gateway only;
- grading (run_command criteria) sees nothing the agent left outside the workspace: each
  command gets an empty HOME and /tmp, no user site-packages, and the task's environment as the
  task built it (its venv, mounted read-only over the workspace's `.venv` whatever the agent did
  to it, first on PATH; the env_packages' own folders); it also sees the task's files
  ($TASK_DIR) without the reference solution. The reference ($REFERENCE_DIR) is mounted only
  into a command that names it (coder-eval's `diff "$REFERENCE_DIR/x" out.txt`), which then
  sees the workspace read-only.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import uuid
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any

from django.conf import settings
from django.core.files.base import ContentFile
from django.core.files.storage import default_storage
from django.utils import timezone

from runs_app.engine import bundle_cache, criteria, gateway, hosts, identity, trial_container
from runs_app.engine.leases import release_connection
from runs_app.engine.outcome import TrialAborted
from runs_app.engine.sandbox import (
    Caps,
    DiskCap,
    Limits,
    Mount,
    Phase,
    ProcessResult,
    Sandbox,
    SandboxError,
    SandboxPaths,
    SandboxUnavailable,
    discard,
    environments,
    open_sandbox,
    phase_limits,
    workspace,
)
from runs_app.engine.sandbox.bubblewrap.command import bwrap_binary
from runs_app.models import Run, Trial

logger = logging.getLogger(__name__)

VENV_DIRNAME = ".venv"  # coder-eval's name; artifacts leave it out
# A command naming $REFERENCE_DIR (or ${REFERENCE_DIR}) compares with the reference solution.
REFERENCE_TOKEN = "REFERENCE_DIR"
GIT_TIMEOUT = 120.0


def shim_interpreter() -> str:
    """The Python a record_cli shim runs with: the system's, which every sandbox sees read-only
    (the worker's own may live where a sandbox cannot look)."""
    system = shutil.which("python3", path="/usr/bin:/bin")
    return os.path.realpath(system or sys.executable)


def host_folder(name: str) -> Path:
    """A fresh folder for a sandbox under TRIAL_ROOT (whose mode lets sandbox uids reach it)."""
    root = Path(settings.TRIAL_ROOT)
    missing = [folder for folder in [*reversed(root.parents), root] if not folder.exists()]
    for folder in missing:  # the worker's umask may be 077: what it makes, sandbox uids must cross
        folder.mkdir(exist_ok=True)
        os.chmod(folder, 0o711)
    os.chmod(root, 0o711)
    return root / f"{name}-{uuid.uuid4().hex[:8]}"


def open_host_sandbox(
    root: Path, caps: Caps, *, shared: list[Mount] | None = None, env: dict[str, str] | None = None
) -> Sandbox:
    """A started sandbox of the host's driver in `root`, its folders capped by `caps`."""
    box = open_sandbox(
        "bubblewrap",
        root,
        stage_root=Path(settings.SANDBOX_ROOT) / "runtimes",
        shared=shared or [],
        env=env,
        disk=DiskCap(caps.disk_bytes, caps.max_inodes),
    )
    box.start()
    return box


def host_caps(config: dict) -> Caps:
    """A trial's caps: its `sandbox.limits` over the host's defaults."""
    box = (config.get("sandbox") or {}).get("limits") or {}
    return Caps(
        memory_bytes=int(box.get("max_memory_mb") or settings.SANDBOX_MEMORY_MB) << 20,
        disk_bytes=int(box.get("max_disk_mb") or settings.SANDBOX_DISK_MB) << 20,
        max_processes=int(box.get("max_pids") or 512),
        max_inodes=int(box.get("max_inodes") or settings.SANDBOX_INODES),
        agent_output_bytes=settings.AGENT_OUTPUT_CAP_BYTES,
    )


class TrialSandbox:
    """One trial's sandbox (see the module docstring). `should_stop` is polled while its
    commands run (the trial's cancel, its lease, its transcript)."""

    def __init__(self, trial: Trial, config: dict, should_stop: Callable[[], str | None]):
        self.trial = trial
        self.config = config
        self.should_stop = should_stop
        self.caps = host_caps(config)
        # The run's suite folder (hooks.suite), which every command of the trial reads.
        ready = trial.run.suite_status == Run.Suite.READY and trial.run.suite_dir
        self.suite_dir = Path(trial.run.suite_dir) if ready else None
        self.box: Sandbox | None = None
        self.task_bundle_dir = Path()
        self.task_yaml_dir = "."
        self.experiment_bundle_dir: Path | None = None
        self.experiment_yaml_dir = "."
        # What run_command criteria get of the task's environment (coder-eval: the venv and
        # node_modules/.bin first on PATH, VIRTUAL_ENV).
        self.venv_env: dict[str, str] = {}
        # The host's task environments (env_packages) every command sees.
        self.env_mounts: list[Mount] = []
        # The task's venv as the task built it, outside the workspace: grading mounts it over the
        # workspace's `.venv` (which the agent may have changed). None: the task has no venv.
        self.grading_venv: Path | None = None
        # A command of some phase found the trial at its disk or inode cap, and was stopped.
        self.over_disk = False
        # What the trial's environment is made of, by component (`identity`): the task's
        # env_packages environments here; the driver's own are added by `environment_components`.
        self.environment: dict[str, str] = {}
        # A container task's (`trial_container`): its image, what getting it printed, whether
        # the workspace is the image's own folder, the runtimes its agent's command sees.
        self.container = hosts.runs_in_container(config)
        self.image: trial_container.images.TaskImage | None = None
        self.image_build = trial_container.ImageBuild()
        self.in_image = False
        self.runtime_mounts: list[Mount] = []

    @property
    def paths(self) -> SandboxPaths:
        if self.box is None:
            raise TrialAborted("harness", "the trial's sandbox is not open")
        return self.box.started

    @property
    def root(self) -> Path:
        return self.paths.root

    @property
    def workspace(self) -> Path:
        """Where the engine reads the trial's files (snapshots, criteria, artifacts): the
        workspace, or the host's copy of the image's folder (`pull_workspace`)."""
        return self.paths.root / "mirror" if self.in_image else self.paths.workspace

    def pull_workspace(self) -> Path:
        """The image's folder copied out to `workspace` (a no-op for a mounted workspace)."""
        if self.in_image:
            assert isinstance(self.box, trial_container.container.ContainerSandbox)
            self.box.pull_workspace(into=self.workspace)
        return self.workspace

    def working_directory(self) -> Path:
        """The folder the trial's commands run in, as they see it: the workspace, or in a
        container its workdir (the image's folder, or where the workspace is mounted)."""
        assert self.box is not None
        if self.container:
            assert isinstance(self.box, trial_container.container.ContainerSandbox)
            return self.box.cwd
        return self.paths.workspace

    def command_folder(self, relative: Path) -> Path:
        """Where commands see a folder of the workspace (the image's folder, or the mount)."""
        assert self.box is not None
        if self.in_image:
            assert isinstance(self.box, trial_container.container.ContainerSandbox)
            return self.box.cwd / relative
        return self.paths.workspace / relative

    def container_path_variable(self) -> str:
        """The PATH commands of the trial's container start from (the image's, the node first)."""
        assert self.box is not None
        return self.box.env.get("PATH") or trial_container.DEFAULT_PATH

    def push_workspace(self) -> None:
        """What the engine wrote in `paths.workspace` (template sources, a reference, an agent's
        prompt file) copied into the image's folder, owned by the container's user; the host
        folder is then emptied for the next push."""
        if not self.in_image:
            return
        assert isinstance(self.box, trial_container.container.ContainerSandbox)
        paths = self.paths
        if paths.uid is not None:
            workspace.chown_tree(paths.workspace, paths.uid, paths.uid)
        self.box.push_workspace()
        for entry in paths.workspace.iterdir():
            if entry.is_dir() and not entry.is_symlink():
                workspace.remove_tree(entry)
            else:
                entry.unlink()

    # --- building it ----------------------------------------------------------------------------

    def open(self, experiment: dict, purpose: str = "trial") -> None:
        """The trial's sandbox, started, and its task (and experiment) bundle, unpacked once per
        host. `experiment` is the run's frozen experiment settings (its bundle and YAML path);
        `purpose` names its folder (a re-grade's is not a running trial's, which sweeps check)."""
        shared = [Mount(self.suite_dir)] if self.suite_dir else []
        env = {
            "EVALSITE_TRIAL_ID": str(self.trial.pk),
            **({"EVALSITE_SUITE_DIR": str(self.suite_dir)} if self.suite_dir else {}),
        }
        version = self.trial.task_version
        self.task_bundle_dir = bundle_cache.unpacked(version.bundle_id)
        self.task_yaml_dir = str(PurePosixPath(version.yaml_path).parent)
        if experiment.get("bundle"):
            self.experiment_bundle_dir = bundle_cache.unpacked(experiment["bundle"])
            self.experiment_yaml_dir = str(PurePosixPath(experiment.get("yaml_path") or ".").parent)
        root = host_folder(f"{purpose}-{self.trial.pk}-a{self.trial.attempt}")
        if self.container:
            self.box = trial_container.open_container(self, root, shared, env)
        else:
            self.box = open_host_sandbox(root, self.caps, shared=shared, env=env)
        self.box.shared.insert(0, Mount(self.box.started.home, writable=True))

    def apply_template_sources(self) -> None:
        sources = (self.config.get("sandbox") or {}).get("template_sources") or []
        for index, source in enumerate(sources):
            bundle_dir, yaml_dir = self.origin(f"sandbox.template_sources[{index}]")
            workspace.materialize(
                self.paths.workspace, [source], bundle_dir, yaml_dir, ignore_patterns=self.ignore_patterns(),
                first_index=index, git=self._git,
            )  # fmt: skip
        if sources:
            self.push_workspace()

    def write_cli_recorders(self) -> None:
        """coder-eval's `sandbox.record_cli`: a recording shim per tool in the workspace's
        `cli_mocks/` (the agent's PATH starts there), and the empty log `cli_called` reads."""
        box = self.config.get("sandbox") or {}
        if not box.get("record_cli"):
            return
        workspace_dir = self.paths.workspace
        mock_dirs = [workspace_dir / folder for folder in box.get("mock_path_dirs") or []]
        try:
            criteria.cli.write_recorders(workspace_dir, box["record_cli"], shim_interpreter(), mock_dirs)
        except ValueError as exc:
            raise TrialAborted("setup", f"sandbox.record_cli: {exc}") from None

    def provide_environment(self) -> None:
        """coder-eval's per-sandbox virtualenv (`sandbox.python`, on unless null): `.venv` in the
        workspace, with system site packages, first on the PATH of run_command criteria (not of
        pre_run, post_run or the agent, as in coder-eval 0.12.16). It is made like one template
        venv per host (a venv of symlinks and a pyvenv.cfg, from its listing), not by `python -m
        venv`. The `env_packages` of `sandbox.python` and `sandbox.node` come from environments
        built on the host once per requirement set and mounted read-only (`environments`)."""
        if self.container:
            return  # the image is the environment (env_packages are refused for containers)
        box = self.config.get("sandbox") or {}
        root = Path(settings.SANDBOX_ROOT)
        path = [os.environ.get("PATH", os.defpath)]
        try:
            node_env = (box.get("node") or {}).get("env_packages") and environments.node_packages(
                root, list(box["node"]["env_packages"])
            )
            python = box.get("python", {})
            python_env = (
                python is not None
                and python.get("env_packages")
                and environments.python_packages(root, list(python["env_packages"]))
            )
        except environments.InstallError as exc:
            raise TrialAborted(
                "setup", f"installing the task's env_packages on the worker host: {exc}"
            ) from None
        paths = self.paths
        if node_env:
            self.environment["env.node"] = node_env.name
            self._share(Mount(node_env))
            link = paths.workspace / "node_modules"
            if not link.exists():
                link.symlink_to(node_env / "node_modules")
            # The environment's own folder, not the workspace's link (the agent may replace it).
            path.insert(0, str(node_env / "node_modules" / ".bin"))
            self.venv_env |= {"NODE_PATH": "", "NPM_CONFIG_PREFIX": str(paths.home / ".npm-prefix")}
        if python is not None:
            target = paths.workspace / VENV_DIRNAME
            if python_env:
                self.environment["env.python"] = python_env.name
                self._share(Mount(python_env))
            if not target.exists():
                environments.new_venv(root, target, owner=paths.uid)
                if python_env:
                    environments.link_python_packages(target, python_env)
                    if paths.uid is not None:
                        workspace.chown_tree(target, paths.uid, paths.uid)
            self.grading_venv = paths.root / "grading-venv"
            if not self.grading_venv.exists():
                environments.new_venv(root, self.grading_venv)
                if python_env:
                    environments.link_python_packages(self.grading_venv, python_env)
                environments.readable_by_all(self.grading_venv)
            path.insert(0, str(target / "bin"))
            self.venv_env["VIRTUAL_ENV"] = str(target)
        if len(path) > 1:
            self.venv_env["PATH"] = os.pathsep.join(path)

    def environment_components(self) -> dict[str, str]:
        """The trial's environment, component by component: the namespace driver's (bubblewrap
        and the system it shows) and the task's environments; a container's image instead."""
        if self.container:
            image = self.image.digest if self.image is not None else "not had"
            return {"sandbox": "docker", "image": image, **self.environment}
        try:
            driver = identity.sandbox_environment(bwrap_binary())
        except SandboxUnavailable:
            driver = {"sandbox": "bubblewrap not installed"}
        return {**driver, **self.environment}

    def _share(self, mount: Mount) -> None:
        self.env_mounts.append(mount)
        assert self.box is not None
        self.box.shared.append(mount)

    # --- where the task's files are ---------------------------------------------------------------

    def origin(self, lineage_key: str) -> tuple[Path, str]:
        """Where a relative path of this config field resolves: the task's YAML folder, or
        the experiment's when an experiment, variant or override layer set it."""
        layer = self.trial.lineage.get(lineage_key, "task")
        if layer in ("experiment", "variant", "override") and self.experiment_bundle_dir is not None:
            return self.experiment_bundle_dir, self.experiment_yaml_dir
        return self.task_bundle_dir, self.task_yaml_dir

    @property
    def task_dir(self) -> Path:
        return self.task_bundle_dir / self.task_yaml_dir

    def reference_dir(self) -> Path | None:
        reference = self.config.get("reference") or {}
        directory = reference.get("directory") if isinstance(reference, dict) else None
        if not directory:
            return None
        bundle_dir, yaml_dir = self.origin("reference.directory")
        folder = (bundle_dir / yaml_dir / directory).resolve()
        if not folder.is_relative_to(bundle_dir.resolve()):
            # An override could name any folder of the worker; the oracle would copy it in.
            raise TrialAborted("setup", f"reference.directory {directory!r} leaves the task's bundle")
        return folder

    def ignore_patterns(self) -> list[str]:
        return list((self.config.get("sandbox") or {}).get("ignore_patterns") or [])

    # --- running commands -------------------------------------------------------------------------

    def limits(self, phase: Phase, wall_seconds: float) -> Limits:
        return phase_limits(phase, self.caps, wall_seconds)

    def run_command(
        self, command: str, timeout: float, phase: Phase = Phase.GRADING
    ) -> criteria.CommandOutcome:
        """A shell command of the task in the trial's sandbox (pre_run, hooks, post_run,
        run_command criteria). Grading's are steered by nothing the agent left (see the module
        docstring)."""
        if phase == Phase.GRADING:
            result = self._grading_command(command, timeout)
        else:
            result = self.run(command, limits=self.limits(phase, timeout))
        exit_code = result.exit_code if result.exit_code is not None else 128 + (result.signal or 9)
        return criteria.CommandOutcome(exit_code, result.stdout, result.stderr, result.timed_out)

    def _grading_command(self, command: str, timeout: float) -> ProcessResult:
        """A run_command criterion (coder-eval: the venv, node_modules/.bin and TASK_DIR are
        run_command's only)."""
        mounts = [Mount(self.task_bundle_dir)]
        env = {**self.venv_env, "TASK_DIR": str(self.task_dir), "PYTHONNOUSERSITE": "1"}
        reference = self.reference_dir()
        if reference is not None and REFERENCE_TOKEN in command:
            env["REFERENCE_DIR"] = str(reference)
            mounts.append(Mount(self.paths.workspace))  # read-only: nothing it runs may change it
        elif reference is not None and reference.is_relative_to(self.task_bundle_dir.resolve()):
            mounts.append(Mount(reference, hidden=True))
        if self.grading_venv is not None:
            mounts.append(Mount(self._venv_mount_point(), source=self.grading_venv))
        limits = self.limits(Phase.GRADING, timeout)
        return self.run(command, limits=limits, env=env, mounts=mounts, fresh_home=True)

    def _venv_mount_point(self) -> Path:
        """The workspace's `.venv` as a plain folder, whatever the agent made of it (a link, a
        file, nothing), for the task's venv to be mounted over."""
        target = self.paths.workspace / VENV_DIRNAME
        if target.is_symlink() or (target.exists() and not target.is_dir()):
            target.unlink()
        if not target.exists():
            target.mkdir()
        return target

    def run(
        self,
        argv: list[str] | str,
        *,
        limits: Limits,
        env: dict[str, str] | None = None,
        mounts: list[Mount] | None = None,
        via: gateway.Gateway | None = None,
        user: str | None = None,
        **options: Any,
    ) -> ProcessResult:
        """One command in the trial's sandbox with `limits`, `env` and `mounts` besides the
        trial's own; with `via`, behind that gateway (the forwarder on the sandbox's loopback,
        its socket mounted)."""
        mounts = list(mounts or [])
        env = dict(env or {})
        if self.in_image:  # the agent's files were staged in the host folder, pushed to the image's
            assert isinstance(self.box, trial_container.container.ContainerSandbox)
            staging, folder = str(self.paths.workspace), str(self.box.cwd)
            env = {key: folder + value[len(staging) :] if value.startswith(staging) else value
                   for key, value in env.items()}  # fmt: skip
        if via is not None:
            forwarder = gateway.forwarder(Path(settings.SANDBOX_ROOT), static=self.container)
            argv = gateway.wrap_command(list(argv), via.socket_path, forwarder)
            mounts += [Mount(via.socket_path), Mount(forwarder)]
            if self.paths.uid is not None:
                os.chown(via.socket_path, self.paths.uid, self.paths.uid)
            env = {**via.sandbox_env(), **env}
        options.setdefault("should_stop", self._should_stop)
        if user is not None:  # a verifier's own user: containers only (specs refuse it elsewhere)
            options["user"] = user
        release_connection()
        assert self.box is not None
        result = self.box.exec(argv, limits=limits, env=env, mounts=mounts, **options)
        self.disk_exceeded()  # a command that hit the cap and ended before the next poll
        return result

    def _should_stop(self) -> str | None:
        """What stops a command of any phase: the trial's own reasons, or its disk cap."""
        return self.should_stop() or ("disk" if self.disk_exceeded() else None)

    def disk_exceeded(self) -> bool:
        """Whether the trial holds its disk or inode cap (once it did, it stays flagged)."""
        if not self.over_disk and self.box is not None and self.box.disk_exceeded():
            self.over_disk = True
        return self.over_disk

    def _git(self, argv: list[str], timeout: float, host: str) -> tuple[int, str, bool]:
        """git (cloning a repo source) in the trial's sandbox, whose only way out is a CONNECT
        proxy to the repository's `host`; the scrubbed environment, no credentials."""
        proxy = gateway.Gateway(self.root / "git.sock", [], allowed_hosts=[host]).start()
        try:
            limits = self.limits(Phase.SETUP, timeout)
            result = self.run(argv, limits=limits, env={"GIT_TERMINAL_PROMPT": "0"}, via=proxy)
        finally:
            proxy.close()
        return (result.exit_code if result.exit_code is not None else -1), result.stderr, result.timed_out

    # --- files ------------------------------------------------------------------------------------

    def give_workspace_to_sandbox(self) -> None:
        """Files the worker wrote (oracle copies, prompt files) must belong to the sandbox uid."""
        paths = self.paths
        if paths.uid is not None:
            for folder in (paths.workspace, paths.home):
                workspace.chown_tree(folder, paths.uid, paths.uid)
        self.push_workspace()

    def snapshot(self) -> dict:
        return workspace.snapshot(self.pull_workspace(), self.ignore_patterns())

    def save_artifact(self) -> str:
        data = workspace.make_artifact_tarball(self.workspace, self.ignore_patterns())
        name = f"artifacts/run-{self.trial.run_id}/trial-{self.trial.pk}-attempt-{self.trial.attempt}.tar.gz"
        return default_storage.save(name, ContentFile(data))

    def cleanup(self) -> None:
        if self.box is None:
            return
        root = self.box.root
        try:
            self.box.cleanup()
        except Exception:
            logger.exception("could not remove sandbox %s", root)
            shutil.rmtree(root, ignore_errors=True)
        self.box = None


def sweep_sandboxes() -> int:
    """Remove the sandbox folders of trials no worker runs any more (a killed worker leaves its
    trials' folders behind), and of suites no worker holds: at worker start. Returns how many
    were removed."""
    root = Path(settings.TRIAL_ROOT)
    if not root.is_dir():
        return 0
    now = timezone.now()
    removed = 0
    for folder in root.glob("trial-*"):
        parts = folder.name.split("-")  # trial-<id>-a<attempt>-<token>
        live = (
            len(parts) == 4
            and parts[1].isdigit()
            and Trial.objects.filter(
                pk=int(parts[1]), attempt=int(parts[2][1:] or 0), status=Trial.Status.RUNNING,
                lease_expires_at__gt=now,
            ).exists()
        )  # fmt: skip
        if not live:
            discard(folder)
            removed += 1
    for folder in root.glob("suite-*"):  # a run's suite folder, while its holder renews the lease
        held = Run.objects.filter(
            suite_dir=str(folder / "workspace"), suite_lease_expires_at__gt=now
        ).exists()  # fmt: skip
        if not held:
            discard(folder)
            removed += 1
    return removed + _reap_containers()


def _reap_containers() -> int:
    """Containers a dead worker of this host left whose folder is gone (the folders' own are
    removed with them above): none when the host runs no container engine."""
    if settings.CONTAINER_ENGINE == "none" or not Path(settings.DOCKER_CLI).exists():
        return 0
    try:
        return len(trial_container.container.reap())
    except (SandboxError, SandboxUnavailable) as exc:
        logger.warning("could not list the containers of dead workers: %s", exc)
        return 0
