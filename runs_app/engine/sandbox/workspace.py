"""A trial's folders: layout, materialisation of template sources, snapshots, diff, artifacts.

Follows coder-eval's `sandbox.template_sources`: `template_dir` {path} copies a folder given
relative to the task YAML's folder, `starter_files` {files: [{path, content}]} writes inline
files, `repo` {url, commit} clones a git repository into `repo/` (coder-eval's place for it) and
checks out the commit. Sources apply in order; later ones overwrite earlier files. Template copies
and snapshots skip coder-eval's default ignore patterns (`.git`, `__pycache__`, `node_modules`...).

On a root worker the trial's folders belong to a uid leased for the trial (see `containment`), and
everything materialised into the workspace is handed to that uid, so the agent can edit it.

Pure Python, no Django.
"""

from __future__ import annotations

import contextlib
import difflib
import fnmatch
import io
import os
import shutil
import stat
import subprocess
import tarfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from runs_app.engine.sandbox import containment
from runs_app.engine.sandbox.base import SandboxPaths

REPO_DIRNAME = "repo"
DEFAULT_IGNORE_PATTERNS: tuple[str, ...] = (
    ".venv",
    "venv",
    "ENV",
    "env",
    "virtualenv",
    ".git",
    ".svn",
    ".hg",
    "__pycache__",
    "*.pyc",
    "*.pyo",
    "*.pyd",
    ".pytest_cache",
    ".ruff_cache",
    "*.egg-info",
    ".eggs",
    "dist",
    "build",
    ".vscode",
    ".idea",
    "*.swp",
    "*.swo",
    "*~",
    ".DS_Store",
    "Thumbs.db",
    "node_modules",
    ".npm",
    "bower_components",
    ".coverage",
    "htmlcov",
    ".tox",
    ".nox",
    "*.so",
    "*.dylib",
    "*.dll",
)


# Past these, the snapshot and the artifact the runner makes of a workspace after the agent stop,
# so a million files or a sparse terabyte cost bounded time and memory (far above real ones).
MAX_ENTRIES = 200_000  # folders, files and links listed
SNAPSHOT_MAX_BYTES = 64 << 20  # text a snapshot reads in all
ARTIFACT_MAX_BYTES = 512 << 20  # regular files an artifact keeps
# The longest path the system opens (Linux's PATH_MAX, the terminating NUL included).
PATH_MAX = 4096


class WorkspaceError(ValueError):
    """A template source cannot be applied; the message names the source and the field."""


# git argv, timeout, the one host it may reach -> (exit code, stderr, timed out)
GitRunner = Callable[[list[str], float, str], tuple[int, str, bool]]

# ---------------------------------------------------------------------------------------------
# Layout and cleanup


def layout(trial_root: Path) -> SandboxPaths:
    """Create `workspace/`, `home/` and `tmp/` under a fresh (absent or empty) trial folder.

    On a root worker, a uid is leased for the trial and owns the three folders; every parent of
    `trial_root` must be searchable by others (mode o+x) so that uid can reach them.
    """
    trial_root = trial_root.absolute()
    trial_root.mkdir(parents=True, exist_ok=True)
    if any(trial_root.iterdir()):
        raise WorkspaceError(f"{trial_root} is not empty: each trial needs a fresh folder")
    uid = None
    if os.geteuid() == 0:
        _check_searchable(trial_root)
        uid = containment.lease_sandbox_uid()
    try:
        os.chmod(trial_root, 0o711)
        paths = SandboxPaths(
            trial_root, trial_root / "workspace", trial_root / "home", trial_root / "tmp", uid
        )
        for folder in (paths.workspace, paths.home, paths.tmp):
            folder.mkdir(mode=0o700)
            if uid is not None:
                os.chown(folder, uid, uid)
    except BaseException:
        if uid is not None:
            containment.release_sandbox_uid(uid)
        raise
    return paths


def _check_searchable(trial_root: Path) -> None:
    for folder in trial_root.parents:
        if not os.stat(folder).st_mode & stat.S_IXOTH:
            raise WorkspaceError(
                f"{folder} is not searchable by other users (mode o+x), so the sandbox uid cannot "
                f"reach {trial_root}: `chmod o+x {folder}` or put trials under another folder"
            )


def release(trial_root: Path) -> None:
    """Kill what still runs as the trial's uid and give the uid back."""
    workspace = trial_root / "workspace"
    if workspace.exists() and os.geteuid() == 0:
        containment.release_sandbox_uid(workspace.lstat().st_uid)


def cleanup(trial_root: Path) -> None:
    """Kill what still runs as the trial's uid, give the uid back, and delete the folder.

    Copes with read-only files and folders (an agent may chmod them) and with files owned by the
    sandbox uid.
    """
    release(trial_root)
    remove_tree(trial_root)


def remove_tree(root: Path) -> None:
    """Delete a folder a sandbox wrote to, whatever the agent did to it."""
    if not root.exists():
        return
    try:
        shutil.rmtree(root)
    except FileNotFoundError:
        return
    except (OSError, RecursionError):
        # Modes the agent set, or folders nested deeper than Python walks (shutil recurses) or
        # than a path can name: GNU chmod and rm walk any tree, and never through a link.
        subprocess.run(["chmod", "-R", "u+rwx", "--", str(root)], capture_output=True)
        subprocess.run(["rm", "-rf", "--", str(root)], capture_output=True, check=True)


# ---------------------------------------------------------------------------------------------
# Materialisation


def materialize(
    workspace: Path,
    template_sources: list[dict],
    bundle_dir: Path,
    yaml_dir: str,
    *,
    ignore_patterns: Iterable[str] = (),
    git_timeout: float = 120.0,
    first_index: int = 0,
    git: GitRunner | None = None,
) -> None:
    """Apply `template_sources` to `workspace`, in order (later sources overwrite earlier files).

    `template_dir` paths are relative to `bundle_dir / yaml_dir` (the task YAML's folder) and
    must stay inside `bundle_dir`; written paths must stay inside the workspace, also through
    symlinks an earlier source created. `first_index` numbers the sources in error messages when
    a caller applies them one at a time. `git(argv, timeout)` runs git for `repo` sources (the
    runner runs it in the trial's sandbox, reaching only the repository's host).
    """
    patterns = (*DEFAULT_IGNORE_PATTERNS, *ignore_patterns)
    for index, source in enumerate(template_sources, start=first_index):
        where = f"sandbox.template_sources[{index}]"
        kind = source.get("type")
        if kind == "template_dir":
            _copy_template(workspace, source, bundle_dir, yaml_dir, patterns, where)
        elif kind == "starter_files":
            _write_starter_files(workspace, source, where)
        elif kind == "repo":
            _clone_repo(workspace, source, git_timeout, where, git)
        else:
            raise WorkspaceError(f"{where}.type: {kind!r} is not one of template_dir, starter_files, repo")
    owner = workspace.stat()
    if os.geteuid() == 0 and owner.st_uid != 0:
        chown_tree(workspace, owner.st_uid, owner.st_gid)


def _required(source: dict, field: str, where: str) -> object:
    if not source.get(field):
        raise WorkspaceError(f"{where}.{field} is required")
    return source[field]


def _destination(workspace: Path, relative: str, where: str) -> Path:
    """`workspace / relative`, refusing absolute paths, `..` and symlinks that lead outside."""
    pure = Path(relative)
    if pure.is_absolute() or ".." in pure.parts or not pure.parts:
        raise WorkspaceError(f"{where}: path {relative!r} must be relative and stay inside the workspace")
    dest = workspace / pure
    dest.parent.mkdir(parents=True, exist_ok=True)
    if not dest.parent.resolve().is_relative_to(workspace.resolve()):
        raise WorkspaceError(f"{where}: path {relative!r} leads outside the workspace through a symlink")
    if dest.is_symlink():
        dest.unlink()  # overwrite the link itself, never the file it points to
    return dest


def _copy_template(
    workspace: Path, source: dict, bundle_dir: Path, yaml_dir: str, patterns: tuple[str, ...], where: str
) -> None:
    relative = str(_required(source, "path", where))
    bundle = bundle_dir.resolve()
    folder = (bundle / yaml_dir / relative).resolve()
    if not folder.is_relative_to(bundle):
        raise WorkspaceError(f"{where}.path: {relative!r} leads outside the task bundle")
    if not folder.is_dir():
        raise WorkspaceError(f"{where}.path: {relative!r} is not a folder next to the task YAML")
    # coder-eval: `mount_point` is where in the workspace the folder lands; `include_patterns`
    # re-include template-relative paths the ignore patterns drop (fnmatch, `*` crossing "/").
    mount = str(source.get("mount_point") or ".")
    prefix = Path() if mount == "." else Path(mount)
    includes = [str(p).replace("\\", "/").removeprefix("./") for p in source.get("include_patterns") or []]

    def skipped(relative: Path) -> bool:
        text = relative.as_posix()
        return _ignored(relative, patterns) and not any(fnmatch.fnmatchcase(text, p) for p in includes)

    for dirpath, dirnames, filenames in os.walk(folder):
        base = Path(dirpath).relative_to(folder)
        # With include patterns an ignored folder is still walked: a file inside may be re-included.
        dirnames[:] = sorted(d for d in dirnames if includes or not skipped(base / d))
        links = [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]
        for name in dirnames:
            if skipped(base / name):
                continue
            dest = _destination(workspace, str(prefix / base / name), where)
            if name in links:
                _copy_entry(Path(dirpath) / name, dest, base / name, where)
            elif not dest.is_dir():
                if dest.exists():
                    raise WorkspaceError(
                        f"{where}: {base / name} is a folder here but a file in the workspace"
                    )
                dest.mkdir()  # empty folders are part of the template too
        dirnames[:] = [d for d in dirnames if d not in links]
        for name in sorted(filenames):
            if not skipped(base / name):
                dest = _destination(workspace, str(prefix / base / name), where)
                _copy_entry(Path(dirpath) / name, dest, base / name, where)


def _copy_entry(src: Path, dest: Path, relative: Path, where: str) -> None:
    """Copy a file, or a symlink as a symlink (following it would copy host files in)."""
    if dest.is_dir():
        raise WorkspaceError(f"{where}: {relative} is a file here but a folder in the workspace")
    shutil.copy2(src, dest, follow_symlinks=False)


def _write_starter_files(workspace: Path, source: dict, where: str) -> None:
    files = _required(source, "files", where)
    if not isinstance(files, list):
        raise WorkspaceError(f"{where}.files must be a list of {{path, content}}")
    for number, entry in enumerate(files):
        if not isinstance(entry, dict):
            raise WorkspaceError(f"{where}.files[{number}] must be a mapping with path and content")
        path = _required(entry, "path", f"{where}.files[{number}]")
        dest = _destination(workspace, str(path), f"{where}.files[{number}]")
        dest.write_text(str(entry.get("content", "")), encoding="utf-8")


def _clone_repo(workspace: Path, source: dict, timeout: float, where: str, git: GitRunner | None) -> None:
    from experiments_app.specs.task import repo_url_problem  # the import-time rule, checked again here

    url = str(_required(source, "url", where))
    if problem := repo_url_problem(url):
        raise WorkspaceError(f"{where}.url: {problem}")
    if git is None:
        raise WorkspaceError(f"{where}: repo sources are cloned in the trial's sandbox, and none was given")
    target = workspace / REPO_DIRNAME
    if target.exists():
        raise WorkspaceError(f"{where}: {target.name}/ already exists (only one repo source is allowed)")
    commit, ref = source.get("commit"), source.get("ref")
    options = ["--no-checkout"] if commit else (["--branch", str(ref)] if ref else [])
    steps = [("clone", ["git", "clone", "--quiet", *options, "--", url, str(target)])]
    if commit:
        steps.append(
            ("checkout", ["git", "-C", str(target), "checkout", "--quiet", "--detach", str(commit), "--"])
        )
    host = urlsplit(url).hostname or ""
    for verb, command in steps:
        code, stderr, timed_out = git(command, timeout, host)
        if timed_out:
            raise WorkspaceError(f"{where}: `git {verb}` of {url} took over {timeout:g} s")
        if code != 0:
            raise WorkspaceError(f"{where}: `git {verb}` of {url} failed: {stderr.strip()}")


def tree_size(root: Path) -> int:
    """Bytes of the regular files under `root` (links not followed; a hard-linked file once)."""
    sizes = {
        (info.st_dev, info.st_ino): info.st_blocks * 512
        for _, info in entries(root)
        if stat.S_ISREG(info.st_mode)
    }
    return sum(sizes.values())


def chown_tree(root: Path, uid: int, gid: int) -> None:
    for relative, _ in entries(root):
        os.lchown(os.path.join(root, relative), uid, gid)


def entries(root: Path, ignore_patterns: Iterable[str] = ()) -> Iterator[tuple[str, os.stat_result]]:
    """(path relative to `root` with "/" between names, its lstat) of everything under `root`, in
    path order, a folder's entries before what its subfolders hold; never through a link; what
    `ignore_patterns` match (as `_ignored` reads them) left out, with all an ignored folder holds.

    The agent shaped this tree, so: iterative (os.walk recursed, and folders nested a few thousand
    deep raised RecursionError on Python 3.11); linear in the tree's size, however deep; a folder
    that cannot be listed (its mode, or a path longer than the system can name) is left out with
    all it holds; names that are not UTF-8 come as os.fsdecode makes them (`printable` shows them).
    """
    patterns = tuple(ignore_patterns)
    # A folder is never entered once ignored, so a pattern without "/" is matched against the
    # last name only (each name checked once, not once per entry below it).
    names = [pattern for pattern in patterns if "/" not in pattern]
    paths = [pattern.strip("/") for pattern in patterns if "/" in pattern]
    folders = [""]
    while folders:
        folder = folders.pop()
        try:
            with os.scandir(os.path.join(root, folder)) as listing:
                found = sorted(listing, key=lambda entry: entry.name)
        except OSError:
            continue
        subfolders = []
        for entry in found:
            relative = f"{folder}/{entry.name}" if folder else entry.name
            if any(fnmatch.fnmatchcase(entry.name, p) for p in names) or any(
                fnmatch.fnmatchcase(relative, p) for p in paths
            ):
                continue
            if len(os.fsencode(entry.path)) >= PATH_MAX:
                continue
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            yield relative, info
            if stat.S_ISDIR(info.st_mode):
                subfolders.append(relative)
        folders.extend(reversed(subfolders))


def _ignored(relative: Path, patterns: Iterable[str]) -> bool:
    """A pattern without "/" matches any path component; one with "/" the whole relative path."""
    text = relative.as_posix()
    for pattern in patterns:
        if "/" in pattern:
            if fnmatch.fnmatchcase(text, pattern.strip("/")):
                return True
        elif any(fnmatch.fnmatchcase(part, pattern) for part in relative.parts):
            return True
    return False


# ---------------------------------------------------------------------------------------------
# Snapshot, diff, artifacts


def snapshot(
    workspace: Path,
    ignore_patterns: Iterable[str] = (),
    max_file_bytes: int = 512 << 10,
    max_total_bytes: int = SNAPSHOT_MAX_BYTES,
    max_entries: int = MAX_ENTRIES,
) -> dict[str, bytes | None]:
    """Relative path -> content of every regular file and symlink (its target) in the workspace.

    Binary files (a NUL byte), files over `max_file_bytes` and files past `max_total_bytes` read
    in all map to None: present, not diffed. A file with several hard links is read once. Never
    follows symlinks and never opens FIFOs or devices (the agent controls this folder); stops
    after `max_entries` entries, so a workspace of a million files costs bounded time and memory.
    """
    patterns = (*DEFAULT_IGNORE_PATTERNS, *ignore_patterns)
    files: dict[str, bytes | None] = {}
    read: dict[tuple[int, int], bytes | None] = {}
    budget = max_total_bytes
    for count, (relative, info) in enumerate(entries(workspace, patterns)):
        if count >= max_entries:
            break
        path = os.path.join(workspace, relative)
        if stat.S_ISLNK(info.st_mode):
            with contextlib.suppress(OSError):
                files[relative] = os.fsencode(os.readlink(path))
        elif stat.S_ISREG(info.st_mode):
            inode = (info.st_dev, info.st_ino)
            if inode not in read:
                fits = info.st_size <= min(max_file_bytes, budget)
                read[inode] = _read_for_diff(path, max_file_bytes) if fits else None
                budget -= len(read[inode] or b"")
            files[relative] = read[inode]
    return files


def _read_for_diff(path: str, max_bytes: int) -> bytes | None:
    """A regular file's content, or None if binary, too big or unreadable (a mode the agent set)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as f:
            content = f.read(max_bytes + 1)
    except OSError:
        return None
    return None if len(content) > max_bytes or b"\0" in content else content


def unified_diff(
    before: dict[str, bytes | None], after: dict[str, bytes | None], cap_bytes: int
) -> tuple[str, bool]:
    """A git-style unified diff from `before` to `after`, files in path order, cut at `cap_bytes`.

    Returns (text, truncated). Binary or oversized files appear as one "Binary files" line when
    added or removed; when both sides are unknown (None) no change can be shown. File names are
    shown with `printable`, so any name the agent gave makes valid text of one line.
    """
    changed = [
        path
        for path in sorted(before.keys() | after.keys())
        if before.get(path, False) != after.get(path, False)
    ]
    parts, size = [], 0
    for path in changed:
        chunk = _file_diff(printable(path), before.get(path, False), after.get(path, False))
        parts.append(chunk)
        size += len(chunk.encode("utf-8"))
        if size > cap_bytes:  # the rest would be cut: a thousand hard links must not be diffed
            break
    text = "".join(parts)
    if size <= cap_bytes:
        return text, False
    marker = f"... diff truncated ({len(changed)} files changed, cap {cap_bytes})\n"
    encoded = text.encode("utf-8")
    cut = encoded[: max(0, cap_bytes - len(marker))]
    cut = cut[: cut.rfind(b"\n") + 1]  # whole lines only
    return cut.decode("utf-8", "ignore") + marker, True


def printable(name: str) -> str:
    """A file name as the agent wrote it, as text any page and database can hold: bytes that are
    not UTF-8 as \\xff, control characters (a newline in a name) escaped."""
    text = os.fsencode(name).decode("utf-8", "backslashreplace")
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def _file_diff(path: str, old: bytes | None | Literal[False], new: bytes | None | Literal[False]) -> str:
    header = f"diff --git a/{path} b/{path}\n"
    if old is False:
        header += "new file\n"
    elif new is False:
        header += "deleted file\n"
    old_name = "/dev/null" if old is False else f"a/{path}"
    new_name = "/dev/null" if new is False else f"b/{path}"
    if old is None or new is None:
        return header + f"Binary files {old_name} and {new_name} differ\n"
    old_lines = _lines(old or b"")
    new_lines = _lines(new or b"")
    body = difflib.unified_diff(old_lines, new_lines, old_name, new_name)
    return header + "".join(body)


def _lines(content: bytes) -> list[str]:
    lines = content.decode("utf-8", "replace").splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n\\ No newline at end of file\n"
    return lines


def make_artifact_tarball(
    workspace: Path,
    ignore_patterns: Iterable[str] = (),
    max_bytes: int = ARTIFACT_MAX_BYTES,
    max_entries: int = MAX_ENTRIES,
) -> bytes:
    """The workspace as a tar.gz (entries under `workspace/`, sorted, symlinks kept as links).

    Only folders, regular files and links are kept, any name included. Regular files past
    `max_bytes` in all (a sparse file of a terabyte, say), files the worker cannot read (a mode
    the agent set) and entries past `max_entries` are left out, so packing costs bounded time and
    memory.
    """
    buffer = io.BytesIO()
    left = max_bytes
    packed: set[tuple[int, int]] = set()  # tarfile stores a file's further hard links as links
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        tar.add(workspace, arcname="workspace", recursive=False)
        for count, (relative, info) in enumerate(entries(workspace, ignore_patterns)):
            if count >= max_entries:
                break
            if stat.S_ISREG(info.st_mode):
                inode = (info.st_dev, info.st_ino)
                if inode not in packed:
                    if info.st_size > left:
                        continue
                    left -= info.st_size
                    packed.add(inode)
            elif not (stat.S_ISDIR(info.st_mode) or stat.S_ISLNK(info.st_mode)):
                continue
            with contextlib.suppress(OSError):  # opening fails before anything is written
                tar.add(os.path.join(workspace, relative), arcname=f"workspace/{relative}", recursive=False)
    return buffer.getvalue()
