"""Task and experiment bundles on a worker host: read from the database once per host, by digest.

Bundles are content-addressed, hence immutable: a blob fetched once serves every later trial on
the host (a file under BUNDLE_CACHE_DIR, shared by the host's worker processes) and every later
trial of the process (a few in memory). A worker host needs no copy of the task files.
"""

import os
import tempfile
from pathlib import Path

from django.conf import settings

from experiments_app.models import Bundle

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


def forget() -> None:
    """Drop the in-memory copies (tests that reuse digests across databases)."""
    _IN_MEMORY.clear()
