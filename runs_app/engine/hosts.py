"""What a worker host says of itself on the workers page: the versions of its agent CLIs."""

import json
import os
import subprocess
import tempfile
from pathlib import Path

from experiments_app.specs.agent_kinds import KINDS, AgentKindInfo
from runs_app.engine.agents.base import find_cli

# The model CLIs the kinds drive.
AGENT_CLIS: tuple[AgentKindInfo, ...] = tuple(kind for kind in KINDS.values() if kind.cli)


def agent_versions(cache_file: Path) -> dict[str, str]:
    """Each installed agent CLI's `--version` line (a CLI that is not installed is left out):
    two hosts whose claude differs run different agents under one variant's name.

    Asking all five costs about 4 s of CPU, so answers are kept in `cache_file` per binary
    (its real path, size and modification time): a restarted worker asks again only after an
    upgrade."""
    try:
        cache = json.loads(cache_file.read_text())
    except (OSError, ValueError):
        cache = {}
    versions, fresh = {}, {}
    for kind in AGENT_CLIS:
        binary, _missing = find_cli(kind.name, kind.cli, {}, kind.cli_variable)
        if binary is None:
            continue
        real = os.path.realpath(binary)
        stat = os.stat(real)
        key = f"{real}:{stat.st_size}:{stat.st_mtime_ns}"
        versions[kind.name] = fresh[key] = cache.get(key) or _ask_version([binary, *kind.version_args])
    if fresh != cache:
        _write_atomically(cache_file, json.dumps(fresh))
    return versions


def _ask_version(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    lines = (done.stdout.strip() or done.stderr.strip()).splitlines()
    return lines[0][:120] if done.returncode == 0 and lines else "unknown"


def _write_atomically(path: Path, text: str) -> None:
    handle, scratch = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(handle, "w") as out:
            out.write(text)
        os.replace(scratch, path)
    except OSError:
        Path(scratch).unlink(missing_ok=True)
