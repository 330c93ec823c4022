"""Tamper evidence: a task's protected paths (`integrity.protected`), read before the agent and
again before grading. A trial whose agent changed, added or removed one fails, flagged
`tampered` with what changed; none of the peers checks this. Pure Python, no Django.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import stat
from pathlib import Path

CHUNK = 1 << 20


def digests(workspace: Path, patterns: list[str]) -> dict[str, str]:
    """Each workspace entry matching a pattern (fnmatch on its path relative to the workspace:
    `tests/**` or `tests/*` match everything below tests/) -> the sha256 of what it is: a
    file's bytes, a link's target, or the kind of a special file. Links are not followed."""
    found: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(workspace):
        base = Path(dirpath).relative_to(workspace)
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            relative = (base / name).as_posix()
            if any(fnmatch.fnmatchcase(relative, pattern) for pattern in patterns):
                found[relative] = _digest(Path(dirpath) / name)
    return found


def _digest(path: Path) -> str:
    digest = hashlib.sha256()
    try:
        info = path.lstat()
        if stat.S_ISLNK(info.st_mode):
            digest.update(b"link:" + os.fsencode(os.readlink(path)))
        elif stat.S_ISREG(info.st_mode):
            with open(path, "rb") as handle:
                while chunk := handle.read(CHUNK):
                    digest.update(chunk)
        else:
            digest.update(f"special:{stat.S_IFMT(info.st_mode)}".encode())
    except OSError as exc:
        digest.update(f"unreadable:{exc.errno}".encode())
    return digest.hexdigest()


def changes(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """What changed between two readings, one line a path: `changed`, `added` or `removed`."""
    lines = []
    for path in sorted(before.keys() | after.keys()):
        if path not in after:
            lines.append(f"removed {path}")
        elif path not in before:
            lines.append(f"added {path}")
        elif before[path] != after[path]:
            lines.append(f"changed {path}")
    return lines
