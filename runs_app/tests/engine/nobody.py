"""A worker process of an unprivileged user (nobody), for the tests of non-root workers."""

import os
import shutil
import subprocess
from pathlib import Path

from runs_app.engine.sandbox.process import launcher

NOBODY = 65534
ENGINE = Path(__file__).resolve().parents[2] / "engine"
PY = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else "python3"


def nobody_worker(folder: Path, code: str, **env: str) -> subprocess.CompletedProcess:
    """Run `code` as a worker process of an unprivileged user (nobody), with the sandbox code
    copied where that user can read it (the checkout may sit in a 0700 folder)."""
    package = folder / "lib" / "runs_app" / "engine"
    package.mkdir(parents=True)
    for name in ("__init__.py", "native.py"):
        shutil.copy(ENGINE / name, package / name)
    shutil.copytree(ENGINE / "sandbox", package / "sandbox", ignore=shutil.ignore_patterns("__pycache__"))
    (package.parent / "__init__.py").write_text("")
    (folder / "lib" / ".build").mkdir()
    shutil.copy(launcher(), folder / "lib" / ".build" / "evalsite-launch")
    for path in [folder, *folder.rglob("*")]:
        os.chown(path, NOBODY, NOBODY)
    prelude = f"import json, sys; sys.path.insert(0, {str(folder / 'lib')!r}); from pathlib import Path; "
    return subprocess.run(
        [PY, "-c", prelude + code],
        cwd=folder,
        env={"PATH": "/usr/bin:/bin", **env},
        user=NOBODY,
        group=NOBODY,
        extra_groups=[],
        capture_output=True,
        text=True,
        timeout=60,
    )
