"""The real coder-eval 0.12.16 command for tests that check evalsite's files with it: `CODER_EVAL`
(a path), else the one `make coder-eval` installs (.agents/coder-eval), else `coder-eval` on PATH;
skipped without one, failed where it must run (EVALSITE_REQUIRE_CODER_EVAL=1, as `.ci/run` sets
where `make coder-eval` installed it)."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from django.conf import settings

INSTALLED = settings.BASE_DIR / ".agents" / "coder-eval" / "bin" / "coder-eval"


def coder_eval() -> Path:
    found = os.environ.get("CODER_EVAL") or (INSTALLED if INSTALLED.is_file() else shutil.which("coder-eval"))
    if not found or not Path(found).is_file():
        why = "coder-eval not found: `make coder-eval`, or set CODER_EVAL=/path/to/coder-eval (0.12.16)"
        if os.environ.get("EVALSITE_REQUIRE_CODER_EVAL"):
            pytest.fail(f"{why} (EVALSITE_REQUIRE_CODER_EVAL is set: it must run here)")
        pytest.skip(why)
    return Path(found)


def run_coder_eval(*args: str) -> subprocess.CompletedProcess:
    # Wide and plain: rich wraps and colours what the test reads otherwise.
    env = {**os.environ, "COLUMNS": "300", "NO_COLOR": "1", "TERM": "dumb"}
    return subprocess.run(
        [str(coder_eval()), *args], capture_output=True, text=True, timeout=120, env=env, check=False
    )


def coder_eval_python() -> Path:
    """The interpreter coder-eval is installed in (its writer code run as coder-eval runs it)."""
    return coder_eval().resolve().parent / "python"
