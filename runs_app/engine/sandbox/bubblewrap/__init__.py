"""The bubblewrap driver: every command of the sandbox in fresh Linux namespaces on the worker
host (`command`: the bwrap command line), under the host's process control (`process`).

The sandbox's folders live on the host (`workspace.layout`), on a file system of their own
with the sandbox's disk and inode caps where the worker can mount one (`filesystem`); each
`exec` starts one bwrap that sees the system and the runtimes read-only, the workspace, HOME and
/tmp writable, and the mounts of its phase. On a root worker the folders belong to a uid leased
for the sandbox, which every command runs as. Pure Python, no Django.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from runs_app.engine.sandbox import filesystem, process, workspace
from runs_app.engine.sandbox.base import Limits, Mount, ProcessResult, Sandbox, SandboxPaths
from runs_app.engine.sandbox.bubblewrap import command
from runs_app.engine.sandbox.containment import child_identity


class BubblewrapSandbox(Sandbox):
    driver = "bubblewrap"

    def __init__(
        self,
        root: Path,
        *,
        stage_root: Path | None = None,
        shared: Sequence[Mount] = (),
        env: Mapping[str, str] | None = None,
        disk: filesystem.DiskCap | None = None,
    ):
        super().__init__(root, shared=shared, env=env)
        self.stage_root = stage_root
        self.disk = disk
        self.disk_watch: filesystem.DiskWatch | None = None

    def start(self) -> SandboxPaths:
        if self.paths is None:
            mounted = False
            if self.disk is not None:
                self.root.mkdir(parents=True)
                mounted = filesystem.mount_capped(self.root, self.disk)
                self.disk_watch = filesystem.DiskWatch(self.root, self.disk, mounted)
            try:
                self.paths = workspace.layout(self.root)
            except BaseException:
                if mounted:
                    filesystem.unmount(self.root)
                raise
        return self.paths

    def disk_exceeded(self) -> bool:
        return self.disk_watch is not None and self.disk_watch.exceeded()

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
    ) -> ProcessResult:
        paths = self.started
        shared, home, tmp, scratch = self.shared, paths.home, paths.tmp, None
        if fresh_home:
            scratch = self._scratch()
            home, tmp = scratch / "home", scratch / "tmp"
            shared = [mount for mount in shared if mount.path != paths.home] + [Mount(home, writable=True)]
        try:
            return run_process(
                argv, cwd=paths.workspace, env=self.environment(env, home=home), limits=limits,
                mounts=[*shared, *mounts], tmp=tmp, stage_root=self.stage_root, stdin=stdin,
                on_stdout_line=on_stdout_line, should_stop=should_stop, poll_interval=poll_interval,
            )  # fmt: skip
        finally:
            if scratch is not None:
                workspace.remove_tree(scratch)

    def _scratch(self) -> Path:
        """An empty HOME and /tmp beside the sandbox's, owned by its user."""
        paths = self.started
        scratch = paths.root / f"fresh-{secrets.token_hex(4)}"
        scratch.mkdir()
        os.chmod(scratch, 0o711)  # the worker's umask may be 077; its user must reach inside
        for name in ("home", "tmp"):
            (scratch / name).mkdir(mode=0o700)
            if paths.uid is not None:
                os.chown(scratch / name, paths.uid, paths.uid)
        return scratch

    def cleanup(self) -> None:
        # Whatever of the sandbox is left runs as its leased uid, which cleanup kills and gives
        # back before its file system goes.
        workspace.release(self.root)
        filesystem.unmount(self.root)
        workspace.cleanup(self.root)
        self.paths = None


def run_process(
    argv: list[str] | str,
    *,
    cwd: Path,
    env: dict[str, str],
    limits: Limits,
    mounts: Sequence[Mount] = (),
    tmp: Path | None = None,
    stage_root: Path | None = None,
    user: int | None = None,
    **options: Any,
) -> ProcessResult:
    """One command in a fresh bwrap sandbox: a str `argv` through `/bin/sh -c`, in `cwd`
    (writable), with `mounts` and `tmp` as its /tmp (TMPDIR points there). `stage_root` is where
    a root worker stages runtimes its sandbox uid cannot reach; `user` forces the sandbox uid
    (root workers). `options` are `process.run`'s."""
    args = ["/bin/sh", "-c", argv] if isinstance(argv, str) else list(argv)
    identity = child_identity(cwd, user)
    args = command.command_line(
        args, cwd=cwd, mounts=mounts, tmp=tmp,
        stage_root=(stage_root or command.DEFAULT_STAGE_ROOT) if identity is not None else None,
    )  # fmt: skip
    if tmp is not None:
        env = {**env, "TMPDIR": "/tmp", "TMP": "/tmp", "TEMP": "/tmp"}
    return process.run(args, cwd=cwd, env=env, limits=limits, identity=identity, **options)
