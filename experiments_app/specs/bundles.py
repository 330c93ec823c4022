"""Task bundles: a YAML file plus every file it references, as one compressed blob (no Django).

Format: a gzip-compressed POSIX (pax) tar holding regular files only, in sorted path order,
with normalized metadata (mtime 0, uid/gid 0, no owner names, mode 0644, or 0755 for files
starting with "#!" so scripts stay runnable). The same files therefore always give the
same bytes, whatever their mtimes, owners, order or the folder they came from.

`digest` is the sha256 of the uncompressed tar stream, not of the gzip blob: the tar is
canonical, while gzip output may differ between zlib versions, and a digest that changed
with the machine's zlib would make unchanged tasks look edited on re-import.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import posixpath
import tarfile
from dataclasses import dataclass
from pathlib import Path

DEFAULT_MAX_BYTES = 20 * 1024 * 1024


@dataclass(frozen=True)
class Bundle:
    blob: bytes  # gzip-compressed tar
    digest: str  # sha256 hex of the uncompressed tar
    size: int  # total bytes of the files' contents (what the cap limits)


class BundleTooLarge(ValueError):
    pass


class UnsafeBundle(ValueError):
    """A bundle entry that could escape its folder, or that is not a regular file."""


def make_bundle(files: dict[str, bytes], max_bytes: int = DEFAULT_MAX_BYTES) -> Bundle:
    """Pack `files` (bundle-relative posix path -> content) into a deterministic blob."""
    size = sum(len(data) for data in files.values())
    if size > max_bytes:
        raise BundleTooLarge(too_large_message({name: len(data) for name, data in files.items()}, max_bytes))
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(files):
            data = files[name]
            tar.addfile(_tar_info(check_member_name(name), data), io.BytesIO(data))
    raw = buf.getvalue()
    # mtime=0 keeps the gzip header free of the current time.
    blob = gzip.compress(raw, compresslevel=6, mtime=0)
    return Bundle(blob=blob, digest=hashlib.sha256(raw).hexdigest(), size=size)


def _tar_info(name: str, data: bytes) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = 0
    info.mode = 0o755 if data.startswith(b"#!") else 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def too_large_message(sizes: dict[str, int], max_bytes: int) -> str:
    """Say how far over the cap a bundle of files with these sizes is, and which files weigh most."""
    biggest = sorted(sizes, key=lambda name: sizes[name], reverse=True)[:3]
    listing = ", ".join(f"{name} ({_mb(sizes[name])})" for name in biggest)
    return (
        f"bundle is {_mb(sum(sizes.values()))}, over the {_mb(max_bytes)} cap; largest files: {listing}. "
        "Remove large files from the template/reference folders."
    )


def _mb(n: int) -> str:
    return f"{n / (1024 * 1024):.1f} MB"


def check_member_name(name: str) -> str:
    """Return `name` if it is a plain relative posix path that stays inside its folder."""
    norm = posixpath.normpath(name)
    if not name or name.startswith("/") or "\\" in name or norm == "." or norm.startswith("../"):
        raise UnsafeBundle(f"unsafe path in bundle: {name!r}")
    if norm != name or ".." in name.split("/"):
        raise UnsafeBundle(f"path in bundle is not normalized: {name!r}")
    return name


def read_bundle(blob: bytes, max_bytes: int | None = None) -> dict[str, bytes]:
    """Unpack a blob made by `make_bundle`; refuses links, devices and escaping paths."""
    files: dict[str, bytes] = {}
    total = 0
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(blob)), mode="r:") as tar:
        for info in tar:
            if not info.isreg():
                raise UnsafeBundle(f"bundle entry {info.name!r} is not a regular file")
            total += info.size
            if max_bytes is not None and total > max_bytes:
                raise BundleTooLarge(f"bundle unpacks to more than {_mb(max_bytes)}")
            extracted = tar.extractfile(info)
            assert extracted is not None  # regular files always have content
            files[check_member_name(info.name)] = extracted.read()
    return files


def write_bundle_files(files: dict[str, bytes], dest_dir: Path) -> None:
    """Write bundle files under `dest_dir` (e.g. for export), refusing paths that escape it."""
    dest = dest_dir.resolve()
    for name in sorted(files):
        target = (dest / check_member_name(name)).resolve()
        if not target.is_relative_to(dest):
            # A symlink already present in dest could redirect the write.
            raise UnsafeBundle(f"bundle path {name!r} would be written outside {dest}")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(files[name])
        if files[name].startswith(b"#!"):
            target.chmod(0o755)


def extract_bundle(blob: bytes, dest: Path, max_bytes: int | None = None) -> None:
    """Unpack a bundle blob into `dest`."""
    write_bundle_files(read_bundle(blob, max_bytes=max_bytes), dest)
