"""Mounts made on the host that appear in a running container (root workers, Linux ≥ 5.12).

A container's mounts are fixed when it starts; a phase's are not (grading's task folder, the
gateway's socket, an empty HOME). So each of the container's mount roots (the host's sandbox
folders, /tmp, the workdir...) is an empty folder of a small per-trial tmpfs, the *skeleton*,
made a shared mount and bind-mounted into the container as its slave (`rslave`): whatever the
host mounts under a skeleton folder appears at once at the same place in the container, and
goes when the host unmounts it.

Every mount is made with the kernel's mount API (`open_tree`, `mount_setattr`, `move_mount`,
`fsmount`): a read-only mount is read-only from its first moment (a bind then a remount would be
writable in the container in between: propagation copies a mount, not a later remount), and its
mount point is opened beneath the skeleton without following any symbolic link (`openat2`), so
a link the sandbox planted in its workspace never sends a mount anywhere on the host. A mount is
removed through the descriptor of the mount itself, never by path.

Pure Python, Linux only, no Django.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from runs_app.engine.sandbox.base import SandboxError

# The generic syscall numbers (the same on x86_64 and arm64).
_OPEN_TREE, _MOVE_MOUNT, _FSOPEN, _FSCONFIG, _FSMOUNT, _OPENAT2, _MOUNT_SETATTR = (
    428, 429, 430, 431, 432, 437, 442,
)  # fmt: skip
_OPEN_TREE_CLONE, _AT_RECURSIVE, _AT_EMPTY_PATH = 1, 0x8000, 0x1000
_MOVE_MOUNT_F_EMPTY_PATH, _MOVE_MOUNT_T_EMPTY_PATH = 0x4, 0x40
_FSCONFIG_SET_STRING, _FSCONFIG_CMD_CREATE = 1, 6
_MOUNT_ATTR_RDONLY, _MOUNT_ATTR_NOSUID, _MOUNT_ATTR_NODEV = 0x1, 0x2, 0x4
_MS_SHARED, _MS_PRIVATE = 1 << 20, 1 << 18
_MS_NOSUID, _MS_NODEV, _MS_BIND, _MS_REC = 2, 4, 4096, 16384
_RESOLVE_NO_MAGICLINKS, _RESOLVE_NO_SYMLINKS, _RESOLVE_BENEATH, _RESOLVE_IN_ROOT = 0x02, 0x04, 0x08, 0x10
_MNT_DETACH, _UMOUNT_NOFOLLOW = 2, 8


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]  # fmt: skip


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC.syscall.restype = ctypes.c_long


def _syscall(number: int, *args: object, what: str) -> int:
    result = _LIBC.syscall(ctypes.c_long(number), *args)
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")
    return int(result)


def _cstr(path: str | Path) -> bytes:
    return os.fsencode(str(path))


@dataclass
class Placed:
    """One mount made under a skeleton: the descriptor of the mount itself (it unmounts it),
    and the mount point's parts `place` made (removed after it, last first)."""

    fd: int
    skeleton: Path
    made: list[PurePosixPath]


def unsupported() -> str | None:
    """Why this kernel cannot make the driver's mounts (the mount API, openat2), or None."""
    for number, name in ((_OPEN_TREE, "open_tree"), (_MOUNT_SETATTR, "mount_setattr"), (_OPENAT2, "openat2")):
        # Bad arguments on purpose: a kernel that has the call says EBADF or EINVAL, not ENOSYS.
        missing = (
            _LIBC.syscall(ctypes.c_long(number), -1, None, 0, None, 0) < 0
            and ctypes.get_errno() == errno.ENOSYS
        )
        if missing:
            return f"this kernel lacks {name} (Linux 5.12 or later runs container sandboxes)"
    return None


def make_skeleton(folder: Path) -> None:
    """A small tmpfs at `folder` (an empty folder), shared, so what is mounted under it
    propagates to the containers that mount its folders as slaves."""
    options = b"size=1m,nr_inodes=4096,mode=0711"
    flags = _MS_NOSUID | _MS_NODEV
    if _LIBC.mount(b"evalsite-skeleton", _cstr(folder), b"tmpfs", flags, options) != 0:
        code = ctypes.get_errno()
        raise SandboxError(f"mounting the container's skeleton on {folder} failed: {os.strerror(code)}")
    if _LIBC.mount(None, _cstr(folder), None, _MS_SHARED, None) != 0:
        code = ctypes.get_errno()
        detach(folder)
        raise SandboxError(f"making {folder} a shared mount failed: {os.strerror(code)}")


def bind_onto_itself(folder: Path) -> None:
    """`folder` as a mount of its own, nosuid and nodev (a trial folder without a disk cap:
    nothing the container writes there runs setuid on the host)."""
    if _LIBC.mount(_cstr(folder), _cstr(folder), None, _MS_BIND | _MS_REC, None) != 0:
        code = ctypes.get_errno()
        raise SandboxError(f"binding {folder} onto itself failed: {os.strerror(code)}")
    flags = _MS_BIND | 32 | _MS_NOSUID | _MS_NODEV  # 32: MS_REMOUNT
    if _LIBC.mount(None, _cstr(folder), None, flags, None) != 0:
        code = ctypes.get_errno()
        detach(folder)
        raise SandboxError(f"making {folder} nosuid failed: {os.strerror(code)}")


def detach(folder: Path) -> None:
    """Unmount whatever is mounted on `folder`, with everything under it (lazily: nothing may
    hold it by then). Not `os.path.ismount`, which misses a folder bound onto itself."""
    for _ in range(16):  # mounts stacked on it, one by one
        if _LIBC.umount2(_cstr(folder), _MNT_DETACH | _UMOUNT_NOFOLLOW) == 0:
            continue
        code = ctypes.get_errno()
        if code in (errno.EINVAL, errno.ENOENT):
            return
        raise SandboxError(f"unmounting {folder} failed: {os.strerror(code)}")


def folder_beneath(
    base_fd: int,
    relative: PurePosixPath,
    *,
    create: str | None = None,
    mode: int = 0o711,
    owner: tuple[int, int] | None = None,
    made: list[PurePosixPath] | None = None,
) -> int:
    """An O_PATH descriptor of `relative` under `base_fd`, no symbolic link followed and never
    leaving it. With `create` ("dir" or "file"), what is missing is made: folders with `mode`,
    the last part a folder or an empty file, all given to `owner` (and listed in `made`)."""
    fd = os.dup(base_fd)
    parts = [part for part in relative.parts if part not in ("", "/", ".")]
    try:
        for index, part in enumerate(parts):
            try:
                child = open_beneath(fd, part, os.O_PATH)
            except FileNotFoundError:
                if create is None:
                    raise
                if index == len(parts) - 1 and create == "file":
                    os.close(
                        os.open(part, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW, 0o644, dir_fd=fd)
                    )
                else:
                    os.mkdir(part, mode, dir_fd=fd)
                child = open_beneath(fd, part, os.O_PATH)
                # Through the descriptor: what was made, whatever is at that name now; the
                # mode whatever the worker's umask.
                os.chmod(
                    f"/proc/self/fd/{child}", mode if create == "dir" or index < len(parts) - 1 else 0o644
                )
                if owner is not None:
                    os.chown(f"/proc/self/fd/{child}", *owner)
                if made is not None:
                    made.append(PurePosixPath(*parts[: index + 1]))
            os.close(fd)
            fd = child
        return fd
    except BaseException:
        os.close(fd)
        raise


def open_beneath(
    dir_fd: int, path: str, flags: int, mode: int = 0, *, links: bool = False, in_root: bool = False
) -> int:
    """openat2: `path` under `dir_fd`, never leaving it (`in_root`: `dir_fd` is the root its
    absolute links resolve in), through no magic link and, unless `links`, no symbolic link."""
    resolve = _RESOLVE_NO_MAGICLINKS | (_RESOLVE_IN_ROOT if in_root else _RESOLVE_BENEATH)
    if not links:
        resolve |= _RESOLVE_NO_SYMLINKS
    how = _OpenHow(flags | os.O_CLOEXEC, mode, resolve)
    result = _LIBC.syscall(
        ctypes.c_long(_OPENAT2), dir_fd, _cstr(path), ctypes.byref(how), ctypes.sizeof(how)
    )
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), path)
    return int(result)


def place(skeleton: Path, relative: PurePosixPath, *, source: Path | None, writable: bool) -> Placed:
    """Mount `source` (a bind of a host folder or file, recursive) or, None, an empty read-only
    tmpfs at `skeleton / relative`, making its mount point when missing."""
    where = skeleton / relative
    made: list[PurePosixPath] = []
    try:
        mount_fd = _bind_tree(source, writable) if source is not None else _empty_tmpfs()
    except OSError as exc:
        raise SandboxError(f"cannot mount {source} for the container: {exc.strerror}") from None
    try:
        base = os.open(skeleton, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            kind = "dir" if source is None or source.is_dir() else "file"
            target = folder_beneath(base, relative, create=kind, made=made)
        finally:
            os.close(base)
        try:
            flags = _MOVE_MOUNT_F_EMPTY_PATH | _MOVE_MOUNT_T_EMPTY_PATH
            _syscall(_MOVE_MOUNT, mount_fd, b"", target, b"", flags, what="move_mount")
        finally:
            os.close(target)
    except OSError as exc:
        os.close(mount_fd)
        _remove_made(skeleton, made)
        reason = "a symbolic link is on the way" if exc.errno == errno.ELOOP else exc.strerror
        raise SandboxError(f"cannot mount at {where} in the container: {reason}") from None
    return Placed(mount_fd, skeleton, made)


def _bind_tree(source: Path, writable: bool) -> int:
    fd = _syscall(_OPEN_TREE, -100, _cstr(source), _OPEN_TREE_CLONE | os.O_CLOEXEC | _AT_RECURSIVE,
                  what=f"open_tree {source}")  # fmt: skip
    attr = _MountAttr(
        _MOUNT_ATTR_NOSUID | _MOUNT_ATTR_NODEV | (0 if writable else _MOUNT_ATTR_RDONLY), 0, _MS_PRIVATE, 0
    )
    try:
        flags = _AT_EMPTY_PATH | _AT_RECURSIVE
        _syscall(
            _MOUNT_SETATTR, fd, b"", flags, ctypes.byref(attr), ctypes.sizeof(attr), what="mount_setattr"
        )
    except BaseException:
        os.close(fd)
        raise
    return fd


def _empty_tmpfs() -> int:
    fs = _syscall(_FSOPEN, b"tmpfs", 1, what="fsopen tmpfs")  # 1: FSOPEN_CLOEXEC
    try:
        for key, value in ((b"size", b"4k"), (b"nr_inodes", b"16"), (b"mode", b"0755")):
            _syscall(_FSCONFIG, fs, _FSCONFIG_SET_STRING, key, value, 0, what="fsconfig")
        _syscall(_FSCONFIG, fs, _FSCONFIG_CMD_CREATE, None, None, 0, what="fsconfig create")
        attrs = _MOUNT_ATTR_RDONLY | _MOUNT_ATTR_NOSUID | _MOUNT_ATTR_NODEV
        return _syscall(_FSMOUNT, fs, 1, attrs, what="fsmount")  # 1: FSMOUNT_CLOEXEC
    finally:
        os.close(fs)


def remove(placed: Placed) -> None:
    """Unmount what `place` mounted (and what was mounted under it), by its own descriptor, and
    remove the mount point it made: after it, the container shows nothing of it."""
    try:
        if _LIBC.umount2(_cstr(f"/proc/self/fd/{placed.fd}"), _MNT_DETACH) != 0:
            code = ctypes.get_errno()
            if code != errno.EINVAL:  # EINVAL: not mounted any more (its skeleton went first)
                raise SandboxError(f"unmounting a mount of {placed.skeleton} failed: {os.strerror(code)}")
    finally:
        with contextlib.suppress(OSError):
            os.close(placed.fd)
    _remove_made(placed.skeleton, placed.made)


def _remove_made(skeleton: Path, made: list[PurePosixPath]) -> None:
    """Remove the parts of mount points `place` made, deepest first, while they are empty."""
    if not made:
        return
    try:
        base = os.open(skeleton, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        for part in reversed(made):
            try:
                parent = folder_beneath(base, part.parent)
            except OSError:
                continue
            try:
                with contextlib.suppress(IsADirectoryError, NotADirectoryError, PermissionError):
                    os.unlink(part.name, dir_fd=parent)
                    continue
                with contextlib.suppress(OSError):  # not empty, or another mount's point
                    os.rmdir(part.name, dir_fd=parent)
            finally:
                os.close(parent)
    finally:
        os.close(base)
