"""A sandbox's own file system: its disk and inode caps, enforced by the kernel in every phase.

On a root worker the sandbox's folder is a tmpfs of its own, mounted with `size` (the disk cap)
and `nr_inodes` (the inode cap): past either, writes fail (ENOSPC) whichever phase writes, and
its use is read in microseconds (`statvfs`), so a trial at its cap is stopped within a poll.
Unmounting frees it at once, however many files the agent left. A tmpfs lives in memory: the
pages a command writes count against that command's memory cgroup, and what the trial holds
against the host's RAM (docs/deploy.md says how to size it).

A worker that cannot mount (not root) walks the folder instead, every few seconds: the caps
hold only as well as that poll (docs/deploy.md).

Pure Python, Linux only, no Django.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from runs_app.engine.sandbox.base import SandboxError

_MS_NOSUID, _MS_NODEV = 2, 4
_MNT_DETACH = 2
WALK_EVERY_SECONDS = 3.0


@dataclass(frozen=True)
class DiskCap:
    bytes: int
    inodes: int


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def mount_capped(root: Path, cap: DiskCap) -> bool:
    """Mount a tmpfs with `cap` on the empty folder `root`; False where this worker cannot mount
    (not root, or no CAP_SYS_ADMIN), which then polls instead."""
    if os.geteuid() != 0:
        return False
    options = f"size={cap.bytes},nr_inodes={cap.inodes},mode=0711".encode()
    if _libc().mount(b"evalsite-sandbox", os.fsencode(root), b"tmpfs", _MS_NOSUID | _MS_NODEV, options) == 0:
        return True
    code = ctypes.get_errno()
    if code == errno.EPERM:
        return False
    raise SandboxError(f"mounting the sandbox's file system on {root} failed: {os.strerror(code)}")


def unmount(root: Path) -> None:
    """Detach the sandbox's file system (its files go with it)."""
    if os.path.ismount(root) and _libc().umount2(os.fsencode(root), _MNT_DETACH) != 0:
        code = ctypes.get_errno()
        raise SandboxError(f"unmounting the sandbox's file system on {root} failed: {os.strerror(code)}")


class DiskWatch:
    """Whether a sandbox's folder is at its disk or inode cap."""

    def __init__(self, root: Path, cap: DiskCap, mounted: bool):
        self.root, self.cap, self.mounted = root, cap, mounted
        self.next_walk = time.monotonic() + WALK_EVERY_SECONDS

    def usage(self) -> tuple[int, int]:
        """(bytes, inodes) the sandbox holds."""
        if self.mounted:
            found = os.statvfs(self.root)
            return (found.f_blocks - found.f_bfree) * found.f_frsize, found.f_files - found.f_ffree
        return tree_usage(self.root)

    def exceeded(self) -> bool:
        """At the cap (a full tmpfs refuses the next write); without a mount, checked every
        WALK_EVERY_SECONDS (walking a large tree costs milliseconds)."""
        if not self.mounted:
            if time.monotonic() < self.next_walk:
                return False
            self.next_walk = time.monotonic() + WALK_EVERY_SECONDS
        used, inodes = self.usage()
        # A tmpfs counts its root folder and a few pages of its own: "full" is within a page.
        return used >= self.cap.bytes - 4096 or inodes >= self.cap.inodes


def tree_usage(root: Path) -> tuple[int, int]:
    """Bytes and entries under `root` (links not followed)."""
    total, entries = 0, 0
    for dirpath, dirnames, filenames in os.walk(root):
        entries += len(dirnames) + len(filenames)
        for name in filenames:
            with contextlib.suppress(OSError):
                st = os.lstat(os.path.join(dirpath, name))
                if stat.S_ISREG(st.st_mode):
                    total += st.st_blocks * 512
    return total, entries
