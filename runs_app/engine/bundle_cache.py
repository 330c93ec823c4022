"""Task and experiment bundles on a worker host: read from the database once per host, by digest.

Bundles are content-addressed, hence immutable: a blob fetched once serves every later trial on
the host (a file under BUNDLE_CACHE_DIR, shared by the host's worker processes) and every later
trial of the process (a few in memory). A worker host needs no copy of the task files.

Trials read a bundle's files from one unpacked, read-only copy per host (`unpacked`), not one
of their own: unpacking, chowning and deleting a copy was a tenth of a trivial trial's time.
"""

import os
import shutil
import stat
import tempfile
from pathlib import Path

from django.conf import settings

from experiments_app.models import Bundle
from experiments_app.specs.bundles import extract_bundle

_IN_MEMORY: dict[str, bytes] = {}
_IN_MEMORY_MAX = 16


def bundle_blob(digest: str) -> bytes:
    """The stored blob of the bundle with this digest."""
    blob = _IN_MEMORY.get(digest)
    if blob is None:
        blob = _from_host(digest)
        if len(_IN_MEMORY) >= _IN_MEMORY_MAX:
            _IN_MEMORY.pop(next(iter(_IN_MEMORY)))
        _IN_MEMORY[digest] = blob
    return blob


def _from_host(digest: str) -> bytes:
    folder = Path(settings.BUNDLE_CACHE_DIR)
    path = folder / f"{digest}.bundle"
    try:
        return path.read_bytes()
    except FileNotFoundError:
        pass
    blob = bytes(Bundle.objects.values_list("data", flat=True).get(pk=digest))
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    # Written aside, then renamed: a process reading the cache sees a whole blob or none.
    handle, scratch = tempfile.mkstemp(dir=folder, prefix=f".{digest}.")
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(blob)
        os.replace(scratch, path)
    except OSError:
        Path(scratch).unlink(missing_ok=True)
    return blob


def unpacked(digest: str) -> Path:
    """The bundle's files, unpacked once per host under SANDBOX_ROOT/bundles/<digest>.

    Owned by the worker and readable by every sandbox uid (only the phases that need them mount
    them, read-only, into a sandbox; nothing else of the host exists there), in a folder that
    lists nothing. Unpacked aside and renamed into place: a reader sees the whole bundle or none.
    """
    root = Path(settings.SANDBOX_ROOT) / "bundles"
    target = root / digest
    if target.is_dir():
        return target
    for folder in (root.parent, root):  # whatever the worker's umask
        folder.mkdir(parents=True, exist_ok=True)
        os.chmod(folder, 0o711)
    scratch = Path(tempfile.mkdtemp(dir=root, prefix=f".{digest}."))
    try:
        extract_bundle(bundle_blob(digest), scratch)
        _readable_by_all(scratch)
        os.rename(scratch, target)
    except OSError:
        if not target.is_dir():  # not just another process unpacking it first
            raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target


def _readable_by_all(folder: Path) -> None:
    os.chmod(folder, 0o755)
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in dirnames:
            os.chmod(os.path.join(dirpath, name), 0o755)
        for name in filenames:
            path = os.path.join(dirpath, name)
            executable = os.lstat(path).st_mode & stat.S_IXUSR
            os.chmod(path, 0o755 if executable else 0o644)


def forget() -> None:
    """Drop the in-memory copies (tests that reuse digests across databases)."""
    _IN_MEMORY.clear()
