"""The environments a sandbox gets from its host: coder-eval's per-sandbox `.venv`, and the
packages of `sandbox.python.env_packages` / `sandbox.node.env_packages` (no Django).

A sandbox has no network to install from, so the worker installs on the host, once per
requirement set: `<SANDBOX_ROOT>/envs/<kind>-<digest>/`, built in place under a file lock (venv
scripts carry their absolute path) and marked complete last, so a crashed build is redone. Each
trial then mounts it read-only at that same path:

- Python: the trial's `.venv` (made like the host's template venv, as without packages) gets a
  `.pth` line naming the environment's site-packages, and its `bin/` links the environment's
  scripts. Installed with uv where it is on PATH, else with this Python's pip (`pip --python`).
- Node: the workspace's `node_modules` is a link to the environment's (Node resolves modules
  by their real path); its `.bin` goes first on the PATH of commands, as in coder-eval.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

INSTALL_TIMEOUT = 300  # coder-eval's
COMPLETE = ".evalsite-complete"
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"


class InstallError(Exception):
    """Installing a task's packages failed; the message carries the installer's last words."""


def system_python() -> str:
    """The Python a sandbox runs: the system's, which the sandbox sees under /usr."""
    return shutil.which("python3", path=SYSTEM_PATH) or "python3"


def venv_template(root: Path) -> Path:
    """This host's template venv (the system python3, system site packages, no pip), made once."""
    template = root / "venv-template"
    if not (template / "pyvenv.cfg").exists():
        template.parent.mkdir(parents=True, exist_ok=True)
        staging = template.with_name(f"venv-template.{os.getpid()}")
        shutil.rmtree(staging, ignore_errors=True)
        subprocess.run(
            [system_python(), "-m", "venv", "--system-site-packages", "--without-pip", str(staging)],
            check=True, capture_output=True, timeout=60,
        )  # fmt: skip
        try:
            staging.rename(template)  # atomic: a concurrent maker's template wins, this one goes
        except OSError:
            shutil.rmtree(staging, ignore_errors=True)
    return template


def new_venv(root: Path, target: Path, owner: int | None = None) -> None:
    """A trial's `.venv` at `target`: the host template's folders, links and files made afresh
    (owned by `owner`), from a listing of the template read once per process. Copying the
    template with shutil and then chowning it took 3 of a trivial trial's 10 ms of harness time.
    Its activate scripts name `target`, where a copy named the template."""
    template = venv_template(root)
    old, new = os.fsencode(template), os.fsencode(target)
    for relative, kind, mode, payload in _venv_listing(template):
        path = os.path.join(target, relative) if relative else os.fspath(target)
        if kind == "link":
            os.symlink(payload, path)
            if owner is not None:
                os.lchown(path, owner, owner)
            continue
        if kind == "dir":
            os.mkdir(path)
            os.chmod(path, mode)
            if owner is not None:
                os.chown(path, owner, owner)
            continue
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, payload.replace(old, new))
            os.fchmod(fd, mode)
            if owner is not None:
                os.fchown(fd, owner, owner)
        finally:
            os.close(fd)


_LISTINGS: dict[tuple[str, int, int], tuple[tuple[str, str, int, bytes], ...]] = {}


def _venv_listing(template: Path) -> tuple[tuple[str, str, int, bytes], ...]:
    """(relative path, "dir"/"link"/"file", mode, link target or content), parents first; read
    again if the template was made anew."""
    made = os.stat(template / "pyvenv.cfg")
    key = (os.fspath(template), made.st_ino, made.st_mtime_ns)
    if key not in _LISTINGS:
        entries = [("", "dir", stat.S_IMODE(os.stat(template).st_mode), b"")]
        for dirpath, dirnames, filenames in os.walk(template):
            for name in sorted(dirnames + filenames):
                path = os.path.join(dirpath, name)
                relative = os.path.relpath(path, template)
                info = os.lstat(path)
                if stat.S_ISLNK(info.st_mode):
                    entries.append((relative, "link", 0, os.fsencode(os.readlink(path))))
                elif stat.S_ISDIR(info.st_mode):
                    entries.append((relative, "dir", stat.S_IMODE(info.st_mode), b""))
                else:
                    entries.append((relative, "file", stat.S_IMODE(info.st_mode), Path(path).read_bytes()))
        _LISTINGS[key] = tuple(entries)
    return _LISTINGS[key]


def python_packages(root: Path, packages: list[str]) -> Path:
    """A venv holding `packages` (in the order given), built once per host and requirement set."""
    python = system_python()
    version = subprocess.run(
        [python, "-c", "import sys; print(sys.version)"], capture_output=True, text=True, timeout=30
    ).stdout.strip()
    uv = shutil.which("uv")
    key = _digest(["python", version, "uv" if uv else "pip", *packages])

    def build(target: Path) -> None:
        if uv:
            _install([uv, "venv", "--system-site-packages", "--python", python, str(target)], "uv venv")
            _install(
                [uv, "pip", "install", "--python", str(target / "bin/python"), *packages], "uv pip install"
            )
        else:
            _install([python, "-m", "venv", "--system-site-packages", "--without-pip", str(target)], "venv")
            pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--python"]
            _install([*pip, str(target / "bin/python"), "install", "-q", *packages], "pip install")

    return _built(root / "envs" / f"python-{key}", build)


def node_packages(root: Path, packages: list[str]) -> Path:
    """A folder whose node_modules holds `packages`, built once per host and requirement set."""
    bun, npm = shutil.which("bun"), shutil.which("npm") or ""
    if not (bun or npm):
        raise InstallError("sandbox.node.env_packages needs npm (or bun) on the worker host")
    key = _digest(["node", "bun" if bun else "npm", *packages])

    def build(target: Path) -> None:
        target.mkdir(parents=True)
        (target / "package.json").write_text('{"private": true}\n')
        if bun:
            _install([bun, "add", "--cwd", str(target), *packages], "bun add")
        else:
            argv = [npm, "install", "--prefix", str(target), "--no-audit", "--no-fund", "--loglevel=error"]
            _install([*argv, *packages], "npm install")

    return _built(root / "envs" / f"node-{key}", build)


def link_python_packages(venv: Path, env: Path) -> None:
    """Make the trial's `.venv` see `env`'s packages and scripts."""
    site = next((venv / "lib").glob("python3*/site-packages"))
    (site / "evalsite-env-packages.pth").write_text(
        str(next((env / "lib").glob("python3*/site-packages"))) + "\n"
    )
    for script in (env / "bin").iterdir():
        link = venv / "bin" / script.name
        if not link.exists() and not link.is_symlink():
            link.symlink_to(script)


def _digest(parts: list[str]) -> str:
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:20]


def _built(target: Path, build) -> Path:
    if (target / COMPLETE).exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.with_name(target.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build per host; the others wait and reuse it
        if not (target / COMPLETE).exists():
            shutil.rmtree(target, ignore_errors=True)  # a crashed build's leftovers
            build(target)
            readable_by_all(target)
            (target / COMPLETE).touch()
    return target


def readable_by_all(target: Path) -> None:
    """Sandboxes run as another user, and the worker's umask may be 077: a+rX over the tree."""
    os.chmod(target.parent, 0o755)
    for dirpath, _dirnames, filenames in os.walk(target):
        os.chmod(dirpath, 0o755)
        for name in filenames:
            path = os.path.join(dirpath, name)
            if not os.path.islink(path):
                mode = os.stat(path).st_mode
                os.chmod(path, mode | 0o444 | (0o111 if mode & 0o100 else 0))


def _install(argv: list[str], what: str) -> None:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=INSTALL_TIMEOUT)
    except subprocess.TimeoutExpired:
        raise InstallError(f"{what} took more than {INSTALL_TIMEOUT} s") from None
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip()[-1500:]
        raise InstallError(f"{what} failed (exit {done.returncode}): {tail}")
