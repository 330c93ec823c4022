"""The container driver: one container per trial, from the task's image, every command of the
trial a `docker exec` into it under the host's process control (`process`). Root workers only.

1. `start()` makes the trial's folders on the host (`workspace.layout`, on a tmpfs with the
   trial's disk and inode caps) and starts the container: `--network none`, the task's user
   (by default the uid leased to the trial), no capabilities (root: only what package installs
   need, `command.ROOT_CAPABILITIES`), no-new-privileges, Docker's seccomp profile, the trial's
   memory, CPUs and pids, a read-only system unless the agent works inside the image, and a
   static PID 1 (`box.c`) that idles. Labels name the trial folder and the worker (`reap`).
2. Mounts: every mount of a command (the workspace at the workdir, /tmp, HOME, the runtimes,
   the gateway's socket, grading's task folder...) is made by the host under the container's
   mount roots, empty skeleton folders that propagate into the container (`mounts`): a phase's
   mounts appear for its command and go after it, read-only ones read-only from the start,
   hidden ones an empty tmpfs. So grading sees the task's files and the agent never does, and a
   command naming the reference sees the workspace read-only, as under bubblewrap.
3. `exec` runs the command under `box run` (its phase's rlimits), lowers the container's pids
   and memory caps to the phase's for its time, and when the client ends (the command's end,
   its wall clock, a stop) ends every process of the container but PID 1 (a grace period after
   SIGTERM when stopped): nothing an agent starts outlives its phase, like a bubblewrap PID
   namespace. Commands of one sandbox run one at a time.
4. `cleanup()` removes the container and its anonymous volumes (`rm -f -v`), the mounts, the
   folders and the leased uid, whatever happened; `reap()` removes what a dead worker left.

With `in_image`, the workspace is the image's own folder (Harbor's /app): files are read and
written through the container's root, beneath that folder (`read_file`, `write_file`), and
`pull_workspace()` copies it to the host's `paths.workspace` for snapshots, diffs and artifacts.
The layer it lives in has no kernel cap here (overlay2 on ext4 takes no `--storage-opt size`):
its size is walked with the trial's disk cap, like a non-root worker's folders. Elsewhere the
workspace may be mounted at another path than its host one (`workdir`): `command_path` says
where commands see a host path.

Root in the container is root on the host unless the engine remaps users (dockerd
`--userns-remap`, a daemon-wide setting): either way the folders belong to the container user's
ids on the host (its PID 1's), and the container holds no capability beyond the list above, no
new privileges, no engine socket, no network.

Pure Python, Linux only, no Django.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import secrets
import socket
import stat
import subprocess
import tarfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from runs_app.engine.sandbox import containment, filesystem, process, workspace
from runs_app.engine.sandbox.base import (
    Limits,
    Mount,
    ProcessResult,
    Sandbox,
    SandboxError,
    SandboxPaths,
    SandboxUnavailable,
)
from runs_app.engine.sandbox.docker import command
from runs_app.engine.sandbox.docker import mounts as host_mounts
from runs_app.engine.sandbox.docker.cgroup import ContainerCgroup, host_identity, init_pid_of

__all__ = [
    "ContainerSandbox",
    "Leftover",
    "Resources",
    "ImageConfig",
    "containers",
    "discard",
    "image_config",
    "reap",
    "unavailable",
    "worker_id",
]

TMP = Path("/tmp")
# The client's own process caps: a Go program with a few dozen threads.
CLIENT_PROCESSES = 256


@dataclass(frozen=True)
class Resources:
    """The container's caps, held for the trial (None: the engine's default, no cap)."""

    memory_bytes: int | None = None
    cpus: float | None = None
    pids: int | None = None


@dataclass(frozen=True)
class ImageConfig:
    """What an image says of itself: its USER ("" for root), WORKDIR ("" for /), ENV, labels."""

    user: str
    workdir: str
    env: dict[str, str]
    labels: dict[str, str]
    id: str = ""  # the engine's id of the image (`sha256:...`)


def image_config(image: str) -> ImageConfig:
    """`docker image inspect`: what the engine reads before it opens a sandbox of the image
    (coder-eval's images name their user and workdir, Harbor's their folder)."""
    inspected = json.loads(command.call(["image", "inspect", image]))[0]
    found = inspected.get("Config") or {}
    env = dict(item.split("=", 1) for item in found.get("Env") or [] if "=" in item)
    return ImageConfig(
        found.get("User") or "",
        found.get("WorkingDir") or "",
        env,
        found.get("Labels") or {},
        inspected.get("Id", ""),
    )


def unavailable() -> str | None:
    """Why this worker cannot run container sandboxes, or None when it can (a worker says so
    before it takes container trials; tests skip with it)."""
    if os.geteuid() != 0:
        return "the container driver runs on root workers only"
    problem = host_mounts.unsupported()
    if problem:
        return problem
    try:
        command.docker_binary()
        command.call(["version", "--format", "{{.Server.Version}}"], timeout=15)
    except (SandboxError, SandboxUnavailable) as exc:
        return f"no container engine answers here (`make containers` starts dockerd): {exc}"
    return None


def worker_id() -> str:
    """This worker process as the containers it starts name it: "<host>:<pid>"."""
    return f"{socket.gethostname()}:{os.getpid()}"


class ContainerSandbox(Sandbox):
    driver = "docker"

    def __init__(
        self,
        root: Path,
        *,
        stage_root: Path | None = None,
        shared: Sequence[Mount] = (),
        env: Mapping[str, str] | None = None,
        disk: filesystem.DiskCap | None = None,
        image: str = "",
        user: str | None = None,
        workdir: str | PurePosixPath | None = None,
        in_image: bool = False,
        resources: Resources | None = None,
        mount_roots: Sequence[str | PurePosixPath] = (),
    ):
        """`image`: a local image reference. `user`: who runs every command ("root", "1000",
        "1000:1000", a name of the image), by default the uid leased to the trial. `workdir`:
        where commands run: the workspace's place in the container (default: its host path),
        or, `in_image`, the image's own folder that is the workspace. `mount_roots`: container
        folders (besides /tmp, the workdir, the host's sandbox folders and the shared mounts)
        under which phases mount things later (Harbor's /tests, /solution, /logs)."""
        super().__init__(root.absolute(), shared=shared, env=env)
        if not image:
            raise SandboxError("the container driver needs an image")
        if in_image and workdir is None:
            raise SandboxError("in_image: name the image's folder that is the workspace (workdir)")
        self.image = image
        self.user = user
        self.workdir = PurePosixPath(workdir) if workdir is not None else None
        self.in_image = in_image
        self.resources = resources or Resources()
        self.stage_root = stage_root
        self.disk = disk
        self.extra_roots = [PurePosixPath(folder) for folder in mount_roots]
        self.name = f"evalsite-{self.root.name}"
        self.cgroup: ContainerCgroup | None = None
        self.disk_watch: filesystem.DiskWatch | None = None
        self._lock = threading.Lock()
        self._roots: list[tuple[Path, Path]] = []  # (container folder, its skeleton folder), deepest first
        self._placed: list[tuple[Mount, host_mounts.Placed]] = []
        self._leased: int | None = None
        self._layer: Path | None = None  # the container's writable layer on the host, if written
        self._layer_usage = (0, 0)
        self._next_layer_walk = 0.0

    # --- life cycle -------------------------------------------------------------------------------

    def start(self) -> SandboxPaths:
        if self.paths is not None:
            return self.paths
        if os.geteuid() != 0:
            raise SandboxUnavailable(
                "the container driver runs on root workers only: it mounts each phase's folders "
                "into the trial's container"
            )
        command.docker_binary()
        if self.root.is_relative_to(TMP):
            raise SandboxError(
                f"{self.root}: a container trial's folder must not be under /tmp (its own /tmp hides it)"
            )
        self.root.mkdir(parents=True)
        try:
            self._start()
        except BaseException:
            with contextlib.suppress(Exception):
                self.cleanup()
            raise
        assert self.paths is not None
        return self.paths

    def _start(self) -> None:
        if self.disk is not None and filesystem.mount_capped(self.root, self.disk):
            self.disk_watch = filesystem.DiskWatch(self.root, self.disk, True)
        elif self.disk is None:
            host_mounts.bind_onto_itself(self.root)  # nosuid, nodev: as the capped tmpfs is
        else:
            raise SandboxUnavailable("this worker cannot mount the trial's file system (no CAP_SYS_ADMIN)")
        paths = workspace.layout(self.root)
        self._leased = paths.uid
        control = self.root / "control"
        control.mkdir(mode=0o700)
        skeleton = self.root / "mounts"
        skeleton.mkdir(mode=0o700)
        host_mounts.make_skeleton(skeleton)
        for index, folder in enumerate(self._mount_roots(paths.workspace)):
            (skeleton / str(index)).mkdir()
            os.chmod(skeleton / str(index), 0o711)  # whatever the worker's umask
            self._roots.append((folder, skeleton / str(index)))
        self._roots.sort(key=lambda pair: len(pair[0].parts), reverse=True)
        labels = {command.LABEL: "1", command.ROOT_LABEL: str(self.root), command.WORKER_LABEL: worker_id()}
        started = command.call(
            command.run_args(
                name=self.name, image=self.image, user=self.user or f"{paths.uid}:{paths.uid}", labels=labels,
                memory_bytes=self.resources.memory_bytes, cpus=self.resources.cpus, pids=self.resources.pids,
                read_only=not self.in_image,
                skeletons=[(source, PurePosixPath(target)) for target, source in self._roots],
                workdir=self.workdir if self.in_image else None,
            )
        )  # fmt: skip
        # Its PID 1 from its cgroup, without a round trip to the engine (a tenth of a trial's
        # cost); the engine is asked when that fails, and for the writable layer of an image's folder.
        init_pid = init_pid_of(started.decode().strip().splitlines()[-1]) if not self.in_image else None
        if init_pid is None:
            found = json.loads(command.call(["inspect", "--type", "container", self.name]))[0]
            init_pid = int(found["State"]["Pid"])
            if self.in_image and found.get("GraphDriver", {}).get("Data", {}).get("UpperDir"):
                self._layer = Path(found["GraphDriver"]["Data"]["UpperDir"])
        self.cgroup = ContainerCgroup(init_pid)
        uid, gid = host_identity(init_pid)
        for folder in (paths.workspace, paths.home, paths.tmp):
            os.chown(folder, uid, gid)
        self.paths = dataclasses.replace(paths, uid=uid)
        self._mount(self._stack(paths.tmp, self.shared, ()))

    def _mount_roots(self, host_workspace: Path) -> list[Path]:
        """The container's folders under which mounts are made: the outermost of /tmp, the
        workdir, the host's sandbox folders, `mount_roots` and the shared mounts' paths."""
        wanted = [TMP, self.root.parent, *(Path(folder) for folder in self.extra_roots)]
        if self.stage_root is not None:
            wanted.append(self.stage_root.absolute().parent)
        if not self.in_image:
            wanted.append(Path(self.workdir or host_workspace))
        wanted += [self._container_path(mount.path, host_workspace) for mount in self.shared]
        kept: list[Path] = []
        for folder in sorted(set(wanted), key=lambda path: len(path.parts)):
            if not folder.is_absolute() or folder == Path("/"):
                raise SandboxError(
                    f"{folder}: a container's mount root must be an absolute folder other than /"
                )
            if not any(folder.is_relative_to(outer) for outer in kept):
                kept.append(folder)
        return kept

    def stop(self) -> None:
        if self.cgroup is not None:
            self.cgroup.kill_all()

    def cleanup(self) -> None:
        """Remove the container (and its anonymous volumes), the mounts, the folders and the
        leased uid; whatever state the sandbox is in, as often as called."""
        failure: Exception | None = None
        try:
            remove_container(self.name)
        except SandboxError as exc:
            failure = exc
        self.cgroup = None
        for _, placed in reversed(self._placed):
            with contextlib.suppress(SandboxError):
                host_mounts.remove(placed)
        self._placed.clear()
        self._roots.clear()
        if self._leased is not None:
            containment.release_sandbox_uid(self._leased)
            self._leased = None
        _remove_folder(self.root)
        self.paths = None
        if failure is not None:
            raise failure

    def disk_exceeded(self) -> bool:
        if self.disk_watch is not None and self.disk_watch.exceeded():
            return True
        if self._layer is None or self.disk is None:
            return False
        if time.monotonic() >= self._next_layer_walk:
            self._layer_usage = filesystem.tree_usage(self._layer)
            self._next_layer_walk = time.monotonic() + filesystem.WALK_EVERY_SECONDS
        used, inodes = self._layer_usage
        if self.disk_watch is not None:
            folders = self.disk_watch.usage()
            used, inodes = used + folders[0], inodes + folders[1]
        return used >= self.disk.bytes or inodes >= self.disk.inodes

    # --- commands ---------------------------------------------------------------------------------

    def environment(self, extra: Mapping[str, str] | None = None, home: Path | None = None) -> dict[str, str]:
        """HOME (the sandbox's, or `home`), TMPDIR, the sandbox's own variables, then `extra`:
        over the image's environment, never the worker's (its PATH means nothing in the image)."""
        paths = self.started
        env = {"HOME": str(home or paths.home), "TMPDIR": str(TMP), "TMP": str(TMP), "TEMP": str(TMP)}
        return {**env, **self.env, **(extra or {})}

    @property
    def cwd(self) -> Path:
        """Where commands run in the container."""
        return Path(self.workdir or self.started.workspace)

    def exec(
        self,
        argv: list[str] | str,
        *,
        limits: Limits,
        env: Mapping[str, str] | None = None,
        mounts: Sequence[Mount] = (),
        stdin: bytes | None = None,
        on_stdout_line: Callable[[str], None] | None = None,
        should_stop: Callable[[], str | None] | None = None,
        poll_interval: float = 0.25,
        fresh_home: bool = False,
        user: str | None = None,
    ) -> ProcessResult:
        """As `Sandbox.exec`; `user`: who runs it, when not the container's user (a verifier
        that names its own)."""
        paths = self.started
        args = ["/bin/sh", "-c", argv] if isinstance(argv, str) else list(argv)
        with self._lock:
            cgroup = self.cgroup
            assert cgroup is not None
            home, tmp, shared, scratch = paths.home, paths.tmp, list(self.shared), None
            if fresh_home:
                scratch = self._scratch()
                home, tmp = scratch / "home", scratch / "tmp"
                shared = [mount for mount in shared if mount.path != paths.home] + [
                    Mount(home, writable=True)
                ]
            env_file = self.root / "control" / f"env-{secrets.token_hex(4)}"
            result: ProcessResult | None = None
            oom_before = cgroup.oom_kills()
            try:
                self._mount(self._stack(tmp, shared, mounts))
                inline = command.write_env_file(env_file, self.environment(env, home=home))
                options = process._launch_options(None, process._rlimits(limits, None, False), [])
                client = command.exec_args(
                    name=self.name, argv=args, workdir=PurePosixPath(self.cwd), env_file=env_file,
                    inline_env=inline, limit_options=options, stdin=stdin is not None, user=user,
                )  # fmt: skip
                with self._phase_caps(cgroup, limits):
                    result = process.run(
                        client, cwd=self.root / "control", env=command.client_env(), identity=None,
                        limits=_client_limits(limits), stdin=stdin, on_stdout_line=on_stdout_line,
                        should_stop=should_stop, poll_interval=poll_interval,
                    )  # fmt: skip
            finally:
                # The client has ended: what it ran in the container has not (docker exec
                # does not kill it). Stopped or failed: SIGTERM, the grace, SIGKILL.
                stopped = result is None or result.timed_out or result.cancelled
                ended, needed_kill = cgroup.kill_all(limits.kill_grace_seconds if stopped else None)
                env_file.unlink(missing_ok=True)
                self._mount(self._stack(paths.tmp, self.shared, ()))
                if scratch is not None:
                    workspace.remove_tree(scratch)
            assert result is not None  # process.run raised otherwise
            return dataclasses.replace(
                result,
                killed=result.killed or (stopped and needed_kill),
                leftovers_killed=result.leftovers_killed + (0 if stopped else ended),
                memory_exhausted=result.memory_exhausted or cgroup.oom_kills() > oom_before,
            )

    @contextlib.contextmanager
    def _phase_caps(self, cgroup: ContainerCgroup, limits: Limits) -> Iterator[None]:
        """The container's pids and memory caps lowered to the command's for its time (the
        container holds the trial's; a phase may ask for less, as grading's 256 processes)."""
        restore: list[tuple[Path, str]] = []
        wanted = (("pids", limits.max_processes, self.resources.pids),
                  ("memory", limits.memory_bytes, self.resources.memory_bytes))  # fmt: skip
        try:
            for kind, value, held in wanted:
                limit_file = cgroup.limit_file(kind)
                if value is None or limit_file is None or (held is not None and value >= held):
                    continue
                before = limit_file.read_text().strip()
                try:
                    limit_file.write_text(str(value))
                except OSError:  # memory: more than that is in use already; the trial's cap holds
                    continue
                restore.append((limit_file, before))
            yield
        finally:
            for limit_file, before in reversed(restore):
                with contextlib.suppress(OSError):
                    limit_file.write_text(before)

    def _scratch(self) -> Path:
        """An empty HOME and /tmp beside the sandbox's, owned by its user."""
        paths = self.started
        scratch = paths.root / f"fresh-{secrets.token_hex(4)}"
        scratch.mkdir()
        os.chmod(scratch, 0o711)  # whatever the worker's umask
        for name in ("home", "tmp"):
            (scratch / name).mkdir(mode=0o700)
            if paths.uid is not None:
                os.chown(scratch / name, paths.uid, paths.uid)
        return scratch

    # --- mounts -----------------------------------------------------------------------------------

    def _stack(self, tmp: Path, shared: Sequence[Mount], extra: Sequence[Mount]) -> list[Mount]:
        """Every mount of a command, in order (a later one over an earlier one)."""
        paths = self.started
        base = [] if self.in_image else [Mount(self.cwd, writable=True, source=paths.workspace)]
        return [*base, Mount(TMP, writable=True, source=tmp), *shared, *extra]

    def _mount(self, wanted: list[Mount]) -> None:
        """Make the container's mounts `wanted`: what differs from the mounts in place is
        unmounted (last first) and mounted anew (first first)."""
        keep = 0
        while keep < min(len(self._placed), len(wanted)) and self._placed[keep][0] == wanted[keep]:
            keep += 1
        while len(self._placed) > keep:
            host_mounts.remove(self._placed.pop()[1])
        for mount in wanted[keep:]:
            self._placed.append((mount, self._place(mount)))

    def _place(self, mount: Mount) -> host_mounts.Placed:
        paths = self.started
        target = self._container_path(mount.path, paths.workspace)
        source = None if mount.hidden else (mount.source or mount.path)
        if (
            source is not None
            and source.is_relative_to(paths.root)
            and _is_socket(source)
            and paths.uid is not None
        ):
            os.chown(source, paths.uid, paths.uid)  # the gateway's socket: its user must connect
        for folder, skeleton in self._roots:
            if target.is_relative_to(folder):
                relative = PurePosixPath(target.relative_to(folder))
                return host_mounts.place(skeleton, relative, source=source, writable=mount.writable)
        roots = ", ".join(str(folder) for folder, _ in self._roots)
        raise SandboxError(
            f"cannot mount {target} into the container: it is under none of its mount roots ({roots}); "
            "name a folder above it in mount_roots when opening the sandbox"
        )

    def _container_path(self, path: Path, host_workspace: Path) -> Path:
        if not self.in_image and self.workdir is not None and path.is_relative_to(host_workspace):
            return Path(self.workdir) / path.relative_to(host_workspace)
        return path

    def command_path(self, path: Path) -> Path:
        """Where a host path of the sandbox is in the container: the workspace's at the
        workdir, every other at its own path (the engine's variables naming paths need it)."""
        return self._container_path(path, self.started.workspace)

    # --- files ------------------------------------------------------------------------------------

    def read_file(self, relative: str, max_bytes: int = 64 << 20) -> bytes:
        with self._workspace() as folder:
            try:
                fd = host_mounts.open_beneath(folder, relative, os.O_RDONLY, links=True)
            except OSError as exc:
                raise _file_error(relative, exc) from None
        with os.fdopen(fd, "rb") as handle:
            return handle.read(max_bytes)

    def write_file(self, relative: str, data: bytes) -> Path:
        """Write a workspace file (and its missing folders) owned by the sandbox's user; returns
        its host path (in the image's folder: its path in the container)."""
        paths = self.started
        owner = (paths.uid, paths.uid) if paths.uid is not None else None
        parent, name = PurePosixPath(relative).parent, PurePosixPath(relative).name
        with self._workspace() as folder:
            try:
                parent_fd = host_mounts.folder_beneath(folder, parent, create="dir", mode=0o755, owner=owner)
                try:
                    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
                    fd = host_mounts.open_beneath(parent_fd, name, flags, 0o644)
                finally:
                    os.close(parent_fd)
            except OSError as exc:
                raise _file_error(relative, exc) from None
        with os.fdopen(fd, "wb") as handle:
            if owner is not None:
                os.fchown(handle.fileno(), *owner)
            handle.write(data)
        return (self.cwd if self.in_image else paths.workspace) / relative

    @contextlib.contextmanager
    def _workspace(self) -> Iterator[int]:
        """A descriptor of the workspace: the host folder, or the image's own folder resolved
        in the container's root. Files are opened beneath it, never through a link leaving it."""
        paths = self.started
        if not self.in_image:
            folder = os.open(paths.workspace, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        else:
            assert self.cgroup is not None and self.workdir is not None
            root = os.open(f"/proc/{self.cgroup.init_pid}/root", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                relative = str(self.workdir).lstrip("/")
                flags = os.O_PATH | os.O_DIRECTORY
                folder = host_mounts.open_beneath(root, relative, flags, links=True, in_root=True)
            finally:
                os.close(root)
        try:
            yield folder
        finally:
            os.close(folder)

    def push_workspace(self) -> None:
        """In the image's folder mode: copy the host's `paths.workspace` (what the engine wrote
        there: template sources, a reference, an agent's prompt files) into that folder, with its
        owners and modes. (The other mode mounts it: a no-op.)"""
        paths = self.started
        if not self.in_image or not any(paths.workspace.iterdir()):
            return
        target = f"{self.name}:{self.workdir}"
        argv = [command.docker_binary(), "cp", "--archive", f"{paths.workspace}/.", target]
        copy = subprocess.run(
            argv, capture_output=True, stdin=subprocess.DEVNULL, env=command.client_env(),
            timeout=command.CALL_TIMEOUT,
        )  # fmt: skip
        if copy.returncode != 0:
            error = copy.stderr.decode("utf-8", "replace").strip()[-500:]
            raise SandboxError(f"copying the workspace into {self.workdir} failed: {error}")

    def _own_folders(self) -> tuple[PurePosixPath, ...]:
        """The driver's mount folders inside the image's folder (a worker's runtimes under /work
        when the image works in /work), relative to it: not the task's files."""
        assert self.workdir is not None
        inside = [
            PurePosixPath(folder)
            for folder, _ in self._roots
            if PurePosixPath(folder).is_relative_to(self.workdir)
        ]
        return tuple(folder.relative_to(self.workdir) for folder in inside if folder != self.workdir)

    def pull_workspace(self, into: Path | None = None) -> Path:
        """In the image's folder mode: copy that folder to `into` (by default the host's
        `paths.workspace`), replaced, for snapshots, diffs and artifacts, and return it. (The
        other mode mounts it: a no-op returning `paths.workspace`.)"""
        paths = self.started
        if not self.in_image:
            return paths.workspace
        target = into or paths.workspace
        workspace.remove_tree(target)
        target.mkdir(mode=0o700)
        copy = subprocess.Popen(
            [command.docker_binary(), "cp", f"{self.name}:{self.workdir}/.", "-"], stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=command.client_env(),
        )  # fmt: skip
        assert copy.stdout is not None and copy.stderr is not None
        unpacking = ""
        try:
            with tarfile.open(fileobj=copy.stdout, mode="r|") as archive:
                archive.extractall(
                    target, filter=functools.partial(_mirror_filter, skipped=self._own_folders())
                )
        except (tarfile.TarError, OSError) as exc:
            copy.kill()
            unpacking = str(exc)
        finally:
            copy.stdout.close()
            error = copy.stderr.read().decode("utf-8", "replace").strip()
            copy.stderr.close()
            copy.wait()
        # docker's own words first: an empty archive ("empty file") says only that it wrote nothing.
        if copy.returncode != 0 or unpacking:
            why = "; ".join(part for part in (error[-500:], unpacking) if part)
            raise SandboxError(f"copying {self.workdir} out of the container failed: {why}")
        return target


def _client_limits(limits: Limits) -> Limits:
    """The docker client's own limits: the command's wall clock, grace and output caps; the
    command's rlimits are set in the container by `box run`, its caps by the container."""
    return Limits(
        wall_seconds=limits.wall_seconds, cpu_seconds=None, address_space_bytes=None,
        max_processes=CLIENT_PROCESSES, max_file_bytes=None, memory_bytes=None,
        stdout_cap_bytes=limits.stdout_cap_bytes, stderr_cap_bytes=limits.stderr_cap_bytes,
        kill_grace_seconds=limits.kill_grace_seconds,
    )  # fmt: skip


def _mirror_filter(
    member: tarfile.TarInfo, destination: str, skipped: tuple[PurePosixPath, ...] = ()
) -> tarfile.TarInfo | None:
    """What of the container's folder the host's copy takes: tarfile's data filter (no path
    leaving the copy, no device, no setuid bit, no owner), except that a symbolic link is kept
    whatever it points to, as in a workspace (the engine's snapshots never follow one). What is
    under `skipped` (the driver's own mount folders inside the image's folder) is left out."""
    name = PurePosixPath(member.name.removeprefix("./"))
    if any(name == folder or name.is_relative_to(folder) for folder in skipped):
        return None
    if member.issym():
        return tarfile.tar_filter(member, destination).replace(uid=0, gid=0, uname="", gname="", deep=False)
    return tarfile.data_filter(member, destination)


def _is_socket(path: Path) -> bool:
    with contextlib.suppress(OSError):
        return stat.S_ISSOCK(path.lstat().st_mode)
    return False


def _file_error(relative: str, exc: OSError) -> Exception:
    if isinstance(exc, FileNotFoundError):
        return FileNotFoundError(exc.errno, exc.strerror, relative)
    return SandboxError(f"{relative!r}: {exc.strerror} (a link leaving the workspace, or no such folder)")


# ---------------------------------------------------------------------------------------------
# What dead workers left


@dataclass(frozen=True)
class Leftover:
    """A container of the driver: its name, trial folder, worker ("<host>:<pid>"), state."""

    name: str
    root: Path
    worker: str
    running: bool


def remove_container(name: str) -> None:
    """`docker rm -f -v`: the container, its processes and anonymous volumes; gone is fine."""
    try:
        command.call(["rm", "--force", "--volumes", name])
    except SandboxError as exc:
        if "No such container" not in str(exc):
            raise


def discard(root: Path) -> None:
    """Remove a container sandbox's trial folder that no worker holds: its container, its
    mounts, its files."""
    remove_container(f"evalsite-{root.absolute().name}")
    _remove_folder(root)


def _remove_folder(root: Path) -> None:
    host_mounts.detach(root / "mounts")
    host_mounts.detach(root)  # its capped tmpfs, or itself bound onto itself
    workspace.cleanup(root)


def containers() -> list[Leftover]:
    """Every container of the driver the engine holds, running or not."""
    labels = (f'{{{{.Label "{name}"}}}}' for name in (command.ROOT_LABEL, command.WORKER_LABEL))
    template = "\t".join(["{{.Names}}", *labels, "{{.State}}"])
    listed = command.call(
        ["ps", "--all", "--no-trunc", "--filter", f"label={command.LABEL}", "--format", template]
    )
    found = []
    for line in listed.decode().splitlines():
        name, root, worker, state = (line.split("\t") + ["", "", ""])[:4]
        found.append(Leftover(name, Path(root), worker, state == "running"))
    return found


def _worker_gone(worker: str) -> bool:
    host, _, pid = worker.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return False  # another host's worker: its own sweep decides
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def reap(*, root: Path | None = None, worker: str | None = None) -> list[str]:
    """Remove the containers of the trial folder `root`, or of the worker `worker`; with
    neither, those a dead worker of this host left (its process is gone, or their trial folder
    is). Returns their names. The engine calls it from its sweep of trial folders."""
    removed = []
    for found in containers():
        if root is not None or worker is not None:
            chosen = (root is not None and found.root == root.absolute()) or found.worker == worker
        else:
            chosen = _worker_gone(found.worker) or not found.root.exists()
        if chosen:
            remove_container(found.name)
            removed.append(found.name)
    return removed
